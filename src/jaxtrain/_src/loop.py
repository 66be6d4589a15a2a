"""`fit()`: its arguments checked, its run assembled (`assembly.py`), then the training loop.

The parts each live in their own module: the feed (`feeds.py`: where batches come from), the
compiled calls (`calls.py`: K fused steps, compiled ahead of time, and the choice of K), the loop
state (`loop_state.py`) and the hooks (`hooks/`: metrics, evaluation, checkpoints, run files,
TensorBoard, progress). The loop itself, shared with populations, is `training.py`; the pure step
functions are in `step.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any, Sequence

import optax
from flax import nnx
from rich.console import Console

from jaxtrain._src.assembly import RunSpec, Specification, assemble
from jaxtrain._src.checks import check_path_length
from jaxtrain._src.choosers import AutoSteps
from jaxtrain._src.config import TrainConfig
from jaxtrain._src.errors import ConfigError, setting
from jaxtrain._src.extras import EXTRAS, check_installed
from jaxtrain._src.hooks import (
    CheckpointHook,
    EarlyStopping,
    EvalHook,
    Hook,
    MetricsHook,
    PlotHook,
    ProgressHook,
    RunFilesHook,
    TensorBoard,
)
from jaxtrain._src.state import TrainState
from jaxtrain._src.step import Augment, LossFn, Preprocess
from jaxtrain._src.training import Alone, TrainingStopped, train

__all__ = ["FitResult", "RunOptions", "TrainingStopped", "fit", "run"]

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
class RunOptions:
    """What a tool adds to a run beside `fit`'s arguments (the command line's own path), for `run`."""

    name: str = "fit"
    """The run's name in config.json and summary.json (the recipe's, from the command line)."""

    saved_config: Any = None
    """What config.json records (the recipe's whole config); None records the `TrainConfig`."""

    console: Console | None = None
    """Where to print; None makes a new rich Console."""

    auto_steps: AutoSteps = AutoSteps()
    """How the automatic K is measured (when `config.steps_per_call` is 0)."""

    started: float | None = None
    """`time.perf_counter()` when the tool's command began (its imports and data included): a
    deadline (`TrainConfig.max_time`) counts from it; None: from the call of `run`."""

    plots: bool = True
    """Draw the loss curves (curves.png) when the run ends; a sweep's trials leave them to
    `jaxtrain plot RUN_DIR` (drawing takes a few tenths of a second, a trial's seconds)."""


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
        batch means (may be empty; per-sample values are a ConfigError) or `jaxtrain.metrics` counts,
        computed from their sums over the epoch. `key` is fresh every step.
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
        With `config.val_split` (and no val_data) the last rows of `train_data` validate, as Keras's
        `validation_split` takes them.
      config: training settings. `config.step_form` "auto" (the default) times the forms of a call
        (a `lax.scan` loop, unrolled steps, the plain step) on the run's first steps and keeps the
        fastest: XLA:CPU runs some ops, convolutions above all, many times slower in a loop body.
        The decision is kept (in the compile cache, else in ~/.cache/jaxtrain/forms) and reused,
        untimed, by later runs of the same program on this machine: the same seed gives the same
        numbers bit for bit whatever the load (`summary["step_form"]["decided"]`).
      optimizer: your own optax transformation; None builds one from `config.optim`.
        `config.on_nan="skip"` wraps either.
        The logged `lr` is read from its state where it holds one (`optax.inject_hyperparams`
        anywhere in it); else wrap it as `jaxtrain.log_learning_rate(optimizer, schedule)`.
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
      A `FitResult`. With `config.early_stopping.restore_best` the model holds the weights of the
      best epoch (`summary["restored_epoch"]`); `FitResult.state` stays the last step's.

    Raises:
      ConfigError, DataError, CheckpointError: settings, data or checkpoints that cannot work.
      NonFiniteLossError: a training loss became NaN or Inf (with `on_nan="stop"`).
      TrainingStopped: SIGINT or SIGTERM arrived; a checkpoint was saved first.
    """
    return run(model, loss_fn, train_data, val_data, config, optimizer=optimizer, hooks=hooks,
               preprocess=preprocess, augment=augment, run_dir=run_dir, resume=resume, verbosity=verbosity)


def run(
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
    session: RunOptions = RunOptions(),
) -> FitResult:
    """`fit`, with what a tool adds (`RunOptions`): the run's name, the config to save, the console."""
    _check_arguments(model, config, optimizer, hooks, run_dir, resume, verbosity)
    spec = Specification([RunSpec(model, config, run_dir, hooks, optimizer, session.name, session.saved_config)],
                         loss_fn, train_data, val_data, preprocess, augment, resume, verbosity, session.console,
                         session.auto_steps, session.plots, started=session.started)
    with contextlib.ExitStack() as stack:
        assembly = assemble(spec, stack)
        lone, finished = assembly.runs[0], assembly.finished[0]
        if finished is not None:  # a finished run stays finished: nothing trained, compiled or rewritten
            nnx.update(model, lone.state.params, lone.state.model_state)
            return FitResult(model, lone.state, lone.loop.history, finished, lone.run_dir)
        train(lone, Alone(lone, model), assembly.signals)
        return FitResult(model, lone.state, lone.loop.history, lone.summary, lone.run_dir)


_CONFIGURED = {EarlyStopping: "TrainConfig(early_stopping=EarlyStoppingConfig(...))",
               TensorBoard: "TrainConfig(tensorboard=True) and a run_dir",
               CheckpointHook: "TrainConfig(checkpoint=CheckpointConfig(...)) and a run_dir",
               MetricsHook: "TrainConfig(log_every=..., on_nan=...)", EvalHook: "val_data",
               RunFilesHook: "run_dir", PlotHook: "run_dir", ProgressHook: "verbosity"}


def _check_arguments(model: Any, config: Any, optimizer: Any, hooks: Any, run_dir: Any, resume: bool | str,
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
    if optimizer is not None and config.optim.plateau_patience:
        raise ConfigError(f"{setting('optim.plateau_patience', config.optim.plateau_patience)} reduces the learning "
                          "rate of config.optim's optimizer, but optimizer= is your own: put "
                          "optax.contrib.reduce_on_plateau in it (it gets the loss as value=), or drop optimizer=")
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
    for name in (n.strip() for n in config.track.split(",")):
        if name in EXTRAS:  # checked before the run directory is claimed: a missing package leaves nothing behind
            check_installed(name, f"the {name} tracker")
    check_path_length(run_dir, "run_dir")
