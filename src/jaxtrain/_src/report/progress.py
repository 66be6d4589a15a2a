"""Progress within an epoch: on a terminal (or in Jupyter) a rich bar with steps, steps/s,
samples/s, ETA and the last logged loss; elsewhere (a piped log, a scheduler's output file) one
plain line per log interval, which a file keeps readable (as Keras's `verbose=2`).

The rate counts only steps known to have finished: JAX dispatch is asynchronous, so a call of K
steps returns before it computes, and counting steps when they are queued (as rich's own speed
estimate does) read 168,598 steps/s for an 852 steps/s run. The loop keeps one call queued, so
every call but the last one queued has finished when the next is handed on; the rate is those
steps over the epoch's seconds so far, less compilation (as the epoch's `train_time_s`), from the
first reading on, and is the same for every line printed at one moment (the rows of one fetch)."""

from __future__ import annotations

import time
from typing import Callable

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
)
from rich.text import Text


class EpochRate:
    """Steps per second and the seconds left in an epoch, from the steps known to have finished
    (`settle`) and the seconds since the epoch began less those spent compiling. `clock` is
    injectable (tests); `time.perf_counter` by default."""

    def __init__(self, clock: Callable[[], float] | None = None):
        self.clock = clock or time.perf_counter
        self.start(0, 0)

    def start(self, done: int, total: int, compile_s: float = 0.0) -> None:
        """The epoch begins with `done` of its `total` steps finished (a resumed epoch's)."""
        self.total, self.first, self.done = total, done, done
        self._t0, self._compile0, self._seconds = self.clock(), compile_s, 0.0

    def settle(self, done: int, compile_s: float = 0.0) -> None:
        """`done` steps of the epoch have finished by now; `compile_s` the run's compile seconds so far."""
        if done > self.done:
            self.done = done
            self._seconds = self.clock() - self._t0 - (compile_s - self._compile0)

    @property
    def steps_per_s(self) -> float:
        """0 until a step has finished."""
        return (self.done - self.first) / self._seconds if self._seconds > 0 and self.done > self.first else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current rate; None before the first reading."""
        rate = self.steps_per_s
        return (self.total - self.done) / rate if rate else None


def _eta(seconds: float | None) -> str:
    return "--" if seconds is None else f"{seconds:.0f} s"


class _RateColumn(ProgressColumn):
    """Steps/s, samples/s and the ETA from the epoch's `EpochRate` (the task's `rate` field)."""

    def __init__(self, batch_size: int):
        super().__init__()
        self.batch_size = batch_size

    def render(self, task: Task) -> Text:
        rate: EpochRate = task.fields["rate"]
        speed = rate.steps_per_s
        if not speed:
            return Text("-- steps/s ETA --", style="progress.data.speed")
        return Text(f"{speed:,.0f} steps/s {speed * self.batch_size:,.0f} samples/s ETA {_eta(rate.eta_s)}",
                    style="progress.data.speed")


class EpochProgress:
    """One bar per epoch, moved by `update` with the steps known to have finished; `log` with each
    logged loss. A no-op when `enabled` is False. When `console` is not a terminal, `log` prints a
    line instead of a bar."""

    def __init__(self, console: Console, batch_size: int, enabled: bool = True,
                 clock: Callable[[], float] | None = None):
        self.enabled, self.console, self.batch_size = enabled, console, batch_size
        self.lines = enabled and not (console.is_terminal or console.is_jupyter)
        self.rate = EpochRate(clock)
        self._epoch: tuple[int, int] | None = None  # (epoch, epochs) while one is shown
        enabled = enabled and not self.lines
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            _RateColumn(batch_size),
            TimeElapsedColumn(),
            TextColumn("{task.fields[loss]}"),
            console=console,
            disable=not enabled,
        )
        self._task: TaskID | None = None

    def start_epoch(self, epoch: int, epochs: int, steps: int, completed: int = 0, compile_s: float = 0.0) -> None:
        """Epoch `epoch` of `epochs` begins, `completed` of its `steps` done; `compile_s` the run's compile seconds."""
        self._epoch = (epoch, epochs)
        self.rate.start(completed, steps, compile_s)
        if not self.enabled or self.lines:
            return
        self._progress.start()
        self._task = self._progress.add_task(f"Epoch {epoch}/{epochs}", total=steps, completed=completed, loss="",
                                             rate=self.rate)

    def update(self, done: int, compile_s: float = 0.0) -> None:
        """`done` steps of the epoch have finished (not merely been queued)."""
        self.rate.settle(done, compile_s)
        if self._task is not None:
            self._progress.update(self._task, completed=self.rate.done)

    def restart(self, done: int, compile_s: float = 0.0) -> None:
        """`done` steps have finished, at a pace the rest will not keep (the run's timed first calls):
        the rate counts from now."""
        self.rate.start(done, self.rate.total, compile_s)
        if self._task is not None:
            self._progress.update(self._task, completed=done)

    def log(self, loss: float, at: int) -> None:
        """The loss logged at step `at` of the epoch: the bar's last loss, or a line."""
        if self._task is not None:
            self._progress.update(self._task, loss=f"loss {loss:.4f}")
        if not (self.lines and self._epoch):
            return
        (epoch, epochs), rate = self._epoch, self.rate
        speed = f"{rate.steps_per_s * self.batch_size:,.0f}" if rate.steps_per_s else "--"  # no reading yet
        self.console.print(f"  epoch {epoch}/{epochs} step {at:,}/{rate.total:,} loss {loss:.4f} "
                           f"{speed} samples/s ETA {_eta(rate.eta_s)}", soft_wrap=True)

    def end_epoch(self) -> None:
        self._epoch = None
        if self._task is None:
            return
        self._progress.stop()
        self._progress.remove_task(self._task)
        self._task = None
