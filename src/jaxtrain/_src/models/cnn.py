"""A small CNN for 28×28 grey images (the Flax MNIST example's shape), built from layers that
stay fast inside `lax.scan` on XLA:CPU.

XLA:CPU runs `lax.conv_general_dilated` about 9× slower inside a loop body than outside one
(jax-ml/jax#12868; `jaxtrain bench scan`: 786 ms vs 85 ms per training step at batch 128), and
jaxtrain fuses K steps into one `lax.scan`. `Conv2D` therefore computes a stride-1 SAME
convolution as im2col + one matmul, which XLA runs at full speed anywhere (49 ms per step inside
the scan). The
parameters have `nnx.Conv`'s layout and initialisation, and the output equals `lax.conv` (tested).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxtrain._src import remat as remat_lib


def conv2d_same(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """Stride-1 'SAME' 2-D convolution (cross-correlation, as `lax.conv`) via im2col.

    Args:
      x: (B, H, W, C_in) inputs.
      kernel: (kh, kw, C_in, C_out), odd kh and kw.

    Returns:
      (B, H, W, C_out).
    """
    kh, kw, c_in, c_out = kernel.shape
    B, H, W, _ = x.shape
    ph, pw = kh // 2, kw // 2
    xp = jnp.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))  # (B, H+kh-1, W+kw-1, C_in)
    patches = [xp[:, i : i + H, j : j + W, :] for i in range(kh) for j in range(kw)]
    cols = jnp.concatenate(patches, axis=-1).reshape(B * H * W, kh * kw * c_in)  # (i, j, c) order as the kernel
    # One 2-D matmul: XLA:CPU compiles the 2-D form's weight gradient (cols^T dy) to its fast
    # matmul path without transposed copies (see models/gpt.py `_dense`).
    return (cols @ kernel.reshape(kh * kw * c_in, c_out)).reshape(B, H, W, c_out)


def avg_pool_2x2(x: jax.Array) -> jax.Array:
    """2×2 average pooling with stride 2 (H and W even): (B, H, W, C) -> (B, H/2, W/2, C)."""
    B, H, W, C = x.shape
    return x.reshape(B, H // 2, 2, W // 2, 2, C).mean(axis=(2, 4))


class Conv2D(nnx.Module):
    """A stride-1 'SAME' convolution with bias; parameters and init as `nnx.Conv`."""

    def __init__(self, in_features: int, out_features: int, kernel_size: tuple[int, int] = (3, 3), *, rngs: nnx.Rngs):
        if kernel_size[0] % 2 == 0 or kernel_size[1] % 2 == 0:
            raise ValueError(f"kernel_size={kernel_size}: only odd sizes keep 'SAME' padding symmetric")
        init = nnx.initializers.lecun_normal()
        self.kernel = nnx.Param(init(rngs.params(), (*kernel_size, in_features, out_features)))
        self.bias = nnx.Param(jnp.zeros((out_features,)))

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, H, W, C_in) -> (B, H, W, C_out)
        return conv2d_same(x, self.kernel[...]) + self.bias[...]


def _conv_stage(conv: Conv2D, x: jax.Array) -> jax.Array:  # (B, H, W, C_in) -> (B, H/2, W/2, C_out)
    return avg_pool_2x2(jax.nn.relu(conv(x)))


class CNN(nnx.Module):
    """Conv(32, 3×3) → ReLU → avg-pool 2 → Conv(64, 3×3) → ReLU → avg-pool 2 → Dense(256) → ReLU → Dense(10).

    `remat` ("none", "blocks", "full"; see `jaxtrain.remat`) recomputes each conv stage's
    activations in the backward pass instead of keeping them.
    """

    def __init__(self, num_classes: int = 10, *, remat: remat_lib.Mode = "none", rngs: nnx.Rngs):
        self.remat = remat_lib.check_mode(remat)
        self.conv1 = Conv2D(1, 32, rngs=rngs)
        self.conv2 = Conv2D(32, 64, rngs=rngs)
        self.dense1 = nnx.Linear(7 * 7 * 64, 256, rngs=rngs)
        self.dense2 = nnx.Linear(256, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, 28, 28, 1) -> (B, 10)
        x = remat_lib.call(_conv_stage, self.conv1, x, mode=self.remat)  # (B, 14, 14, 32)
        x = remat_lib.call(_conv_stage, self.conv2, x, mode=self.remat)  # (B, 7, 7, 64)
        x = x.reshape(x.shape[0], -1)  # (B, 3136), (h, w, c) order
        return self.dense2(jax.nn.relu(self.dense1(x)))


def _conv_relu(conv: Conv2D, x: jax.Array) -> jax.Array:
    return jax.nn.relu(conv(x))


class SequenceCNN(nnx.Module):
    """Token embedding → `layers` × (Conv1D(k) → ReLU) → mean over positions → Linear(outputs).

    A 1-D convolution over a sequence is `Conv2D` with a (k, 1) kernel on a (B, L, 1, C) view.
    `remat` ("none", "blocks", "full"; see `jaxtrain.remat`) recomputes each conv layer's
    activations in the backward pass instead of keeping them.
    """

    def __init__(self, vocab_size: int, outputs: int, *, embed: int = 32, channels: int = 64, layers: int = 3,
                 kernel: int = 5, remat: remat_lib.Mode = "none", rngs: nnx.Rngs):
        self.remat = remat_lib.check_mode(remat)
        self.embed = nnx.Embed(vocab_size, embed, rngs=rngs)
        widths = [embed] + [channels] * layers
        self.convs = nnx.List([Conv2D(a, b, (kernel, 1), rngs=rngs) for a, b in zip(widths[:-1], widths[1:])])
        self.head = nnx.Linear(channels, outputs, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:  # (B, L) int -> (B, outputs)
        # The table's rows, not `nnx.Embed.__call__`, which casts to float32 whatever the compute dtype.
        x = jnp.take(self.embed.embedding[...], tokens.astype(jnp.int32), axis=0)[:, :, None, :]  # (B, L, 1, E)
        for conv in self.convs:
            x = remat_lib.call(_conv_relu, conv, x, mode=self.remat)  # (B, L, 1, C)
        return self.head(x.mean(axis=(1, 2)))  # (B, outputs)
