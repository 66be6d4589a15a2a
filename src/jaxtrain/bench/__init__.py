"""Benchmarks: commands that print tables (`jaxtrain bench NAME`), never timed tests."""

from jaxtrain.bench import checkpoint, data, faults, frameworks, ladder, overhead, preprocess, scale, scan

# name -> (config class, main(config) -> exit code)
BENCHMARKS = {
    "checkpoint": (checkpoint.CheckpointBenchConfig, checkpoint.main),
    "data": (data.DataBenchConfig, data.main),
    "faults": (faults.FaultsBenchConfig, faults.main),
    "frameworks": (frameworks.FrameworksConfig, frameworks.main),
    "ladder": (ladder.LadderConfig, ladder.main),
    "overhead": (overhead.OverheadConfig, overhead.main),
    "preprocess": (preprocess.PreprocessBenchConfig, preprocess.main),
    "scale": (scale.ScaleBenchConfig, scale.main),
    "scan": (scan.ScanBenchConfig, scan.main),
}

__all__ = ["BENCHMARKS"]
