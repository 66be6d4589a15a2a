"""`jaxtrain bench attention`: which causal-attention path is fastest here, at which length.

Times forward + backward (`jax.value_and_grad` of a scalar of the output, with respect to q, k
and v; jitted) of each path of `jaxtrain.models.attention` on random (B, T, nh, hs) inputs with the
baby GPT's heads (nh = 4, hs = 32) at T = 64, 256 and 1024: `heads_major` (einsum in a
(B, nh, T, hs) layout), `heads_minor` (einsum straight on (B, T, nh, hs)), `xla`
(`jax.nn.dot_product_attention`'s XLA implementation) and, on a GPU with bf16/fp16 inputs,
`cudnn`. Calls of the paths are interleaved; each figure is the median of `--repeats`. The table
also names the path `causal_attention` takes here, and the fastest one measured.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import TYPE_CHECKING, Literal

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # JAX is imported where it runs: `jaxtrain bench attention --help` needs none
    import jax
    import jax.numpy as jnp

N_HEAD, HEAD_SIZE = 4, 32  # the baby GPT's: 4 heads of 128 / 4
LENGTHS = {64: 12, 256: 12, 1024: 4}  # T -> batch (12 as the baby; 4 keeps T = 1024 near a second per call)


@dataclasses.dataclass(frozen=True)
class AttentionBenchConfig:
    """Settings of the attention benchmark."""

    repeats: int = 7
    """Interleaved timed calls of each path per length (the median is reported)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Input dtype (cuDNN, on a GPU, needs bfloat16)."""
    quick: bool = False
    """A cut-down run for smoke tests (T = 16 and 32, batch 2, 1 repeat)."""


def _paths(dtype: jnp.dtype) -> list[str]:
    import jax

    from jaxtrain._src.models import attention

    names = ["heads_major", "heads_minor", "xla"]
    if jax.default_backend() == "gpu" and attention.choose_path(dtype) == "cudnn":
        names.append("cudnn")
    return names


def _fwd_bwd(path: str):
    import jax
    import jax.numpy as jnp

    from jaxtrain._src.models import attention

    fn = attention.PATHS[path]

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.sum(fn(q, k, v).astype(jnp.float32) * v.astype(jnp.float32))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def measure(T: int, B: int, dtype: jnp.dtype, paths: list[str], repeats: int) -> dict[str, float]:
    """Milliseconds per forward + backward call of each path (median of `repeats`, interleaved)."""
    import jax

    kq, kk, kv = jax.random.split(jax.random.key(T), 3)
    q, k, v = (jax.random.normal(key, (B, T, N_HEAD, HEAD_SIZE), dtype) for key in (kq, kk, kv))
    fns = {}
    for path in paths:
        fn = _fwd_bwd(path)
        try:
            jax.block_until_ready(fn(q, k, v))  # compile; a path the device refuses is left out
        except (NotImplementedError, RuntimeError, ValueError):
            continue
        fns[path] = fn
    times: dict[str, list[float]] = {path: [] for path in fns}
    for _ in range(repeats):
        for path, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(q, k, v))
            times[path].append(time.perf_counter() - t0)
    return {path: statistics.median(t) * 1e3 for path, t in times.items()}


def main(config: AttentionBenchConfig) -> int:
    import jax
    import jax.numpy as jnp

    from jaxtrain._src.models import attention
    from jaxtrain._src.report import device_description

    lengths = {16: 2, 32: 2} if config.quick else LENGTHS
    repeats = 1 if config.quick else config.repeats
    dtype = jnp.dtype(config.dtype)
    paths = _paths(dtype)
    chosen = attention.choose_path(dtype)
    table = Table(title=f"causal attention, forward + backward, ms per call (median of {repeats}), {config.dtype}, "
                        f"nh={N_HEAD}, hs={HEAD_SIZE}, {device_description(jax.devices()[0])}")
    for column in ("T", "batch", "path", "ms/call", "vs fastest", "causal_attention"):
        table.add_column(column, justify="left" if column in ("path", "causal_attention") else "right")
    for T, B in lengths.items():
        ms = measure(T, B, dtype, paths, repeats)
        fastest = min(ms.values())
        for path in paths:
            taken = "takes this" if path == chosen else ""
            if path in ms:
                table.add_row(str(T), str(B), path, f"{ms[path]:.2f}", f"{ms[path] / fastest:.2f}x", taken)
            else:
                table.add_row(str(T), str(B), path, "refused", "", taken)
        table.add_section()
    Console(highlight=False).print(table)
    return 0
