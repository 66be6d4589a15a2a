"""Equinox with a tensorflow-datasets iterator of NumPy batches pulled by `next` inside
`for step in range(steps)` (the shape of Equinox's examples that use tfds), the batch scaled with
NumPy and copied, and the loss logged through a callback every step. Written after the scan's
changes for issue 61, as a held-out check."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax


def log_step(step, loss):
    print(f"step {step}: {loss:.4f}")  # scan: host-sync


def compute_loss(model, x, y):
    logits = jax.vmap(model)(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


@eqx.filter_jit
def step_fn(model, opt_state, x, y, optim):
    loss, grads = eqx.filter_value_and_grad(compute_loss)(model, x, y)
    updates, opt_state = optim.update(grads, opt_state, model)
    return eqx.apply_updates(model, updates), opt_state, loss


def train(model, train_iter, steps):
    optim = optax.adam(1e-3)
    opt_state = optim.init(eqx.filter(model, eqx.is_array))
    for step in range(steps):
        images, labels = next(train_iter)
        images = np.reshape(images, (images.shape[0], -1)) / 255.0  # scan: numpy-in-loop
        x, y = jnp.asarray(images), jnp.asarray(labels)  # scan: per-batch-transfer
        model, opt_state, loss = step_fn(model, opt_state, x, y, optim)
        log_step(step, loss)
    return model
