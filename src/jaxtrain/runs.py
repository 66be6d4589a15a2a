"""Run directories: train a recipe into one, find the newest, reload its config and model."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import jax
import optax
from flax import nnx
from rich.console import Console

from jaxtrain import data as data_lib
from jaxtrain.checkpoint import Checkpointer, CheckpointError
from jaxtrain.config import from_dict
from jaxtrain.errors import ConfigError
from jaxtrain.loop import FitResult, device_description, epoch_steps, fit
from jaxtrain.optim import build_train_optimizer
from jaxtrain.recipes import Recipe, RecipeConfig, get_recipe
from jaxtrain.state import eval_graphdef, init_state
from jaxtrain.step import make_eval_step, make_evaluate


def train(recipe: Recipe, config: RecipeConfig, run_dir: str | os.PathLike | None = None, resume: bool = False,
          console: Console | None = None) -> FitResult:
    """Builds `recipe`'s workload for `config` and fits it into `run_dir` (a new timestamped
    directory under runs/ by default)."""
    run_dir = run_dir or config.run_dir or f"runs/{recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    w = recipe.build(config)
    return fit(w.model, w.loss_fn, w.train, w.val, config, preprocess=w.preprocess, augment=w.augment,
               name=recipe.name, run_dir=run_dir, resume=resume, quiet=config.quiet, run_config=config,
               console=console)


def latest_run(recipe: str, root: str | os.PathLike = "runs") -> Path:
    """The most recently modified `root/<recipe>-*` directory that has a config.json."""
    runs = [p for p in Path(root).glob(f"{recipe}-*") if (p / "config.json").is_file()]
    if not runs:
        raise ConfigError(f"no run of {recipe} under {root}/ to resume; pass the run directory: --resume RUN_DIR")
    return max(runs, key=lambda p: p.stat().st_mtime)


def load_config(run_dir: str | os.PathLike, recipe: str | None = None) -> tuple[Recipe, RecipeConfig]:
    """The recipe and config a run directory was trained with.

    Raises:
      ConfigError: missing directory or config.json, another recipe than `recipe`, unknown keys.
    """
    path = Path(run_dir) / "config.json"
    if not Path(run_dir).is_dir():
        raise ConfigError(f"run directory {run_dir} does not exist")
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a jaxtrain run directory (no config.json)")
    try:
        values = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    saved = values.pop("recipe", None)
    if recipe is not None and saved != recipe:
        raise ConfigError(f"{run_dir} is a run of recipe {saved!r}, not {recipe!r}")
    found = get_recipe(saved)
    return found, from_dict(type(found.config), values)


def restore_model(run_dir: str | os.PathLike, checkpoint: str = "best") -> tuple[nnx.Module, Any, int]:
    """The model of a run with the weights of checkpoint `checkpoint` (best, latest or a step).

    Returns:
      `(model, workload, step)`.
    """
    recipe, config = load_config(run_dir)
    workload = recipe.build(config)
    spe, _ = epoch_steps(config, data_lib.num_rows(workload.train))
    tx = build_train_optimizer(config, config.epochs * spe)
    _, template = init_state(workload.model, tx, jax.random.key(config.seed))
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        raise CheckpointError(f"{run_dir} has no checkpoints/ directory")
    ckpt = Checkpointer(ckpt_dir, read_only=True, best_metric=config.checkpoint.best_metric,
                        best_mode=config.checkpoint.best_mode)
    try:
        if checkpoint in ("best", "latest"):
            step = ckpt.best_step() if checkpoint == "best" else ckpt.latest_step()
        elif checkpoint.isdigit():
            step = int(checkpoint)
        else:
            raise ConfigError(f"checkpoint={checkpoint!r} must be best, latest or a step number")
        state, _ = ckpt.restore(template, step)
    finally:
        ckpt.close()
    nnx.update(workload.model, state.params, state.model_state)
    return workload.model, workload, step


def load(run_dir: str | os.PathLike, checkpoint: str = "best") -> nnx.Module:
    """The trained model of a run directory, for prediction in Python.

    Args:
      run_dir: a directory written by `jaxtrain train` (or `runs.train`).
      checkpoint: `best` (by the run's best metric), `latest`, or a step number.
    """
    return restore_model(run_dir, checkpoint)[0]


def evaluate(run_dir: str | os.PathLike, checkpoint: str = "best") -> dict[str, Any]:
    """Validation metrics of checkpoint `checkpoint` of a run, computed like `fit` does."""
    recipe, config = load_config(run_dir)
    model, workload, step = restore_model(run_dir, checkpoint)
    if workload.val is None:
        raise ConfigError(f"recipe {recipe.name} with this config has no validation data to evaluate on")
    val = workload.val.read(0, len(workload.val)) if data_lib.is_source(workload.val) else workload.val
    n = data_lib.num_samples(val)
    _, state = init_state(model, optax.identity(), jax.random.key(config.seed))
    eval_step = make_eval_step(eval_graphdef(model), workload.loss_fn, workload.preprocess)
    metrics = jax.jit(make_evaluate(eval_step, n, min(config.eval_batch_size or config.batch_size, n)))(
        state, jax.tree.map(jax.numpy.asarray, val)
    )
    return {"recipe": recipe.name, "step": step, "samples": n, "device": device_description(jax.devices()[0]),
            **{f"val_{k}": float(v) for k, v in jax.device_get(metrics).items()}}


def sample_text(
    run_dir: str | os.PathLike,
    prompt: str = "\n",
    length: int = 500,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    checkpoint: str = "best",
) -> str:
    """Text generated by a trained text model (`char-gpt`): `prompt` followed by `length` sampled
    characters; the same seed gives the same text."""
    from jaxtrain.models.gpt import sample

    if not prompt:
        raise ConfigError("the prompt is empty; pass at least one character, e.g. --prompt $'\\n'")
    if length < 1:
        raise ConfigError(f"length={length} must be >= 1")
    recipe, _ = load_config(run_dir)
    model, workload, _ = restore_model(run_dir, checkpoint)
    if workload.tokenizer is None:
        raise ConfigError(f"{run_dir} is a run of {recipe.name}, which does not generate text; use a char-gpt run")
    ids = workload.tokenizer.encode(prompt)
    out = sample(model, jax.numpy.asarray(ids), length, jax.random.key(seed), temperature, top_k)
    return workload.tokenizer.decode(jax.device_get(out))
