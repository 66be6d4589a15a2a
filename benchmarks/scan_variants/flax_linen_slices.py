"""Flax linen MNIST, a TrainState and an epoch of index slices over NumPy arrays (the shape of
flax's examples/mnist before its data moved to the device), with per-batch scaling on the host."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax.training import train_state


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(32, (3, 3))(x))
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(10)(x)


@jax.jit
def train_step(state, images, labels):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def train_epoch(state, train_x, train_y, batch_size, rng):
    steps_per_epoch = len(train_x) // batch_size
    perms = rng.permutation(len(train_x))  # scan: clean
    losses = []
    for i in range(steps_per_epoch):
        idx = perms[i * batch_size:(i + 1) * batch_size]
        images = train_x[idx].astype(np.float32) / 255.0  # scan: numpy-in-loop
        images = jnp.asarray(images)  # scan: per-batch-transfer
        labels = jnp.asarray(train_y[idx])  # scan: per-batch-transfer
        state, loss = train_step(state, images, labels)
        losses.append(float(loss))  # scan: host-sync
    return state, np.mean(losses)  # scan: clean


def main(train_x, train_y, epochs=3):
    model = CNN()
    params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 28, 28, 1)))["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(0.1, 0.9))
    rng = np.random.default_rng(0)
    for epoch in range(epochs):
        state, loss = train_epoch(state, train_x, train_y, 128, rng)
        print(f"epoch {epoch} loss {loss:.4f}")  # scan: clean
    return state
