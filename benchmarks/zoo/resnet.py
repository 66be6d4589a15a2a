"""`resnet-bn`: the ResNet-18 of Flax's ImageNet example, in NNX, on 32x32 images.

Source: google/flax `examples/imagenet/models.py` (ResNetBlock, ResNet, ResNet18) and
`examples/imagenet/train.py` (loss with L2 weight penalty, SGD). The layout is ResNet18's: a 7x7/2
stem conv (no bias) → BatchNorm(momentum 0.9, eps 1e-5) → relu → 3x3/2 max-pool, then stages
[2, 2, 2, 2] of basic blocks (the second BatchNorm of each block starts at scale 0; a 1x1
projection where the shape changes), global mean pool, Dense. Default (lecun-normal) conv init.
The loss adds 0.5 * 1e-4 * sum of squares of every parameter with ndim > 1, as the example does.
SGD with Nesterov momentum 0.9 at the example's linear scaling rule, lr = 0.1 * batch / 256.

Shrunk: 32x32x3 inputs and 10 classes (ImageNet: 224x224, 1000), 16 base filters (64); the
example's 5-epoch warmup and cosine decay are left out (runs here are shorter than the warmup);
the example pmaps its step, so its hand loop here is `jax.jit`.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.zoo.base import Batch, ZooModel, class_images

SOURCE = "google/flax examples/imagenet/models.py (ResNet18) + examples/imagenet/train.py"
BATCH_SIZE = 128  # the example's config.batch_size
WEIGHT_DECAY = 1e-4  # train.py's L2 penalty coefficient


class ResNetBlock(nnx.Module):
    """Two 3x3 convs with BatchNorm; a 1x1 conv + BatchNorm on the residual where shapes differ."""

    def __init__(self, in_filters: int, filters: int, strides: tuple[int, int] = (1, 1), *, rngs: nnx.Rngs):
        conv = partial(nnx.Conv, use_bias=False, rngs=rngs)
        norm = partial(nnx.BatchNorm, momentum=0.9, epsilon=1e-5, rngs=rngs)
        self.conv1 = conv(in_filters, filters, (3, 3), strides)
        self.norm1 = norm(filters)
        self.conv2 = conv(filters, filters, (3, 3))
        self.norm2 = norm(filters, scale_init=nnx.initializers.zeros_init())
        # Linen decides at call time (residual.shape != y.shape); NNX builds the projection up front.
        if strides != (1, 1) or in_filters != filters:
            self.conv_proj = conv(in_filters, filters, (1, 1), strides)
            self.norm_proj = norm(filters)
        else:
            self.conv_proj = self.norm_proj = None

    def __call__(self, x: jax.Array) -> jax.Array:
        residual = x
        y = nnx.relu(self.norm1(self.conv1(x)))
        y = self.norm2(self.conv2(y))
        if self.conv_proj is not None:
            residual = self.norm_proj(self.conv_proj(residual))
        return nnx.relu(residual + y)


class ResNet(nnx.Module):
    """ResNet v1.5 with basic blocks; `stage_sizes` [2, 2, 2, 2] is ResNet18."""

    def __init__(self, stage_sizes: tuple[int, ...], num_classes: int, num_filters: int = 64,
                 in_channels: int = 3, *, rngs: nnx.Rngs):
        self.conv_init = nnx.Conv(in_channels, num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)],
                                  use_bias=False, rngs=rngs)
        self.bn_init = nnx.BatchNorm(num_filters, momentum=0.9, epsilon=1e-5, rngs=rngs)
        blocks = []
        in_filters = num_filters
        for i, block_size in enumerate(stage_sizes):
            for j in range(block_size):
                strides = (2, 2) if i > 0 and j == 0 else (1, 1)
                blocks.append(ResNetBlock(in_filters, num_filters * 2**i, strides, rngs=rngs))
                in_filters = num_filters * 2**i
        self.blocks = nnx.List(blocks)
        self.head = nnx.Linear(in_filters, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, H, W, 3) -> (B, num_classes)
        x = nnx.relu(self.bn_init(self.conv_init(x)))  # (B, H/2, W/2, F)
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")  # (B, H/4, W/4, F)
        for block in self.blocks:
            x = block(x)  # (B, H/32, W/32, 8F) after the last stage
        x = jnp.mean(x, axis=(1, 2))  # (B, 8F)
        return self.head(x)


def loss_fn(model: ResNet, batch: Batch, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Cross-entropy + 0.5 * 1e-4 * ||W||^2 over weights with ndim > 1 (train.py's weight penalty)."""
    logits = model(batch["image"])
    loss = optax.softmax_cross_entropy(logits, jax.nn.one_hot(batch["label"], logits.shape[-1])).mean()
    weight_l2 = sum(jnp.sum(w**2) for w in jax.tree.leaves(nnx.state(model, nnx.Param)) if w.ndim > 1)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
    return loss + WEIGHT_DECAY * 0.5 * weight_l2, {"cross_entropy": loss, "accuracy": accuracy}


def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
    """CIFAR-10-shaped: image float32 (32, 32, 3) standardised per channel, label int32."""
    image, label = class_images(n, seed, (32, 32, 3))
    return {"image": (image - 0.5) / 0.25, "label": label}


MODEL = ZooModel(
    name="resnet-bn",
    source=SOURCE,
    make_model=lambda seed: ResNet((2, 2, 2, 2), num_classes=10, num_filters=16, rngs=nnx.Rngs(seed)),
    loss_fn=loss_fn,
    make_data=make_data,
    optimizer=lambda: optax.sgd(0.1 * BATCH_SIZE / 256, momentum=0.9, nesterov=True),
    batch_size=BATCH_SIZE,
    hand_jit="jit",
)
