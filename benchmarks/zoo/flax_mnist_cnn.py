"""`flax-mnist-cnn`: the CNN of the Flax NNX MNIST tutorial.

Source: google/flax `docs_nnx/mnist_tutorial.md` (https://flax.readthedocs.io/en/latest/mnist_tutorial.html,
as of the v0.12.8 release; the same model is `examples/mnist/train.py`). Conv 32 → BatchNorm → avg-pool,
Conv 64 → BatchNorm → avg-pool, Linear 256, Linear 10, with Dropout(0.025) after the first conv and
the first linear layer. The dropout layers hold no RNG stream: the tutorial threads an `nnx.Rngs`
through `train_step` into `model(x, rngs)`; here that `Rngs` is built from the step's key.
`optax.adamw(0.005, 0.9)` (the tutorial's learning_rate and "momentum" as b1), batch 32, `@nnx.jit`.
Nothing is shrunk.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.zoo.base import Batch, ZooModel, class_images

SOURCE = "google/flax docs_nnx/mnist_tutorial.md (MNIST tutorial, v0.12.8)"


class CNN(nnx.Module):
    """The tutorial's CNN; BatchNorm trains on batch statistics as built."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm1 = nnx.BatchNorm(32, rngs=rngs)
        self.dropout1 = nnx.Dropout(rate=0.025)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm2 = nnx.BatchNorm(64, rngs=rngs)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(3136, 256, rngs=rngs)  # 7 * 7 * 64 after two 2x2 pools
        self.dropout2 = nnx.Dropout(rate=0.025)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x: jax.Array, rngs: nnx.Rngs | None = None) -> jax.Array:  # (B, 28, 28, 1) -> (B, 10)
        x = self.avg_pool(nnx.relu(self.batch_norm1(self.dropout1(self.conv1(x), rngs=rngs))))  # (B, 14, 14, 32)
        x = self.avg_pool(nnx.relu(self.batch_norm2(self.conv2(x))))  # (B, 7, 7, 64)
        x = x.reshape(x.shape[0], -1)  # (B, 3136)
        x = nnx.relu(self.dropout2(self.linear1(x), rngs=rngs))
        return self.linear2(x)


def loss_fn(model: CNN, batch: Batch, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Softmax cross-entropy with integer labels; also the batch accuracy."""
    logits = model(batch["image"], nnx.Rngs(key))
    loss = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=batch["label"]).mean()
    return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"])}


def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
    """MNIST-shaped: image float32 (28, 28, 1) in [0, 1] (the tutorial divides by 255), label int32."""
    image, label = class_images(n, seed, (28, 28, 1))
    return {"image": image, "label": label}


MODEL = ZooModel(
    name="flax-mnist-cnn",
    source=SOURCE,
    make_model=lambda seed: CNN(rngs=nnx.Rngs(seed)),
    loss_fn=loss_fn,
    make_data=make_data,
    optimizer=lambda: optax.adamw(0.005, 0.9),
    batch_size=32,
    hand_jit="nnx.jit",
)
