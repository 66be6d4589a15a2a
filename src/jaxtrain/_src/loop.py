"""`fit()`: build the parts, then run the training loop over epochs and compiled calls.

The parts each live in their own module: the feed (`feeds.py`: where batches come from), the
compiled calls (`calls.py`: K fused steps, compiled ahead of time, and the choice of K), the loop
state (`loop_state.py`) and the hooks (`hooks/`: metrics, evaluation, checkpoints, run files,
TensorBoard, progress). The loop itself, shared with populations, is `training.py`; the pure step
functions are in `step.py`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import optax
from flax import nnx
from rich.console import Console

from jaxtrain._src.calls import AutoSteps
from jaxtrain._src.checks import check_fit_inputs, check_path_length
from jaxtrain._src.config import TrainConfig, to_dict
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.feeds import adapt_inputs, place_validation
from jaxtrain._src.hooks import (
    CheckpointHook,
    EarlyStopping,
    EvalHook,
    Hook,
    MemoryHook,
    MetricsHook,
    PlotHook,
    ProgressHook,
    Run,
    RunFilesHook,
    TensorBoard,
)
from jaxtrain._src.loop_state import LoopState
from jaxtrain._src.program import build_program
from jaxtrain._src.run_guard import RunGuard
from jaxtrain._src.state import TrainState
from jaxtrain._src.step import Augment, LossFn, Preprocess
from jaxtrain._src.training import Alone, StopSignals, TrainingStopped, run_hooks, step_form_of, summarise_model, train

__all__ = ["FitResult", "Session", "TrainingStopped", "fit", "run_fit"]

VERBOSITY = ("progress", "summary", "result", "silent")


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
        and summaries only), "result" (the final result alone: a few lines of best and final
        metrics and the run directory) or "silent" (nothing; notes go to stderr).

    Returns:
      A `FitResult`.

    Raises:
      ConfigError, DataError, CheckpointError: settings, data or checkpoints that cannot work.
      NonFiniteLossError: a training loss became NaN or Inf (with `on_nan="stop"`).
      TrainingStopped: SIGINT or SIGTERM arrived; a checkpoint was saved first.
    """
    return run_fit(model, loss_fn, train_data, val_data, config, optimizer=optimizer, hooks=hooks,
                   preprocess=preprocess, augment=augment, run_dir=run_dir, resume=resume, verbosity=verbosity)


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
    with StopSignals() as signals, RunGuard(run_dir, saved, resume=resume is True, overwrite=resume == "overwrite",
                                             primary=primary) as guard:
        run_dir, resuming = guard.path, guard.resume
        console, shown, bar = _printing(session.console, verbosity, primary)
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

        progress = ProgressHook(shown, bar=bar, result_only=verbosity == "result")
        calls = program.calls(config.steps_per_call or loop.steps_per_call, session.auto_steps, log=progress.message,
                              form=step_form_of(config, loop))
        eval_batch = config.eval_batch_size or config.batch_size
        evaluation = None if val is None else EvalHook(program.eval_step, val, val_streamed, eval_batch,
                                                       config.eval_every)
        state = program.state
        run = Run(name, config, console, run_dir, jax.local_devices()[0], program.layout, feed, calls, state,
                  int(state.step), loop, [], num_val=evaluation.num_samples if evaluation else 0,
                  resumed_step=int(state.step) if resuming else None, t_start=t_start)
        run.model_summary = summarise_model(model, loss_fn, train_data, preprocess, config.batch_size)
        run.hooks = [memory, *run_hooks(config, hooks, evaluation, checkpoints, progress,
                                         run_dir if primary else None, saved, loop, session.plots)]

        train(run, Alone(run, model), signals)
        return FitResult(model, run.state, loop.history, run.summary, run.run_dir)


_CONFIGURED = {EarlyStopping: "TrainConfig(early_stopping=EarlyStoppingConfig(...))",
               TensorBoard: "TrainConfig(tensorboard=True) and a run_dir",
               CheckpointHook: "TrainConfig(checkpoint=CheckpointConfig(...)) and a run_dir",
               MetricsHook: "TrainConfig(log_every=..., on_nan=...)", EvalHook: "val_data",
               RunFilesHook: "run_dir", PlotHook: "run_dir", ProgressHook: "verbosity"}


def _printing(console: Console | None, verbosity: str, primary: bool) -> tuple[Console, Console, bool]:
    """`(run's console, progress's console, bar)`: where the run's hooks print (nowhere when silent
    or result-only, or in processes other than the first), where the progress hook prints its
    blocks or result, and whether it shows progress."""
    if verbosity == "silent" or not primary:
        return Console(quiet=True), Console(quiet=True), False
    shown = console or Console(highlight=False, soft_wrap=True)
    if verbosity == "result":  # the loss curves' path, the K chooser's decisions, ...: not printed
        return Console(quiet=True), shown, False
    return shown, shown, verbosity == "progress"


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
