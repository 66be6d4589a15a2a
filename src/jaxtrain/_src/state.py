"""The training state: one pytree holding everything a step reads and writes."""

from __future__ import annotations

from typing import NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import optax
from flax import nnx

Node = TypeVar("Node")


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
    """Splits `model` once into a static graph definition, in training mode, and a `TrainState`.

    Args:
      model: a Flax NNX module with initialised parameters, in either mode (it is left as it is).
      tx: the optax transformation that will update the parameters.
      rng: PRNG key for the per-step keys of training.

    Returns:
      `(graphdef, state)`; `nnx.merge(graphdef, state.params, state.model_state)` rebuilds
      the model in training mode (dropout on, batch statistics updated).
    """
    graphdef, params, model_state = split_params(in_mode(model, train=True))
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        model_state=model_state,
        opt_state=tx.init(params),
        rng=rng,
    )
    return graphdef, state


def split_params(node: Node) -> tuple[nnx.GraphDef[Node], nnx.State, nnx.State]:
    """`nnx.split(node, nnx.Param, ...)`: its graph definition, its `nnx.Param` variables and all its
    other variables (batch-norm statistics, RNG counters, ...)."""
    graphdef, params, rest = nnx.split(node, nnx.Param, ...)  # type: ignore[misc]  # one State per filter: 2 here
    return graphdef, params, rest


def in_mode(model: nnx.Module, train: bool) -> nnx.Module:
    """A view of `model` in training mode (`train`: dropout on, batch statistics updated) or
    evaluation mode, whatever mode `model` is in; it shares `model`'s variables, and `model` itself
    is left in its mode.

    The modes are Flax's `Module.train()` and `Module.eval()`: the `deterministic` and
    `use_running_average` attributes of every module that has them (`nnx.Dropout`, `nnx.BatchNorm`,
    `nnx.MultiHeadAttention`, the user's own modules). `nnx.with_attributes` sets them on a copy
    rather than on `model`, so a model that arrives in evaluation mode (`model.eval()` before `fit`)
    still trains with dropout, and goes back to its caller in evaluation mode.
    """
    return nnx.with_attributes(model, deterministic=not train, use_running_average=not train,
                               raise_if_not_found=False)


def eval_graphdef(model: nnx.Module) -> nnx.GraphDef:
    """The graph definition of `model` in evaluation mode (dropout off, running averages used);
    `model` is left in its mode."""
    return nnx.split(in_mode(model, train=False), nnx.Param, ...)[0]
