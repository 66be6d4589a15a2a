"""`fit()`: build the parts, then one plain loop over epochs and compiled calls.

The parts each live in their own module: the feed (`feeds.py`: where batches come from), the
compiled calls (`calls.py`: K fused steps, compiled ahead of time, and the choice of K), the loop
state (`loop_state.py`) and the hooks (`hooks/`: metrics, evaluation, checkpoints, run files,
TensorBoard, progress). The pure step functions are in `step.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import optax
from flax import nnx
from jax.experimental import multihost_utils
from rich.console import Console

from jaxtrain._src.calls import AutoSteps
from jaxtrain._src.checkpoint import CheckpointError
from jaxtrain._src.checks import abstract_batch, check_fit_inputs, check_path_length
from jaxtrain._src.config import TrainConfig, to_dict
from jaxtrain._src.errors import ConfigError, JaxtrainError, NonFiniteLossError
from jaxtrain._src.feeds import adapt_inputs, place_validation
from jaxtrain._src.hooks import (
    CheckpointHook,
    EarlyStopping,
    EvalHook,
    Hook,
    MemoryHook,
    MetricsHook,
    PlotHook,
    ProfileHook,
    ProgressHook,
    Run,
    RunFilesHook,
    RunHook,
    TensorBoard,
)
from jaxtrain._src.hooks.trackers import make_trackers
from jaxtrain._src.loop_state import LoopState
from jaxtrain._src.moments import announce
from jaxtrain._src.program import build_program
from jaxtrain._src.report import build_summary
from jaxtrain._src.report.model_summary import model_summary
from jaxtrain._src.run_guard import RunGuard
from jaxtrain._src.state import TrainState, in_mode
from jaxtrain._src.step import Augment, LossFn, Preprocess

__all__ = ["FitResult", "Session", "TrainingStopped", "fit", "run_fit"]

VERBOSITY = ("progress", "summary", "silent")


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What `fit` returns.

    Attributes:
      model: the trained model (the same object that was passed in, updated in place).
      state: the final `TrainState`.
      history: one dict per epoch: `train_loss`, `val_loss`, `val_<metric>`, times, samples.
      summary: the run summary (the contents of summary.json).
      run_dir: where the run's files are, or None.
    """

    model: nnx.Module
    state: TrainState
    history: list[dict[str, Any]]
    summary: dict[str, Any]
    run_dir: Path | None

    @property
    def best_val_loss(self) -> float | None:
        return self.summary["best_val_loss"]

    @property
    def final_train_loss(self) -> float:
        return self.summary["final_train_loss"]


class TrainingStopped(JaxtrainError):
    """Training was stopped by SIGINT or SIGTERM after saving a checkpoint (exit code 128 + signal)."""

    def __init__(self, signum: int, step: int, resume_hint: str):
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}; {resume_hint}")


class _StopSignals:
    """Turns SIGINT/SIGTERM into a flag the loop checks at call boundaries (main thread only).

    In a job of several processes SIGTERM is left to JAX's preemption service, which makes every
    process agree on the call at which they all stop (one stopping alone would leave the others
    waiting in a collective)."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self._many, self._calls = jax.process_count() > 1, 0

    def __enter__(self) -> "_StopSignals":
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


@dataclasses.dataclass(frozen=True)
class Session:
    """What a tool adds to a run beside `fit`'s arguments (the command line's own path).

    Attributes:
      name: the run's name in config.json and summary.json (the recipe's, from the command line).
      saved_config: what config.json records (the recipe's whole config); default the TrainConfig.
      console: where to print; a new rich Console by default.
      auto_steps: how the automatic K is measured (when `config.steps_per_call` is 0).
      plots: draw the loss curves (curves.png) when the run ends; a sweep's trials leave them to
        `jaxtrain plot RUN_DIR` (drawing takes a few tenths of a second, a trial's seconds).
    """

    name: str = "fit"
    saved_config: Any = None
    console: Console | None = None
    auto_steps: AutoSteps = AutoSteps()
    plots: bool = True


def fit(
    model: nnx.Module,
    loss_fn: LossFn,
    train_data: Any,
    val_data: Any = None,
    config: TrainConfig = TrainConfig(),
    *,
    optimizer: optax.GradientTransformation | None = None,
    hooks: Sequence[Hook] = (),
    preprocess: Preprocess | None = None,
    augment: Augment | None = None,
    run_dir: str | os.PathLike | None = None,
    resume: bool | str = False,
    verbosity: str = "progress",
) -> FitResult:
    """Trains `model` on `train_data` and evaluates on `val_data` after every epoch.

    Args:
      model: a Flax NNX module; it is trained in place and also returned in the result. It trains in
        training mode and is evaluated in evaluation mode whatever mode it arrives in, and is left
        in the mode it arrived in.
      loss_fn: `loss_fn(model, batch, key) -> (loss, metrics)`, with `metrics` a dict of scalar
        batch means (may be empty; per-sample values are a ConfigError). `key` is fresh every step.
      train_data: a pytree (dict, tuple, ...) of arrays with one row per sample; a row source
        (`jaxtrain.data.HDF5Source`, `NpySource`, `ArraySource`); a map-style dataset (`len` and
        `[i]` giving one sample: a PyTorch `Dataset`, a Hugging Face `Dataset`, a Grain
        `MapDataset`), ordered and batched by jaxtrain; or an iterable of batches (a `DataLoader`,
        a batched Grain or Hugging Face iterable, a generator, or a callable returning a fresh
        iterator each epoch), used in its own order with its own batch size.
        `config.data.placement` decides whether rows are held on the device whole or streamed in
        batches (auto: streamed when over the budget; a loader's batches are always streamed).
      val_data: any of the same for validation (same keys, row shapes, dtype kinds), or None. Held
        on the device when it fits what the training data leave of the budget, else evaluated streamed.
      config: training settings. `config.step_form` "auto" (the default) times the forms of a call
        (a `lax.scan` loop, unrolled steps, the plain step) on the run's first steps and keeps the
        fastest: XLA:CPU runs some ops, convolutions above all, many times slower in a loop body.
      optimizer: your own optax transformation; None builds one from `config.optim`.
        `config.on_nan="skip"` wraps either.
      hooks: your `jaxtrain.Hook`s; they see a read-only `RunView` and run after evaluation, before
        early stopping, checkpoints and reports (the loop orders its own hooks around them).
      preprocess: `batch -> batch`, traced into training and evaluation (e.g. normalisation).
      augment: `(batch, key) -> batch`, traced into training only (e.g. input noise).
      run_dir: directory for config.json, metrics.jsonl, summary.json, checkpoints/ and
        tensorboard/; None writes nothing.
      resume: False starts a new run (a `run_dir` holding a run is refused; it is locked while
        training); True continues from the newest complete checkpoint in `run_dir` (model,
        optimizer, step, RNG, data position, history and hooks' state, so the result equals an
        uninterrupted run's; with no checkpoint yet it starts afresh; only settings that
        `jaxtrain.RESUMABLE` lists may change); "overwrite" replaces the run in `run_dir`.
      verbosity: "progress" (a bar on a terminal, else a line per log interval), "summary" (header
        and summaries only) or "silent" (nothing; notes go to stderr).

    Returns:
      A `FitResult`.

    Raises:
      ConfigError, DataError, CheckpointError: settings, data or checkpoints that cannot work.
      NonFiniteLossError: a training loss became NaN or Inf (with `on_nan="stop"`).
      TrainingStopped: SIGINT or SIGTERM arrived; a checkpoint was saved first.
    """
    return run_fit(model, loss_fn, train_data, val_data, config, optimizer=optimizer, hooks=hooks,
                   preprocess=preprocess, augment=augment, run_dir=run_dir, resume=resume, verbosity=verbosity)


def _model_summary(model: nnx.Module, loss_fn: LossFn, train_data: Any, preprocess: Preprocess | None,
                   batch_size: int) -> dict[str, Any]:
    """The model summary, its output shapes traced through the loss on one abstract batch."""
    def trace(model: nnx.Module, batch: Any) -> Any:
        return loss_fn(model, preprocess(batch) if preprocess else batch, jax.random.key(0))

    return model_summary(in_mode(model, train=True), trace, abstract_batch(train_data, batch_size, "train_data"))


def run_fit(
    model: nnx.Module,
    loss_fn: LossFn,
    train_data: Any,
    val_data: Any = None,
    config: TrainConfig = TrainConfig(),
    *,
    optimizer: optax.GradientTransformation | None = None,
    hooks: Sequence[Hook] = (),
    preprocess: Preprocess | None = None,
    augment: Augment | None = None,
    run_dir: str | os.PathLike | None = None,
    resume: bool | str = False,
    verbosity: str = "progress",
    session: Session = Session(),
) -> FitResult:
    """`fit`, with what a tool adds (`Session`): the run's name, the config to save, the console."""
    t_start, memory = time.perf_counter(), MemoryHook()  # the memory the caller brought
    _check_arguments(model, config, optimizer, hooks, run_dir, resume, verbosity)
    train_data, val_data, config = adapt_inputs(train_data, val_data, config)
    check_fit_inputs(model, loss_fn, train_data, val_data, config.batch_size, preprocess, augment,  # eval_shape
                     config.data.allow_nan)
    primary = jax.process_index() == 0  # of several processes, only the first prints and writes run files
    name = session.name
    saved = {"recipe": name, **to_dict(session.saved_config or config)}
    # Stop signals count from here; the directory is claimed (locked, checked) before anything else.
    with _StopSignals() as signals, RunGuard(run_dir, saved, resume=resume is True, overwrite=resume == "overwrite",
                                             primary=primary) as guard:
        run_dir, resuming = guard.path, guard.resume
        console, bar = _printing(session.console, verbosity, primary)
        program = build_program(model, loss_fn, config, train_data=train_data, optimizer=optimizer,
                                preprocess=preprocess, augment=augment)
        feed = program.feed
        val, val_streamed = place_validation(val_data, config, feed) if val_data is not None else (None, False)

        # Restore before anything is written: a failed resume must leave the run directory untouched.
        checkpoints = None
        guard.clear()  # the files of a run this one replaces (resume="overwrite")
        if run_dir is not None and (config.checkpoint.enabled or resuming):
            checkpoints = CheckpointHook(run_dir / "checkpoints", config.checkpoint, name, saved)
        loop = program.restore(checkpoints, config.epochs) if resuming else LoopState(feed=feed.get_state())
        finished = guard.finished(int(program.state.step), loop.epoch <= config.epochs) if resuming else None
        if finished is not None:  # a finished run stays finished: nothing trained, compiled or rewritten
            feed.close()
            nnx.update(model, program.state.params, program.state.model_state)
            return FitResult(model, program.state, loop.history, finished, run_dir)

        progress = ProgressHook(console, bar=bar)
        calls = program.calls(config.steps_per_call or loop.steps_per_call, session.auto_steps, log=progress.message,
                              form=_step_form(config, loop))
        eval_batch = config.eval_batch_size or config.batch_size
        evaluation = None if val is None else EvalHook(program.eval_step, val, val_streamed, eval_batch,
                                                       config.eval_every)
        state = program.state
        run = Run(name, config, console, run_dir, jax.local_devices()[0], program.layout, feed, calls, state,
                  int(state.step), loop, [], num_val=evaluation.num_samples if evaluation else 0,
                  resumed_step=int(state.step) if resuming else None, t_start=t_start)
        run.model_summary = _model_summary(model, loss_fn, train_data, preprocess, config.batch_size)
        run.hooks = [memory, *_run_hooks(config, hooks, evaluation, checkpoints, progress,
                                         run_dir if primary else None, saved, loop, session.plots)]

        status = "interrupted"
        try:
            feed.setup(calls.compile, (loop.epoch, loop.position))  # a streamed feed starts reading meanwhile
            calls.get(calls.next_length(feed.steps_per_epoch - loop.position))  # compile before the header
            if signals.poll() is not None:  # a signal during start-up or compilation: nothing trained yet
                raise TrainingStopped(signals.signum, run.step,
                                      "before training began; nothing was trained, so start it again")
            run.each("on_start")
            for epoch in range(loop.epoch, config.epochs + 1):
                loop.epoch = epoch
                feed.start_epoch(epoch, loop.position)
                run.each("on_epoch_start")
                t_epoch, compile_before = time.perf_counter(), calls.compile_s
                running = None  # outputs of the call still running on the device
                while loop.position < feed.steps_per_epoch:
                    k = calls.next_length(feed.steps_per_epoch - loop.position)
                    args = feed.next_args(k, previous=running)
                    run.state, metrics = calls(k, run.state, args)
                    if running is not None:  # wait for the previous call: one call stays queued
                        calls.wait(running)
                    running = metrics
                    loop.position += k
                    run.step += k
                    run.stop_signal = signals.poll()
                    announce("call", run=run)
                    run.each("after_call", k, metrics)
                    announce("call done", run=run)
                    if run.stop_signal is not None and loop.position < feed.steps_per_epoch:
                        raise TrainingStopped(run.stop_signal, run.step, run.resume_hint)
                calls.wait(running)  # the epoch's time includes its last call
                train_s = time.perf_counter() - t_epoch - (calls.compile_s - compile_before)
                loop.train_time_s += train_s
                record = {"epoch": epoch, "step": run.step, "samples": feed.steps_per_epoch * config.samples_per_step,
                          "samples_dropped": feed.dropped, "train_time_s": train_s, "eval_time_s": 0.0,
                          "epoch_time_s": train_s, **feed.epoch_stats(train_s)}
                loop.history.append(record)
                run.each("on_epoch_end", record)  # metrics and evaluation fill the record, then the rest
                loop.position = 0
                if run.stop_reason is not None:
                    break
                if signals.signum is not None and epoch < config.epochs:
                    raise TrainingStopped(signals.signum, run.step, run.resume_hint)
            status = "stopped early" if run.stop_reason else "completed"
        except JaxtrainError as e:
            status = _FAILURES.get(type(e), f"failed: {e}")
            raise
        except Exception as e:  # a user's hook or loss that raised
            status = f"failed: {type(e).__name__}: {e}"
            raise
        finally:
            feed.close()
            nnx.update(model, run.state.params, run.state.model_state)
            _end(run, build_summary(run, status))
        return FitResult(model, run.state, loop.history, run.summary, run.run_dir)


def _step_form(config: TrainConfig, loop: LoopState) -> str:
    """The calls' form: the config's, or on resume the form the run measured when it began."""
    return loop.step_form if config.step_form == "auto" and loop.step_form else config.step_form


_CONFIGURED = {EarlyStopping: "TrainConfig(early_stopping=EarlyStoppingConfig(...))",
               TensorBoard: "TrainConfig(tensorboard=True) and a run_dir",
               CheckpointHook: "TrainConfig(checkpoint=CheckpointConfig(...)) and a run_dir",
               MetricsHook: "TrainConfig(log_every=..., on_nan=...)", EvalHook: "val_data",
               RunFilesHook: "run_dir", PlotHook: "run_dir", ProgressHook: "verbosity"}

_FAILURES = {TrainingStopped: "stopped by signal", NonFiniteLossError: "stopped: non-finite loss",
             CheckpointError: "failed: checkpoint not written"}


def _end(run: Run, summary: dict[str, Any]) -> None:
    """Hands the summary to every hook, the run files last (they write summary.json once every
    hook has added to it), then tells the library's hooks the files are written (`after_files`:
    the trackers upload them). A hook's error at the end of a finished run (TensorBoard's files on a
    full disk) fails it: the summary says "failed: ..." and the error is raised after every hook
    ran; once a run failed, errors of the hooks' clean-up are not raised over the error that stopped it."""
    run.summary = summary
    run.calls.close()  # background compiles end (their seconds are in the profile)
    error = None
    ending = [functools.partial(h.on_end, run, summary)
              for h in sorted(run.hooks, key=lambda h: isinstance(h, RunFilesHook))]
    ending += [functools.partial(h.after_files, run) for h in run.hooks if isinstance(h, RunHook)]
    for end in ending:
        try:
            end()
        except Exception as e:
            if summary["status"] in ("completed", "stopped early") and error is None:
                summary["status"], error = f"failed: {e}", e
    if error is not None:
        raise error


def _run_hooks(config: TrainConfig, hooks: Sequence[Hook], evaluation: Hook | None, checkpoints: Hook | None,
               progress: Hook, run_dir: Path | None, saved: dict[str, Any], loop: LoopState,
               plots: bool = True) -> list[Hook]:
    """The run's hooks in order: metrics and evaluation first (they fill the epoch record), the
    user's, the profile (the user's ProfileHook, if any, else a default one), early stopping, run
    files in `run_dir` (None: this process writes none; `saved` is config.json), checkpoints,
    plots (unless not `plots`), TensorBoard, the trackers of `config.track`, progress; each
    restored from `loop` when it has saved state."""
    ordered = [
        MetricsHook(config.log_every, config.on_nan),
        *([evaluation] if evaluation else []),
        *hooks,
        *([] if any(isinstance(h, ProfileHook) for h in hooks) else [ProfileHook()]),
        *([EarlyStopping(**dataclasses.asdict(config.early_stopping))] if config.early_stopping.patience else []),
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


def _printing(console: Console | None, verbosity: str, primary: bool) -> tuple[Console, bool]:
    """Where the run prints (nowhere when silent, or in processes other than the first) and whether
    it shows progress."""
    if verbosity == "silent" or not primary:
        return Console(quiet=True), False
    return console or Console(highlight=False, soft_wrap=True), verbosity == "progress"


def _check_arguments(model: Any, config: Any, optimizer: Any, hooks: Any, run_dir: Any, resume: bool,
                     verbosity: str) -> None:
    """Wrong types a user can pass, as one clear line each."""
    if verbosity not in VERBOSITY:
        raise ConfigError(f"verbosity={verbosity!r} must be one of {', '.join(VERBOSITY)}")
    if not isinstance(model, nnx.Module):
        raise ConfigError(f"model must be a flax.nnx.Module; got {type(model).__name__}")
    if not isinstance(config, TrainConfig):
        raise ConfigError(f"config must be a jaxtrain.TrainConfig; got {type(config).__name__}")
    if optimizer is not None and not isinstance(optimizer, optax.GradientTransformation):
        raise ConfigError(f"optimizer must be an optax.GradientTransformation (e.g. optax.adamw(1e-3)); "
                          f"got {type(optimizer).__name__}")
    if isinstance(hooks, Hook) or not all(isinstance(h, Hook) for h in hooks):
        raise ConfigError("hooks must be a list of jaxtrain.Hook objects (subclass Hook or use LambdaHook)")
    for hook in hooks:
        if type(hook) in _CONFIGURED:
            raise ConfigError(f"{type(hook).__name__} is added by the loop itself; set it with "
                              f"{_CONFIGURED[type(hook)]} instead of passing it in hooks")
    if resume not in (False, True, "overwrite"):
        raise ConfigError(f"resume={resume!r} must be False (a new run), True (continue) or 'overwrite'")
    if resume and run_dir is None:
        raise ConfigError("resume needs the run directory of the run to continue (run_dir=...)")
    if config.track and run_dir is None:
        raise ConfigError(f"track={config.track!r} needs a run directory (run_dir=...): the trackers upload its "
                          "files and keep the tracked run's id there")
    check_path_length(run_dir, "run_dir")
