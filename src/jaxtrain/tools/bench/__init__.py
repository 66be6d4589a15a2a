"""Benchmarks: commands that print tables (`jaxtrain bench NAME`), never timed tests.

`BENCHMARKS` names each benchmark's module; `benchmark(name)` imports that one alone (a benchmark
whose module imports no JAX answers `jaxtrain bench NAME --help` at once)."""

from __future__ import annotations

import importlib
from typing import Any, Callable

# name -> (module under jaxtrain.tools.bench, its config class, its main(config) -> exit code)
BENCHMARKS = {
    "attention": ("attention", "AttentionBenchConfig", "main"),
    "checkpoint": ("checkpoint", "CheckpointBenchConfig", "main"),
    "data": ("data", "DataBenchConfig", "main"),
    "ema": ("ema", "EmaBenchConfig", "main"),
    "faults": ("faults", "FaultsBenchConfig", "main"),
    "frameworks": ("frameworks", "FrameworksConfig", "main"),
    "ladder": ("ladder", "LadderConfig", "main"),
    "overhead": ("overhead", "OverheadConfig", "main"),
    "precision": ("precision", "PrecisionBenchConfig", "main"),
    "predict": ("predict", "PredictBenchConfig", "main"),
    "preprocess": ("preprocess", "PreprocessBenchConfig", "main"),
    "profile": ("profile", "ProfileBenchConfig", "main"),
    "remat": ("remat", "RematBenchConfig", "main"),
    "scale": ("scale", "ScaleBenchConfig", "main"),
    "scan": ("scan", "ScanBenchConfig", "main"),
    "scan-corpus": ("scan_corpus", "ScanCorpusConfig", "main"),
    "selfplay": ("selfplay", "SelfPlayBenchConfig", "main"),
    "shortrun": ("shortrun", "ShortRunBenchConfig", "main"),
    "sweep": ("sweep", "SweepBenchConfig", "main"),
    "xla-flags": ("xla_flags", "XlaFlagsBenchConfig", "main"),
    "zoo": ("zoo_bench", "ZooBenchConfig", "main"),
}


def benchmark(name: str) -> tuple[type, Callable[[Any], int]]:
    """`(config class, main)` of the benchmark `name` (a key of `BENCHMARKS`), its module imported."""
    module, config, main = BENCHMARKS[name]
    loaded = importlib.import_module(f"{__name__}.{module}")
    return getattr(loaded, config), getattr(loaded, main)


__all__ = ["BENCHMARKS", "benchmark"]
