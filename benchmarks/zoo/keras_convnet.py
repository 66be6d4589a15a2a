"""`keras-convnet`: Keras's "Simple MNIST convnet" in Flax NNX.

Source: keras-team/keras-io `examples/vision/mnist_convnet.py` (fchollet). Conv2D 32 3x3 relu →
MaxPooling2D 2 → Conv2D 64 3x3 relu → MaxPooling2D 2 → Flatten → Dropout 0.5 → Dense 10 softmax.
Keras's defaults carried over: "valid" padding, Glorot-uniform kernels, zero biases; the model
outputs probabilities and `categorical_crossentropy` renormalises, clips them to [1e-7, 1 - 1e-7]
and takes the log, as Keras's JAX backend does. Labels are one-hot (`to_categorical`). Adam with
Keras's defaults (lr 1e-3, epsilon 1e-7; Keras adds epsilon to sqrt(v) before bias correction,
optax after, a difference of under 1e-7 in the denominator), batch 128. Keras's JAX backend
compiles a stateless step with `jax.jit`. Nothing is shrunk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.zoo.base import Batch, ZooModel, class_images, one_hot

SOURCE = "keras-team/keras-io examples/vision/mnist_convnet.py (Simple MNIST convnet)"
EPSILON = 1e-7  # keras.config.epsilon()


class ConvNet(nnx.Module):
    """The Sequential model of the example; Dropout holds its own RNG stream."""

    def __init__(self, num_classes: int = 10, *, rngs: nnx.Rngs):
        glorot = nnx.initializers.glorot_uniform()  # Keras's default kernel_initializer
        self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), padding="VALID", kernel_init=glorot, rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), padding="VALID", kernel_init=glorot, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.dense = nnx.Linear(5 * 5 * 64, num_classes, kernel_init=glorot, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, 28, 28, 1) -> class probabilities (B, 10)
        x = nnx.max_pool(nnx.relu(self.conv1(x)), (2, 2), strides=(2, 2))  # (B, 13, 13, 32)
        x = nnx.max_pool(nnx.relu(self.conv2(x)), (2, 2), strides=(2, 2))  # (B, 5, 5, 64)
        x = self.dropout(x.reshape(x.shape[0], -1))  # (B, 1600)
        return nnx.softmax(self.dense(x))


def categorical_crossentropy(target: jax.Array, output: jax.Array) -> jax.Array:
    """Keras's categorical cross-entropy of probabilities `output` (B, K) against one-hot `target`."""
    output = output / jnp.sum(output, axis=-1, keepdims=True)
    output = jnp.clip(output, EPSILON, 1.0 - EPSILON)
    return -jnp.sum(target * jnp.log(output), axis=-1)  # (B,)


def loss_fn(model: ConvNet, batch: Batch, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean categorical cross-entropy; also Keras's "accuracy" (argmax match)."""
    probs = model(batch["image"])
    loss = categorical_crossentropy(batch["label"], probs).mean()
    return loss, {"accuracy": jnp.mean(jnp.argmax(probs, -1) == jnp.argmax(batch["label"], -1))}


def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
    """MNIST-shaped: image float32 (28, 28, 1) in [0, 1], label one-hot float32 (10,)."""
    image, label = class_images(n, seed, (28, 28, 1))
    return {"image": image, "label": one_hot(label, 10)}


MODEL = ZooModel(
    name="keras-convnet",
    source=SOURCE,
    make_model=lambda seed: ConvNet(rngs=nnx.Rngs(seed)),
    loss_fn=loss_fn,
    make_data=make_data,
    optimizer=lambda: optax.adam(1e-3, b1=0.9, b2=0.999, eps=EPSILON),
    batch_size=128,
    hand_jit="jit",
)
