"""Orbax checkpoints of the train state and the loop state: at every epoch end, every
`every_steps` steps and every `every` seconds of wall time (at the next call boundary) and when
SIGINT/SIGTERM arrives; the newest
`keep_last` and the `keep_best` best by `best_metric` are kept.

Each checkpoint also holds the run's settings (`config`, as config.json has them: the reference a
resume is checked against, config.json or not) and the training data's fingerprint (`data`): a
resume on other data is refused unless `data.accept_changed` is set, which is then noted on stderr
and in metrics.jsonl."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Callable

import jax

from jaxtrain._src.checkpoint import (
    Checkpointer,
    CheckpointError,
    checksum_program,
    flatten_feed,
    flatten_state,
    is_on_host,
)
from jaxtrain._src.compiling import shapes_of
from jaxtrain._src.config import CheckpointConfig
from jaxtrain._src.data.fingerprint import data_change, describe, unchecked
from jaxtrain._src.deadline import parse_duration
from jaxtrain._src.errors import ConfigError, DataError, JaxtrainError, argument, render, resume_advice, setting
from jaxtrain._src.hooks.base import Run, RunHook, missing_metric
from jaxtrain._src.loop_state import LoopState
from jaxtrain._src.moments import announce
from jaxtrain._src.optim import fresh_skip_counters, restore_values, toggle_skip, without_values
from jaxtrain._src.report.notes import note
from jaxtrain._src.state import TrainState


class CheckpointHook(RunHook):
    """Saves checkpoints into `directory` (`<run dir>/checkpoints`); `restore` resumes from one."""

    clock: Callable[[], float] = staticmethod(time.monotonic)
    """The clock of time-based saves (`CheckpointConfig.every`); the tests replace it."""

    def __init__(self, directory: str | os.PathLike, config: CheckpointConfig, name: str = "fit",
                 run_config: dict[str, Any] | None = None, writer: Executor | None = None):
        self.config, self._name, self._run_config = config, name, run_config
        self.ckpt = Checkpointer(directory, config.keep_last, config.keep_best, config.best_metric, config.best_mode,
                                 writer=writer)
        self._beside = writer is not None  # a population's member: its saves are written beside the loop
        self._last_save = 0
        self._every_s = parse_duration(config.every, "checkpoint.every")
        self._saved_at = 0.0  # `clock()` at the last save (or the start)
        self._accepted: str | None = None  # the note of a resume on changed data, for metrics.jsonl

    def restore(self, template: TrainState, shardings: Any = None, epochs: int | None = None, feed: Any = None,
                accept_changed: bool = False, step: int | None = None) -> tuple[TrainState, LoopState]:
        """The newest complete checkpoint's train state (checked against `template`, placed with
        `shardings`, whatever mesh wrote it) and loop state, or checkpoint `step`'s; `feed` (a
        `feeds.Feed`) is set to its saved position and arrays.

        Raises:
          ConfigError: `epochs` is fewer than the checkpoint has trained (or is in the middle of).
          DataError: the training data differ from the checkpoint's and `accept_changed` is False.
        """
        arrays = feed.arrays() if feed is not None else None
        saved, saved_shardings = _as_saved(template), None if shardings is None else _as_saved(shardings)
        try:
            state, arrays, meta = self.ckpt.restore_with_feed(saved, arrays, step, shardings=saved_shardings)
        except CheckpointError as e:
            state, arrays, meta = self._restore_other_on_nan(saved, arrays, saved_shardings, e, step)
        state = state._replace(opt_state=restore_values(template.opt_state, state.opt_state))
        self._check_data(meta, getattr(feed, "fingerprint", None), accept_changed)
        try:
            loop = LoopState.from_meta(meta)
        except JaxtrainError as e:
            raise CheckpointError(f"{self.ckpt.directory}: {e}") from None
        if feed is not None:
            feed.set_state(loop.feed, arrays)
        done = loop.epoch - 1  # whole epochs trained
        if epochs is not None and epochs < done + (loop.position > 0):
            where = f"{done} epochs" + (f" and {loop.position} steps of epoch {loop.epoch}" if loop.position else "")
            raise ConfigError(f"the checkpoint at step {int(state.step)} has trained {where}; "
                              f"{setting('epochs', epochs)} is fewer: pass "
                              f"{setting('epochs', done + (loop.position > 0))} or more",
                              run_dir=self.ckpt.directory.parent, epochs=epochs, epochs_trained=done)
        if epochs == done:
            note(f"the run has already trained its {done} epoch{'s' if done != 1 else ''}; nothing to train "
                 f"(pass {setting('epochs', done + 1)} or more to train further)")
        return state, loop

    def _restore_other_on_nan(self, template: TrainState, arrays: Any, shardings: Any, error: CheckpointError,
                              step: int | None = None) -> tuple[TrainState, Any, dict[str, Any]]:
        """A checkpoint written with the other `on_nan` (whose optimizer state has, or lacks,
        `optax.apply_if_finite`'s counters), restored into that structure and brought to this
        run's; `error` again where it is not that either."""
        other = template._replace(opt_state=toggle_skip(template.opt_state, fresh_skip_counters))
        other_shardings = None
        if shardings is not None:
            replicated = (shardings.step,) * 2 + (shardings.step,)
            other_shardings = shardings._replace(opt_state=toggle_skip(shardings.opt_state, lambda: replicated))
        try:
            state, arrays, meta = self.ckpt.restore_with_feed(other, arrays, step, shardings=other_shardings)
        except CheckpointError:
            raise error from None

        def counters() -> tuple:  # none skipped yet, placed as the step is
            fresh = fresh_skip_counters()
            return tuple(jax.device_put(c, shardings.step) for c in fresh) if shardings is not None else fresh

        return state._replace(opt_state=toggle_skip(state.opt_state, counters)), arrays, meta

    def _check_data(self, meta: dict[str, Any], now: dict[str, Any] | None, accept: bool) -> None:
        step, why = meta.get("step"), unchecked(now)
        if why is not None:
            note(f"{why}: the resume cannot check that the training data are those of checkpoint step {step}")
        change = data_change(meta.get("data"), now)
        if change is None or now is None:  # (a change needs both fingerprints)
            return
        where = describe(now)
        if not accept:
            raise DataError(f"the training data changed since checkpoint step {step} was saved ({where}: {change}); "
                            "a resume would continue on other data: restore the data, start a new run, or pass "
                            f"{setting('data.accept_changed', True)} to continue on these",
                            run_dir=self.ckpt.directory.parent, file=now.get("file"))
        self._accepted = (f"resumed on changed training data ({where}: {change}) from checkpoint step {step}, "
                          f"as {setting('data.accept_changed', True)} allows")
        note(self._accepted)

    def on_start(self, run: Run) -> None:
        # arrays off the host are checksummed by a program: compiled beside training (about a second
        # on a CPU), not at the first save; arrays on the host take a CRC-32 and need none, nor do a
        # population member's saves, whose arrays come to the host first (`copies_for_writer`)
        if not self._beside:
            flat = flatten_state(_as_saved(run.state)) | flatten_feed(run.feed.arrays())
            if not all(is_on_host(x) for x in flat.values()):
                self.ckpt.checksum_program = run.calls.compile(checksum_program(), shapes_of(flat), background=True,
                                                               what="checkpoint checksums")
        if self._accepted is not None and jax.process_index() == 0:  # kept by run files' cut to the resumed step
            path = self.ckpt.directory.parent / "metrics.jsonl"  # appended, never through a link
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write(json.dumps({"kind": "note", "step": run.step, "note": render(self._accepted)}) + "\n")
        self._last_save, self._saved_at = run.step, self.clock()
        run.last_checkpoint = self._describe_last
        run_dir = self.ckpt.directory.parent
        run.resume_hint = f"checkpoint saved; resume with: {resume_advice(run_dir, self._name)}"

    def _describe_last(self) -> str:
        latest = self.ckpt.latest_step()
        return f"the last good checkpoint is step {latest}" if latest is not None else "no checkpoint was saved"

    def after_call(self, run: Run, k: int, metrics: dict[str, jax.Array]) -> None:
        every, every_s = self.config.every_steps, self._every_s
        due = (run.stop_signal is not None or (every and run.step - self._last_save >= every)
               or (every_s and self.clock() - self._saved_at >= every_s))
        # epoch ends save in on_epoch_end, and so does a deadline's end, mid-epoch (`Run.end_step`)
        if due and run.loop.position < run.feed.steps_per_epoch and not run.at_end_step:
            run.flush()  # every metric up to this step is fetched and checked finite
            self._save(run, None, "step")

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        metric = self.config.best_metric
        self._save(run, {metric: record.get(metric)}, "epoch")
        known = missing_metric(metric, record) if self.config.keep_best else None
        if known is not None:
            overwrite = argument("overwrite", True, python='resume="overwrite"')
            raise ConfigError(f"{setting('checkpoint.best_metric', metric)} is not in the epoch record, so no "
                              f"checkpoint could be ranked; choose one of: {known}, and start the run again with "
                              f"it ({overwrite})")
        if (run.epoch == run.last_epoch or run.stop_reason is not None) and not self._beside:
            self.ckpt.wait()  # a failed final save is an error of the run

    def _save(self, run: Run, metrics: dict[str, Any] | None, kind: str) -> None:
        meta = {**run.snapshot().to_meta(), "config": self._run_config,
                "data": getattr(run.feed, "fingerprint", None)}
        self.ckpt.save(run.step, _as_saved(run.state), meta, metrics, feed=run.feed.arrays())
        announce("checkpoint saved", step=run.step, kind=kind)
        self._last_save, self._saved_at = run.step, self.clock()

    def on_end(self, run: Run, summary: dict[str, Any]) -> None:
        """Waits for the last saves. A member of a population waits here, not at its last epoch's
        end, so that its final save is written while the other members end their epoch: its
        failure is raised here (the run fails, as a lone run's does at its last epoch)."""
        failed = None
        try:
            self.ckpt.wait()
        except CheckpointError as e:  # a lone run's was reported by the save or the wait in on_epoch_end
            failed = e if self._beside and summary["status"] in ("completed", "stopped early") else None
        summary["latest_checkpoint_step"] = self.ckpt.latest_step()
        self.ckpt.close()
        if failed is not None:
            raise failed

    @property
    def directory(self) -> Path:
        return self.ckpt.directory


def _as_saved(state: TrainState) -> TrainState:
    """The train state (or its shardings) as checkpoints hold it: the optimizer's numbers, which
    the run's config gives, left out (`optim.without_values`), so a checkpoint is the same whether
    the numbers were in the program or in the state."""
    return state._replace(opt_state=without_values(state.opt_state))
