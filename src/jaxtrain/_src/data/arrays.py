"""In-memory datasets: validation and the placement decision (device-resident or streamed)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeGuard

import jax
import numpy as np

from jaxtrain._src.errors import DataError

if TYPE_CHECKING:
    from jaxtrain._src.data.sources import DataSource

MAX_LISTED = 8  # arrays named in an error message; a list of more dicts than this is a list of rows
CPU_BUDGET_BYTES = 2 * 1024**3  # the CPU "device" is host RAM: keep a fixed, modest share
ALIGNMENT = 64  # bytes: XLA's CPU client takes a NumPy array whose data start this aligned in place, without a copy


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised C-ordered array whose data start on an `ALIGNMENT`-byte boundary.

    On a CPU the "device" is host memory: `jax.device_put` of such an array uses its buffer in place,
    while an array only 16-byte aligned (NumPy's default) is copied, so a dataset held on the
    device would sit in memory twice (mnist-cnn's 47 MB of images, read from the preprocessing
    cache, which writes its arrays aligned for this).
    """
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    buffer = np.empty(size + ALIGNMENT, np.uint8)
    start = -buffer.ctypes.data % ALIGNMENT
    return buffer[start : start + size].view(dtype).reshape(shape)


def bytes_used_in_place(host: Any, placed: Any) -> int:
    """Bytes of the host arrays `host` whose placed counterparts in `placed` (the same pytree, on one
    device) are the host buffers themselves: what a CPU device took without a copy (`aligned_empty`)."""
    total = 0
    for x, y in zip(jax.tree.leaves(host), jax.tree.leaves(placed)):
        try:
            if isinstance(x, np.ndarray) and x.size and y.unsafe_buffer_pointer() == x.ctypes.data:
                total += x.nbytes
        except Exception:  # noqa: BLE001 - sharded over several devices, or a backend without pointers
            pass
    return total


def is_aligned(x: np.ndarray) -> bool:
    """Whether a CPU device can use `x` in place: C-contiguous, data on an `ALIGNMENT`-byte boundary."""
    return x.size == 0 or (bool(x.flags.c_contiguous) and x.ctypes.data % ALIGNMENT == 0)


def num_samples(data: Any, name: str = "data") -> int:
    """The common leading dimension of every array in the pytree `data`.

    Raises:
      DataError: if `data` holds no arrays, a scalar, or arrays of different lengths.
    """
    if isinstance(data, (list, tuple)) and len(data) > MAX_LISTED and all(isinstance(r, Mapping) for r in data):
        raise DataError(f"{name} is a {type(data).__name__} of {len(data):,} dicts, one per sample; pass one dict of "
                        "arrays with a leading sample axis, e.g. {k: np.stack([r[k] for r in rows]) for k in rows[0]}")
    leaves, _ = jax.tree.flatten_with_path(data)
    if not leaves:
        raise DataError(f"{name} holds no arrays; pass a dict (or tuple) of arrays with one row per sample")
    lengths = {}
    for path, leaf in leaves:
        shape = np.shape(leaf)
        key = jax.tree_util.keystr(path) or "array"
        if len(shape) == 0:
            raise DataError(f"{name}{key} is a scalar; every array needs a leading sample axis")
        lengths[key] = shape[0]
    if len(set(lengths.values())) > 1:
        shown = list(lengths.items())[:MAX_LISTED]
        more = f", … {len(lengths) - len(shown):,} more" if len(lengths) > len(shown) else ""
        detail = ", ".join(f"{k}: {v}" for k, v in shown) + more
        raise DataError(f"{name} arrays have different numbers of rows ({detail}); they must match")
    return next(iter(lengths.values()))


def is_source(data: Any) -> TypeGuard[DataSource]:
    """A row source (`HDF5Source`, `ArraySource`, ...) rather than a pytree of arrays."""
    return hasattr(data, "read") and hasattr(data, "chunk_rows")


def num_rows(data: Any, name: str = "data") -> int:
    """Rows of a row source or of a pytree of arrays (see `num_samples`)."""
    return len(data) if is_source(data) else num_samples(data, name)


def nbytes(data: Any) -> int:
    """Total bytes of every array in `data`."""
    return sum(getattr(x, "nbytes", None) or np.asarray(x).nbytes for x in jax.tree.leaves(data))


def default_budget_bytes(device: jax.Device) -> int:
    """A quarter of the device's memory, or `CPU_BUDGET_BYTES` where the device has no memory stats."""
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]) // 4
    return CPU_BUDGET_BYTES


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the training data lives and why (printed in the run header)."""

    where: str
    reason: str
    split: bool = False  # device-resident rows split over a mesh's devices rather than replicated


def choose_placement(policy: str, data_bytes: int, budget_bytes: int) -> Placement:
    """Decides whether the training set goes on the device whole or is streamed in batches."""
    size = f"{data_bytes / 1024**2:,.1f} MiB"
    budget = f"{budget_bytes / 1024**2:,.0f} MiB"
    if policy in ("device", "stream"):
        return Placement(policy, f"{size}, placement={policy} requested")
    if data_bytes <= budget_bytes:
        return Placement("device", f"{size}, within the {budget} device budget")
    return Placement("stream", f"{size}, over the {budget} device budget")
