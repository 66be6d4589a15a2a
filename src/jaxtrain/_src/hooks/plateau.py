"""Reduce on plateau: the learning rate multiplied by a factor when an epoch metric stops improving."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxtrain._src.config import OptimConfig
from jaxtrain._src.hooks.base import Run, RunHook
from jaxtrain._src.hooks.early_stopping import Watch
from jaxtrain._src.optim import ValuesState


class ReduceOnPlateau(RunHook):
    """`OptimConfig.plateau_*`, as Keras's ReduceLROnPlateau and Lightning's scheduler monitor
    behave: after `plateau_patience` evaluated epochs in which `plateau_metric` did not improve by
    more than `plateau_min_delta`, the learning rate becomes `max(lr * plateau_factor,
    plateau_min_lr)`; then `plateau_cooldown` epochs pass before waiting starts again.

    The rate is changed where the optimizer holds it: the `lr` and `min_lr` numbers of its state
    (`optim.with_values`), both multiplied by one scale, so a schedule keeps its shape at a lower
    level and nothing recompiles. Checkpoints save the scale with this hook's state; a resumed run
    puts it back into the restored optimizer state before training. Each reduction is printed and
    recorded in the epoch record as `lr_reduced_to`; the logged `lr` follows it.
    """

    name = "reduce_on_plateau"

    def __init__(self, optim: OptimConfig):
        self.optim = optim
        self.watch = Watch(optim.plateau_metric, optim.plateau_mode, optim.plateau_min_delta, "optim.plateau")
        self.wait, self.cooldown, self.scale = 0, 0, 1.0

    @property
    def lr(self) -> float:
        """The peak learning rate now (the config's times the reductions so far)."""
        return self.optim.lr * self.scale

    def on_start(self, run: Run) -> None:
        if self.scale != 1.0:  # resumed after a reduction: the restored state holds the config's numbers
            run.state = run.state._replace(opt_state=self._scaled(run.state.opt_state))

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        improved = self.watch.improved(run, record)
        if improved is None:  # no evaluation this epoch
            return
        if self.cooldown > 0:
            self.cooldown -= 1
            self.wait = 0
        if improved:
            self.wait = 0
            return
        if self.cooldown > 0:
            return
        self.wait += 1
        if self.wait < self.optim.plateau_patience or self.lr <= self.optim.plateau_min_lr:
            return
        old = self.lr
        self.scale = max(old * self.optim.plateau_factor, self.optim.plateau_min_lr) / self.optim.lr
        self.wait, self.cooldown = 0, self.optim.plateau_cooldown
        run.state = run.state._replace(opt_state=self._scaled(run.state.opt_state))
        record["lr_reduced_to"] = self.lr
        run.console.print(f"epoch {run.epoch}: {self.watch.metric} did not improve for {self.optim.plateau_patience} "
                          f"epochs; learning rate {old:.3g} -> {self.lr:.3g}")

    def _scaled(self, opt_state: Any) -> Any:
        """`opt_state` with each `ValuesState`'s `lr` and `min_lr` set to the config's times `scale`,
        placed as the numbers they replace (float32, rounded once from the host's product)."""
        is_values = lambda x: isinstance(x, ValuesState)  # noqa: E731

        def put(x: Any) -> Any:
            if not is_values(x):
                return x
            values = dict(x.values)
            for name in ("lr", "min_lr"):
                values[name] = jax.device_put(np.float32(getattr(self.optim, name) * self.scale),
                                              values[name].sharding)
            return x._replace(values=values)

        return jax.tree.map(put, opt_state, is_leaf=is_values)

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.watch.best, "best_epoch": self.watch.best_epoch, "wait": self.wait,
                "cooldown": self.cooldown, "scale": self.scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.watch.best, self.watch.best_epoch = state["best"], state["best_epoch"]
        self.wait, self.cooldown, self.scale = state["wait"], state["cooldown"], state["scale"]
