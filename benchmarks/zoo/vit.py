"""`tiny-vit`: the Vision Transformer of the Flax NNX ViT example, tiny, on 32x32 images.

Source: google/flax `docs_nnx/examples/vit_training.md` (itself from the JAX AI Stack ViT tutorial and
google-research/vision_transformer `vit_jax/models_vit.py`). Patch embedding by a strided VALID conv,
a zero-initialised class token, truncated-normal(0.02) position embeddings, Dropout, pre-LayerNorm
encoder blocks (`nnx.MultiHeadAttention(..., dropout_rate, broadcast_dropout=False,
deterministic=False, keep_rngs=False)`, MLP up → GELU → Dropout → down → Dropout), a final
LayerNorm and a linear head on the class token. As in the example, `model(x, rngs=...)` receives the
step's randomness and hands it to every dropout (the example passes `rngs.fork()`; here an `Rngs`
built from the step's key); only the MLP dropout also holds a stream of its own, unused, as there.
`@nnx.jit` step.

Shrunk: 32x32x3 images, patch 4 (64 patches + class token), hidden 64, 4 heads, MLP 256 (the
example's 4x ratio), 2 layers, 10 classes; float32 activations (the example computes in bfloat16,
slow on a CPU). The example fine-tunes pretrained weights with SGD (Nesterov momentum 0.8,
lr 1e-3); this model trains from scratch, so its optimizer is AdamW (lr 1e-3, weight decay 0.1, the
ViT paper's pre-training decay). Batch 32 (the example's 64 took ~185 ms a step on 2 cores, a third
of it drawing dropout masks).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.zoo.base import Batch, ZooModel, class_images

SOURCE = "google/flax docs_nnx/examples/vit_training.md (from google-research/vision_transformer)"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The example's ModelConfig, with tiny defaults."""

    num_classes: int = 10
    in_channels: int = 3
    img_size: int = 32
    patch_size: int = 4
    num_layers: int = 2
    num_heads: int = 4
    mlp_dim: int = 256
    hidden_size: int = 64
    dropout_rate: float = 0.1


class TransformerEncoder(nnx.Module):
    """Pre-LayerNorm block: x + MHA(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(config.hidden_size, rngs=rngs)
        self.mha = nnx.MultiHeadAttention(
            num_heads=config.num_heads,
            in_features=config.hidden_size,
            dropout_rate=config.dropout_rate,
            broadcast_dropout=False,
            decode=False,
            deterministic=False,
            keep_rngs=False,
            rngs=rngs,
        )
        self.norm2 = nnx.LayerNorm(config.hidden_size, rngs=rngs)
        self.mlp_up_proj = nnx.Linear(config.hidden_size, config.mlp_dim, rngs=rngs)
        self.mlp_down_proj = nnx.Linear(config.mlp_dim, config.hidden_size, rngs=rngs)
        self.mlp_drop = nnx.Dropout(config.dropout_rate, rngs=rngs)

    def mlp(self, x: jax.Array, rngs: nnx.Rngs | None = None) -> jax.Array:  # (B, N, D) -> (B, N, D)
        x = self.mlp_drop(nnx.gelu(self.mlp_up_proj(x)), rngs=rngs)  # (B, N, mlp_dim)
        return self.mlp_drop(self.mlp_down_proj(x), rngs=rngs)

    def __call__(self, x: jax.Array, rngs: nnx.Rngs | None = None) -> jax.Array:
        x = x + self.mha(self.norm1(x), rngs=rngs)
        return x + self.mlp(self.norm2(x), rngs=rngs)


class VisionTransformer(nnx.Module):
    """Images (B, H, W, C) -> class logits (B, num_classes)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        n_patches = (config.img_size // config.patch_size) ** 2
        self.patch_embeddings = nnx.Conv(
            config.in_channels,
            config.hidden_size,
            kernel_size=(config.patch_size, config.patch_size),
            strides=(config.patch_size, config.patch_size),
            padding="VALID",
            rngs=rngs,
        )
        initializer = jax.nn.initializers.truncated_normal(stddev=0.02)
        self.position_embeddings = nnx.Param(initializer(rngs.params(), (1, n_patches + 1, config.hidden_size)))
        self.dropout = nnx.Dropout(config.dropout_rate)
        self.cls_token = nnx.Param(jnp.zeros((1, 1, config.hidden_size)))
        self.encoder = nnx.Sequential(*[TransformerEncoder(config, rngs=rngs) for _ in range(config.num_layers)])
        self.final_norm = nnx.LayerNorm(config.hidden_size, rngs=rngs)
        self.classifier = nnx.Linear(config.hidden_size, config.num_classes, rngs=rngs)

    def embed(self, x: jax.Array) -> jax.Array:
        patches = self.patch_embeddings(x)  # (B, H/P, W/P, D)
        B = patches.shape[0]
        patches = patches.reshape(B, -1, patches.shape[-1])  # (B, N, D)
        cls_token = jnp.tile(self.cls_token[...], (B, 1, 1))  # (B, 1, D)
        x = jnp.concatenate([cls_token, patches], axis=1)  # (B, N + 1, D)
        return x + self.position_embeddings[...]

    def __call__(self, x: jax.Array, rngs: nnx.Rngs | None = None) -> jax.Array:
        x = self.dropout(self.embed(x), rngs=rngs)
        x = self.encoder(x, rngs=rngs)  # nnx.Sequential hands `rngs` to every block
        x = self.final_norm(x)
        return self.classifier(x[:, 0])  # the class token's features


def loss_fn(model: VisionTransformer, batch: Batch, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The example's `compute_losses_and_logits`, with the step's Rngs made from `key`."""
    logits = model(batch["image"], rngs=nnx.Rngs(key))
    loss = optax.softmax_cross_entropy_with_integer_labels(logits=logits.astype(jnp.float32),
                                                           labels=batch["label"]).mean()
    return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"])}


def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
    """CIFAR-10-shaped: image float32 (32, 32, 3) in [0, 1], label int32."""
    image, label = class_images(n, seed, (32, 32, 3))
    return {"image": image, "label": label}


MODEL = ZooModel(
    name="tiny-vit",
    source=SOURCE,
    make_model=lambda seed: VisionTransformer(ModelConfig(), rngs=nnx.Rngs(seed)),
    loss_fn=loss_fn,
    make_data=make_data,
    optimizer=lambda: optax.adamw(1e-3, weight_decay=0.1),
    batch_size=32,
    hand_jit="nnx.jit",
)
