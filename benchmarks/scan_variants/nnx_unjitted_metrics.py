"""Flax NNX with the step left un-jitted (a forgotten `@nnx.jit`), batches from a Python list of
NumPy arrays converted in the loop, and `loss.item()` kept in a history list (the shape of NNX
quick-start snippets). Written after the scan's changes for issue 61, as a held-out check."""

import jax.numpy as jnp
import optax
from flax import nnx


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)  # scan: unjitted-grad
    optimizer.update(model, grads)
    return loss


def main(batches, epochs=10):
    model = nnx.Linear(8, 1, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.01), wrt=nnx.Param)
    history = []
    for epoch in range(epochs):
        for xb, yb in batches:
            x = jnp.array(xb)  # scan: per-batch-transfer
            y = jnp.array(yb)  # scan: per-batch-transfer
            loss = train_step(model, optimizer, x, y)
            history.append(loss.item())  # scan: host-sync
        print(epoch, history[-1])  # scan: clean
    return history
