"""A training set's fingerprint: cheap to take, saved in each checkpoint, compared on resume.

It holds the rows, each array's row shape and dtype, and a CRC-32 of 8 rows spread evenly over
the set; for an HDF5 file also its path, size and modification time. A resume whose data differ
in rows, arrays, size or sampled rows is refused (a file that was only touched, or rewritten with
the same contents, passes: its modification time alone is not a change).

A loader (a torch or Grain DataLoader) is fingerprinted through the map-style dataset it reads:
its length, its first sample's arrays and 8 samples, each read twice (a dataset whose samples
change from one read to the next, as random augmentation makes them, is checked by length and
arrays only); a torch DataLoader with worker processes reads them in a worker, as it would. A
loader with no dataset to sample (a generator, an iterable dataset) has an `unchecked`
fingerprint saying why: a resume notes that its data cannot be checked.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

import jax
import numpy as np

from jaxtrain._src.data.adapters import BatchStream, to_numpy
from jaxtrain._src.data.arrays import is_source

SAMPLED_ROWS = 8


def _rows(n: int) -> list[int]:
    return sorted({int(i) for i in np.linspace(0, n - 1, SAMPLED_ROWS)}) if n > 0 else []


def fingerprint(data: Any) -> dict[str, Any]:
    """The fingerprint of `data`: a row source (`HDF5Source`, `ArraySource`), a pytree of arrays or
    a loader's batches (`BatchStream`)."""
    if isinstance(data, BatchStream):
        return _loader_fingerprint(data)
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
    file = getattr(data, "path", None)  # a file source's
    if file is not None:
        try:
            stat = os.stat(file)
            out.update(file=os.path.abspath(file), size=stat.st_size, mtime_ns=stat.st_mtime_ns)
        except OSError:
            out.update(file=os.path.abspath(file))
    return out


def _loader_fingerprint(stream: BatchStream) -> dict[str, Any]:
    """A loader's fingerprint, taken through its map-style dataset (see the module docstring)."""
    dataset, kind = stream.dataset(), type(stream.data).__name__
    if dataset is None:
        return {"unchecked": f"{stream.name} ({kind}) has no map-style dataset to sample"}
    try:
        n = len(dataset)
        samples = [jax.tree_util.tree_flatten_with_path(x)[0] for x in stream.samples([r for r in _rows(n)
                                                                                        for _ in range(2)])]
        arrays = {jax.tree_util.keystr(p): [list(a.shape), str(a.dtype)]
                  for p, a in ((p, to_numpy(x)) for p, x in samples[0])}
        crc, stable = 0, True
        for first, again in zip(samples[::2], samples[1::2]):  # each sample read twice
            stable = stable and _leaves_crc(first, crc) == _leaves_crc(again, crc)
            crc = _leaves_crc(first, crc)
    except Exception as e:  # noqa: BLE001 - a dataset that cannot be indexed after all
        return {"unchecked": f"{stream.name}'s {type(dataset).__name__} cannot be sampled "
                             f"({type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]})"}
    source = f"the {kind}'s {type(dataset).__name__}" if dataset is not stream.data else f"the {kind}"
    return {"rows": n, "arrays": arrays, "source": source, **({"sample_crc32": f"{crc:08x}"} if stable else {})}


def _leaves_crc(leaves: list[tuple[Any, Any]], crc: int) -> int:
    """`crc` continued over one sample's leaves (their paths, shapes and bytes; objects by repr)."""
    for path, x in leaves:
        a = to_numpy(x)
        data = repr(x).encode() if a.dtype.kind == "O" else np.ascontiguousarray(a).tobytes()
        crc = zlib.crc32(data, zlib.crc32(f"{jax.tree_util.keystr(path)}{a.shape}".encode(), crc))
    return crc


def unchecked(fp: dict[str, Any] | None) -> str | None:
    """Why the data of fingerprint `fp` cannot be checked on resume, or None."""
    return (fp or {}).get("unchecked")


def data_change(saved: dict[str, Any] | None, now: dict[str, Any] | None) -> str | None:
    """What differs between two fingerprints, in a few words (None: the same data, or nothing to
    compare: a checkpoint saved without one, data made during the run, or a loader that cannot be
    checked)."""
    if not saved or not now or unchecked(saved) or unchecked(now):
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
    """`/data/train.h5`, `the training arrays (50,000 rows)` for data in memory, or `the
    DataLoader's MyDataset (4,500 rows)` for a loader's."""
    return fp.get("file") or f"{fp.get('source', 'the training arrays')} ({fp.get('rows', 0):,} rows)"
