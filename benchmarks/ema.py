"""`jaxtrain bench ema`: what an average of the weights (`--ema`) costs per training step.

mlp-regression's recipe (its model, data and batch; checkpoints off) trained for `--epochs` with
`--ema 0` and `--ema 0.999`, each run a fresh process, the two interleaved for `--runs` rounds;
the step time is the run's training time (compilation and evaluation excluded) over its steps,
and the cost is the median step time with the average over the median without.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.child import run_child

TARGET = 1.03  # the average may cost at most 3% of the step time


@dataclasses.dataclass(frozen=True)
class EmaBenchConfig:
    """Settings of the EMA benchmark."""

    runs: int = 5
    """Interleaved rounds (a fresh process per run)."""
    epochs: int = 2
    """Epochs of mlp-regression per run."""
    decay: float = 0.999
    """The --ema of the runs with an average."""
    quick: bool = False
    """A cut-down run for smoke tests (1 round, small data)."""


def _values(config: EmaBenchConfig, ema: float) -> dict[str, Any]:
    from jaxtrain._src.config import to_dict
    from jaxtrain.tools.recipes import get_recipe

    recipe = get_recipe("mlp-regression")
    c = recipe.config
    c = dataclasses.replace(c, epochs=config.epochs, ema=ema, quiet=True,
                            checkpoint=dataclasses.replace(c.checkpoint, enabled=False))
    if config.quick:
        c = dataclasses.replace(c, data=dataclasses.replace(c.data, samples=3000, val_samples=500))
    return to_dict(c)


def main(config: EmaBenchConfig) -> int:
    if config.quick:
        config = dataclasses.replace(config, runs=1, epochs=1)
    console = Console(highlight=False)
    variants = {"no average": 0.0, f"--ema {config.decay}": config.decay}
    ms: dict[str, list[float]] = {v: [] for v in variants}
    for run in range(1, config.runs + 1):
        for name, ema in variants.items():
            r = run_child("benchmarks.frameworks", {"workload": "mlp-regression",
                                                              "config": _values(config, ema)})
            if "error" in r:
                console.print(f"run {run} {name}: FAILED: {r['error']}")
                return 1
            ms[name].append(1000 * r["train_s"] / r["steps"])
            console.print(f"run {run} {name}: {ms[name][-1]:.4f} ms/step ({r['steps']} steps, K={r['steps_per_call']})")
    table = Table(title=f"ema: mlp-regression, {config.epochs} epochs, {config.runs} interleaved rounds, medians")
    for column in ("variant", "ms/step (each run)", "median", "× no average"):
        table.add_column(column)
    base = statistics.median(ms["no average"])
    for name, values in ms.items():
        median = statistics.median(values)
        table.add_row(name, ", ".join(f"{v:.4f}" for v in values), f"{median:.4f}", f"{median / base:.3f}×")
    console.print(table)
    cost = statistics.median(ms[f"--ema {config.decay}"]) / base
    console.print(f"target ≤ {TARGET:.2f}× the step time: {'met' if cost <= TARGET else 'missed'} ({cost:.3f}×)")
    return 0
