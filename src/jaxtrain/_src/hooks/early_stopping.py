"""Early stopping: end training when a metric of the epoch record stops improving."""

from __future__ import annotations

from typing import Any

from jaxtrain._src.config import EARLY_STOPPING_REASON
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.hooks.base import Run, RunHook, missing_metric


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
        self.best: float | None = None
        self.best_epoch = 0
        self.wait = 0

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        known = missing_metric(self.metric, record)
        if known is not None:
            raise ConfigError(f"early stopping metric {self.metric!r} is not in the epoch record; choose one of: "
                              f"{known}")
        if self.metric not in record:  # no evaluation this epoch
            return
        value = record[self.metric]
        sign = 1.0 if self.mode == "min" else -1.0
        if self.best is None or sign * (self.best - value) > self.min_delta:
            self.best, self.best_epoch, self.wait = value, run.epoch, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            run.stop_reason = (f"{EARLY_STOPPING_REASON}{self.metric} did not improve for {self.patience} epochs "
                               f"(best {self.best:.6f} at epoch {self.best_epoch})")

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_epoch": self.best_epoch, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch, self.wait = state["best"], state["best_epoch"], state["wait"]
