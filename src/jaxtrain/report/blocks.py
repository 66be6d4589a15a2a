"""The text blocks printed after each epoch and at the end of training."""

from __future__ import annotations

from typing import Any

RULE = "=" * 80
INPUT_BOUND_FRACTION = 0.10  # an epoch whose step waited longer than this share of its time is input-bound


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6f}"


def _label(metric: str) -> str:
    """`mae` -> `MAE`, `top_5_accuracy` -> `Top 5 Accuracy`."""
    return metric.upper() if len(metric) <= 3 else metric.replace("_", " ").title()


def epoch_block(epoch: int, epochs: int, record: dict[str, Any], elapsed_s: float) -> str:
    """The per-epoch summary: losses, metrics, epoch time and elapsed time."""
    lines = [RULE, f"Epoch {epoch}/{epochs} Summary", RULE, f"  Train Loss:     {_fmt(record['train_loss'])}"]
    if "val_loss" in record:
        lines.append(f"  Val Loss:       {_fmt(record['val_loss'])}")
    for name, value in record.items():
        if name.startswith("val_") and name != "val_loss":
            lines.append(f"  {'Val ' + _label(name[4:]) + ':':<15} {_fmt(value)}")
    epoch_s = record["epoch_time_s"]
    lines += [
        f"  Epoch Time:     {epoch_s / 60:.2f} min ({epoch_s:.1f}s)",
        f"  Elapsed Time:   {elapsed_s / 60:.2f} min",
    ]
    if "input_wait_fraction" in record:
        lines.append(f"  Input Wait:     {record['input_wait_fraction']:.1%} of training time (streamed data)")
        if record["input_wait_fraction"] > INPUT_BOUND_FRACTION:
            lines.append(
                "  Input-bound: the compiled step waited for data. Hold the data on the device if it fits "
                "(--data.placement device or a larger --data.memory-budget-gb), store the HDF5 file uncompressed "
                "or with lzf and chunks of >= 1 MiB, use a larger batch, or move the file to faster storage."
            )
    if record.get("skipped_steps"):
        lines.append(f"  Skipped Steps:  {record['skipped_steps']} (non-finite loss or gradient; --on-nan skip)")
    if record.get("samples_dropped"):
        lines.append(
            f"  Samples Used:   {record['samples']:,} of {record['samples'] + record['samples_dropped']:,} "
            f"(last partial batch of {record['samples_dropped']} dropped)"
        )
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
        f"  Compile Time:         {summary['compile_time_s']:.2f}s (not in epoch times)",
        *([f"  Skipped Steps:        {summary['skipped_steps']} (non-finite)"] if summary.get("skipped_steps") else []),
        f"  Throughput:           {summary['samples_per_s']:,.0f} samples/s, {summary['steps_per_s']:,.1f} steps/s",
        f"  Device:               {summary['device']}",
        RULE,
    ]
    return "\n".join(lines)
