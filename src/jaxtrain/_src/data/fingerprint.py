"""A training set's fingerprint: cheap to take, saved in each checkpoint, compared on resume.

It holds the rows, each array's row shape and dtype, and a CRC-32 of 8 rows spread evenly over
the set; for an HDF5 file also its path, size and modification time. A resume whose data differ
in rows, arrays, size or sampled rows is refused (a file that was only touched, or rewritten with
the same contents, passes: its modification time alone is not a change).
"""

from __future__ import annotations

import os
import zlib
from typing import Any

import jax
import numpy as np

from jaxtrain._src.data.arrays import is_source

SAMPLED_ROWS = 8


def _rows(n: int) -> list[int]:
    return sorted({int(i) for i in np.linspace(0, n - 1, SAMPLED_ROWS)}) if n > 0 else []


def fingerprint(data: Any) -> dict[str, Any]:
    """The fingerprint of `data`: a row source (`HDF5Source`, `ArraySource`) or a pytree of arrays."""
    crc = 0
    if is_source(data):
        n = len(data)
        arrays = {k: [list(shape), str(np.dtype(data.dtypes[k]))] for k, shape in data.row_shapes.items()}
        for r in _rows(n):
            for name, block in sorted(data.read(r, r + 1).items()):
                crc = zlib.crc32(np.ascontiguousarray(block).tobytes(), zlib.crc32(name.encode(), crc))
    else:
        leaves = jax.tree_util.tree_flatten_with_path(data)[0]
        n = int(np.shape(leaves[0][1])[0]) if leaves and np.ndim(leaves[0][1]) else 0
        arrays = {jax.tree_util.keystr(p): [list(np.shape(x)[1:]), str(np.dtype(x.dtype))] for p, x in leaves}
        index = np.asarray(_rows(n), np.int32)
        for path, x in leaves:
            crc = zlib.crc32(np.ascontiguousarray(np.asarray(x[index])).tobytes(),
                             zlib.crc32(jax.tree_util.keystr(path).encode(), crc))
    out: dict[str, Any] = {"rows": n, "arrays": arrays, "sample_crc32": f"{crc:08x}"}
    path = getattr(data, "path", None)
    if path is not None:
        try:
            stat = os.stat(path)
            out.update(file=os.path.abspath(path), size=stat.st_size, mtime_ns=stat.st_mtime_ns)
        except OSError:
            out.update(file=os.path.abspath(path))
    return out


def data_change(saved: dict[str, Any] | None, now: dict[str, Any] | None) -> str | None:
    """What differs between two fingerprints, in a few words (None: the same data, or nothing to
    compare: a checkpoint saved without one, or data made during the run)."""
    if not saved or not now:
        return None
    changes = []
    if saved.get("rows") != now.get("rows"):
        changes.append(f"rows {saved.get('rows'):,} -> {now.get('rows'):,}")
    if saved.get("arrays") != now.get("arrays"):
        changes.append("other arrays (names, row shapes or dtypes)")
    if saved.get("size") is not None and now.get("size") is not None and saved["size"] != now["size"]:
        changes.append(f"size {saved['size']:,} -> {now['size']:,} bytes")
    if not changes and saved.get("sample_crc32") != now.get("sample_crc32"):
        changes.append(f"other values in the {SAMPLED_ROWS} rows sampled")
    return "; ".join(changes) or None


def describe(fp: dict[str, Any]) -> str:
    """`/data/train.h5`, or `the training arrays (50,000 rows)` for data in memory."""
    return fp.get("file") or f"the training arrays ({fp.get('rows', 0):,} rows)"
