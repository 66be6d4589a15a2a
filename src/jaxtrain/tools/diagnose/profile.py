"""`jaxtrain profile`: train a recipe briefly and say where the time goes.

The recipe trains for one epoch of its real length (so the automatic K is measured as in a real
run) and stops after `seconds` of training, whichever comes first, without validation,
checkpoints or a run directory. `hooks.profile.ProfileHook` measures the run (every run carries the
same profile in its final block); `report.profile_report` gives the verdict. The device's
float32 matmul rate is measured first and recorded for the profiles of later runs (`_src.machine`). With `trace_dir`, a
`jax.profiler` trace of the training is written there for TensorBoard's profile plugin or Perfetto.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from jaxtrain import ConfigError

if TYPE_CHECKING:
    from jaxtrain.tools.recipes.base import Recipe, RecipeConfig

__all__ = ["DEFAULT_SECONDS", "profile_recipe"]

DEFAULT_SECONDS = 20.0  # training profiled at most: long enough for steady state, short enough to wait for


def profile_recipe(recipe: "Recipe", config: "RecipeConfig", seconds: float = DEFAULT_SECONDS,
                   trace_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Trains `recipe` with `config` for one epoch or `seconds` of training, whichever ends first,
    and returns its profile (`summary["profile"]`: shares, FLOP/s, verdict, advice), with the run's
    memory section under "memory" (`summary["memory"]`; None where the process's memory is unknown).

    Raises:
      ConfigError: `seconds` is not positive.
    """
    from jaxtrain import distributed
    from jaxtrain.engine import ProfileBudgetReached, RunOptions, run
    from jaxtrain.hooks import ProfileHook

    if not seconds > 0:
        raise ConfigError(f"--seconds {seconds:g} must be > 0")
    distributed.initialize(config.dist)
    config = dataclasses.replace(
        config, epochs=1, tensorboard=False, checkpoint=dataclasses.replace(config.checkpoint, enabled=False),
        early_stopping=dataclasses.replace(config.early_stopping, patience=0))
    w = recipe.build(config)
    import jax

    from jaxtrain.engine import measure_matmul_rate

    peak = measure_matmul_rate(jax.local_devices()[0])  # recorded too: later runs' profiles read it
    hook = ProfileHook(budget_s=seconds, trace_dir=trace_dir, peak_flop_s=peak)
    try:
        run(w.model, w.loss_fn, w.train, None, config, hooks=[hook, *w.hooks], preprocess=w.preprocess,
            augment=w.augment, verbosity="silent", session=RunOptions(name=recipe.name))
    except ProfileBudgetReached:
        pass  # the time budget ended training mid-epoch; the profile is complete
    finally:
        w.close()
    assert hook.profile is not None  # built at the end of a run that finished or reached the budget
    return {**hook.profile, "memory": hook.memory}
