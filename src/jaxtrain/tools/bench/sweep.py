"""`jaxtrain bench sweep`: trials per hour of `jaxtrain sweep`, one trial at a time against workers.

Each measured run is the whole command, `jaxtrain sweep WORKLOAD ... --trials N` in a fresh
process and a fresh sweep folder (process start, data, compilation, training, evaluation,
checkpoints and the study's bookkeeping included), timed from start to exit. The modes run
interleaved for `--rounds` rounds; the figure is the median of N trials / wall time, as trials per
hour, and its ratio to one trial at a time. The trials draw the learning rate only (the random
sampler, no pruning), so every trial of a workload does the same work whichever mode runs it.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

TARGET, AIM = 2.0, 3.0  # trials per hour against one trial at a time, on a 2-core CPU

WORKLOADS = {
    "mlp-regression": ["--data.samples", "8000", "--data.val-samples", "1000", "--epochs", "3"],
    "mnist-cnn": ["--data.limit", "3000", "--epochs", "2"],
}
QUICK = {
    "mlp-regression": ["--data.samples", "600", "--data.val-samples", "100", "--model.hidden", "16", "--epochs", "1"],
    "mnist-cnn": ["--data.limit", "300", "--epochs", "1"],
}


@dataclasses.dataclass(frozen=True)
class SweepBenchConfig:
    """Settings of the sweep benchmark."""

    workloads: tuple[str, ...] = ("mlp-regression", "mnist-cnn")
    """Recipes swept (each with its small fixed settings above)."""
    modes: tuple[str, ...] = ("sequential", "workers")
    """sequential: one trial at a time (`--workers 1`); workers: `--workers W`."""
    workers: int = 2
    """W of the worker modes."""
    trials: int = 8
    """Trials per measured sweep."""
    rounds: int = 3
    """Interleaved rounds (every mode once per round)."""
    quick: bool = False
    """A cut-down run for smoke tests (1 round, 2 trials, tiny data)."""


def _command(workload: str, mode: str, config: SweepBenchConfig, out: Path) -> list[str]:
    flags = (QUICK if config.quick else WORKLOADS)[workload]
    command = [sys.executable, "-m", "jaxtrain", "sweep", workload, *flags, "--space",
               "optim.lr=loguniform:1e-4:1e-2", "--trials", str(config.trials), "--out", str(out),
               "--sampler", "random", "--pruner", "none",
               "--workers", str(1 if mode == "sequential" else config.workers)]
    return command


def main(config: SweepBenchConfig) -> int:
    if config.quick:
        config = dataclasses.replace(config, rounds=1, trials=2)
    for mode in config.modes:
        if mode not in ("sequential", "workers"):
            print(f"error: unknown mode {mode!r}; choose sequential, workers", file=sys.stderr)
            return 2
    unknown = [w for w in config.workloads if w not in WORKLOADS]
    if unknown:
        print(f"error: unknown workload {unknown[0]!r}; choose {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    console = Console(highlight=False)
    rates: dict[tuple[str, str], list[float]] = {(w, m): [] for w in config.workloads for m in config.modes}
    with tempfile.TemporaryDirectory(prefix="jaxtrain-bench-sweep-") as tmp:
        for round_ in range(1, config.rounds + 1):
            for workload in config.workloads:
                for mode in config.modes:
                    out = Path(tmp) / f"{workload}-{mode}-{round_}"
                    command = _command(workload, mode, config, out)
                    t0 = time.perf_counter()
                    done = subprocess.run(command, capture_output=True, text=True)
                    wall = time.perf_counter() - t0
                    if done.returncode != 0:
                        console.print(f"round {round_} {workload} {mode}: FAILED (exit {done.returncode}): "
                                      f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
                        return 1
                    rates[workload, mode].append(3600 * config.trials / wall)
                    console.print(f"round {round_} {workload} {mode}: {config.trials} trials in {wall:.1f} s "
                                  f"({rates[workload, mode][-1]:,.0f} trials/hour)")
    table = Table(title=f"sweep: {config.trials} trials per sweep, {config.rounds} interleaved rounds, medians "
                        f"({os.cpu_count()} CPU cores)")
    for column in ("workload", "mode", "trials/hour (each round)", "median", "× sequential"):
        table.add_column(column, justify="left" if column in ("workload", "mode") else "right")
    best = {}
    for workload in config.workloads:
        base = statistics.median(rates[workload, "sequential"]) if "sequential" in config.modes else None
        for mode in config.modes:
            median = statistics.median(rates[workload, mode])
            label = mode if mode == "sequential" else f"{mode} (W={config.workers})"
            table.add_row(workload, label, ", ".join(f"{r:,.0f}" for r in rates[workload, mode]), f"{median:,.0f}",
                          "-" if base is None else f"{median / base:.2f}×")
            if base is not None and mode != "sequential":
                best[workload] = max(best.get(workload, 0.0), median / base)
    console.print(table)
    for workload, ratio in best.items():
        verdict = "met" if ratio >= TARGET else "missed"
        console.print(f"{workload}: best {ratio:.2f}× one trial at a time; target ≥ {TARGET:.0f}× (aim {AIM:.0f}×): "
                      f"{verdict}")
    return 0
