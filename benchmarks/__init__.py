"""Benchmarks: commands that print tables (`jaxtrain bench NAME`), never timed tests.

A folder of the repository, not of the installed package (the wheel holds src/ alone): the model
zoo, the PyTorch mirrors, fault injection and the ladders are for measuring jaxtrain, not for
training with it. They sit above the tools and may import anything of jaxtrain (`jaxtrain._src`
included); nothing under src/jaxtrain imports them (tests/library/test_layers.py). The command
`jaxtrain bench` finds this folder beside src/ in a checkout (`jaxtrain.tools.cli`); the tests find it
through pytest's `pythonpath`, and child processes through PYTHONPATH (`child.child_environ`).

`BENCHMARKS` names each benchmark's module; `benchmark(name)` imports that one alone (a benchmark
whose module imports no JAX answers `jaxtrain bench NAME --help` at once)."""

from __future__ import annotations

import importlib
from typing import Any, Callable

# name -> (module under benchmarks, its config class); each module's main(config) -> exit code
BENCHMARKS = {
    "attention": ("attention", "AttentionBenchConfig"),
    "checkpoint": ("checkpoint", "CheckpointBenchConfig"),
    "data": ("data", "DataBenchConfig"),
    "ema": ("ema", "EmaBenchConfig"),
    "faults": ("faults", "FaultsBenchConfig"),
    "frameworks": ("frameworks", "FrameworksConfig"),
    "gpu": ("gpu", "GpuBenchConfig"),
    "ladder": ("ladder", "LadderConfig"),
    "overhead": ("overhead", "OverheadConfig"),
    "precision": ("precision", "PrecisionBenchConfig"),
    "predict": ("predict", "PredictBenchConfig"),
    "preprocess": ("preprocess", "PreprocessBenchConfig"),
    "profile": ("profile", "ProfileBenchConfig"),
    "progress": ("progress", "ProgressBenchConfig"),
    "remat": ("remat", "RematBenchConfig"),
    "sameseed": ("sameseed", "SameSeedBenchConfig"),
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
