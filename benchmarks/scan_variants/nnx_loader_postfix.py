"""Flax NNX with a tf.data/torch-style loader yielding NumPy dicts, an `nnx.jit` step and tqdm's
postfix updated with the loss every step (the shape of the NNX MNIST tutorial's loop, with the
per-step reads many users add)."""

import jax.numpy as jnp
import optax
from flax import nnx
from tqdm import tqdm


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(784, 256, rngs=rngs)
        self.l2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        return self.l2(nnx.relu(self.l1(x)))


def loss_fn(model, batch):
    logits = model(batch["image"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()


@nnx.jit
def train_step(model, optimizer, batch):
    loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
    optimizer.update(model, grads)
    return loss


def train(model, optimizer, loader, epochs):
    for epoch in range(epochs):
        bar = tqdm(loader, desc=f"epoch {epoch}")
        for raw in bar:
            batch = {
                "image": jnp.array(raw["image"], dtype=jnp.float32).reshape(-1, 784),  # scan: per-batch-transfer
                "label": jnp.array(raw["label"]),  # scan: per-batch-transfer
            }
            loss = train_step(model, optimizer, batch)
            bar.set_postfix(loss=loss.item())  # scan: host-sync


def main(loader):
    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    train(model, optimizer, loader, epochs=2)
