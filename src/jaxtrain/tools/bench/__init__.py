"""Benchmarks: commands that print tables (`jaxtrain bench NAME`), never timed tests.

`BENCHMARKS` names each benchmark's module; `benchmark(name)` imports that one alone (a benchmark
whose module imports no JAX answers `jaxtrain bench NAME --help` at once)."""

from __future__ import annotations

import importlib
from typing import Any, Callable

# name -> (module under jaxtrain.tools.bench, its config class); each module's main(config) -> exit code
BENCHMARKS = {
    "attention": ("attention", "AttentionBenchConfig"),
    "checkpoint": ("checkpoint", "CheckpointBenchConfig"),
    "data": ("data", "DataBenchConfig"),
    "ema": ("ema", "EmaBenchConfig"),
    "faults": ("faults", "FaultsBenchConfig"),
    "frameworks": ("frameworks", "FrameworksConfig"),
    "ladder": ("ladder", "LadderConfig"),
    "overhead": ("overhead", "OverheadConfig"),
    "precision": ("precision", "PrecisionBenchConfig"),
    "predict": ("predict", "PredictBenchConfig"),
    "preprocess": ("preprocess", "PreprocessBenchConfig"),
    "profile": ("profile", "ProfileBenchConfig"),
    "remat": ("remat", "RematBenchConfig"),
    "scale": ("scale", "ScaleBenchConfig"),
    "scan": ("scan", "ScanBenchConfig"),
    "scan-corpus": ("scan_corpus", "ScanCorpusConfig"),
    "selfplay": ("selfplay", "SelfPlayBenchConfig"),
    "shortrun": ("shortrun", "ShortRunBenchConfig"),
    "sweep": ("sweep", "SweepBenchConfig"),
    "xla-flags": ("xla_flags", "XlaFlagsBenchConfig"),
    "zoo": ("zoo_bench", "ZooBenchConfig"),
}


def benchmark(name: str) -> tuple[type, Callable[[Any], int]]:
    """`(config class, main)` of the benchmark `name` (a key of `BENCHMARKS`), its module imported."""
    module, config = BENCHMARKS[name]
    loaded = importlib.import_module(f"{__name__}.{module}")
    return getattr(loaded, config), loaded.main


__all__ = ["BENCHMARKS", "benchmark"]
