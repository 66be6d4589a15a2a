"""The hand-written training loops of the zoo's sources, generic over a `ZooModel`.

`hand_jit == "nnx.jit"` (Flax's NNX tutorials): `nnx.Optimizer(model, tx, wrt=nnx.Param)` and an
`@nnx.jit` step over the NNX objects, `nnx.value_and_grad` inside, updates in place; no donation, as
the MNIST tutorial (the ViT and miniGPT examples donate model and optimizer).

`hand_jit == "jit"` (Flax's Linen-era examples, nanoGPT-style JAX loops): `nnx.split` once into
(graphdef, params, rest); a `jax.jit` step over (params, rest, opt_state, batch, key) that merges
the model, differentiates the loss with respect to params, returns the new rest (BatchNorm
statistics, RNG counts, custom Variables) and applies the optax update; the three states are donated.

Both slice batches on the host in the Python loop (rows i*B:(i+1)*B of step i, wrapping around the
data) and give step i the key `fold_in(key(seed), i)`.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import jax
import numpy as np
import optax
from flax import nnx

from benchmarks.zoo.base import Batch, ZooModel

Step = Callable[[Batch, jax.Array], jax.Array]  # (batch, key) -> loss, updating the model's training state


def step_keys(seed: int, steps: int) -> jax.Array:
    """Step i's key, fold_in(key(seed), i), for i < steps: a (steps,) key array."""
    base = jax.random.key(seed)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(np.arange(steps, dtype=np.uint32))


def _nnx_jit_step(zm: ZooModel, model: nnx.Module) -> tuple[Step, Callable[[], None]]:
    optimizer = nnx.Optimizer(model, zm.optimizer(), wrt=nnx.Param)

    @nnx.jit
    def train_step(model: nnx.Module, optimizer: nnx.Optimizer, batch: Batch, key: jax.Array) -> jax.Array:
        grad_fn = nnx.value_and_grad(zm.loss_fn, has_aux=True)
        (loss, _), grads = grad_fn(model, batch, key)
        optimizer.update(model, grads)  # in place
        return loss

    return (lambda batch, key: train_step(model, optimizer, batch, key)), (lambda: None)


def _jit_step(zm: ZooModel, model: nnx.Module) -> tuple[Step, Callable[[], None]]:
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = zm.optimizer()
    state = [params, rest, tx.init(params)]

    def train_step(params: nnx.State, rest: nnx.State, opt_state: optax.OptState, batch: Batch, key: jax.Array):
        def loss_of(params: nnx.State) -> tuple[jax.Array, nnx.State]:
            # copy: merge would reuse the State's Variables, created at the jit's trace level, and
            # Flax refuses to mutate them (RNG counts, BatchNorm statistics) under the grad's trace.
            m = nnx.merge(graphdef, params, rest, copy=True)
            loss, _ = zm.loss_fn(m, batch, key)
            return loss, nnx.split(m, nnx.Param, ...)[2]  # rest after the forward pass

        (loss, rest), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), rest, opt_state, loss

    compiled = jax.jit(train_step, donate_argnums=(0, 1, 2))

    def step(batch: Batch, key: jax.Array) -> jax.Array:
        *state[:], loss = compiled(*state, batch, key)
        return loss

    def write_back() -> None:  # the split arrays were donated: give the model the trained ones
        nnx.update(model, state[0], state[1])

    return step, write_back


def make_step(zm: ZooModel, model: nnx.Module) -> tuple[Step, Callable[[], None]]:
    """`(step, write_back)`: the source's compiled step over `model`, and the call that leaves the
    trained state in `model` (needed after "jit" steps, whose split state was donated)."""
    return (_nnx_jit_step if zm.hand_jit == "nnx.jit" else _jit_step)(zm, model)


def hand_losses(zm: ZooModel, model: nnx.Module, batches: Sequence[Batch],
                keys: jax.Array | None = None) -> np.ndarray:
    """Trains `model` in place on `batches` in order; the loss of each step, float32 (len(batches),).

    `keys[i]` is step i's key (default: `step_keys(0, len(batches))`). To compare with
    `jaxtrain.fit`, start both from the same weights and batches and pass fit's step keys.
    """
    keys = step_keys(0, len(batches)) if keys is None else keys
    step, write_back = make_step(zm, model)
    losses = [step(batch, keys[i]) for i, batch in enumerate(batches)]
    write_back()
    return np.asarray(jax.device_get(losses), np.float32)


def hand_loop(zm: ZooModel, data: dict[str, np.ndarray], steps: int, seed: int) -> tuple[list[float], float]:
    """The source's loop for `steps` steps from `zm.make_model(seed)`: (losses, seconds per step).

    Seconds per step are timed from the end of the first (compiling) step to the last step's
    result, so they exclude compilation; NaN with fewer than 2 steps.
    """
    model = zm.make_model(seed)
    B = zm.batch_size
    n_batches = len(next(iter(data.values()))) // B
    if n_batches < 1:
        raise ValueError(f"{zm.name}: {len(next(iter(data.values())))} rows are fewer than one batch of {B}")
    step, write_back = make_step(zm, model)
    keys = step_keys(seed, steps)
    losses: list[jax.Array] = []
    start = 0.0
    for i in range(steps):
        j = i % n_batches
        batch = {k: v[j * B:(j + 1) * B] for k, v in data.items()}
        losses.append(step(batch, keys[i]))
        if i == 0:
            jax.block_until_ready(losses[0])
            start = time.perf_counter()
    jax.block_until_ready(losses[-1])
    seconds = (time.perf_counter() - start) / (steps - 1) if steps > 1 else float("nan")
    write_back()
    return [float(x) for x in jax.device_get(losses)], seconds
