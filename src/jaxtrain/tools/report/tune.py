"""What `jaxtrain tune batch-size` prints and draws: the table of batches, the recommendation and
a PNG of throughput and step memory against batch size."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from jaxtrain.engine import format_bytes, save_figure

if TYPE_CHECKING:
    from jaxtrain.tools.tune import BatchSizeResult, LRRange


def print_batch_size(result: "BatchSizeResult", console: Console, command: str = "") -> None:
    """The table of `result.rows` and the recommendation; `command` (e.g. `jaxtrain train
    mlp-regression`) prefixes the suggested flags."""
    console.print(f"[bold]{result.name}[/bold] on {result.device}: memory cap {format_bytes(result.cap_bytes)} per "
                  f"training step, from {result.cap_source}")
    data = (f"; the datasets fit keeps on the device, {format_bytes(result.data_bytes)}, come on top"
            if result.data_bytes else "; fit keeps no dataset on the device")
    console.print(f"a step's memory = parameters + optimizer state ({format_bytes(result.state_bytes)}) + one batch "
                  f"+ temporaries (XLA's compiled memory analysis){data}")
    table = Table(show_edge=False, pad_edge=False)
    for column in ("batch", "step memory", "temporaries", "fits cap", "samples/s", "steps/s", "note"):
        table.add_column(column, justify="left" if column in ("fits cap", "note") else "right")
    for row in result.rows:
        marks = [m for m, b in (("best", result.best), ("largest", result.largest)) if b == row.batch_size]
        note = ", ".join(marks + ([row.failure] if row.failure else []))
        table.add_row(f"{row.batch_size:,}", format_bytes(row.memory["peak_bytes"]),
                      format_bytes(row.memory["temp_bytes"]), "yes" if row.fits else "no",
                      f"{row.samples_per_s:,.0f}" if row.trained else "-",
                      f"{row.steps_per_s:,.1f}" if row.trained else "-", note)
    console.print(table)
    largest, best = result.row(result.largest), result.row(result.best)
    call = (f"; fit's compiled call of K steps, data included, needs {format_bytes(largest.call_memory['peak_bytes'])}"
            if largest.call_memory else "")
    timed = ("samples/s: median of 3 timed compiled calls per batch (compilation and epoch starts excluded), one run"
             if result.throughput else "only the largest batch trained (--no-throughput)")
    console.print(f"search ended at {result.stopped_by}; {timed}")
    console.print(f"largest batch that fits and trained: [bold]{result.largest:,}[/bold] (a step needs "
                  f"{format_bytes(largest.memory['peak_bytes'])}{call})")
    if result.throughput and best.samples_per_s is not None:  # (the best batch trained)
        near = [f"{r.batch_size:,}" for r in result.rows if r.samples_per_s is not None and r.batch_size != result.best
                and r.samples_per_s >= 0.9 * best.samples_per_s]
        close = f"; within 10% of it: {', '.join(near)} (one run each: differences this small may be noise)" \
            if near else ""
        console.print(f"best throughput: [bold]batch {result.best:,}[/bold], {best.samples_per_s:,.0f} "
                      f"samples/s{close}")
    lr, rule = result.learning_rate(result.best)
    samples = result.best * result.grad_accum
    ratio = f"{samples:,}/{result.base_batch:,}"
    ratio = ratio if result.optimizer == "sgd" else f"sqrt({ratio})"
    console.print(f"learning rate for {samples:,} samples per step (the config's is {result.base_lr:g} for "
                  f"{result.base_batch:,}): {result.base_lr:g} x {ratio} = {lr:.3g}, the {rule}")
    check = result.check
    if check is None:  # check_samples=0: nothing measured its training, so nothing is recommended
        console.print("unchecked (no check ran): the fastest batch at the scaled rate would be "
                      f"{result.flags(result.best)}")
        return
    _print_check(result, console)
    if check.batch_size is None:  # (the check's reason said why)
        console.print("recommended: no change (keep the config's batch and learning rate)")
        return
    console.print(f"recommended: {(command + ' ') if command else ''}{result.recommended}")
    samples = check.batch_size * result.grad_accum
    if result.step_settings and samples != result.base_batch:  # (the check trained with them as they are)
        console.print(f"settings counted in steps ({', '.join(result.step_settings)}) are kept: each step sees "
                      f"{samples / result.base_batch:.3g}x the samples (dividing them by that is not checked)")


def _print_check(result: "BatchSizeResult", console: Console) -> None:
    """The check's runs (one line each) and its one-line reason."""
    from jaxtrain.tools.tune import CHECK_TOLERANCE, format_lr

    check = result.check
    assert check is not None
    base = check.baseline.loss
    console.print(f"check: {check.samples:,} training samples asked per run (each run's, in whole steps, below), "
                  f"same initial weights and data order; {check.metric} (a batch holds within "
                  f"{CHECK_TOLERANCE:g}x the config's)")
    if check.capped:
        console.print(f"check: {check.capped}")
    for t in check.trials:
        loss = f"{t.loss:.4g}" if t.loss != float("inf") else "not finite"
        ratio = f" ({t.loss / base:.2f}x)" if t is not check.baseline and base > 0 and t.loss != float("inf") else ""
        console.print(f"  batch {t.batch_size:>6,} lr {format_lr(t.lr):>7} {t.rate:<14} {t.samples:>9,} samples  "
                      f"{loss}{ratio}")
    console.print(f"why: {check.reason}")


def plot_batch_size(result: "BatchSizeResult", out: str | os.PathLike) -> Path:
    """Draws samples/s (left axis) and a step's compiled memory with the cap (right axis) against
    batch size (log2) to a PNG at `out`; returns its path.

    Raises:
      ConfigError: the PNG cannot be written there.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    mib = 2**20
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    rates = {r.batch_size: r.samples_per_s for r in result.rows if r.samples_per_s is not None}  # the trained
    ax.plot(list(rates), list(rates.values()), "o-", color="#4c72b0", label="samples/s")
    best = result.row(result.best)
    ax.plot([best.batch_size], [rates[best.batch_size]], "*", ms=15, color="#c44e52",
            label=f"best: {best.batch_size:,}")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlabel("batch size")
    ax.set_ylabel("training samples/s", color="#4c72b0")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    memory = ax.twinx()
    memory.plot([r.batch_size for r in result.rows], [r.memory["peak_bytes"] / mib for r in result.rows], "s--",
                color="#dd8452", label="step memory (compiled)")
    memory.axhline(result.cap_bytes / mib, color="#dd8452", lw=1, ls=":",
                   label=f"cap {format_bytes(result.cap_bytes)}")
    memory.axvline(result.largest, color="#55a868", lw=1, ls="-.", label=f"largest that fits: {result.largest:,}")
    memory.set_ylabel("step memory (MiB)", color="#dd8452")
    memory.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0] + memory.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="upper left")  # labelled with their labels
    ax.set_title(f"{result.name} on {result.device}: throughput and memory against batch size", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, Path(out), make_parent=True)  # the default is under runs/, which may not exist yet


def print_lr_range(result: "LRRange", console: Console, name: str, optimizer: str, command: str = "") -> None:
    """The range test's curve at ten points and its suggestion; `command` (default `jaxtrain train
    NAME`) is the train command of the settings the test ran with, to which the suggestion adds
    `--optim.lr`."""
    from jaxtrain.tools.tune import format_lr

    end = result.end
    table = Table(title=f"{name}: learning-rate range test, {optimizer}, {len(result.lrs)} steps")
    for col in ("step", "learning rate", "loss (smoothed)"):
        table.add_column(col, justify="right")
    for i in sorted({round(j * (end - 1) / 9) for j in range(10)}):
        table.add_row(f"{i:,}", format_lr(result.lrs[i]), f"{result.smoothed[i]:.4f}")
    console.print(table)
    if end < len(result.lrs):
        console.print(f"the loss diverged at step {end:,} (learning rate {format_lr(result.lrs[end])}); "
                      "later steps are not read")
    console.print(f"the loss is lowest at learning rate {format_lr(result.min_loss_lr)} (too high to train at: it "
                  f"rises after); the suggestion is a tenth of it, {format_lr(result.suggestion)} (steepest descent "
                  f"at {format_lr(result.steepest)})")
    check = result.check
    if check is None:  # check_samples=0: not compared with the config's rate, so not recommended
        console.print(f"unchecked (no check ran): the suggestion is --optim.lr {format_lr(result.suggestion)}")
        return
    console.print(f"check: {check.reason}")
    if check.capped:
        console.print(f"check: {check.capped}")
    if check.lr != check.trials[1].lr:  # the suggestion trained worse than the config's rate
        console.print(f"recommended: no change (keep the config's learning rate, {format_lr(check.lr)})")
        return
    console.print(f"train with: {command or f'jaxtrain train {name}'} --optim.lr {format_lr(result.suggestion)}")


def plot_lr_range(result: "LRRange", name: str, out: str | os.PathLike) -> Path:
    """Draws the loss (raw and smoothed) against the learning rate (log) with the suggestion to a
    PNG at `out`; returns its path.

    Raises:
      ConfigError: the PNG cannot be written there.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    end = result.end
    ax.plot(result.lrs[:end], result.losses[:end], color="#4c72b0", alpha=0.3, lw=1, label="loss")
    ax.plot(result.lrs[:end], result.smoothed, color="#4c72b0", lw=2, label="smoothed")
    at = result.lrs.index(result.min_loss_lr)
    ax.plot([result.min_loss_lr], [result.smoothed[at]], "o", ms=8, color="#8172b2",
            label=f"lowest loss: {result.min_loss_lr:.2g}")
    ax.axvline(result.suggestion, color="#c44e52", lw=1.5, ls="--", label=f"suggestion (a tenth): "
               f"{result.suggestion:.2g}")
    ax.set_xscale("log")
    low, high = min(result.smoothed), max(result.smoothed)
    ax.set_ylim(low - 0.1 * (high - low), high + 0.25 * (high - low))  # the smoothed curve; raw spikes are cut
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{name}: learning-rate range test", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, Path(out), make_parent=True)
