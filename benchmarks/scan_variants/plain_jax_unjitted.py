"""Plain JAX from a tutorial: an un-jitted gradient step over `range(n_steps)` with slices of NumPy
arrays, each slice converted with `jnp.array`, the loss printed every step (the shape of JAX
tutorial notebooks and of many first scripts)."""

import jax
import jax.numpy as jnp
import numpy as np


def predict(params, x):
    w, b = params
    return jnp.tanh(x @ w + b)


def loss_fn(params, x, y):
    return jnp.mean((predict(params, x) - y) ** 2)


def sgd(params, grads, lr=0.01):
    return [p - lr * g for p, g in zip(params, grads)]  # scan: manual-update


def main(X, Y, batch_size=32, n_steps=500):
    rng = np.random.default_rng(0)
    params = [jnp.asarray(rng.normal(size=(X.shape[1], 1))), jnp.zeros(1)]
    n_batches = len(X) // batch_size
    for step in range(n_steps):
        i = step % n_batches
        xb = (X[i * batch_size:(i + 1) * batch_size] - X.mean(0)) / X.std(0)  # scan: numpy-in-loop
        xb = jnp.array(xb)  # scan: per-batch-transfer
        yb = jnp.array(Y[i * batch_size:(i + 1) * batch_size])  # scan: per-batch-transfer
        loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb)  # scan: unjitted-grad
        params = sgd(params, grads)
        print(step, loss)  # scan: host-sync
    return params
