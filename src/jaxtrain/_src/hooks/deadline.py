"""The `Deadline` hook: a run that ends by `TrainConfig.max_time` with its schedule run out.

After the run's first calls have chosen its form and K (calibration), the hook times the calls
the run makes, all in (waits, the hooks' work between calls, epoch ends; the timing starts again
after a call that compiled, whose seconds are no step's), and plans the run's last
step: the steps that fit in the time left, less a reserve for the final evaluation, checkpoint and
run files (the last epoch end's seconds when one was seen, else a guess from the time per step and
the validation set's size). It re-plans after every call, and sets the plan where the loop and
the optimizer read it: `Run.end_step` (the loop ends there, mid-epoch if need be, with the epoch's
record, evaluation and checkpoint) and the schedule's length in the optimizer state
(`optim.set_planned_steps`: the warmup-cosine, fitted to the plan, reaches its end value on the
last step; the program does not depend on it, so nothing compiles again). The schedule's length
changes only when the plan moves by more than `REPLAN_SHARE`, so the rates follow one curve.

The budget counts every session of the run: each checkpoint holds the seconds used so far and the
plan (`state_dict`), so a resume with a longer `max_time` continues with the time left, re-planned
over the whole run: the schedule is the one a run given that time from the start would follow,
so from the resumed step the rates follow the stretched curve (as a resume with more `epochs`
stretches a schedule). A resume with no time left trains nothing.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import jax

from jaxtrain._src.config import TrainConfig
from jaxtrain._src.deadline import plan_steps
from jaxtrain._src.errors import render, setting
from jaxtrain._src.hooks.base import Run, RunHook
from jaxtrain._src.loop_state import LoopState
from jaxtrain._src.optim import _injected_learning_rate, planned_steps_of, set_planned_steps
from jaxtrain._src.report.notes import note

__all__ = ["Deadline", "clock", "more_to_train", "setup_s"]

clock: Callable[[], float] = time.perf_counter
"""The hook's clock (seconds); the tests replace it to run a deadline without waiting for it."""


def setup_s(run: Run) -> float:
    """Seconds the run's session spent before training (the command's imports and data when it says
    when it began, `Run.started`; the run's setup and compilation): they count into the budget.
    The tests replace it (their clock has no setup seconds)."""
    return run.elapsed_s if run.started is None else time.perf_counter() - run.started


REPLAN_SHARE = 0.002
"""A plan that moved by less than this share of the planned steps leaves the schedule as it was."""
END_S = 1.0
"""Seconds kept for what follows the last epoch end (summary, plots, closing files)."""
MARGIN = 0.02
"""The share of the budget kept free of the plan: the time per step is measured, not promised."""
EVAL_SHARE = 1.0
"""A validation sample's cost as a share of a training sample's, until an epoch end is timed: a
forward pass without its backward, yet measured at 0.7 on mnist-cnn on a loaded CPU (its program
compiling beside training), so a run that ends in its first epoch keeps a whole sample's worth."""
MIN_LEFT_S = 1.0
"""A resume with less time than this left trains nothing."""


class Deadline(RunHook):
    """Fits a run to `max_time_s` seconds (`TrainConfig.max_time`): plans its steps, ends it at
    the plan, fits the learning-rate schedule to the plan, and says so in the summary
    (`summary["deadline"]`: the budget, the planned and the run steps, the seconds used)."""

    name = "deadline"

    def __init__(self, max_time_s: float):
        self.max_time_s = max_time_s
        self.planned: int | None = None  # the plan: the run's last step
        self._used_before = 0.0  # seconds the run's earlier sessions used (from the checkpoint)
        self._start = self._end = 0.0  # this session's start and deadline on `clock`
        self._ref: tuple[float, int] | None = None  # (clock, steps done) where the timing starts
        self._last_call: float | None = None  # clock when the last call was queued
        self._gap: float | None = None  # the last epoch end's seconds (a call, evaluation, checkpoint, hooks)
        self._fitted = False  # the optimizer holds the schedule's length
        self._ended = False  # the plan's last step is queued
        self._compile_s = 0.0  # the calls' compile seconds at the last call

    def state_dict(self) -> dict[str, Any]:
        # a run at its planned end has spent its budget: what is left was kept for its end
        used = max(self.used_s, self.max_time_s) if self._ended else self.used_s
        return {"used_s": used, "planned_steps": self.planned}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._used_before = float(state.get("used_s", 0.0))
        self.planned = state.get("planned_steps")

    @property
    def used_s(self) -> float:
        """Seconds of the budget used by the run's sessions, this one until now."""
        return self._used_before + clock() - self._start

    def on_start(self, run: Run) -> None:
        self._start = clock() - setup_s(run)  # the session's setup and compilation count, the command's too
        self._end = self._start + self.max_time_s - self._used_before
        self._fitted = planned_steps_of(run.state.opt_state) is not None
        if not self._fitted and (run.config.optim.schedule != "constant" or not _own_optimizer(run)):
            note(f"{setting('max_time', run.config.max_time)}: the learning-rate schedule is not fitted to the "
                 "deadline (only the config's warmup-cosine is; not the exponential one or your own optimizer); "
                 "the run still ends by the deadline")
        if self.planned is not None and self._fitted:
            # the restored state holds the config's numbers (`optim.restore_values`): the saved plan first,
            # whatever the re-plan below keeps
            run.state = run.state._replace(opt_state=set_planned_steps(run.state.opt_state, self.planned))
        if self.planned is not None and run.step > 0 and self._used_before > 0:
            # a resume keeps the saved plan until this session's own calls are timed (`after_call` re-plans):
            # the earlier sessions' seconds per step hold their setup and compiles, not the pace
            self._set(run, self.planned, end=False)
        spe = run.feed.steps_per_epoch
        guess = self.planned or run.config.epochs * spe
        run.planned_epochs = max(run.loop.epoch, math.ceil(guess / spe))  # shown until the first plan

    def after_call(self, run: Run, k: int, metrics: dict[str, jax.Array]) -> None:
        now = clock()
        self._last_call = now
        if run.calls.calibrating:  # its calls are timed in several forms and K: not the run's pace
            return
        done = run.step - k  # the loop waited for the call before this one
        compiled, self._compile_s = self._compile_s != run.calls.compile_s, run.calls.compile_s
        if self._ref is None or compiled:  # a program compiled since (a new K): its seconds are no step's
            self._ref = (now, done)
        if done <= self._ref[1]:
            return
        t0, done0 = self._ref
        per_step = (now - t0) / (done - done0)
        reserve = self._reserve(run, per_step)
        planned = plan_steps(now=now, end=self._end, reserve=reserve, done_step=done, queued_step=run.step,
                             seconds_per_step=per_step)
        if self.planned is not None and run.step < self.planned and planned < self.planned:
            late_s = now + (self.planned - done) * per_step + reserve - self._end  # the old plan's overrun
            if late_s < MARGIN * self.max_time_s / 2:
                planned = self.planned  # late within half the margin: the schedule keeps its end
        self._set(run, planned)
        self._ended = run.at_end_step

    def _reserve(self, run: Run, per_step: float) -> float:
        """Seconds kept for the end: the last epoch end's (evaluation, checkpoint), or a guess."""
        if self._gap is not None:
            end = 1.25 * self._gap
        else:
            end = per_step * EVAL_SHARE * run.num_val / run.config.samples_per_step
        return end + END_S + MARGIN * self.max_time_s

    def _set(self, run: Run, planned: int, end: bool = True) -> None:
        """Plans the run's last step: the schedule's length (when it moved by more than
        `REPLAN_SHARE`, or when the run's end is reached), the loop's end and its last epoch."""
        old = self.planned
        if old is None or abs(planned - old) > REPLAN_SHARE * old or planned <= run.step:
            self.planned = old = planned
            if self._fitted:
                run.state = run.state._replace(opt_state=set_planned_steps(run.state.opt_state, planned))
        if end:
            run.end_step = old
        run.planned_epochs = max(run.loop.epoch, math.ceil(old / run.feed.steps_per_epoch))

    def on_epoch_start(self, run: Run) -> None:
        if self._last_call is not None:  # the epoch end just passed: the last call, evaluation, checkpoint
            self._gap = clock() - self._last_call

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        if run.end_step is None:  # not planned yet (the epoch was shorter than the calibration): go on
            run.planned_epochs = run.epoch + 1

    def on_end(self, run: Run, summary: dict[str, Any]) -> None:
        at = run.at_end_step
        lr = _injected_learning_rate(run.state.opt_state)  # the last step's rate: the schedule's end, when fitted
        summary["deadline"] = {"max_time_s": self.max_time_s, "used_s": round(self.used_s, 3),
                               "planned_steps": self.planned, "steps": run.step, "stopped_at_deadline": at,
                               "schedule_fitted": self._fitted, "final_lr": None if lr is None else float(lr)}
        if at and summary.get("status") == "completed":
            run.console.print(render(f"  stopped at the deadline ({setting('max_time', run.config.max_time)}): "
                                     f"step {run.step:,} of {self.planned:,} planned, {self.used_s:.1f} s used"))


def _own_optimizer(run: Run) -> bool:
    """Whether the run trains with the config's optimizer (whose schedule a deadline may fit)."""
    from jaxtrain._src.optim import ValuesState

    is_values = lambda x: isinstance(x, ValuesState)  # noqa: E731
    return any(is_values(x) for x in jax.tree.leaves(run.state.opt_state, is_leaf=is_values))


def more_to_train(config: TrainConfig, loop: LoopState) -> bool:
    """Whether a resumed run has more to train: epochs left, or with a deadline, time left (then
    `epochs` does not limit it); a note says when a deadline's run has none."""
    if not config.max_time_s:
        return loop.epoch <= config.epochs
    used = float(loop.hooks.get(Deadline.name, {}).get("used_s", 0.0))
    if config.max_time_s - used >= MIN_LEFT_S:
        return True
    note(f"the run has used {used:.0f} s of its {setting('max_time', config.max_time)}; nothing to train "
         f"(pass a longer {setting('max_time')} to train further)")
    return False
