"""The text blocks printed after each epoch and at the end of training."""

from __future__ import annotations

import os
import statistics
from typing import TYPE_CHECKING, Any

import jax

from jaxtrain._src import memory
from jaxtrain._src.errors import render, setting
from jaxtrain._src.report.memory_report import memory_lines
from jaxtrain._src.report.model_summary import summary_lines
from jaxtrain._src.report.profile_report import profile_lines

if TYPE_CHECKING:
    from jaxtrain._src.hooks.base import Run

RULE = "=" * 80
INPUT_BOUND_FRACTION = 0.10  # an epoch whose step waited longer than this share of its time is input-bound


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6f}"


def _label(metric: str) -> str:
    """`mae` -> `MAE`, `top_5_accuracy` -> `Top 5 Accuracy`, `ema_loss` -> `EMA Loss` (of the
    average of the weights)."""
    if metric.startswith("ema_"):
        return "EMA " + _label(metric[4:])
    return metric.upper() if len(metric) <= 3 else metric.replace("_", " ").title()


def device_description(device: jax.Device) -> str:
    """A short human-readable name of the device, e.g. `cpu (2 cores)` or `gpu: NVIDIA H100`."""
    if device.platform == "cpu":
        return f"cpu ({os.cpu_count()} cores)"
    return f"{device.platform}: {device.device_kind}"


def _batch(config: Any) -> str:
    """`12`, or `12 x 4 micro-batches = 48` with gradient accumulation."""
    if config.grad_accum == 1:
        return str(config.batch_size)
    return f"{config.batch_size} x {config.grad_accum} micro-batches = {config.samples_per_step}"


def header_block(run: "Run") -> str:
    """The lines printed before training: device, data and where they live, batching, run dir."""
    feed, config = run.feed, run.config
    lines = [
        f"[bold]jaxtrain[/bold] {run.name} on {device_description(run.device)}",
        f"  data: {feed.num_samples:,} train / {run.num_val:,} val samples; training data {feed.describe()}",
        f"  batch {_batch(config)}: {feed.steps_per_epoch:,} steps/epoch"
        + (f" ({feed.dropped} samples/epoch dropped: partial batch)" if feed.dropped else "")
        + (f" ({feed.steps_per_epoch * config.samples_per_step:,} samples per epoch drawn "
           f"{'with' if feed.placement.where == 'replay' else 'without'} replacement)"
           if config.steps_per_epoch else ""),
        f"  compiled call: {memory.describe(run.calls.memory)}; precision {config.precision}",
        *([f"  rewritten for XLA:CPU: {run.calls.rewrites} (TrainConfig.rewrite)"] if run.calls.rewrites else []),
    ]
    if run.model_summary is not None:
        flops = run.calls.flops_per_step(grad_accum=config.grad_accum)
        lines += ["  model:", *("  " + line for line in summary_lines(run.model_summary, depth=2, flops=flops))]
    if run.layout.num_devices > 1:
        lines.append(f"  mesh: {run.layout.describe()}; batch split over every device")
        lines.append(f"  {run.layout.rule(run.state)}")
    if run.run_dir is not None:
        lines.append(f"  run dir: {run.run_dir}")
    if run.resumed_step is not None:
        loop = run.loop
        lines.append(f"  resumed from the checkpoint at step {run.resumed_step:,} (epoch {loop.epoch}, "
                     f"step {loop.position:,} of it)")
        saved = loop.feed.get("placement", "device")
        if saved != feed.placement.where:
            lines.append(f"  note: the interrupted run's data were placed as {saved}, now {feed.placement.where}: "
                         "the data order from here on differs from an uninterrupted run's")
    return "\n".join(lines)


def _form_line(form: dict[str, Any] | None) -> list[str]:
    """The final block's line on the calls' form and why."""
    if not form:
        return []
    return [f"  Step Form:            {form['form']} ({form['why']})"]


def _rewrite_line(summary: dict[str, Any]) -> list[str]:
    """The final block's line on the XLA:CPU rewrite: what was rewritten, or why it was not."""
    if summary.get("rewrites"):
        return [f"  Rewritten for XLA:CPU: {summary['rewrites']}"]
    if summary.get("rewrite_declined"):
        return [f"  Not Rewritten:        {summary['rewrite_declined']}"]
    return []


def build_summary(run: "Run", status: str) -> dict[str, Any]:
    """The contents of summary.json, a stable contract for scripts (hooks add to it in `on_end`)."""
    history, loop = run.loop.history, run.loop
    last = history[-1] if history else {}
    val_losses = [(r["val_loss"], r["epoch"]) for r in history if "val_loss" in r]
    best = min(val_losses) if val_losses else (None, None)
    samples = sum(r["samples"] for r in history)
    train_s = loop.train_time_s
    summary = {
        "recipe": run.name,
        "status": status,
        "epochs": len(history),
        "steps": run.step,
        "steps_per_call": run.calls.k,
        "step_form": run.calls.form.summary(),
        "rewrites": run.calls.rewrites,
        "rewrite_declined": run.rewrite_declined,
        "final_train_loss": last.get("train_loss"),
        "final_val_loss": val_losses[-1][0] if val_losses else None,
        "best_val_loss": best[0],
        "best_epoch": best[1],
        "total_time_s": run.elapsed_s,
        "compile_time_s": run.calls.compile_s,
        "train_time_s": train_s,
        "mean_epoch_time_s": statistics.mean(r["epoch_time_s"] for r in history) if history else 0.0,
        "samples_per_s": samples / train_s if train_s else 0.0,
        "steps_per_s": run.step / train_s if train_s else 0.0,
        "samples_per_epoch": last.get("samples"),
        "samples_dropped_per_epoch": last.get("samples_dropped"),
        "device": device_description(run.device),
        "mesh": run.layout.describe(),
        "precision": run.config.precision,
        "grad_accum": run.config.grad_accum,
        "compiled_memory": run.calls.memory,
        "model": None if run.model_summary is None else {
            **run.model_summary, "flops_per_step": run.calls.flops_per_step(grad_accum=run.config.grad_accum)},
        "jax_version": jax.__version__,
    }
    if run.stop_reason:
        summary["stop_reason"] = run.stop_reason
    for key, value in last.items():
        if key.startswith("val_") and key != "val_loss":
            summary[f"final_{key}"] = value
    return summary


def epoch_block(epoch: int, epochs: int, record: dict[str, Any], elapsed_s: float, placement: str = "stream") -> str:
    """The per-epoch summary: losses, metrics, epoch time and elapsed time."""
    lines = [RULE, f"Epoch {epoch}/{epochs} Summary", RULE, f"  Train Loss:     {_fmt(record['train_loss'])}"]
    if "val_loss" in record:
        lines.append(f"  Val Loss:       {_fmt(record['val_loss'])}")
    for name, value in record.items():
        if name.startswith("val_") and name != "val_loss":
            lines.append(f"  {'Val ' + _label(name[4:]) + ':':<15} {_fmt(value)}")
    if "games" in record:  # self-play (jaxtrain.rl.hooks.SelfPlay)
        lines.append(f"  Self-Play:      {record['games']} games, {record['positions']:,} positions in "
                     f"{record['selfplay_time_s']:.2f}s ({record['ms_per_game']:.2f} ms/game); mean length "
                     f"{record['game_length']:.1f}, first player won {record['first_player_wins']:.0%}, "
                     f"draws {record['draws']:.0%}")
    epoch_s = record["epoch_time_s"]
    lines += [
        f"  Epoch Time:     {epoch_s / 60:.2f} min ({epoch_s:.1f}s)",
        f"  Elapsed Time:   {elapsed_s / 60:.2f} min",
    ]
    if "input_wait_fraction" in record:
        lines.append(f"  Input Wait:     {record['input_wait_fraction']:.1%} of training time (streamed data)")
        if record["input_wait_fraction"] > INPUT_BOUND_FRACTION and placement == "loader":
            lines.append("  Input-bound: the compiled step waited for the loader's batches. Give it more worker "
                         "processes (DataLoader num_workers, Grain worker_count), or pass its map-style dataset so "
                         "jaxtrain reads it on threads, or holds it on the device when it fits.")
        elif record["input_wait_fraction"] > INPUT_BOUND_FRACTION:
            lines.append(
                render(f"  Input-bound: the compiled step waited for data. Hold the data on the device if it fits "
                       f"({setting('data.placement', 'device')} or a larger {setting('data.memory_budget_gb')}), "
                       "store the HDF5 file uncompressed or with lzf and chunks of >= 1 MiB, move the file to "
                       "faster storage, or a larger batch (`jaxtrain tune batch-size` checks that it trains as well).")
            )
    if record.get("skipped_steps"):
        lines.append(render(f"  Skipped Steps:  {record['skipped_steps']} (non-finite loss or gradient; "
                            f"{setting('on_nan', 'skip')})"))
    if record.get("samples_dropped"):
        lines.append(
            f"  Samples Used:   {record['samples']:,} of {record['samples'] + record['samples_dropped']:,} "
            f"(last partial batch of {record['samples_dropped']} dropped)"
        )
    return "\n".join(lines)


def result_block(summary: dict[str, Any], run_dir: Any = None) -> str:
    """The final result alone (`verbosity="result"`): how the run ended, its best and
    final metrics (named as in summary.json) and its directory, in a few lines."""
    epochs, steps = summary["epochs"], summary["steps"]
    ended = summary["status"] + (f" ({summary['stop_reason']})" if summary.get("stop_reason") else "")
    lines = [f"{summary['recipe']} {ended}: {epochs} epoch{'s' if epochs != 1 else ''}, {steps:,} steps in "
             f"{summary['total_time_s']:.1f}s"]
    if summary["best_val_loss"] is not None:
        lines.append(f"  best val_loss {_fmt(summary['best_val_loss'])} (epoch {summary['best_epoch']})")
    if summary.get("restored_epoch"):
        lines.append(f"  the model holds the weights of epoch {summary['restored_epoch']} (restore_best)")
    final = {"train_loss": summary["final_train_loss"], "val_loss": summary["final_val_loss"],
             **{name[len("final_"):]: value for name, value in summary.items()
                if name.startswith("final_val_") and name != "final_val_loss"}}
    lines.append("  final " + ", ".join(f"{name} {_fmt(value)}" for name, value in final.items() if value is not None))
    if run_dir is not None:
        lines.append(f"  run dir: {run_dir}")
    return "\n".join(lines)


def final_block(summary: dict[str, Any]) -> str:
    """The `TRAINING COMPLETE!` block: final results, then timing statistics."""
    total = summary["total_time_s"]
    lines = [
        RULE,
        "TRAINING COMPLETE!",
        RULE,
        "FINAL RESULTS:",
        f"  Best Val Loss:        {_fmt(summary['best_val_loss'])}"
        + (f" (epoch {summary['best_epoch']})" if summary.get("best_epoch") else ""),
        f"  Final Train Loss:     {_fmt(summary['final_train_loss'])}",
        f"  Final Val Loss:       {_fmt(summary['final_val_loss'])}",
    ]
    if summary.get("restored_epoch"):
        lines.append(f"  Restored Weights:     epoch {summary['restored_epoch']} (the model holds them: restore_best)")
    for name, value in summary.items():
        if name.startswith("final_val_") and name != "final_val_loss":
            label = "Final Val " + _label(name[len("final_val_") :]) + ":"
            lines.append(f"  {label:<21} {_fmt(value)}")
    lines += [
        "",
        "TIMING STATISTICS:",
        f"  Total Training Time:  {total / 60:.2f} min ({total / 3600:.4f} h)",
        f"  Average Epoch Time:   {summary['mean_epoch_time_s']:.2f}s",
        f"  Total Epochs:         {summary['epochs']}",
        f"  Total Steps:          {summary['steps']} ({summary['steps_per_call']} per compiled call)",
        *_form_line(summary.get("step_form")),
        *_rewrite_line(summary),
        f"  Compile Time:         {summary['compile_time_s']:.2f}s (not in epoch times)",
        *([f"  Skipped Steps:        {summary['skipped_steps']} (non-finite)"] if summary.get("skipped_steps") else []),
        f"  Throughput:           {summary['samples_per_s']:,.0f} samples/s, {summary['steps_per_s']:,.1f} steps/s",
        f"  Device:               {summary['device']}",
        *(["", *profile_lines(summary["profile"])] if summary.get("profile") else []),
        *(["", *memory_lines(summary["memory"])] if summary.get("memory") else []),
        RULE,
    ]
    return "\n".join(lines)
