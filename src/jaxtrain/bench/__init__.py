"""Benchmarks: commands that print tables (`jaxtrain bench NAME`), never timed tests."""

from jaxtrain.bench import overhead

# name -> (config class, main(config) -> exit code)
BENCHMARKS = {"overhead": (overhead.OverheadConfig, overhead.main)}

__all__ = ["BENCHMARKS"]
