"""Early stopping and restoring the best weights: watching a metric of the epoch record for the best epoch."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxtrain._src.config import EARLY_STOPPING_REASON
from jaxtrain._src.errors import ConfigError, JaxtrainError
from jaxtrain._src.hooks.base import Run, RunHook, missing_metric
from jaxtrain._src.report.notes import note


class Watch:
    """The best value of an epoch metric so far, and its epoch: what early stopping, reduce on
    plateau and restoring the best weights share (`what` names the setting in the message of a
    metric the record lacks)."""

    def __init__(self, metric: str, mode: str, min_delta: float, what: str):
        self.metric, self.mode, self.min_delta, self.what = metric, mode, min_delta, what
        self.best: float | None = None
        self.best_epoch = 0
        self.best_step: int | None = None  # an epoch number can recur (a deadline's stop mid-epoch, then a resume)

    def improved(self, run: Run, record: dict[str, Any]) -> bool | None:
        """Whether this epoch improved on the best by more than `min_delta` (it becomes the best);
        None when the epoch has no value (no evaluation that epoch, see `eval_every`)."""
        known = missing_metric(self.metric, record)
        if known is not None:
            raise ConfigError(f"{self.what} metric {self.metric!r} is not in the epoch record; choose one of: {known}")
        if self.metric not in record:
            return None
        value, sign = record[self.metric], 1.0 if self.mode == "min" else -1.0
        if self.best is None or sign * (self.best - value) > self.min_delta:
            self.best, self.best_epoch, self.best_step = value, run.epoch, run.step
            return True
        return False


class EarlyStopping(RunHook):
    """Stops training after `patience` epochs in which `metric` did not improve by more than
    `min_delta` (lower is better with mode "min", higher with "max").

    The run then ends with status "stopped early" in summary.json; the checkpoint hook keeps the
    best checkpoint by its own `best_metric` as always. Epochs without the metric (no evaluation
    that epoch, see `eval_every`) are not counted.
    """

    name = "early_stopping"

    def __init__(self, metric: str = "val_loss", patience: int = 5, mode: str = "min", min_delta: float = 0.0):
        if not isinstance(patience, int) or patience < 1:
            raise ConfigError(f"EarlyStopping patience={patience!r} must be an integer >= 1")
        if mode not in ("min", "max"):
            raise ConfigError(f"EarlyStopping mode={mode!r} must be min or max")
        if not min_delta >= 0:
            raise ConfigError(f"EarlyStopping min_delta={min_delta!r} must be >= 0")
        self.metric, self.patience, self.mode, self.min_delta = metric, patience, mode, min_delta
        self.watch = Watch(metric, mode, min_delta, "early stopping")
        self.wait = 0

    @property
    def best(self) -> float | None:
        return self.watch.best

    @property
    def best_epoch(self) -> int:
        return self.watch.best_epoch

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        improved = self.watch.improved(run, record)
        if improved is None:
            return
        self.wait = 0 if improved else self.wait + 1
        if self.wait >= self.patience:
            run.stop_reason = (f"{EARLY_STOPPING_REASON}{self.metric} did not improve for {self.patience} epochs "
                               f"(best {self.best:.6f} at epoch {self.best_epoch})")

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.watch.best, self.watch.best_epoch, self.wait = state["best"], state["best_epoch"], state["wait"]


class RestoreBest(RunHook):
    """Keeps a copy of the weights (parameters and model state such as batch-norm statistics) of
    the epoch with the best `metric`, made on the device when that epoch ends, so that the model
    ends with them (`EarlyStoppingConfig.restore_best`, Keras's `restore_best_weights`; `fit`'s
    end applies `best`). A resumed run whose best epoch came before the resume reads that epoch's
    weights from its checkpoint when one is kept (`checkpoint.keep_best` on the same metric keeps it)."""

    name = "restore_best"

    def __init__(self, metric: str = "val_loss", mode: str = "min", min_delta: float = 0.0):
        self.watch = Watch(metric, mode, min_delta, "restore_best")
        self._weights: tuple[int, Any, Any] | None = None  # (epoch, params, model_state)
        self._weights_step: int | None = None  # the step they are of

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        if self.watch.improved(run, record):  # copies: the next call donates the state's buffers
            self._weights = (run.epoch, jax.tree.map(jnp.copy, run.state.params),
                             jax.tree.map(jnp.copy, run.state.model_state))
            self._weights_step = run.step

    def best(self, run: Run) -> tuple[int, Any, Any] | None:
        """`(epoch, params, model_state)` of the best epoch, or None (no epoch had the metric, or
        its weights are neither in memory nor in a checkpoint: noted)."""
        epoch = self.watch.best_epoch
        if self.watch.best is None:
            note(f"restore_best: no epoch had {self.watch.metric!r}; the model keeps the last weights")
            return None
        if self._weights is not None and self._weights_step == self.watch.best_step:
            return self._weights
        state = self._from_checkpoint(run, epoch)
        if state is None:
            note(f"restore_best: the best epoch ({epoch}) came before the resume and no checkpoint of it is kept; "
                 "the model keeps the last weights")
            return None
        return epoch, state.params, state.model_state

    def _from_checkpoint(self, run: Run, epoch: int) -> Any:
        from jaxtrain._src.hooks.checkpointing import CheckpointHook  # the saved state of that epoch, if kept
        from jaxtrain._src.run_guard import checkpoint_steps

        steps = [r["step"] for r in run.loop.history if r.get("epoch") == epoch]
        if self.watch.best_step is not None:  # the best record's own step (its epoch's number may recur)
            steps = [self.watch.best_step]
        hooks = [h for h in run.hooks if isinstance(h, CheckpointHook)]
        if not steps or not hooks or steps[-1] not in checkpoint_steps(hooks[0].ckpt.directory):
            return None
        try:
            return hooks[0].restore(run.state, run.layout.state_shardings(run.state), step=steps[-1])[0]
        except JaxtrainError:
            return None

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.watch.best, "best_epoch": self.watch.best_epoch, "best_step": self.watch.best_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.watch.best, self.watch.best_epoch = state["best"], state["best_epoch"]
        self.watch.best_step = state.get("best_step")  # absent from runs saved before it was kept
