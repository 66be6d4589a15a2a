"""What a person watches: the run header, a progress bar per epoch, the epoch blocks, the loss
curves' path and the final block."""

from __future__ import annotations

from typing import Any

import jax
from rich.console import Console

from jaxtrain._src.hooks.base import Run, RunHook
from jaxtrain._src.report import EpochProgress, epoch_block, final_block, header_block, result_block
from jaxtrain._src.report.plots import plot_run

FINISHED = ("completed", "stopped early")


def _finished(metrics: Any) -> bool:
    """Whether a call's outputs are computed, without waiting (False where that cannot be told)."""
    leaves = jax.tree.leaves(metrics)
    try:
        return bool(leaves) and all(leaf.is_ready() for leaf in leaves)
    except AttributeError:  # a population member's shared transfer, say
        return False


class ProgressHook(RunHook):
    """Prints the header and blocks; with `bar`, a rich progress bar (steps/s, samples/s, ETA,
    the last logged loss). With `result_only` (verbosity "result"), only the final result: a script's log
    or a sweep's terminal gets the few lines it needs, not the header, epochs and profile."""

    def __init__(self, console: Console, bar: bool = True, result_only: bool = False):
        self.console, self._bar_enabled, self.result_only = console, bar and not result_only, result_only
        self._bar: EpochProgress | None = None
        self._calibrating = False  # the call being made is one of the run's first, timed ones (`calls.calibrate`)
        self._rows: list[tuple[float, int]] = []  # (loss, step of the epoch) of rows not yet shown

    def message(self, text: str) -> None:
        if not self.result_only:
            self.console.print(f"  {text}")

    def on_start(self, run: Run) -> None:
        self._bar = EpochProgress(self.console, run.config.samples_per_step, enabled=self._bar_enabled)
        if not self.result_only:
            self.console.print(header_block(run))

    def _started(self) -> EpochProgress:
        assert self._bar is not None  # made in on_start
        return self._bar

    def on_epoch_start(self, run: Run) -> None:
        self._started().start_epoch(run.epoch, run.last_epoch, run.feed.steps_per_epoch,
                                    completed=run.loop.position, compile_s=run.calls.compile_s)
        self._calibrating = run.calls.calibrating

    def after_call(self, run: Run, k: int, metrics: dict[str, jax.Array]) -> None:
        bar = self._started()
        if self._calibrating and run.loop.position < run.feed.steps_per_epoch:
            # one of the run's first calls, timed one by one beside the forms' timings (`calls.calibrate`):
            # its steps have finished; the rate starts after it, at the pace the run keeps
            bar.restart(run.loop.position, run.calls.compile_s)
        else:  # XLA:CPU often computes a call before its dispatch returns: then its steps count now
            bar.update(run.loop.position - (0 if _finished(metrics) else run.queued), run.calls.compile_s)
        self._calibrating = run.calls.calibrating
        self._print_rows(run)

    def on_log(self, run: Run, row: dict[str, Any]) -> None:
        """A row fetched during a call's events is shown with that call's reading (`after_call`, the
        progress hook hears it last); one fetched at the epoch's end, at once: every step has finished."""
        self._rows.append((row["loss"], row["step"] - (run.epoch - 1) * run.feed.steps_per_epoch))
        if not run.queued:
            self._print_rows(run)

    def _print_rows(self, run: Run) -> None:
        bar = self._started()
        if not run.queued and not self._calibrating:
            bar.update(run.loop.position, run.calls.compile_s)
        for loss, at in self._rows:
            bar.log(loss, at)
        self._rows.clear()

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        self._print_rows(run)
        self._started().end_epoch()
        if self.result_only:
            return
        self.console.print(epoch_block(run.epoch, run.last_epoch, record, run.elapsed_s, run.feed.placement.where))
        if run.stop_reason:
            self.message(run.stop_reason)

    def on_end(self, run: Run, summary: dict[str, Any]) -> None:
        if self._bar is not None:
            self._print_rows(run)
            self._bar.end_epoch()
        if summary["status"] in FINISHED:
            if self.result_only:  # a path or a metric's name is not markup
                self.console.print(result_block(summary, run.run_dir), markup=False, highlight=False)
            else:
                self.console.print(final_block(summary))


class PlotHook(RunHook):
    """Draws the run's loss curves to `<run dir>/curves.png` when training finished.

    Matplotlib is imported then, not in a background thread while the run trains: on a 2-core
    machine that import (0.25 s of a core) slowed the first epoch's calls by a quarter, so the first
    progress readings understated the run's throughput, and the run as a whole was no faster."""

    def on_end(self, run: Run, summary: dict[str, Any]) -> None:
        if run.run_dir is not None and summary["status"] in FINISHED:
            run.console.print(f"  loss curves: {plot_run(run.run_dir)}")
