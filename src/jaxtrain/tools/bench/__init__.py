"""Benchmarks: commands that print tables (`jaxtrain bench NAME`), never timed tests."""

from jaxtrain.tools.bench import (
    attention,
    checkpoint,
    data,
    ema,
    faults,
    frameworks,
    ladder,
    overhead,
    precision,
    predict,
    preprocess,
    profile,
    remat,
    scale,
    scan,
    scan_corpus,
    selfplay,
    shortrun,
    sweep,
    xla_flags,
    zoo_bench,
)

# name -> (config class, main(config) -> exit code)
BENCHMARKS = {
    "attention": (attention.AttentionBenchConfig, attention.main),
    "checkpoint": (checkpoint.CheckpointBenchConfig, checkpoint.main),
    "data": (data.DataBenchConfig, data.main),
    "ema": (ema.EmaBenchConfig, ema.main),
    "faults": (faults.FaultsBenchConfig, faults.main),
    "frameworks": (frameworks.FrameworksConfig, frameworks.main),
    "ladder": (ladder.LadderConfig, ladder.main),
    "overhead": (overhead.OverheadConfig, overhead.main),
    "precision": (precision.PrecisionBenchConfig, precision.main),
    "predict": (predict.PredictBenchConfig, predict.main),
    "preprocess": (preprocess.PreprocessBenchConfig, preprocess.main),
    "profile": (profile.ProfileBenchConfig, profile.main),
    "remat": (remat.RematBenchConfig, remat.main),
    "scale": (scale.ScaleBenchConfig, scale.main),
    "scan": (scan.ScanBenchConfig, scan.main),
    "scan-corpus": (scan_corpus.ScanCorpusConfig, scan_corpus.main),
    "selfplay": (selfplay.SelfPlayBenchConfig, selfplay.main),
    "shortrun": (shortrun.ShortRunBenchConfig, shortrun.main),
    "sweep": (sweep.SweepBenchConfig, sweep.main),
    "xla-flags": (xla_flags.XlaFlagsBenchConfig, xla_flags.main),
    "zoo": (zoo_bench.ZooBenchConfig, zoo_bench.main),
}

__all__ = ["BENCHMARKS"]
