"""`unet`: the U-Net flow-matching model of the Flax NNX digits diffusion example.

Source: google/flax `docs_nnx/examples/digits_diffusion_model.md` (also jax-ml/jax-ai-stack
`docs/source/digits_diffusion_model.md`). A U-Net on scikit-learn's 8x8 digits: a sinusoidal time
encoding through a GELU MLP, projected and added at each of four encoder levels; residual blocks of
two (conv 3x3 → LayerNorm → GELU) with a 1x1 shortcut; max-pool down, single-head
`nnx.MultiHeadAttention` at the two deepest levels and in the bridge; nearest-neighbour up-sampling
with skip connections; LayerNorm → GELU → conv out. The loss is conditional flow matching with
logit-normal time sampling, drawing its noise from an `nnx.Rngs` the step passes in (built here
from the step's key). clip_by_global_norm(0.5) then AdamW(5e-4, weight decay 2e-5), `@nnx.jit`.

Shrunk: 16 base features (64), so the widest layers are 256 channels (1024); the 1000-step warmup
and cosine decay are left out (runs here are shorter than the warmup). The example trains on the
~180 images of the digit 2 as one batch; here batches of 64.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.zoo.base import Batch, ZooModel, class_images

SOURCE = "google/flax docs_nnx/examples/digits_diffusion_model.md (U-Net, flow matching)"


class ResBlock(nnx.Module):
    """(conv 3x3 → LayerNorm → GELU) x 2, plus a 1x1-conv shortcut."""

    def __init__(self, in_channels: int, out_channels: int, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(in_channels, out_channels, kernel_size=(3, 3), strides=(1, 1),
                              padding=((1, 1), (1, 1)), rngs=rngs)
        self.norm1 = nnx.LayerNorm(out_channels, rngs=rngs)
        self.conv2 = nnx.Conv(out_channels, out_channels, kernel_size=(3, 3), strides=(1, 1),
                              padding=((1, 1), (1, 1)), rngs=rngs)
        self.norm2 = nnx.LayerNorm(out_channels, rngs=rngs)
        self.shortcut = nnx.Conv(in_channels, out_channels, kernel_size=(1, 1), strides=(1, 1), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        identity = self.shortcut(x)
        x = nnx.gelu(self.norm1(self.conv1(x)))
        x = nnx.gelu(self.norm2(self.conv2(x)))
        return x + identity


class UNet(nnx.Module):
    """`model(x (B, H, W, C), t (B,)) -> velocity (B, H, W, out_channels)`."""

    def __init__(self, in_channels: int, out_channels: int, features: int, time_emb_dim: int = 128, *,
                 rngs: nnx.Rngs):
        self.features = features
        self.time_mlp = nnx.Sequential(
            nnx.Linear(time_emb_dim, time_emb_dim, rngs=rngs),
            nnx.gelu,
            nnx.Linear(time_emb_dim, time_emb_dim, rngs=rngs))
        self.time_proj = nnx.List([nnx.Linear(time_emb_dim, features * m, rngs=rngs) for m in (1, 2, 4, 8)])
        self.down_convs = nnx.List([
            ResBlock(in_channels, features, rngs),
            ResBlock(features, features * 2, rngs),
            ResBlock(features * 2, features * 4, rngs),
            ResBlock(features * 4, features * 8, rngs),
        ])
        self.attention1 = nnx.MultiHeadAttention(num_heads=1, in_features=features * 4, decode=False, rngs=rngs)
        self.attention2 = nnx.MultiHeadAttention(num_heads=1, in_features=features * 8, decode=False, rngs=rngs)
        self.bridge_down = ResBlock(features * 8, features * 16, rngs)
        self.bridge_attention = nnx.MultiHeadAttention(num_heads=1, in_features=features * 16, decode=False,
                                                       rngs=rngs)
        self.bridge_up = ResBlock(features * 16, features * 16, rngs)
        self.up_convs = nnx.List([
            ResBlock(features * 24, features * 8, rngs),
            ResBlock(features * 12, features * 4, rngs),
            ResBlock(features * 6, features * 2, rngs),
            ResBlock(features * 3, features, rngs),
        ])
        self.final_norm = nnx.LayerNorm(features, rngs=rngs)
        self.final_conv = nnx.Conv(features, out_channels, kernel_size=(3, 3), strides=(1, 1),
                                   padding=((1, 1), (1, 1)), rngs=rngs)

    def _apply_attention(self, attn: nnx.MultiHeadAttention, x: jax.Array) -> jax.Array:
        B, H, W, C = x.shape
        out = attn(x.reshape(B, H * W, C)).reshape(B, H, W, C)  # attention over the H*W positions
        return x + out

    def _pos_encoding(self, t: jax.Array, dim: int) -> jax.Array:  # (B,) -> (B, dim)
        half_dim = dim // 2
        emb = jnp.log(10000.0) / (half_dim - 1)
        emb = jnp.exp(jnp.arange(half_dim) * -emb)
        emb = (1000 * t[:, None]) * emb[None, :]  # (B, half_dim)
        return jnp.concatenate([jnp.sin(emb), jnp.cos(emb)], axis=1)

    def _downsample(self, x: jax.Array) -> jax.Array:
        return nnx.max_pool(x, window_shape=(2, 2), strides=(2, 2), padding="SAME")

    def _upsample(self, x: jax.Array, target_size: int) -> jax.Array:
        return jax.image.resize(x, (x.shape[0], target_size, target_size, x.shape[3]), method="nearest")

    def __call__(self, x: jax.Array, t: jax.Array) -> jax.Array:
        t_emb = self.time_mlp(self._pos_encoding(t, 128))  # (B, 128)
        t_embs = [proj(t_emb)[:, None, None, :] for proj in self.time_proj]  # (B, 1, 1, F * 2^i)
        attns = [None, None, self.attention1, self.attention2]
        ds = []
        for conv, t_e, attn in zip(self.down_convs, t_embs, attns):
            inp = self._downsample(ds[-1]) if ds else x
            d = conv(inp)  # level i: (B, H / 2^i, W / 2^i, F * 2^i)
            if attn is not None:
                d = self._apply_attention(attn, d)
            d = d + jnp.broadcast_to(t_e, d.shape)
            ds.append(d)
        b = self.bridge_down(self._downsample(ds[-1]))  # (B, 1, 1, 16F) for 8x8 inputs
        b = self.bridge_up(self._apply_attention(self.bridge_attention, b))
        u = b
        for conv, skip in zip(self.up_convs, reversed(ds)):
            u = conv(jnp.concatenate([self._upsample(u, skip.shape[1]), skip], axis=-1))
        return self.final_conv(nnx.gelu(self.final_norm(u)))


def loss_fn(model: UNet, batch: Batch, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Conditional flow matching: regress x1 - x0 at x_t = (1 - t) x0 + t x1, t = sigmoid(N(0, 1))."""
    rngs = nnx.Rngs(key)
    x1 = batch["image"]
    u = rngs.normal((x1.shape[0],))
    t = jax.nn.sigmoid(u)  # logit-normal time sampling
    t_full = t[:, None, None, None]
    x0 = rngs.normal(x1.shape)
    xt = (1 - t_full) * x0 + t_full * x1
    return jnp.mean((model(xt, t) - (x1 - x0)) ** 2), {}


def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
    """digits-shaped: image float32 (8, 8, 1) in [-1, 1], one digit class as in the example."""
    image, _ = class_images(n, seed, (8, 8, 1), num_classes=1, signal=0.8)
    return {"image": image * 2.0 - 1.0}


MODEL = ZooModel(
    name="unet",
    source=SOURCE,
    make_model=lambda seed: UNet(1, 1, 16, rngs=nnx.Rngs(seed)),
    loss_fn=loss_fn,
    make_data=make_data,
    optimizer=lambda: optax.chain(
        optax.clip_by_global_norm(0.5),
        optax.adamw(learning_rate=5e-4, weight_decay=2e-5, b1=0.9, b2=0.999, eps=1e-8)),
    batch_size=64,
    hand_jit="nnx.jit",
)
