"""A rich progress bar per epoch: steps, steps/s, samples/s, ETA and the last logged loss."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
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
    """One bar per epoch; `advance` after each compiled call. A no-op when `enabled` is False."""

    def __init__(self, console: Console, batch_size: int, enabled: bool = True):
        self.enabled = enabled
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
        self._task = None

    def start_epoch(self, epoch: int, epochs: int, steps: int, completed: int = 0) -> None:
        if not self.enabled:
            return
        self._progress.start()
        self._task = self._progress.add_task(f"Epoch {epoch}/{epochs}", total=steps, completed=completed, loss="")

    def advance(self, steps: int, loss: float | None = None) -> None:
        if self._task is None:
            return
        fields = {} if loss is None else {"loss": f"loss {loss:.4f}"}
        self._progress.update(self._task, advance=steps, **fields)

    def end_epoch(self) -> None:
        if self._task is None:
            return
        self._progress.stop()
        self._progress.remove_task(self._task)
        self._task = None
