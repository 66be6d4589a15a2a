"""A clean loop for the false-positive count: the dataset put on the device once, each batch
gathered inside the jitted step from device indices, the loss read every `log_every` steps and
once per epoch (the shape of flax's current examples/mnist)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax


def loss_fn(params, x, y):
    return jnp.mean((x @ params - y) ** 2)


tx = optax.adam(1e-3)


@jax.jit
def train_step(params, opt_state, xs, ys, idx):
    x, y = xs[idx], ys[idx]
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss


def main(X, Y, epochs=5, batch_size=64, log_every=100):
    xs, ys = jax.device_put(X), jax.device_put(Y)  # scan: clean
    params = jnp.zeros((X.shape[1], Y.shape[1]))
    opt_state = tx.init(params)
    key, step = jax.random.PRNGKey(0), 0
    for epoch in range(epochs):
        key, sub = jax.random.split(key)
        order = jax.random.permutation(sub, len(X))
        losses = []
        for i in range(len(X) // batch_size):
            idx = jax.lax.dynamic_slice_in_dim(order, i * batch_size, batch_size)  # scan: clean
            params, opt_state, loss = train_step(params, opt_state, xs, ys, idx)
            losses.append(loss)  # scan: clean
            step += 1
            if step % log_every == 0:
                print(step, float(loss))  # scan: clean
        print(epoch, float(jnp.mean(jnp.stack(losses))))  # scan: clean
    return np.asarray(params)  # scan: clean
