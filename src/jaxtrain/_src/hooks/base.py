"""The hook protocol, the `Run` the loop keeps and the read-only `RunView` that users' hooks see.

The loop announces events; hooks react (Keras callbacks, Lightning callbacks, CLU periodic actions):

    on_start(run)                      parts are built and compiled; nothing has trained yet
    on_epoch_start(run)                an epoch (or the rest of one, after a resume) begins
    after_call(run, k, metrics)        a compiled call of k steps was queued; `metrics` are its
                                       per-step values on the device, each of shape (k,)
    on_log(run, row)                   a training-metrics row (host floats) every `log_every` steps
    flush(run)                         fetch anything held on the device now (before a checkpoint)
    on_epoch_end(run, record)          the epoch's record; hooks may add to it, in order
    on_end(run, summary)               training ended (`summary["status"]` says how); hooks may add keys

Hooks run in list order for every event. `fit` orders its own around the user's: metrics and
evaluation first (they fill the epoch record), then the user's hooks, then early stopping, run
files (an epoch's row is on the disk before its checkpoint starts), checkpoints, plots,
TensorBoard and the progress display. `on_end` reaches the run files last, so summary.json holds
what every hook added.

A user's hook (a `Hook`) is handed a `RunView`: the step, epoch, train state, history, config and
run directory, read-only, and `stop(reason)` to end training after the current epoch. The
library's own hooks (`RunHook`: the built-ins, self-play, the tools' measuring hooks) are handed
the loop's `Run`, with the feed, the compiled calls and the layout, and two events of their own:
`before_compile(run)` while the first training program compiles (to trace theirs meanwhile) and
`after_files(run)` once the run files are written.

Metrics arrive as device arrays: a hook that converts them to host values on every call adds a
host sync per call. Fetch them every so often, as `MetricsHook` does, or use `on_log` rows.

A hook with state that must survive a resume gives itself a `name` and implements `state_dict()`
and `load_state_dict()`; the state is saved in every checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

import jax
from rich.console import Console

from jaxtrain._src.config import TrainConfig
from jaxtrain._src.loop_state import LoopState

if TYPE_CHECKING:  # the run's parts, for their types only (hooks do not build them)
    from jaxtrain._src.calls import CompiledCalls
    from jaxtrain._src.feeds import Feed
    from jaxtrain._src.sharding import Layout


def missing_metric(metric: str, record: dict[str, Any]) -> str | None:
    """The epoch metrics `record` holds ("train_loss, val_loss, ..."), when `metric` should be among them
    and is not (a typo, a metric the loss does not return); None when it is there, or when it is a
    validation metric and the epoch evaluated nothing (`eval_every`, no validation data)."""
    if metric in record or not ("val_loss" in record or not metric.startswith("val_")):
        return None
    return ", ".join(k for k in record if k.startswith(("train_", "val_")) and not k.endswith("_s"))


class Hook:
    """Base class of hooks: every event is a no-op until overridden; events receive a `RunView`."""

    name: str | None = None
    """Key of this hook's state in checkpoints; None: the hook has no state to save."""

    def on_start(self, run: "Run") -> None: ...

    def on_epoch_start(self, run: "Run") -> None: ...

    def after_call(self, run: "Run", k: int, metrics: dict[str, jax.Array]) -> None: ...

    def on_log(self, run: "Run", row: dict[str, Any]) -> None: ...

    def flush(self, run: "Run") -> None: ...

    def on_epoch_end(self, run: "Run", record: dict[str, Any]) -> None: ...

    def on_end(self, run: "Run", summary: dict[str, Any]) -> None: ...

    def state_dict(self) -> dict[str, Any] | None:
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


LIBRARY_EVENTS = ("before_compile", "after_files")  # events of `RunHook`s only


class RunHook(Hook):
    """A hook of the library or its tools: its events receive the loop's whole `Run` (feed,
    compiled calls, layout) instead of the read-only `RunView`."""

    def before_compile(self, run: "Run") -> None:
        """The run's parts are built and its first training program is traced and compiling in the
        background (the form settled, when it needs no timing): programs this hook will need are traced
        now, while it compiles, and asked for in the background compile next, beside the first calls."""

    def after_files(self, run: "Run") -> None:
        """After every hook's `on_end`, once the run files (summary.json) are written."""


class RunView:
    """What a user's hook sees of a run: read-only, except `stop`.

    Attributes:
      name: the run's name.
      config: the training settings (a frozen `TrainConfig`).
      run_dir: the run directory, or None.
      step: optimizer steps queued so far (the last call may still be computing).
      epoch: the current epoch (from 1).
      state: the train state after the last queued call (`TrainState`: step, params,
        model_state, opt_state, rng).
      history: one record per finished epoch (`train_loss`, `val_loss`, `val_<metric>`, times).
      elapsed_s: seconds since `fit` started.
      stop_reason: why training will stop after this epoch, once a hook asked for it.
    """

    __slots__ = ("_run",)
    _run: Run  # set once, in __init__

    def __init__(self, run: "Run"):
        object.__setattr__(self, "_run", run)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the run is read-only for hooks; {name!r} cannot be set (use stop(reason) to end it)")

    name = property(lambda self: self._run.name)
    config = property(lambda self: self._run.config)
    run_dir = property(lambda self: self._run.run_dir)
    step = property(lambda self: self._run.step)
    epoch = property(lambda self: self._run.epoch)
    state = property(lambda self: self._run.state)
    history = property(lambda self: tuple(self._run.loop.history))
    elapsed_s = property(lambda self: self._run.elapsed_s)
    stop_reason = property(lambda self: self._run.stop_reason)

    def stop(self, reason: str) -> None:
        """Ends training after the current epoch (`summary["status"]` becomes "stopped early")."""
        self._run.stop_reason = reason

    def __repr__(self) -> str:
        return f"RunView(name={self.name!r}, epoch={self.epoch}, step={self.step})"


class LambdaHook(Hook):
    """A hook from plain functions, e.g. `LambdaHook(on_log=lambda run, row: print(row["loss"]))`."""

    def __init__(self, *, on_start: Callable | None = None, on_epoch_start: Callable | None = None,
                 after_call: Callable | None = None, on_log: Callable | None = None,
                 on_epoch_end: Callable | None = None, on_end: Callable | None = None):
        for event, fn in (("on_start", on_start), ("on_epoch_start", on_epoch_start), ("after_call", after_call),
                          ("on_log", on_log), ("on_epoch_end", on_epoch_end), ("on_end", on_end)):
            if fn is not None:
                setattr(self, event, fn)


S = TypeVar("S")  # the train state a run carries: a lone run's or member's `TrainState`, a population's own


@dataclasses.dataclass(eq=False)
class Run(Generic[S]):
    """The loop's run: what the library's own hooks (`RunHook`) see. The loop keeps `state`,
    `step` and `loop` current; users' hooks see it through the read-only `RunView`.

    Attributes:
      name: the run's name (the recipe).
      config: the training settings.
      console: where to print.
      run_dir: the run directory, or None.
      device: this process's first device (the kind of device training runs on).
      layout: the mesh of devices and the shardings of the train state and batches.
      feed: where batches come from (`feeds.Feed`).
      calls: the compiled calls (`calls.CompiledCalls`): K, compile time.
      state: the train state after the last queued call (it may still be computing): a `TrainState`,
        or for a population's own run the population's state (`Run[S]`: S is the state's type).
      step: optimizer steps queued so far.
      loop: epoch, position in the epoch, history and training time (`LoopState`).
      hooks: every hook of the run, in order.
      num_val: validation samples (0 without validation data).
      resumed_step: the checkpoint step the run resumed from, or None.
      t_start: `time.perf_counter()` at the start of `fit`.
      stop_signal: SIGINT/SIGTERM number once one arrived (a checkpoint hook saves, the loop stops).
      queued: steps of the call queued last, not yet known to have finished (0 once the epoch ends).
      stop_reason: set by a hook to end training after the current epoch (early stopping).
      last_checkpoint: describes the newest good checkpoint, for error messages.
      resume_hint: how to continue this run, for the message of a stopped run.
      summary: the run's summary, once training ended.
      model_summary: the model's modules, output shapes and parameters (`report.model_summary`).
      hook_s: seconds the hooks spent on each event, keyed `(hook class name, event)` (`hooks.profile`).
      rewrite_declined: why the XLA:CPU rewrite the settings asked for did not happen (`Program`), or None.
      end_step: the step a planner ends training at, mid-epoch if need be (the `Deadline` hook's
        plan); None: training ends with `config.epochs`.
      planned_epochs: the epoch a planner expects training to end in (progress shows it, and the last
        epoch is always evaluated); None: `config.epochs`.
      started: `time.perf_counter()` when the tool's command began (a deadline counts from it), or None.
    """

    name: str
    config: TrainConfig
    console: Console
    run_dir: Path | None
    device: jax.Device
    layout: Layout
    feed: Feed
    calls: CompiledCalls
    state: S
    step: int
    loop: LoopState
    hooks: list[Hook]
    num_val: int = 0
    resumed_step: int | None = None
    t_start: float = dataclasses.field(default_factory=time.perf_counter)
    stop_signal: int | None = None
    queued: int = 0
    stop_reason: str | None = None
    last_checkpoint: Callable[[], str] = lambda: "no checkpoint was saved"
    resume_hint: str = "no run directory, so no checkpoint was saved"
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    model_summary: dict[str, Any] | None = None
    hook_s: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    rewrite_declined: str | None = None
    end_step: int | None = None
    planned_epochs: int | None = None
    started: float | None = None

    @property
    def last_epoch(self) -> int:
        """The epoch training ends with: `config.epochs`, or a planner's (never before this one)."""
        return self.config.epochs if self.planned_epochs is None else max(self.loop.epoch, self.planned_epochs)

    @property
    def at_end_step(self) -> bool:
        """A planner's last step is queued: training ends after this call, mid-epoch if need be."""
        return self.end_step is not None and self.step >= self.end_step

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t_start

    @property
    def epoch(self) -> int:
        return self.loop.epoch

    @functools.cached_property
    def view(self) -> RunView:
        return RunView(self)

    def each(self, event: str, *args: Any) -> None:
        """Announces `event` to every hook, in order (`call`)."""
        for hook in self.hooks:
            self.call(hook, event, *args)

    def call(self, hook: Hook, event: str, *args: Any) -> None:
        """`hook`'s `event`, timed into `hook_s`: the library's hooks get this `Run`, users' hooks
        its `RunView`."""
        if event in LIBRARY_EVENTS and not isinstance(hook, RunHook):  # users' hooks have no such event
            return
        t0 = time.perf_counter()
        try:
            getattr(hook, event)(self if isinstance(hook, RunHook) else self.view, *args)
        finally:
            key = (type(hook).__name__, event)
            self.hook_s[key] = self.hook_s.get(key, 0.0) + time.perf_counter() - t0

    def advance(self, k: int, stop_signal: int | None) -> None:
        """A call of `k` steps was queued: the run's step and position move on; `stop_signal` is the
        SIGINT/SIGTERM seen so far (a checkpoint hook saves on it). The loop waits for the call
        before it queues the next, so every step but the call's `k` (`queued`) has finished."""
        self.loop.position += k
        self.queued = k
        self.step += k
        self.stop_signal = stop_signal

    def after_call(self, k: int, metrics: Any) -> None:
        """Every hook hears the call (`metrics` its outputs on the device)."""
        self.each("after_call", k, metrics)

    def end_epoch(self, record: dict[str, Any]) -> bool:
        """The epoch's record joins the history and every hook hears it (metrics and evaluation
        fill it, then the rest); the next epoch starts at its beginning. False: a hook stopped
        the run (`stop_reason`)."""
        self.queued = 0  # the loop waited for the epoch's last call
        self.loop.train_time_s += record["train_time_s"]
        self.loop.history.append(record)
        self.each("on_epoch_end", record)
        self.loop.position = 0
        return self.stop_reason is None

    def log(self, row: dict[str, Any]) -> None:
        """Hands a training-metrics row to every hook's `on_log`."""
        self.each("on_log", row)

    def flush(self) -> None:
        """Asks every hook to fetch what it holds on the device (called before a checkpoint)."""
        self.each("flush")

    def snapshot(self) -> LoopState:
        """The loop state to save now: a finished epoch counts as the start of the next."""
        loop = self.loop
        epoch, position = (loop.epoch + 1, 0) if loop.position >= self.feed.steps_per_epoch else (
            loop.epoch, loop.position)
        states = {h.name: h.state_dict() for h in self.hooks if h.name}
        hooks = {name: state for name, state in states.items() if state is not None}
        form = "" if self.calls.form.measuring else self.calls.form.form
        return dataclasses.replace(loop, epoch=epoch, position=position, steps_per_call=self.calls.k,
                                   step_form=form, feed=self.feed.get_state(), hooks=hooks)
