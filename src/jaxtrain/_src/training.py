"""The training loop: epochs of compiled calls, for one run or for a population's members.

`fit` and `fit_population` build their parts differently (one program, or one program over P
members) and then run this one loop. What differs is who hears the loop's events, a `Crew`:

- `Alone` (`fit`): the run itself;
- a population's members (`population._Members`): each member's own `Run` and hooks, fed from
  the population's calls, ending one by one as they stop.

So signals, fault-injection moments, evaluation, early stopping, checkpoints, hooks and run
files behave the same for one run and for P, and each is written once: here, in the hooks, or in
`end_run`.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from pathlib import Path
from typing import Any, Protocol, Sequence

import jax
from flax import nnx
from jax.experimental import multihost_utils

from jaxtrain._src.checkpoint import CheckpointError
from jaxtrain._src.checks import abstract_batch
from jaxtrain._src.config import EarlyStoppingConfig, TrainConfig
from jaxtrain._src.errors import JaxtrainError, NonFiniteLossError, setting
from jaxtrain._src.hooks import (
    EarlyStopping,
    Hook,
    MetricsHook,
    PlotHook,
    ProfileHook,
    ReduceOnPlateau,
    RestoreBest,
    Run,
    RunFilesHook,
    RunHook,
    TensorBoard,
)
from jaxtrain._src.hooks.deadline import Deadline
from jaxtrain._src.hooks.trackers import make_trackers
from jaxtrain._src.loop_state import LoopState
from jaxtrain._src.moments import announce
from jaxtrain._src.report import build_summary
from jaxtrain._src.report.model_summary import model_summary
from jaxtrain._src.report.notes import note
from jaxtrain._src.run_guard import NON_FINITE
from jaxtrain._src.state import TrainState, in_mode
from jaxtrain._src.step import LossFn, Preprocess

__all__ = ["FAILURES", "Alone", "Crew", "StopSignals", "TrainingStopped", "end_run", "finish", "run_hooks",
           "step_form_of", "summarise_model", "train"]


class TrainingStopped(JaxtrainError):
    """Training was stopped by SIGINT or SIGTERM after saving a checkpoint (exit code 128 + signal)."""

    def __init__(self, signum: int, step: int, resume_hint: str):
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}; {resume_hint}")


FAILURES = {TrainingStopped: "stopped by signal", NonFiniteLossError: NON_FINITE,
            CheckpointError: "failed: checkpoint not written"}
"""The summary's status for the errors that end a run."""


class StopSignals:
    """Turns SIGINT/SIGTERM into a flag the loop checks at call boundaries (main thread only).

    In a job of several processes SIGTERM is left to JAX's preemption service, which makes every
    process agree on the call at which they all stop (one stopping alone would leave the others
    waiting in a collective)."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self._many, self._calls = jax.process_count() > 1, 0

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT,) if self._many else (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def poll(self) -> int | None:
        """The stop signal, once one arrived (in every process of a job at the same call)."""
        if self._many:
            self._calls += 1
            if multihost_utils.reached_preemption_sync_point(self._calls) and self.signum is None:
                self.signum = signal.SIGTERM
        return self.signum

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


class Crew(Protocol):
    """Who hears the loop's events. The loop keeps the lead `Run`'s state, step, position and
    history; a crew hands them on to the runs it holds."""

    @property
    def resume_hint(self) -> str:
        """How to continue, for the message of a run stopped by a signal."""

    @property
    def training(self) -> bool:
        """Someone is still training (a population whose members all ended stops mid-epoch)."""

    def each(self, event: str) -> None:
        """`before_compile`, `on_start` or `on_epoch_start` to every run still training."""

    def after_call(self, k: int, metrics: Any) -> None:
        """A call of `k` steps was queued and the lead advanced (`Run.advance`); `metrics` are its
        outputs on the device. Each run of the crew advances and hears it (`Run.after_call`)."""

    def epoch_end(self, record: dict[str, Any]) -> bool:
        """The epoch's record: each run ends its epoch with it (`Run.end_epoch`: the lead's history
        gets it); False ends training."""

    def end(self, status: str) -> None:
        """Training ended with `status`: every run still open writes its summary and files."""


class Alone:
    """The crew of a lone run (`fit`): the run is the lead and hears every event itself."""

    def __init__(self, run: Run[TrainState], model: nnx.Module):
        self.run, self.model = run, model

    @property
    def training(self) -> bool:
        return True

    @property
    def resume_hint(self) -> str:
        return self.run.resume_hint

    def each(self, event: str) -> None:
        self.run.each(event)

    def after_call(self, k: int, metrics: Any) -> None:
        self.run.after_call(k, metrics)  # the loop advanced it: it is the lead

    def epoch_end(self, record: dict[str, Any]) -> bool:
        return self.run.end_epoch(record)

    def end(self, status: str) -> None:
        finish(self.run, self.model, status)


def train(run: Run[Any], crew: Crew, signals: StopSignals) -> None:
    """Trains from `run.loop`'s epoch and position to the last epoch: the feed's batches through
    `run.calls` (the run's first through `calls.calibrate`, which times them to choose the calls'
    form and K), every call's outputs and every epoch's record to `crew`; one call stays queued
    while the host hands the previous one on. Whatever ends it (the last epoch, early stopping, a
    signal, an error), the feed is closed and `crew.end` writes the runs' ends; errors are raised
    after that, with the status they gave the summaries."""
    feed, calls, loop, config = run.feed, run.calls, run.loop, run.config
    status = "interrupted"
    try:
        feed.setup(calls.compile, (loop.epoch, loop.position))  # a streamed feed starts reading meanwhile
        first = calls.next_length(feed.steps_per_epoch - loop.position)
        calls.settle_form(first)
        calls.start(first)  # traced here, compiled in the background meanwhile
        crew.each("before_compile")  # evaluation's program: traced here meanwhile, compiled after it
        calls.get(first)  # compiled before the header
        if (signum := signals.poll()) is not None:  # a signal during start-up or compilation: nothing trained yet
            raise TrainingStopped(signum, run.step, "before training began; nothing was trained, "
                                  "so start it again")
        crew.each("on_start")
        epoch = loop.epoch
        while epoch <= run.last_epoch:  # config.epochs, or a deadline's plan (`Run.end_step`)
            loop.epoch = epoch
            feed.start_epoch(epoch, loop.position)
            crew.each("on_epoch_start")
            t_epoch, compile_before = time.perf_counter(), calls.compile_s
            running = None  # outputs of the call still running on the device
            while loop.position < feed.steps_per_epoch and crew.training and not run.at_end_step:
                left = feed.steps_per_epoch - loop.position
                k = calls.next_length(left if run.end_step is None else min(left, run.end_step - run.step))
                args = feed.next_args(k, previous=running)
                # calibration: the run's first calls choose the form (timed on a copy of the state), then K
                call = calls.calibrate if calls.calibrating else calls  # (timed as they train)
                run.state, metrics = call(k, run.state, args)
                if running is not None:  # wait for the previous call: one call stays queued
                    calls.wait(running)
                running = metrics
                run.advance(k, signals.poll())
                announce("call", run=run)
                crew.after_call(k, metrics)
                announce("call done", run=run)
                if run.stop_signal is not None and loop.position < feed.steps_per_epoch:
                    raise TrainingStopped(run.stop_signal, run.step, crew.resume_hint)
            calls.wait(running)  # the epoch's time includes its last call
            train_s = time.perf_counter() - t_epoch - (calls.compile_s - compile_before)
            steps = loop.position if run.at_end_step else feed.steps_per_epoch  # a deadline ends mid-epoch
            record = {"epoch": epoch, "step": run.step, "samples": steps * config.samples_per_step,
                      "samples_dropped": feed.dropped, "train_time_s": train_s, "eval_time_s": 0.0,
                      "epoch_time_s": train_s, **feed.epoch_stats(train_s)}
            if not crew.epoch_end(record) or run.at_end_step:  # the lead's history gets the record
                break
            if signals.signum is not None and epoch < run.last_epoch:
                raise TrainingStopped(signals.signum, run.step, crew.resume_hint)
            epoch += 1
        status = "stopped early" if run.stop_reason else "completed"
    except JaxtrainError as e:
        status = FAILURES.get(type(e), f"failed: {e}")
        raise
    except Exception as e:  # a user's hook or loss that raised
        status = f"failed: {type(e).__name__}: {e}"
        raise
    finally:
        feed.close()
        crew.end(status)


def step_form_of(config: TrainConfig, loop: LoopState) -> str:
    """The calls' form: the config's, or on resume the form the run measured when it began (a
    resumed run computes as it did)."""
    return loop.step_form if config.step_form == "auto" and loop.step_form else config.step_form


def finish(run: Run[TrainState], model: nnx.Module, status: str, **extra: Any) -> None:
    """Ends `run` with `status`: `model` takes its trained variables (those of the best epoch with
    `early_stopping.restore_best`, when training completed or stopped early: `restored_epoch` in
    the summary; the run's state stays the last step's), then the run's summary (with `extra` in
    it) goes to every hook (`end_run`)."""
    params, model_state = run.state.params, run.state.model_state
    keeper = next((h for h in run.hooks if isinstance(h, RestoreBest)), None)
    if keeper is not None and status in ("completed", "stopped early"):
        best = keeper.best(run)
        if best is not None:  # the final block and summary.json name the epoch
            extra["restored_epoch"], params, model_state = best
    nnx.update(model, params, model_state)
    end_run(run, {**build_summary(run, status), **extra})


def end_run(run: Run, summary: dict[str, Any]) -> None:
    """Hands the summary to every hook, the run files last (they write summary.json once every
    hook has added to it), then tells the library's hooks the files are written (`after_files`:
    the trackers upload them). A hook's error at the end of a finished run (TensorBoard's files on a
    full disk) fails it: the summary says "failed: ..." and the error is raised after every hook
    ran; once a run failed, errors of the hooks' clean-up are not raised over the error that stopped it."""
    run.summary = summary
    run.calls.close()  # background compiles end (their seconds are in the profile)
    error = None

    def end(hook: Hook, event: str, *args: Any) -> None:  # every hook ends, whatever one before it raised
        nonlocal error
        try:
            run.call(hook, event, *args)
        except Exception as e:
            if summary["status"] in ("completed", "stopped early") and error is None:
                summary["status"], error = f"failed: {e}", e

    for hook in run.hooks:
        if not isinstance(hook, RunFilesHook):
            end(hook, "on_end", summary)
    if isinstance(summary.get("profile"), dict):  # before the run files write summary.json
        summary["profile"]["hook_seconds"] = hook_seconds(run.hook_s)
    for hook in run.hooks:
        if isinstance(hook, RunFilesHook):
            end(hook, "on_end", summary)
    for hook in run.hooks:
        if isinstance(hook, RunHook):
            end(hook, "after_files")
    if error is not None:
        raise error


_BETWEEN_CALLS = ("before_compile", "on_start", "on_epoch_start", "on_epoch_end", "on_end", "after_files")


def hook_seconds(hook_s: dict[tuple[str, str], float]) -> dict[str, float]:
    """Each hook's seconds between the training calls: its start, epoch and end events (from
    `Run.hook_s`), most first. Not here: after-call seconds, part of `train_s`
    (`after_call_hooks_s`), and `on_log` and `flush`, which run inside another hook's event (a
    checkpoint's flush is the checkpoint's time)."""
    seconds: dict[str, float] = {}
    for (name, event), s in hook_s.items():
        if event in _BETWEEN_CALLS:
            seconds[name] = seconds.get(name, 0.0) + s
    return dict(sorted(seconds.items(), key=lambda kv: -kv[1]))


def run_hooks(config: TrainConfig, hooks: Sequence[Hook], evaluation: Hook | None, checkpoints: Hook | None,
              progress: Hook, run_dir: Path | None, saved: dict[str, Any], loop: LoopState,
              plots: bool = True) -> list[Hook]:
    """The run's hooks in order, each restored from `loop` when it has saved state: metrics and evaluation first
    (they fill the epoch record), the user's, the profile (the user's ProfileHook, if any, else a default one), early
    stopping, restoring the best weights, reduce on plateau, the deadline (`TrainConfig.max_time`), the run files in
    `run_dir` (None: this process writes none; `saved` is config.json), checkpoints, plots (unless not `plots`),
    TensorBoard, the trackers of `config.track`, and progress last."""
    stopping = config.early_stopping
    _note_idle_early_stopping(stopping)
    ordered = [
        MetricsHook(config.log_every, config.on_nan),
        *([evaluation] if evaluation else []),
        *hooks,
        *([] if any(isinstance(h, ProfileHook) for h in hooks) else [ProfileHook()]),
        *([EarlyStopping(stopping.metric, stopping.patience, stopping.mode, stopping.min_delta)]
          if stopping.patience else []),
        *([RestoreBest(stopping.metric, stopping.mode, stopping.min_delta)] if stopping.restore_best else []),
        *([ReduceOnPlateau(config.optim)] if config.optim.plateau_patience else []),
        *([Deadline(config.max_time_s)] if config.max_time_s else []),  # plans the run's end (`Run.end_step`)
        *([RunFilesHook(run_dir, saved)] if run_dir else []),  # an epoch's row is written before its checkpoint
        *([checkpoints] if checkpoints else []),
        *([PlotHook()] if run_dir and plots else []),
        *([TensorBoard()] if run_dir and config.tensorboard else []),
        *(make_trackers(config.track) if run_dir else []),
        progress,
    ]
    for hook in ordered:
        if hook.name in loop.hooks:
            hook.load_state_dict(loop.hooks[hook.name])
    return ordered


def _note_idle_early_stopping(stopping: EarlyStoppingConfig) -> None:
    """A note when early stopping's settings are given while it is off (patience 0, the default):
    a Keras user sets the metric to watch and expects it watched."""
    given = [f.name for f in dataclasses.fields(stopping)
             if f.name not in ("patience", "restore_best") and getattr(stopping, f.name) != f.default]
    if given and not stopping.patience and not stopping.restore_best:  # restore_best watches the metric too
        names = ", ".join(setting(f"early_stopping.{name}", getattr(stopping, name)) for name in given)
        note(f"{names}: early stopping is off, so this has no effect; set "
             f"{setting('early_stopping.patience', placeholder='N')} to stop after N epochs without improvement")


def summarise_model(model: nnx.Module, loss_fn: LossFn, train_data: Any, preprocess: Preprocess | None,
                    batch_size: int) -> dict[str, Any]:
    """The model summary, its output shapes traced through the loss on one abstract batch."""
    def trace(model: nnx.Module, batch: Any) -> Any:
        return loss_fn(model, preprocess(batch) if preprocess else batch, jax.random.key(0))

    return model_summary(in_mode(model, train=True), trace, abstract_batch(train_data, batch_size, "train_data"))
