"""Progress within an epoch: on a terminal (or in Jupyter) a rich bar with steps, steps/s,
samples/s, ETA and the last logged loss; elsewhere (a piped log, a scheduler's output file) one
plain line per log interval, which a file keeps readable (as Keras's `verbose=2`)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class _RateColumn(ProgressColumn):
    """Steps/s and samples/s from rich's own speed estimate."""

    def __init__(self, batch_size: int):
        super().__init__()
        self.batch_size = batch_size

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if not speed:
            return Text("-- steps/s", style="progress.data.speed")
        return Text(f"{speed:,.0f} steps/s {speed * self.batch_size:,.0f} samples/s", style="progress.data.speed")


class EpochProgress:
    """One bar per epoch; `advance` after each compiled call. A no-op when `enabled` is False.
    When `console` is not a terminal, `advance` with a loss prints a line instead of a bar."""

    def __init__(self, console: Console, batch_size: int, enabled: bool = True):
        self.enabled, self.console, self.batch_size = enabled, console, batch_size
        self.lines = enabled and not (console.is_terminal or console.is_jupyter)
        self._line: list = []  # epoch, epochs, steps, done, started, done at start
        enabled = enabled and not self.lines
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            _RateColumn(batch_size),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[loss]}"),
            console=console,
            disable=not enabled,
        )
        self._task: TaskID | None = None

    def start_epoch(self, epoch: int, epochs: int, steps: int, completed: int = 0) -> None:
        self._line = [epoch, epochs, steps, completed, time.perf_counter(), completed]
        if not self.enabled or self.lines:
            return
        self._progress.start()
        self._task = self._progress.add_task(f"Epoch {epoch}/{epochs}", total=steps, completed=completed, loss="")

    def advance(self, steps: int, loss: float | None = None, at: int | None = None) -> None:
        """`steps` more steps done; `loss` logged at step `at` of the epoch (default: the steps done)."""
        if self.lines and self._line:
            self._advance_line(steps, loss, at)
        if self._task is None:
            return
        fields: dict[str, Any] = {} if loss is None else {"loss": f"loss {loss:.4f}"}
        self._progress.update(self._task, advance=steps, **fields)

    def _advance_line(self, steps: int, loss: float | None, at: int | None) -> None:
        epoch, epochs, total, done, started, first = self._line
        self._line[3] = done = done + steps
        if loss is None:
            return
        at = done if at is None else at  # the logged step (the queued steps run ahead of it)
        elapsed = time.perf_counter() - started
        rate = (at - first) / elapsed if elapsed > 0 and at > first else 0.0
        eta = f"{(total - at) / rate:.0f} s" if rate else "--"
        self.console.print(f"  epoch {epoch}/{epochs} step {at:,}/{total:,} loss {loss:.4f} "
                           f"{rate * self.batch_size:,.0f} samples/s ETA {eta}", soft_wrap=True)

    def end_epoch(self) -> None:
        if self._task is None:
            return
        self._progress.stop()
        self._progress.remove_task(self._task)
        self._task = None
