"""Flax linen with `jax.pmap` over local devices (the shape of older flax/haiku multi-device examples):
each host batch reshaped with NumPy to (devices, batch/devices, ...) and sharded, the step's metrics
fetched with `jax.device_get` every step and averaged with NumPy. Written after the scan's changes for
issue 61, as a held-out check."""

import functools

import jax
import numpy as np
import optax


def loss_fn(params, apply_fn, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(apply_fn(params, x), y).mean()


@functools.partial(jax.pmap, axis_name="batch", static_broadcasted_argnums=(3,))
def p_train_step(params, opt_state, batch, apply_fn):
    loss, grads = jax.value_and_grad(loss_fn)(params, apply_fn, batch["x"], batch["y"])
    grads = jax.lax.pmean(grads, "batch")
    updates, opt_state = optax.sgd(0.1).update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, jax.lax.pmean(loss, "batch")


def shard(xs):
    n = jax.local_device_count()
    return jax.tree.map(lambda x: x.reshape((n, -1) + x.shape[1:]), xs)


def train(params, opt_state, apply_fn, loader):
    losses = []
    for x, y in loader:
        batch = shard({"x": np.float32(x) / 255.0, "y": y})  # scan: numpy-in-loop
        params, opt_state, loss = p_train_step(params, opt_state, batch, apply_fn)
        losses.append(jax.device_get(loss)[0])  # scan: host-sync
    return params, opt_state, float(np.mean(losses))  # scan: clean
