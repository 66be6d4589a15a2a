"""The training state: one pytree holding everything a step reads and writes."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx


class TrainState(NamedTuple):
    """Everything needed to continue training, as a pytree of arrays.

    Attributes:
      step: int32 scalar, optimizer steps taken so far.
      params: the model's `nnx.Param` variables (what the optimizer updates).
      model_state: every other model variable (batch-norm statistics, RNG counters, ...).
      opt_state: the optax optimizer state.
      rng: base PRNG key; step `s` uses `fold_in(rng, s)`, so keys do not depend on how steps
        are grouped into compiled calls.
    """

    step: jax.Array
    params: nnx.State
    model_state: nnx.State
    opt_state: optax.OptState
    rng: jax.Array


def init_state(
    model: nnx.Module, tx: optax.GradientTransformation, rng: jax.Array
) -> tuple[nnx.GraphDef, TrainState]:
    """Splits `model` once into a static graph definition and a `TrainState`.

    Args:
      model: a Flax NNX module with initialised parameters.
      tx: the optax transformation that will update the parameters.
      rng: PRNG key for the per-step keys of training.

    Returns:
      `(graphdef, state)`; `nnx.merge(graphdef, state.params, state.model_state)` rebuilds
      the model.
    """
    graphdef, params, model_state = nnx.split(model, nnx.Param, ...)
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        model_state=model_state,
        opt_state=tx.init(params),
        rng=rng,
    )
    return graphdef, state


def eval_graphdef(model: nnx.Module) -> nnx.GraphDef:
    """The graph definition of `model` in evaluation mode (dropout off, running averages on)."""
    model.eval()
    graphdef = nnx.split(model, nnx.Param, ...)[0]
    model.train()
    return graphdef
