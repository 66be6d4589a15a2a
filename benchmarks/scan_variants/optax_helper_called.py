"""Optax with the per-batch work in a helper the loop calls (the shape of scripts that wrap "one
batch" in a function): the helper converts the batch, calls the jitted update and returns the loss
as a Python float."""

import functools

import jax
import jax.numpy as jnp
import optax


def mse(params, x, y):
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


optimizer = optax.sgd(1e-2, momentum=0.9)


@functools.partial(jax.jit, donate_argnums=(0, 1))
def update(params, opt_state, x, y):
    value, grads = jax.value_and_grad(mse)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value


def train_one_batch(params, opt_state, xb, yb):
    xb = jnp.asarray(xb, dtype=jnp.float32)  # scan: per-batch-transfer
    yb = jax.device_put(yb)  # scan: per-batch-transfer
    params, opt_state, value = update(params, opt_state, xb, yb)
    return params, opt_state, float(value)  # scan: host-sync


def fit(params, batches, epochs):
    opt_state = optimizer.init(params)
    for epoch in range(epochs):
        total = 0.0
        for xb, yb in batches():
            params, opt_state, value = train_one_batch(params, opt_state, xb, yb)
            total += value
        print(epoch, total)  # scan: clean
    return params
