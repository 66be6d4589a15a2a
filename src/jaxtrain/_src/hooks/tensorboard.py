"""TensorBoard scalars of a run (point TensorBoard at the `runs` directory): training loss and metrics every
`log_every` steps with the learning rate; per epoch the train and validation figures, throughput
and, for streamed data, the input wait. Written with tensorboardX's `SummaryWriter`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from jaxtrain._src.errors import ConfigError, argument, setting
from jaxtrain._src.hooks.base import Run
from jaxtrain._src.hooks.trackers import SideChannel, side_channel

_NOT_SCALARS = ("kind", "epoch", "step", "elapsed_s")


class TensorBoard(SideChannel):
    """Writes event files to `log_dir` (default `<run dir>/tensorboard`).

    A resumed run purges the events its interrupted predecessor wrote after the checkpoint, so
    every step appears once. Like the trackers it is a side channel: a failed write (a full disk)
    turns it off with one note, and the run goes on.
    """

    label = "TensorBoard"

    def __init__(self, log_dir: str | os.PathLike | None = None):
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._writer: Any = None  # a tensorboardX SummaryWriter (untyped) once on_start made it

    def advice(self) -> str:
        return (f"that {self.log_dir} can be written (free space), choose another {argument('run_dir')}, or turn "
                f"{setting('tensorboard', False)}")

    @side_channel
    def on_start(self, run: Run) -> None:
        SummaryWriter = _summary_writer_class()
        if self.log_dir is None:
            if run.run_dir is None:
                raise ConfigError("the TensorBoard hook needs a run directory or TensorBoard(log_dir=...)")
            self.log_dir = run.run_dir / "tensorboard"
        purge = run.resumed_step + 1 if run.resumed_step is not None else None
        self._writer = SummaryWriter(str(self.log_dir), purge_step=purge, flush_secs=30)

    @side_channel
    def on_log(self, run: Run, row: dict[str, Any]) -> None:
        for name, value in row.items():
            if name not in _NOT_SCALARS and value is not None:
                self._writer.add_scalar(f"train/{name}", value, row["step"])

    @side_channel
    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        step, add = record["step"], self._writer.add_scalar
        for name, value in record.items():
            if name.startswith("train_") and not name.endswith("_s"):
                add(f"epoch/{name}", value, step)
            elif name.startswith("val_"):
                add(f"val/{name[4:]}", value, step)
        if record.get("train_time_s"):
            add("throughput/samples_per_s", record["samples"] / record["train_time_s"], step)
        if "input_wait_fraction" in record:
            add("throughput/input_wait_fraction", record["input_wait_fraction"], step)
        self._writer.flush()

    @side_channel
    def on_end(self, run: Run, summary: dict[str, Any]) -> None:
        if self._writer is not None:
            self._writer.close()


def _summary_writer_class() -> type:
    """tensorboardX's `SummaryWriter`, imported without PyTorch where PyTorch is not loaded yet.

    tensorboardX's writer module imports torch, when installed, only for a type hint; that import
    took 1.4 s of a 2-core machine's 1.43 s for tensorboardX (docs/benchmarks.md, whole-process
    overhead). Marking torch absent while tensorboardX loads leaves its writer on NumPy types,
    which is all scalars need; torch itself stays importable afterwards."""
    if "torch" in sys.modules or "tensorboardX.writer" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError meanwhile
    try:
        from tensorboardX import SummaryWriter
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return SummaryWriter
