"""`mlp-mixer`: MLP-Mixer from google-research/vision_transformer, in NNX, small.

Source: google-research/vision_transformer `vit_jax/models_mixer.py` (MlpBlock, MixerBlock, MlpMixer)
and `vit_jax/train.py` (`make_update_fn`, the optimizer). A patch "stem" conv (kernel = stride =
patch), mixer blocks (LayerNorm → token-mixing MLP across patches → residual, LayerNorm →
channel-mixing MLP → residual, GELU MLPs), a pre-head LayerNorm, mean over patches and a
zero-initialised head. Labels are one-hot and the loss is -mean(sum(log_softmax * labels)), as in
train.py. Optimizer as train.py: clip_by_global_norm(1.0) then SGD with momentum 0.9 and a bfloat16
momentum accumulator, base lr 0.03. The example pmaps its step (`jax.jit` here).

Shrunk: 32x32x3 images with patch 4 (64 patches), hidden 64, token MLP 32, channel MLP 256, 2 blocks
(Mixer-B/16: 768, 384, 3072, 12 blocks on 224x224 or 384x384), 10 classes; batch 64 without the
example's gradient accumulation (512 in 8 accumulation steps); the 500-step warmup and cosine decay
are left out (runs here are shorter than the warmup).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.zoo.base import Batch, ZooModel, class_images, one_hot

SOURCE = "google-research/vision_transformer vit_jax/models_mixer.py + vit_jax/train.py"


class MlpBlock(nnx.Module):
    """Linear(d, mlp_dim) → GELU → Linear(mlp_dim, d) over the last axis."""

    def __init__(self, in_features: int, mlp_dim: int, *, rngs: nnx.Rngs):
        self.dense1 = nnx.Linear(in_features, mlp_dim, rngs=rngs)
        self.dense2 = nnx.Linear(mlp_dim, in_features, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.dense2(nnx.gelu(self.dense1(x)))


class MixerBlock(nnx.Module):
    """Token mixing across patches, then channel mixing, each with a residual."""

    def __init__(self, num_patches: int, hidden_dim: int, tokens_mlp_dim: int, channels_mlp_dim: int, *,
                 rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(hidden_dim, rngs=rngs)
        self.token_mixing = MlpBlock(num_patches, tokens_mlp_dim, rngs=rngs)
        self.norm2 = nnx.LayerNorm(hidden_dim, rngs=rngs)
        self.channel_mixing = MlpBlock(hidden_dim, channels_mlp_dim, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, N, C) -> (B, N, C)
        y = jnp.swapaxes(self.norm1(x), 1, 2)  # (B, C, N)
        y = jnp.swapaxes(self.token_mixing(y), 1, 2)  # (B, N, C)
        x = x + y
        return x + self.channel_mixing(self.norm2(x))


class MlpMixer(nnx.Module):
    """Images (B, H, W, 3) -> class logits (B, num_classes)."""

    def __init__(self, *, img_size: int, patch: int, num_classes: int, num_blocks: int, hidden_dim: int,
                 tokens_mlp_dim: int, channels_mlp_dim: int, in_channels: int = 3, rngs: nnx.Rngs):
        num_patches = (img_size // patch) ** 2
        self.stem = nnx.Conv(in_channels, hidden_dim, (patch, patch), strides=(patch, patch), padding="VALID",
                             rngs=rngs)
        self.blocks = nnx.List([MixerBlock(num_patches, hidden_dim, tokens_mlp_dim, channels_mlp_dim, rngs=rngs)
                                for _ in range(num_blocks)])
        self.pre_head_layer_norm = nnx.LayerNorm(hidden_dim, rngs=rngs)
        self.head = nnx.Linear(hidden_dim, num_classes, kernel_init=nnx.initializers.zeros, rngs=rngs)

    def __call__(self, inputs: jax.Array) -> jax.Array:
        x = self.stem(inputs)  # (B, H/P, W/P, C)
        x = x.reshape(x.shape[0], -1, x.shape[-1])  # 'n h w c -> n (h w) c'
        for block in self.blocks:
            x = block(x)
        x = jnp.mean(self.pre_head_layer_norm(x), axis=1)  # (B, C)
        return self.head(x)


def loss_fn(model: MlpMixer, batch: Batch, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """train.py's cross-entropy against one-hot labels; also the accuracy."""
    logits = model(batch["image"])
    logp = jax.nn.log_softmax(logits)
    loss = -jnp.mean(jnp.sum(logp * batch["label"], axis=1))
    return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == jnp.argmax(batch["label"], -1))}


def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
    """CIFAR-10-shaped: image float32 (32, 32, 3) in [-1, 1] (vit_jax's preprocessing), label one-hot (10,)."""
    image, label = class_images(n, seed, (32, 32, 3))
    return {"image": image * 2.0 - 1.0, "label": one_hot(label, 10)}


MODEL = ZooModel(
    name="mlp-mixer",
    source=SOURCE,
    make_model=lambda seed: MlpMixer(img_size=32, patch=4, num_classes=10, num_blocks=2, hidden_dim=64,
                                     tokens_mlp_dim=32, channels_mlp_dim=256, rngs=nnx.Rngs(seed)),
    loss_fn=loss_fn,
    make_data=make_data,
    optimizer=lambda: optax.chain(optax.clip_by_global_norm(1.0),
                                  optax.sgd(0.03, momentum=0.9, accumulator_dtype="bfloat16")),
    batch_size=64,
    hand_jit="jit",
)
