"""Loading a trained model back from a run directory, for prediction in Python."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
from flax import nnx

from jaxtrain._src.checkpoint import Checkpointer, CheckpointError
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.safe_files import read_json_object
from jaxtrain._src.state import split_params

__all__ = ["load", "load_with_step", "read_config"]


def read_config(run_dir: Path) -> dict[str, Any]:
    """A run directory's config.json as a dict.

    Raises:
      ConfigError: the directory or its config.json is missing, or config.json is not a JSON object.
    """
    if not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} does not exist")
    config = read_json_object(run_dir / "config.json")
    if config is None:
        raise ConfigError(f"{run_dir} is not a jaxtrain run directory (no config.json)")
    return config


def load_with_step(run_dir: str | os.PathLike, model: nnx.Module, checkpoint: str = "best",
                   weights: str = "raw") -> tuple[nnx.Module, int]:
    """`(model, step)`: `model` filled with the weights of checkpoint `checkpoint` of `run_dir`
    (`weights="ema"`: their average, from a run trained with `TrainConfig.ema`)."""
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    if checkpoint not in ("best", "latest") and not str(checkpoint).isdigit():
        raise ConfigError(f"checkpoint={checkpoint!r} must be best, latest or a step number")
    if weights not in ("raw", "ema"):
        raise ConfigError(f"weights={weights!r} must be raw or ema")
    ckpt_dir = run_dir / "checkpoints"
    if not ckpt_dir.is_dir():
        raise CheckpointError(f"{run_dir} has no checkpoints/ directory")
    saved = config.get("checkpoint", {})
    ckpt = Checkpointer(ckpt_dir, read_only=True, best_metric=saved.get("best_metric", "val_loss"),
                        best_mode=saved.get("best_mode", "min"))
    try:
        _, params, model_state = split_params(model)
        # best and latest fall back to the next checkpoint that reads when one is unreadable
        which = int(checkpoint) if str(checkpoint).isdigit() else checkpoint
        params, model_state = ckpt.restore_model(params, model_state, which, weights)
        step = ckpt.restored_step
        assert step is not None  # the restore just above succeeded
    finally:
        ckpt.close()
    nnx.update(model, *jax.tree.map(jax.numpy.asarray, (params, model_state)))
    return model, step


def load(run_dir: str | os.PathLike, checkpoint: str = "best", model: nnx.Module | None = None,
         weights: str = "raw") -> nnx.Module:
    """The trained model of a run directory, for prediction in Python.

    Only the model's variables are restored: no optimizer is rebuilt and no data are read.

    Args:
      run_dir: a directory written by `jaxtrain.fit(..., run_dir=...)` or `jaxtrain train`.
      checkpoint: `best` (by the run's best metric), `latest`, or a step number.
      model: a model of the same structure to fill, e.g.
        `nnx.eval_shape(lambda: MyModel(..., rngs=nnx.Rngs(0)))` (no memory is spent on its
        initial weights). A recipe run's model is built by `jaxtrain.tools.runs.load(run_dir)`.
      weights: raw (the trained weights) or ema (their average, from a run with `TrainConfig.ema`).

    Example:
      >>> model = jaxtrain.load("runs/mine", model=nnx.eval_shape(lambda: MLP((8, 16, 3), rngs=nnx.Rngs(0))))
    """
    if model is None:
        recipe = read_config(Path(run_dir)).get("recipe")
        where = (f"; {run_dir} is a run of the recipe {recipe!r}: jaxtrain.tools.runs.load(run_dir) builds its model"
                 if recipe not in (None, "fit") else "")
        raise ConfigError(f"load needs model=, a model of the run's structure to fill, e.g. "
                          f"nnx.eval_shape(lambda: MyModel(..., rngs=nnx.Rngs(0))){where}")
    return load_with_step(run_dir, model, checkpoint, weights)[0]
