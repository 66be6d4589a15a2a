"""What an HDF5 file holds: datasets, layout, attributes and statistics of a bounded sample of rows.

The sample is a few contiguous, chunk-aligned row ranges spread evenly over each dataset (whole
chunks are what HDF5 reads and decompresses anyway), read a few MiB at a time, so inspecting a
10^8-row file costs about as much as inspecting a 10^5-row one.
"""

from __future__ import annotations

import math
import os
import time
import tracemalloc
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxtrain._src.data.sources import attr_value, hdf5_reason, list_datasets, open_hdf5, rows_text
from jaxtrain._src.errors import ConfigError, DataError

if TYPE_CHECKING:  # h5py (11 MiB resident) is imported where a file is opened
    import h5py

DEFAULT_ROWS = 100_000
SAMPLE_PIECES = 16  # contiguous ranges per dataset
READ_BYTES = 4 << 20  # rows read at once (rounded to whole chunks)
MAX_HISTOGRAM_VALUES = 256  # integer data with at most this many distinct values gets a histogram


def sample_ranges(n: int, chunk_rows: int, rows: int, pieces: int = SAMPLE_PIECES) -> list[tuple[int, int]]:
    """Up to `pieces` disjoint chunk-aligned ranges [start, stop) spread over [0, n), about `rows` rows in all."""
    if n == 0:
        return []
    chunk_rows = max(1, chunk_rows)
    pieces = max(1, min(pieces, -(-rows // chunk_rows)))
    length = -(-rows // (pieces * chunk_rows)) * chunk_rows  # whole chunks per range
    if pieces * length >= n:
        return [(0, n)]
    if pieces == 1:
        return [(0, length)]
    # Starts spaced (n - length) / (pieces - 1) > length apart, rounded down to chunks: disjoint.
    starts = [i * (n - length) // (pieces - 1) // chunk_rows * chunk_rows for i in range(pieces)]
    return [(s, min(s + length, n)) for s in starts]


class _Stats:
    """Streaming per-column count, mean, M2 (Chan's update, float64), min, max, NaN and Inf counts."""

    def __init__(self, columns: int):
        self.n = np.zeros(columns, np.int64)  # finite values per column
        self.mean, self.m2 = np.zeros(columns), np.zeros(columns)
        self.min, self.max = np.full(columns, np.inf), np.full(columns, -np.inf)
        self.nan, self.inf = np.zeros(columns, np.int64), np.zeros(columns, np.int64)

    def update(self, x: np.ndarray) -> None:
        x = x.astype(np.float64)  # (n, C)
        finite = np.isfinite(x)
        if finite.all():
            n = np.full(x.shape[1], len(x))
            xz = x
        else:
            self.nan += np.isnan(x).sum(axis=0)
            self.inf += np.isinf(x).sum(axis=0)
            n = finite.sum(axis=0)
            xz = np.where(finite, x, 0.0)
        safe_n = np.maximum(n, 1)
        mean = xz.sum(axis=0) / safe_n
        m2 = (np.where(finite, x - mean, 0.0) ** 2).sum(axis=0)
        self.min = np.minimum(self.min, np.where(finite, x, np.inf).min(axis=0, initial=np.inf))
        self.max = np.maximum(self.max, np.where(finite, x, -np.inf).max(axis=0, initial=-np.inf))
        total = self.n + n
        delta = mean - self.mean
        weight = np.where(total > 0, n / np.maximum(total, 1), 0.0)
        self.mean = self.mean + delta * weight
        self.m2 = self.m2 + m2 + delta**2 * np.where(total > 0, self.n * n / np.maximum(total, 1), 0.0)
        self.n = total

    def columns(self) -> list[dict[str, Any]]:
        return [self._row(i) for i in range(len(self.n))]

    def overall(self) -> dict[str, Any]:
        """Statistics of all values together (merging the columns)."""
        n = int(self.n.sum())
        mean = float((self.n * self.mean).sum() / max(n, 1))
        m2 = float(self.m2.sum() + (self.n * (self.mean - mean) ** 2).sum())
        return self._format(n, mean, m2, self.min.min(), self.max.max(), self.nan.sum(), self.inf.sum())

    def _row(self, i: int) -> dict[str, Any]:
        return self._format(self.n[i], self.mean[i], self.m2[i], self.min[i], self.max[i], self.nan[i], self.inf[i])

    @staticmethod
    def _format(n, mean, m2, lo, hi, nan, inf) -> dict[str, Any]:
        none = int(n) == 0
        return {"mean": None if none else float(mean), "std": None if none else math.sqrt(float(m2) / int(n)),
                "min": None if none else float(lo), "max": None if none else float(hi),
                "nan": int(nan), "inf": int(inf)}


class _Histogram:
    """Counts of each integer value while there are few distinct values."""

    def __init__(self):
        self.counts: dict[int, int] | None = {}

    def update(self, x: np.ndarray) -> None:
        if self.counts is None or x.size == 0:
            return
        lo, hi = int(x.min()), int(x.max())
        if hi - lo > 1 << 16:
            self.counts = None
            return
        for offset in np.flatnonzero(counts := np.bincount((x.astype(np.int64) - lo).ravel())):
            self.counts[lo + int(offset)] = self.counts.get(lo + int(offset), 0) + int(counts[offset])
        if len(self.counts) > MAX_HISTOGRAM_VALUES:
            self.counts = None


def _inspect_dataset(path: Path, ds: h5py.Dataset, rows: int) -> dict[str, Any]:
    info: dict[str, Any] = {
        "name": ds.name.lstrip("/"), "shape": list(ds.shape), "dtype": str(ds.dtype),
        "chunks": list(ds.chunks) if ds.chunks else None, "compression": ds.compression,
        "compression_opts": attr_value(ds.compression_opts), "shuffle": bool(ds.shuffle),
        "storage_bytes": int(ds.id.get_storage_size()), "nbytes": int(ds.size * ds.dtype.itemsize),
        "sampled_rows": 0, "sample_ranges": 0, "overall": None, "columns": None, "histogram": None, "note": None,
    }
    if ds.ndim == 0 or ds.dtype.kind not in "biuf":
        info["note"] = "scalar" if ds.ndim == 0 else f"no statistics for dtype {ds.dtype}"
        return info
    columns = math.prod(ds.shape[1:])
    chunk = ds.chunks[0] if ds.chunks else 1
    ranges = sample_ranges(ds.shape[0], chunk, rows)
    step = max(chunk, READ_BYTES // max(1, columns * ds.dtype.itemsize) // chunk * chunk)
    stats = _Stats(columns)
    histogram = _Histogram() if ds.dtype.kind in "biu" else None
    for start, stop in ranges:
        for lo in range(start, stop, step):
            hi = min(lo + step, stop)
            try:
                block = ds[lo:hi].reshape(hi - lo, columns)  # (n, C)
            except (OSError, RuntimeError, ValueError) as e:
                raise DataError(f"cannot read {rows_text(lo, hi)} of {info['name']!r} in {path} ({hdf5_reason(e)}); "
                                "the file is corrupt or truncated") from None
            stats.update(block)
            if histogram is not None:
                histogram.update(block)
            info["sampled_rows"] += hi - lo
    info["sample_ranges"] = len(ranges)
    info["overall"] = stats.overall()
    info["columns"] = stats.columns()
    if histogram is not None and histogram.counts is not None:
        info["histogram"] = {str(k): v for k, v in sorted(histogram.counts.items())}
    return info


def inspect_file(path: str | os.PathLike, rows: int = DEFAULT_ROWS) -> dict[str, Any]:
    """The layout, attributes and sample statistics of the HDF5 file `path`, as plain (JSON-able) data.

    Args:
      path: the file.
      rows: rows to sample per dataset (all of them for smaller datasets).

    Returns:
      {"file", "size_bytes", "attrs", "datasets": [per dataset: name, shape, dtype, chunks,
      compression, storage_bytes, nbytes, sampled_rows, overall / columns statistics (mean, std,
      min, max over finite values; nan, inf counts), histogram (integer data with few values)],
      "seconds", "sample_peak_bytes" (tracemalloc peak while reading)}.

    Raises:
      ConfigError: rows < 1.
      DataError: a missing, non-HDF5, corrupt or truncated file.
    """
    if rows < 1:
        raise ConfigError(f"rows={rows} must be an integer >= 1")
    path = Path(path)
    t0 = time.perf_counter()
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        with open_hdf5(path) as f:
            attrs = {k: attr_value(v) for k, v in f.attrs.items()}
            datasets = [_inspect_dataset(path, f[name], rows) for name in list_datasets(f)]
        _, sample_peak = tracemalloc.get_traced_memory()
    finally:
        if not tracing:
            tracemalloc.stop()
    return {
        "file": str(path), "size_bytes": path.stat().st_size, "attrs": attrs, "datasets": datasets,
        "seconds": time.perf_counter() - t0, "sample_peak_bytes": sample_peak,
    }
