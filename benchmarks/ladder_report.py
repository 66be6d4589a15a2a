"""Figures derived from the ladder's raw results, and its table, JSON, Markdown and chart."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

COLUMNS = ("variant", "s/epoch", "10 epochs", "speedup", "steps/s", "compile s", "first step s",
           "amortised at step", "% of peak", "max |Δpred|", "test MSE")


def add_derived(results: list[dict], config: Any, peak_gflops: float, tolerance: float, flop_per_sample: float) -> bool:
    """Adds speedups, projections, amortisation, FLOP/s and the prediction check to `results`.

    Returns whether the benchmark passed: every run JAX variant (0-5) ran and matched the
    original's predictions within `tolerance`.
    """
    ran = {r["variant"]: r for r in results if "epoch_s" in r}
    base = ran.get(0)
    ok = not any("error" in r and r["variant"] <= 5 for r in results)
    reference = _predictions(config, 0) if base and config.validate else None
    for r in ran.values():
        r["epochs10_s"] = 10 * r["epoch_s"]
        r["steps_per_s"] = 1 / r["step_s"]
        r["achieved_gflops"] = flop_per_sample * config.batch_size / r["step_s"] / 1e9
        r["fraction_of_peak"] = r["achieved_gflops"] / peak_gflops
        if base:
            r["speedup"] = base["epoch_s"] / r["epoch_s"]
            saved = base["step_s"] - r["step_s"]
            r["amortised_at_step"] = math.ceil(r["compile_s"] / saved) if saved > 0 and r["compile_s"] > 0 else None
        if reference is not None and config.validate:
            r["max_abs_pred_diff"] = float(np.max(np.abs(_predictions(config, r["variant"]) - reference)))
            r["validated"] = r["max_abs_pred_diff"] <= tolerance
            if r["variant"] <= 5 and not r["validated"]:
                ok = False
    if config.validate and base is None and any(v <= 5 for v in ran):
        ok = False  # nothing to validate against
    return ok


def _predictions(config: Any, variant: int) -> np.ndarray:
    return np.load(Path(config.out) / f"predictions-{variant}.npy")


def _row(r: dict) -> list[str]:
    name = f"{r['variant']} {r['name']}" + (" *" if r.get("extrapolated") else "")
    amortised = r.get("amortised_at_step")
    diff = r.get("max_abs_pred_diff")
    return [
        name, f"{r['epoch_s']:.2f}", f"{r['epochs10_s'] / 60:.2f} min", f"{r.get('speedup', float('nan')):.1f}x",
        f"{r['steps_per_s']:,.0f}", f"{r['compile_s']:.2f}", f"{r['first_step_s']:.3f}",
        "-" if amortised is None else f"{amortised:,}", f"{r['fraction_of_peak']:.1%}",
        "-" if diff is None else f"{diff:.1e}", f"{r['test_mse']:.5f}" if "test_mse" in r else "-",
    ]


def write(results: list[dict], config: Any, peak_gflops: float, console: Console) -> None:
    """Prints the table; writes results.json, results.md and ladder.png under `config.out`."""
    out = Path(config.out)
    ran = [r for r in results if "epoch_s" in r]
    table = Table(title="optimization ladder: mlp-regression, time per epoch (compile excluded)")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "variant" else "right")
    for r in ran:
        table.add_row(*_row(r))
    console.print(table)
    notes = _notes(results, config, peak_gflops)
    for note in notes:
        console.print(note)

    payload = {"config": dataclasses.asdict(config), "peak_gflops": peak_gflops, "results": results}
    (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_row(r)) + " |" for r in ran]
    (out / "results.md").write_text("\n".join(lines + [""] + notes) + "\n")
    _chart(ran, out / "ladder.png")
    console.print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'ladder.png'}")


def _notes(results: list[dict], config: Any, peak_gflops: float) -> list[str]:
    notes = [f"matmul peak measured in this run: {peak_gflops:.0f} GFLOP/s (float32, 2048x2048)"]
    for r in results:
        if r.get("extrapolated"):
            notes.append(f"* variant {r['variant']} was timed on {r['timed_steps']} steps and extrapolated "
                         f"to {r['steps_per_epoch']} steps per epoch")
        if "skipped" in r:
            notes.append(f"variant {r['variant']} skipped: {r['skipped']}")
        if "error" in r:
            notes.append(f"variant {r['variant']} FAILED: {r['error']}")
    if config.validate:
        notes.append("max |Δpred|: largest test-set prediction difference against variant 0 after one epoch from the "
                     "same weights and batch order, noise off; variants 0-5 must be within 1e-5")
    return notes


def _chart(ran: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels = [f"{r['variant']} {r['name']}" for r in ran]
    bars = ax.barh(labels[::-1], [r["epoch_s"] for r in ran][::-1], color="#4c72b0")
    ax.set_xscale("log")
    ax.set_xlabel("seconds per epoch (log scale)")
    ax.set_title("mlp-regression: time per epoch at batch 32")
    for bar, r in zip(bars, ran[::-1]):
        label = f" {r['epoch_s']:.2f} s" + (f"  ({r['speedup']:.1f}x)" if "speedup" in r else "")
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, label, va="center", fontsize=9)
    times = [r["epoch_s"] for r in ran]
    ax.set_xlim(min(times) / 2, max(times) * 8)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
