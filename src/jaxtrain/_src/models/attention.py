"""Causal self-attention, softmax(q·kᵀ/√hs + causal mask)·v, by the fastest path for the device.

`causal_attention(q, k, v)` takes and returns the (B, T, nh, hs) layout of
`jax.nn.dot_product_attention` and picks its implementation when traced:

- GPU, bf16/fp16 inputs: cuDNN's fused attention (`jax.nn.dot_product_attention(...,
  implementation="cudnn")`; flash attention, memory linear in T). cuDNN needs half precision and
  head sizes it supports; in float32, or when cuDNN refuses the shapes or is missing, the XLA
  implementation runs instead.
- Otherwise (CPU): `heads_major`, the path `jaxtrain bench attention` measured fastest on XLA:CPU
  (forward + backward at T = 64, 256 and 1024; figures in docs/benchmarks.md): the heads moved
  before the sequence once, two batched matmuls and a masked softmax between them.

Every path upcasts the scores to float32 for the softmax (bf16 scores lose the small
probabilities) and returns the input dtype. The paths are also callable by name (`PATHS`), for
the benchmark and the tests.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

_HALF = (jnp.bfloat16, jnp.float16)


def heads_major(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Einsum attention in the (B, nh, T, hs) layout: one transpose per input, batched matmuls."""
    hs = q.shape[-1]
    q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))  # (B, nh, T, hs)
    scores = jnp.einsum("bhtd,bhsd->bhts", q, k, preferred_element_type=jnp.float32)  # (B, nh, T, T) f32
    probs = _causal_softmax(scores, hs).astype(v.dtype)
    y = jnp.einsum("bhts,bhsd->bhtd", probs, v)  # (B, nh, T, hs)
    return y.transpose(0, 2, 1, 3)  # (B, T, nh, hs)


def heads_minor(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Einsum attention straight on (B, T, nh, hs): XLA chooses where the heads go."""
    hs = q.shape[-1]
    scores = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32)  # (B, nh, T, T) f32
    probs = _causal_softmax(scores, hs).astype(v.dtype)
    return jnp.einsum("bhts,bshd->bthd", probs, v)  # (B, T, nh, hs)


def xla(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """`jax.nn.dot_product_attention`'s XLA implementation (a vmap over heads of the same math)."""
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")


def cudnn(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """cuDNN's fused (flash) attention: GPU only, bf16/fp16 only."""
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")


def _causal_softmax(scores: jax.Array, hs: int) -> jax.Array:
    """(B, nh, T, S) float32 scores q·kᵀ -> softmax(scores/√hs) over keys <= each query, float32."""
    T, S = scores.shape[-2:]
    causal = jnp.tril(jnp.ones((T, S), bool))  # (T, S): query t sees keys 0..t
    scores = scores * np.float32(1.0 / math.sqrt(hs))  # in float32, as jax.nn.dot_product_attention
    # The same finite fill as jax.nn.dot_product_attention: exp() of it is 0 and its gradient finite.
    scores = jnp.where(causal, scores, np.float32(-0.7 * np.finfo(np.float32).max))
    return jax.nn.softmax(scores, axis=-1)


PATHS: dict[str, Callable[[jax.Array, jax.Array, jax.Array], jax.Array]] = {
    "heads_major": heads_major,
    "heads_minor": heads_minor,
    "xla": xla,
    "cudnn": cudnn,
}
CPU_PATH = "heads_major"
"""The CPU path `causal_attention` takes (measured fastest by `jaxtrain bench attention`)."""


def choose_path(dtype: jnp.dtype, platform: str | None = None) -> str:
    """The name of the path `causal_attention` takes for inputs of `dtype` on `platform`
    (default: JAX's default backend)."""
    platform = platform or jax.default_backend()
    if platform == "gpu":
        return "cudnn" if jnp.dtype(dtype) in _HALF else "xla"
    return CPU_PATH


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal multi-head attention with scale 1/√hs.

    Args:
      q, k, v: (B, T, nh, hs), one dtype.

    Returns:
      (B, T, nh, hs) in the inputs' dtype; the softmax runs in float32.
    """
    path = choose_path(q.dtype)
    if path == "cudnn":
        try:  # cuDNN checks its version, the GPU and the shapes while tracing
            return cudnn(q, k, v)
        except (NotImplementedError, RuntimeError, ValueError):
            path = "xla"
    return PATHS[path](q, k, v)
