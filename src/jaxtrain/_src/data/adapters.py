"""Other libraries' data as jaxtrain's: map-style datasets as row sources, iterables of batches as batch streams.

- **Map-style** (`__len__` and `__getitem__` returning one sample as a pytree of arrays: a PyTorch
  `Dataset`, a Hugging Face `datasets.Dataset`, a Grain `MapDataset`): `MapSource` serves rows as
  the streaming loader reads them, contiguous ranges `read(start, stop)`. It fetches a range in one
  call where the dataset can (a Hugging Face dataset's slice; `ds[a:b]` where that stacks the
  samples; `__getitems__`), else sample by sample on 1 or 4 threads, whichever its first reads
  measured faster, and stacks the samples. jaxtrain then orders, batches and places them like its
  own arrays: the order is jaxtrain's (a function of the seed and the epoch), so a resumed run is
  exact, and a small dataset goes on the device whole.
- **Iterables of batches** (a PyTorch or Grain `DataLoader`, a Grain `IterDataset`, a Hugging
  Face `IterableDataset` batched with `.batch(n)`, a `tf.data` NumPy iterator, a generator, or a
  zero-argument callable returning a fresh iterator each epoch): `BatchStream` hands out their
  batches as NumPy arrays (torch tensors without a copy) in the loader's own order, checking each
  against the first. The feed that stacks and places them is `feeds.IterFeed`.
- **Shards**: `NpySource` reads a folder of `.npy` / `.npz` files as one row range, with positioned
  file reads straight into the batch (no memory map).

`adapt(data)` picks among these; arrays, jaxtrain's own sources and data that make their own feed
pass through unchanged. Torch, datasets and grain are never imported here: objects are recognised
by what they offer, and torch tensors by their `numpy()` method.
"""

from __future__ import annotations

import base64
import collections.abc
import concurrent.futures
import itertools
import json
import math
import os
import re
import signal
import threading
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, TypeGuard

import jax
import numpy as np

from jaxtrain._src.data.arrays import is_source
from jaxtrain._src.data.sources import (
    _check_dtype,
    _row_range,
    check_finite,
    describe_change,
    rows_text,
    stat_fingerprint,
)
from jaxtrain._src.errors import DataError

__all__ = ["BatchStream", "MapSource", "NpySource", "adapt", "to_numpy"]

READ_THREADS = 4  # threads fetching the samples of one read from a map-style dataset, one at a time each
TRIAL_READS = 3  # reads timed with 1 thread and with READ_THREADS each before the faster is kept
SAMPLES_PER_READ = 1024  # samples fetched (and timed) together, one sample at a time


def to_numpy(x: Any) -> np.ndarray:
    """`x` as a NumPy array: a CPU torch tensor shares its memory (`Tensor.numpy()`), a jax.Array
    or a list is converted, a Python scalar becomes a 0-d array."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch") and hasattr(x, "numpy"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _leaves(item: Any) -> tuple[list[np.ndarray], Any]:
    leaves, treedef = jax.tree.flatten(item, is_leaf=lambda x: not isinstance(x, (dict, list, tuple)))
    return [to_numpy(x) for x in leaves], treedef


def _names(item: Any, count: int) -> list[str]:
    """Batch names: a flat dict's own string keys, else leaf0, leaf1, ..."""
    if isinstance(item, Mapping) and all(isinstance(k, str) for k in item) and not any(
            isinstance(v, (dict, list, tuple)) for v in item.values()):
        return sorted(item)  # jax.tree.flatten's order for a dict
    return [f"leaf{i}" for i in range(count)]


def _spec_text(name: str) -> str:
    return "" if re.fullmatch(r"leaf\d+", name) else f" {name!r}"


def _kind(name: str) -> str:
    return "array" if re.fullmatch(r"leaf\d+", name) else "field"


class _Spec:
    """The structure, names, row shapes and dtypes of the first sample or batch, checked against later ones.

    Args:
      first: the first item (a pytree of arrays).
      what: `sample` (rows are the item's arrays) or `batch` (rows are along axis 0).
      source: how to name the data in messages (`train_data`).
    """

    def __init__(self, first: Any, what: str, source: str):
        leaves, self.treedef = _leaves(first)
        self.what, self.source = what, source
        if not leaves:
            raise DataError(f"{source}'s first {what} holds no arrays; each {what} must be a dict, tuple or "
                            "list of arrays")
        self.names = _names(first, len(leaves))
        skip = 1 if what == "batch" else 0
        for name, x in zip(self.names, leaves):
            if x.dtype.kind in "USO":
                what_kind = "objects" if x.dtype.kind == "O" else "strings"
                raise DataError(f"{source}'s {_kind(name)}{_spec_text(name)} holds {what_kind} ({x.dtype}); turn "
                                "it into numbers first (tokenize text, encode labels)")
            _check_dtype(x.dtype, name, source)
            if what == "batch" and x.ndim == 0:
                raise DataError(f"{source} yields single samples ({_kind(name)}{_spec_text(name)} is a scalar), not "
                                "batches; batch them first (DataLoader(ds, batch_size=64), ds.batch(64))")
        self.shapes = {n: x.shape[skip:] for n, x in zip(self.names, leaves)}
        self.dtypes = {n: x.dtype for n, x in zip(self.names, leaves)}
        self.rows = len(leaves[0]) if what == "batch" else 1
        # The common flat shapes, read without flattening a pytree: a dict of arrays, a tuple or list of them.
        self._keys = tuple(self.names) if isinstance(first, dict) and self.names[0] in first else None
        self._sequence = (type(first), len(first)) if isinstance(first, (tuple, list)) and not any(
            isinstance(v, (dict, list, tuple)) for v in first) else None

    def _flat(self, item: Any) -> list[np.ndarray] | None:
        """The leaves of `item` when it has the first item's flat structure, else None."""
        if self._keys is not None and type(item) is dict and len(item) == len(self._keys):
            try:
                return [to_numpy(item[k]) for k in self._keys]
            except KeyError:
                return None
        if self._sequence is not None and (type(item), len(item)) == self._sequence and not any(
                isinstance(v, (dict, list, tuple)) for v in item):
            return [to_numpy(v) for v in item]
        return None

    def check(self, item: Any, where: str, rows: int | None = None) -> dict[str, np.ndarray]:
        """`item` flattened to {name: array}, or a DataError naming `where` and the first difference.
        With `rows`, `item` holds that many samples stacked (a slice of a map-style dataset)."""
        leaves = self._flat(item)
        if leaves is None:
            leaves, treedef = _leaves(item)
            if treedef != self.treedef:
                raise DataError(f"{where} of {self.source} has another structure than the first ({treedef} against "
                                f"{self.treedef}); every {self.what} must have the same fields")
        out = dict(zip(self.names, leaves))
        skip = 1 if self.what == "batch" or rows is not None else 0
        if rows is not None and any(len(x) != rows for x in out.values()):
            raise DataError(f"{where} of {self.source} does not hold {rows} rows in every field")
        for name, x in out.items():
            if x.shape[skip:] != self.shapes[name]:
                fix = ("pad them to one length (in the dataset, or a DataLoader collate_fn that pads)"
                       if len(x.shape[skip:]) == len(self.shapes[name]) else "give every one the same shape")
                raise DataError(f"{where} of {self.source} has {_kind(name)}{_spec_text(name)} of shape "
                                f"{x.shape[skip:]} where the first had {self.shapes[name]}: ragged {self.what}s "
                                f"cannot be stacked; {fix}")
            if x.dtype != self.dtypes[name]:
                raise DataError(f"{where} of {self.source} has {_kind(name)}{_spec_text(name)} of dtype {x.dtype} "
                                f"where the first had {self.dtypes[name]}; give every {self.what} the same dtypes")
        if self.what == "batch" and len({len(x) for x in out.values()}) > 1:
            detail = ", ".join(f"{k}: {len(v)}" for k, v in out.items())
            raise DataError(f"{where} of {self.source} has arrays of different lengths ({detail}); they must match")
        return out

    def unflatten(self, flat: dict[str, np.ndarray]) -> Any:
        return jax.tree.unflatten(self.treedef, [flat[n] for n in self.names])


# -- map-style datasets ---------------------------------------------------------------------------


def _is_hf_dataset(data: Any) -> bool:
    return type(data).__module__.startswith("datasets.") and hasattr(data, "with_format")


class MapSource:
    """A map-style dataset as a row source (see the module docstring).

    Args:
      dataset: `len(dataset)` samples, `dataset[i]` one sample (a pytree of arrays, torch tensors or
        numbers; the same structure, shapes and dtypes every time).
      name: how messages name the data (`train_data`).
      threads: threads fetching samples one at a time (datasets without a batched read); None
        times the first reads with one thread and with `READ_THREADS` and keeps the faster: threads
        help a dataset that waits on files or decodes outside the GIL, and slow down one that
        indexes in Python (`examples/map_read_threads.py` measures both on a torch Dataset).

    Attributes:
      treedef: the structure of a sample; `read` returns its leaves by name, `unflatten` rebuilds it.

    Raises:
      DataError: an empty dataset; a first sample without arrays, or holding strings or objects.
    """

    def __init__(self, dataset: Any, name: str = "data", *, threads: int | None = None):
        if _is_hf_dataset(dataset) and (dataset.format.get("type") in (None, "python")):
            dataset = dataset.with_format("numpy")  # columns come back as arrays of their own dtype
        self.dataset, self.name = dataset, name
        self._n = len(dataset)
        if self._n == 0:
            raise DataError(f"{name} ({type(dataset).__name__}) has no samples; pass a dataset with at least one")
        self._spec = _Spec(self._fetch_one(0), "sample", name)
        self.treedef = self._spec.treedef
        self._threads = threads
        self._trials: dict[int, list[float]] = {1: [], READ_THREADS: []}  # seconds per sample of the timed reads
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.mode = "slice" if _is_hf_dataset(dataset) or self._slices_alike() else \
            "getitems" if hasattr(dataset, "__getitems__") else "samples"

    def _slices_alike(self) -> bool:
        """Whether `dataset[a:b]` stacks samples a..b-1 (as an array- or tensor-backed dataset's
        indexing does): checked on the first and the last 8 samples against reading them one at a time."""
        k = min(self._n, 8)
        for lo in sorted({0, self._n - k}):
            try:
                block = self._spec.check(self.dataset[lo : lo + k], "a slice", rows=k)
                for i in range(k):
                    one = self._spec.check(self._fetch_one(lo + i), f"sample {lo + i}")
                    if not all(np.array_equal(block[n][i], one[n], equal_nan=True) for n in one):
                        return False
            except Exception:  # noqa: BLE001 - a dataset that does not take slices, or gives something else
                return False
        return True

    def _fetch_one(self, i: int) -> Any:
        try:
            return self.dataset[i]
        except Exception as e:
            raise DataError(f"{self.name}[{i}] raised {type(e).__name__}: {_first_line(e)}") from None

    def __len__(self) -> int:
        return self._n

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._spec.names)

    @property
    def chunk_rows(self) -> int:
        return 1  # any row can be fetched alone

    @property
    def row_shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._spec.shapes)

    @property
    def dtypes(self) -> dict[str, np.dtype]:
        return dict(self._spec.dtypes)

    @property
    def row_nbytes(self) -> int:
        return sum(d.itemsize * math.prod(self._spec.shapes[k]) for k, d in self._spec.dtypes.items())

    def unflatten(self, flat: dict[str, np.ndarray]) -> Any:
        """`read`'s {name: (n, ...)} as the dataset's own structure of stacked arrays."""
        return self._spec.unflatten(flat)

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Samples [start, stop) stacked: {name: (stop - start, ...)}.

        Raises:
          DataError: a sample unlike sample 0 (structure, shape, dtype), NaN/Inf in a float field,
            or the dataset raising while fetching (its error, in one line).
        """
        if not 0 <= start <= stop <= self._n:
            raise IndexError(f"rows [{start}, {stop}) are outside this source's {self._n} rows")
        out = {k: np.empty((stop - start, *s), self._spec.dtypes[k]) for k, s in self._spec.shapes.items()}
        if self.mode == "slice":
            block = self._spec.check(self._fetch_slice(start, stop), rows_text(start, stop), rows=stop - start)
            for n, v in block.items():
                out[n][:] = v
        elif self.mode == "getitems":
            try:
                samples = self.dataset.__getitems__(list(range(start, stop)))
            except Exception as e:
                raise DataError(f"{self.name} raised {type(e).__name__} reading {rows_text(start, stop)}: "
                                f"{_first_line(e)}") from None
            for i, sample in enumerate(samples):
                self._fill(out, i, sample, start + i)
        else:
            self._read_samples(out, start, stop)
        for k, v in out.items():
            check_finite(v, k, start, self.name)
        return out

    def _fetch_slice(self, start: int, stop: int) -> Any:
        try:
            return self.dataset[start:stop]
        except Exception as e:
            raise DataError(f"{self.name} raised {type(e).__name__} reading {rows_text(start, stop)}: "
                            f"{_first_line(e)}") from None

    def _fill(self, out: dict[str, np.ndarray], at: int, item: Any, index: int) -> None:
        for n, v in self._spec.check(item, f"sample {index:,}").items():
            out[n][at] = v

    def _read_samples(self, out: dict[str, np.ndarray], start: int, stop: int) -> None:
        for lo in range(start, stop, SAMPLES_PER_READ):  # pieces, so that a whole read is timed too
            self._read_piece(out, start, lo, min(stop, lo + SAMPLES_PER_READ))

    def _read_piece(self, out: dict[str, np.ndarray], base: int, start: int, stop: int) -> None:
        def fetch(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                self._fill(out, i - base, self._fetch_one(i), i)

        n, threads = stop - start, self._threads or self._trial_threads()
        t0 = time.perf_counter()
        if threads == 1 or n < 2 * threads:
            fetch(start, stop)
        else:
            self._fetch_threaded(fetch, start, stop, threads)
        if self._threads is None and n >= 2 * READ_THREADS:
            self._trials[threads].append((time.perf_counter() - t0) / n)

    def _trial_threads(self) -> int:
        """The threads of the next read while timing (alternately 1 and READ_THREADS); then the faster."""
        one, many = self._trials[1], self._trials[READ_THREADS]
        if len(one) + len(many) < 2 * TRIAL_READS:
            return 1 if len(one) <= len(many) else READ_THREADS
        self._threads = 1 if np.median(one) <= np.median(many) else READ_THREADS
        return self._threads

    def _fetch_threaded(self, fetch: Callable[[int, int], None], start: int, stop: int, threads: int) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="jaxtrain-map-read")
        bounds = np.linspace(start, stop, threads + 1).astype(int)
        futures = [self._pool.submit(fetch, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        for f in futures:
            f.result()  # the first error, as raised

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _first_line(e: BaseException) -> str:
    """An exception's message on one line; a DataLoader worker's re-raised error keeps only its own last line."""
    text = str(e).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    if "Original Traceback" in text:  # torch: "Caught X in DataLoader worker process 0.\nOriginal Traceback...\nX: m"
        return f"{lines[0].removeprefix('Caught ').rstrip('.')}: {lines[-1]}"
    return " ".join(lines) if len(lines) <= 3 else lines[0]


# -- shards of .npy / .npz files ------------------------------------------------------------------


class _Shard:
    """One array in one file: where its rows start and how they are laid out (C order)."""

    def __init__(self, path: Path, offset: int, shape: tuple[int, ...], dtype: np.dtype):
        self.path, self.offset, self.shape, self.dtype = path, offset, shape, dtype
        self.row_bytes = dtype.itemsize * math.prod(shape[1:])
        self.stat = stat_fingerprint(path)

    def read_into(self, out: np.ndarray, lo: int, hi: int) -> None:
        """Rows [lo, hi) of this shard into `out` (hi - lo rows), with one positioned read."""
        view = out.data.cast("B")
        with open(self.path, "rb", buffering=0) as f:
            done = 0
            while done < len(view):
                n = os.preadv(f.fileno(), [view[done:]], self.offset + lo * self.row_bytes + done)
                if n == 0:
                    break
                done += n
        change = describe_change(self.stat, stat_fingerprint(self.path))
        if change is not None or done < len(view):
            raise DataError(f"{self.path} changed while it was being read ({change or 'shorter than its header says'}):"
                            " shards must not change during a run; restore them or start a new run")


def _header(f: Any, where: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of the .npy header at `f`'s position (left after it); Fortran order is refused."""
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(f)
    if fortran and len(shape) > 1:
        raise DataError(f"{where} is stored in Fortran order; re-save it in C order "
                        "(np.save(f, np.ascontiguousarray(a)))")
    return shape, dtype


def _npz_shards(path: Path) -> dict[str, _Shard]:
    """The arrays of an .npz file, each found where np.savez stored it (uncompressed) in the zip."""
    shards = {}
    try:
        with zipfile.ZipFile(path) as z, open(path, "rb") as f:
            for info in z.infolist():
                name = info.filename.removesuffix(".npy")
                if info.compress_type != zipfile.ZIP_STORED:
                    raise DataError(f"{name!r} in {path} is compressed (np.savez_compressed); streamed shards are read "
                                    "in place: write them with np.savez")
                f.seek(info.header_offset)
                local = f.read(30)  # the zip local file header: its name and extra field lengths at 26 and 28
                f.seek(info.header_offset + 30 + int.from_bytes(local[26:28], "little")
                       + int.from_bytes(local[28:30], "little"))
                shape, dtype = _header(f, f"{name!r} in {path}")
                shards[name] = _Shard(path, f.tell(), shape, dtype)
    except (OSError, zipfile.BadZipFile, ValueError) as e:
        raise DataError(f"cannot read {path} as .npz ({e}); re-write it with np.savez") from None
    return shards


def _npy_shard(path: Path) -> _Shard:
    try:
        with open(path, "rb") as f:
            shape, dtype = _header(f, str(path))
            return _Shard(path, f.tell(), shape, dtype)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {path} as .npy ({e}); re-write it with np.save") from None


class NpySource:
    """A folder of `.npy` or `.npz` shards as one row range, read in place: each read is one
    positioned file read per shard it spans, straight into the batch's memory, so host memory holds
    what is read, never the files (a memory map would keep every page it touched resident).

    Layouts (shards in name order, their rows one after another):
      - `.npz` files written by `np.savez`, each holding the same arrays (`np.savez(f"{i:05d}.npz",
        x=..., y=...)`);
      - `.npy` files named `NAME.npy` or `NAME-PART.npy` / `NAME_PART.npy`, one array each
        (`x-00000.npy`, `y-00000.npy`, ...): each NAME's parts concatenated.

    Args:
      directory: the folder (an `attrs.json` in it becomes `attrs`, as an HDF5 file's attributes).
      keys: batch name -> array name, e.g. {"x": "features", "y": "targets"}; default every array
        under its own name.
      start, stop: the row range to serve (negative values count from the end), e.g. `stop=-5000`
        to hold out the last 5,000 rows for validation.

    Raises:
      DataError: no shards, shards without the same arrays, arrays of different lengths, a dtype
        that cannot be streamed, compressed or Fortran-ordered arrays; a shard that changes during
        the run (checked after every read).
    """

    def __init__(self, directory: str | os.PathLike, keys: dict[str, str] | None = None, start: int = 0,
                 stop: int | None = None):
        self.path = Path(directory)
        if not self.path.is_dir():
            raise DataError(f"{self.path} is not a folder; pass a folder of .npy or .npz shards")
        npz, npy = sorted(self.path.glob("*.npz")), sorted(self.path.glob("*.npy"))
        if npz and npy:
            raise DataError(f"{self.path} holds both .npz and .npy files; keep one kind of shard per folder")
        parts: dict[str, list[_Shard]] = {}
        for f in npz:
            for name, shard in _npz_shards(f).items():
                parts.setdefault(name, []).append(shard)
        missing = [m for m, p in parts.items() if len(p) != len(npz)]
        if missing:
            raise DataError(f"array {missing[0]!r} is missing from some of the {len(npz)} .npz shards in "
                            f"{self.path}; every shard must hold the same arrays")
        for f in npy:
            name = re.sub(r"[-_][^-_]*\d[^-_]*$", "", f.stem) or f.stem  # x-00000 -> x
            parts.setdefault(name, []).append(_npy_shard(f))
        if not parts:
            raise DataError(f"{self.path} holds no .npy or .npz files; write shards with np.save or np.savez")
        if keys is not None:
            unknown = [k for k in keys.values() if k not in parts]
            if unknown:
                raise DataError(f"{self.path} has no array {unknown[0]!r} (it has: {', '.join(sorted(parts))}); "
                                "pass keys that exist")
            parts = {name: parts[key] for name, key in keys.items()}
        for name, shards in parts.items():
            for shard in shards:
                if not shard.shape:
                    raise DataError(f"{shard.path} holds a scalar {name!r}; shards need a leading row axis")
                _check_dtype(shard.dtype, name, str(shard.path))
                if shard.shape[1:] != shards[0].shape[1:] or shard.dtype != shards[0].dtype:
                    raise DataError(f"the shards of {name!r} in {self.path} differ in row shape or dtype "
                                    f"({shards[0].shape[1:]} {shards[0].dtype} in {shards[0].path.name}, "
                                    f"{shard.shape[1:]} {shard.dtype} in {shard.path.name})")
        self._parts = parts
        self._bounds = {n: np.cumsum([0] + [s.shape[0] for s in shards]) for n, shards in parts.items()}
        lengths = {n: int(b[-1]) for n, b in self._bounds.items()}
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{k}: {v:,}" for k, v in lengths.items())
            raise DataError(f"the arrays in {self.path} have different numbers of rows ({detail}); they must match")
        self.start, self.stop = _row_range(start, stop, next(iter(lengths.values())), str(self.path))
        attrs = self.path / "attrs.json"
        self.attrs = json.loads(attrs.read_text()) if attrs.is_file() else {}

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._parts)

    @property
    def chunk_rows(self) -> int:
        return 1

    @property
    def row_shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: s[0].shape[1:] for n, s in self._parts.items()}

    @property
    def dtypes(self) -> dict[str, np.dtype]:
        return {n: s[0].dtype for n, s in self._parts.items()}

    @property
    def row_nbytes(self) -> int:
        return sum(s[0].row_bytes for s in self._parts.values())

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Rows [start, stop) of the range, across shards: {name: (stop - start, ...)}."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"rows [{start}, {stop}) are outside this source's {len(self)} rows")
        out = {name: np.empty((stop - start, *s[0].shape[1:]), s[0].dtype) for name, s in self._parts.items()}
        self.read_into(start, stop, out)
        return out

    def read_into(self, start: int, stop: int, out: dict[str, np.ndarray]) -> None:
        """`read(start, stop)` written into `out` ({name: (stop - start, ...)} C-contiguous arrays),
        one positioned read per shard straight into them (the streaming loader's window buffers)."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"rows [{start}, {stop}) are outside this source's {len(self)} rows")
        start, stop = start + self.start, stop + self.start
        for name, shards in self._parts.items():
            bounds = self._bounds[name]
            block = out[name]
            row, i = start, int(np.searchsorted(bounds, start, side="right")) - 1
            while row < stop:
                lo, hi = row - bounds[i], min(stop, bounds[i + 1]) - bounds[i]
                shards[i].read_into(block[row - start : row - start + hi - lo], int(lo), int(hi))
                row += hi - lo
                i += 1
            check_finite(block, name, start, str(shards[0].path.parent))

    def close(self) -> None:
        pass


# -- iterables of batches -------------------------------------------------------------------------


def _is_torch_loader(data: Any) -> bool:
    return all(hasattr(data, a) for a in ("dataset", "batch_size", "drop_last", "sampler")) and \
        type(data).__module__.startswith("torch")


class BatchStream:
    """An iterable of batches (see the module docstring), epoch by epoch.

    Args:
      data: a re-iterable object (each `iter()` one epoch), a zero-argument callable returning a
        fresh iterator each epoch, or a one-shot iterator (a generator), read on across epochs.
      name: how messages name it (`train_data`).
      seed: reseeds a torch DataLoader's shuffling generator at each epoch to (seed, epoch), so
        that an epoch's order does not depend on the ones before it (an exact resume).
      allow_nan: batches may hold NaN (`DataConfig.allow_nan`); Inf is refused still.

    Attributes:
      batch_size: rows of the first batch (the loader's batch size).
      once: the data are a one-shot iterator.
      num_batches: batches per epoch when the object says (`len()`), else None.
      num_full, last_rows: full batches per epoch and the rows of a short last one, when known
        exactly (a torch DataLoader; batches by index, as Grain's `.batch(n)`), else None.
      treedef, names, shapes, dtypes: the first batch's structure; rows (B, ...).

    Raises:
      DataError: an empty iterable; a first item that is not a batch of arrays.
    """

    def __init__(self, data: Any, name: str = "data", seed: int = 0, allow_nan: bool = False):
        self.data, self.name, self.seed, self.allow_nan = data, name, seed, allow_nan
        self.once = isinstance(data, collections.abc.Iterator)  # a generator; iter() of a loader would start it
        self._iterator: Iterator | None = None  # the one-shot iterator, continued across epochs
        first_iter = self._new_iterator(1)
        try:
            first = next(first_iter)
        except StopIteration:
            raise DataError(f"{name} yields no batches; pass a loader over at least one batch") from None
        except Exception as e:
            raise _iteration_error(e, name, 1, 0) from None
        self._first_raw = first_iter
        self._pending: Iterator | None = itertools.chain([first], first_iter)  # epoch 1's, its first batch read
        self._spec = _Spec(first, "batch", name)
        self.treedef, self.names = self._spec.treedef, self._spec.names
        self.shapes, self.dtypes = self._spec.shapes, self._spec.dtypes
        self.batch_size = self._spec.rows
        self.num_batches = len(data) if _has_len(data) else None
        self.num_full, self.last_rows = None, None
        if _is_torch_loader(data) and hasattr(data.dataset, "__len__") and data.batch_size:
            n = len(data.dataset)
            self.num_full = n // data.batch_size
            self.last_rows = 0 if data.drop_last else n % data.batch_size
        elif self.num_batches and hasattr(data, "__getitem__"):  # batches by index (Grain's .batch(n)): see the last
            try:
                last = len(self._spec.check(data[self.num_batches - 1], "the last batch")[self.names[0]])
            except Exception:  # noqa: BLE001 - found at the end of the epoch instead
                last = self.batch_size
            self.num_full, self.last_rows = (self.num_batches, 0) if last == self.batch_size else (
                self.num_batches - 1, last)

    def abstract_batch(self, batch_size: int) -> Any:
        """One batch as shapes ((B, ...) per array, B the loader's)."""
        return jax.tree.unflatten(self.treedef, [jax.ShapeDtypeStruct((self.batch_size, *self.shapes[n]),
                                                                      self.dtypes[n]) for n in self.names])

    def unflatten(self, flat: dict[str, np.ndarray]) -> Any:
        return self._spec.unflatten(flat)

    def rows_per_epoch(self) -> int:
        """Rows of one epoch: from a torch DataLoader's dataset, else counted in one pass."""
        if self.num_full is not None:
            return self.num_full * self.batch_size + self.last_rows
        return sum(len(next(iter(batch.values()))) for batch, _ in self.batches(1))

    def reproducible(self) -> str | None:
        """Why an epoch's order may differ from one iteration to the next, or None when it does not
        (a torch DataLoader without its own generator shuffles with torch's global RNG)."""
        if _is_torch_loader(self.data):
            sampler = getattr(self.data, "sampler", None)
            if type(sampler).__name__ == "RandomSampler" and getattr(sampler, "generator", None) is None:
                return ("the DataLoader shuffles with torch's global random generator; pass "
                        "generator=torch.Generator() to it for an exact resume")
        return None

    def dataset(self) -> Any:
        """The map-style dataset the batches come from, for the data's fingerprint: a torch
        DataLoader's `dataset`, a Grain DataLoader's data source, or the data themselves when they
        serve batches by index (Grain's `.batch(n)`); None where there is none to sample (a
        generator, a callable, an iterable dataset)."""
        data = self.data
        if self.once or (callable(data) and not hasattr(data, "__iter__")):
            return None
        if _is_torch_loader(data):
            data = data.dataset
        elif type(data).__module__.startswith("grain") and hasattr(data, "_data_source"):
            data = data._data_source  # Grain's DataLoader keeps its source under this name only
        return data if _has_len(data) and hasattr(data, "__getitem__") else None

    def samples(self, indices: list[int]) -> Iterator[Any]:
        """Samples `indices` of `dataset()`, read where the loader reads them: a torch DataLoader with
        worker processes reads them in one worker of its own kind (a dataset that opens its files on
        first use must not open them in this process, whose children its workers may be), else here."""
        data, dataset = self.data, self.dataset()
        if not (_is_torch_loader(data) and getattr(data, "num_workers", 0) > 0):
            yield from (dataset[i] for i in indices)
            return
        reader = type(data)(dataset, batch_size=None, sampler=indices, num_workers=1,
                            multiprocessing_context=data.multiprocessing_context, worker_init_fn=data.worker_init_fn)
        try:
            yield from reader
        finally:
            _no_torch_sigchld()

    def _new_iterator(self, epoch: int) -> Iterator:
        if self.once:
            if self._iterator is None:
                self._iterator = self.data
            return self._iterator
        if _is_torch_loader(self.data):  # an epoch's shuffle depends on (seed, epoch) alone
            generator = getattr(self.data, "generator", None) or getattr(self.data.sampler, "generator", None)
            if generator is not None:
                generator.manual_seed(int(np.random.default_rng((self.seed, epoch)).integers(2**62)))
        source = self.data() if callable(self.data) and not hasattr(self.data, "__iter__") else self.data
        try:
            return iter(source)
        except TypeError:
            raise DataError(f"{self.name} returned {type(source).__name__}, which is not iterable; the callable "
                            "must return an iterator of batches") from None
        finally:
            _no_torch_sigchld()

    def batches(self, epoch: int, skip: int = 0, state: Any = None,
                ) -> Iterator[tuple[dict[str, np.ndarray], Any]]:
        """`(batch, state after it)` for epoch `epoch`: {name: (B, ...)} NumPy batches in the loader's
        order, after `skip` batches (or from `state`, the iterator's saved state, when given).
        The state is None for an iterator without `get_state`. A short batch ends the epoch (it
        must be the last).

        Raises:
          DataError: the iterator raised (its error in one line), a batch unlike the first, a short
            batch before the last, a one-shot iterator that ran out.
        """
        if self._pending is not None and (epoch == 1 or self.once) and state is None:
            it, raw = self._pending, self._first_raw  # the iterator the first batch was read from
        else:
            it = raw = self._new_iterator(epoch)
        self._pending = None
        stateful = raw if _stateful(raw) else None  # Grain's iterators
        if state is not None and stateful is not None:
            try:
                stateful.set_state(_decode_state(state))
            except Exception as e:
                raise self._state_refused(e) from None
            it, skip = raw, 0
        index, short = 0, None
        while True:
            try:
                item = next(it)
            except StopIteration:
                if self.once and index == 0:
                    raise DataError(f"{self.name} ran out: it is a one-shot iterator (a generator), used up by epoch "
                                    f"{epoch - 1}; pass an iterable or a callable that returns a fresh iterator each "
                                    "epoch (e.g. lambda: batches())") from None
                return
            except DataError:
                raise
            except Exception as e:
                raise _iteration_error(e, self.name, epoch, index) from None
            where = f"batch {index:,} of epoch {epoch}"
            if short is not None:
                raise DataError(f"batch {index - 1:,} of epoch {epoch} of {self.name} has {short} rows, fewer than the "
                                f"first's {self.batch_size}, and is not the last; only the last batch may be short")
            flat = self._spec.check(item, where)
            rows = len(next(iter(flat.values())))
            if rows > self.batch_size:
                raise DataError(f"{where} of {self.name} has {rows} rows, more than the first's {self.batch_size}; "
                                "every batch must have the first batch's rows (the last may have fewer)")
            if rows < self.batch_size:
                short = rows
            if index >= skip:
                for k, v in flat.items():
                    check_finite(v, k, 0, f"{where} of {self.name}", self.allow_nan)
                yield flat, (_encode_state(stateful.get_state()) if stateful is not None else None)
            index += 1


    def refused(self, epoch: int, state: Any) -> str | None:
        """Why the loader will not take back its saved `state` for epoch `epoch` although the data
        are the same (a Grain source whose default repr(), a memory address, differs in every
        process: the position then comes back by skipping batches), or None when it takes it.

        Raises:
          DataError: the loader refused the state for another reason (another sampler, other workers).
        """
        raw = self._new_iterator(epoch)
        if not (hasattr(raw, "get_state") and hasattr(raw, "set_state")):
            return None
        try:
            raw.set_state(_decode_state(state))
        except Exception as e:
            if "repr(" in str(e) and " object at 0x" in str(e):  # Grain's check of the source, on a default repr
                source = self.dataset()
                cls = type(source).__name__ if source is not None else "the data source"
                return (f"Grain compares the data source by repr(), and {cls}'s holds a memory address, new in every "
                        f"process; give {cls} a stable __repr__ (e.g. def __repr__(self): return "
                        f"f\"{cls}({{len(self)}})\") so that a resume takes the saved position")
            raise self._state_refused(e) from None
        return None

    def _state_refused(self, e: BaseException) -> DataError:
        return DataError(f"{self.name} cannot resume from the loader state saved in the checkpoint: the loader "
                         f"refused it ({type(e).__name__}: {_first_line(e)}); build the loader as the run did "
                         "(its sampler, workers and source), or start a new run")


def _no_torch_sigchld() -> None:
    """Removes torch's SIGCHLD handler (in the main thread; elsewhere signals cannot change).

    A torch DataLoader with worker processes, iterated in the main thread, installs a handler that
    raises a dead worker's error in the main thread, wherever that thread is (a compiled call, a
    checkpoint being written). jaxtrain reads loaders in a thread of its own, and torch's reader
    finds a dead worker itself (it checks every 5 s), so the error arrives where the batches do, as
    one line.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    handler = signal.getsignal(signal.SIGCHLD)
    if getattr(handler, "__module__", "").startswith("torch.utils.data"):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _has_len(data: Any) -> bool:
    try:
        len(data)
        return True
    except TypeError:
        return False


class _StatefulIterator(Protocol):
    """An iterator whose position can be saved and restored (Grain's)."""

    def __next__(self) -> Any: ...

    def get_state(self) -> Any: ...

    def set_state(self, state: Any) -> None: ...


def _stateful(it: Iterator) -> TypeGuard[_StatefulIterator]:
    return hasattr(it, "get_state") and hasattr(it, "set_state")


def _encode_state(state: Any) -> Any:
    """An iterator's state, JSON-ready (bytes, as Grain's DataLoader gives, in base64)."""
    return {"bytes": base64.b64encode(state).decode()} if isinstance(state, bytes) else state


def _decode_state(state: Any) -> Any:
    return base64.b64decode(state["bytes"]) if isinstance(state, dict) and set(state) == {"bytes"} else state


def _iteration_error(e: BaseException, name: str, epoch: int, index: int) -> DataError:
    # A loader reading from worker processes meets a broken connection when one of them died (a
    # killed DataLoader worker shows as this about 1 time in 8, else as torch's own RuntimeError).
    died = ("; a worker process of the loader died (killed, or out of memory)"
            if isinstance(e, (ConnectionResetError, BrokenPipeError, EOFError)) else "")
    return DataError(f"{name} raised {type(e).__name__} at batch {index:,} of epoch {epoch}: {_first_line(e)}{died}")


# -- choosing ------------------------------------------------------------------------------------


def _is_arrays(data: Any) -> bool:
    """A pytree of arrays as `fit` always took them (dicts, tuples, lists of arrays; an array)."""
    if isinstance(data, (np.ndarray, jax.Array)):
        return True
    if isinstance(data, (dict, list, tuple)):
        return all(_is_arrays(v) for v in (data.values() if isinstance(data, dict) else data)) or any(
            isinstance(v, (np.ndarray, jax.Array)) for v in jax.tree.leaves(data))
    return False


def adapt(data: Any, name: str = "data", seed: int = 0, allow_nan: bool = False) -> Any:
    """`data` as `fit` takes it: arrays, row sources and data that make their own feed as they are;
    a map-style dataset as a `MapSource`; an iterable of batches or a callable as a `BatchStream`.
    Anything else is returned as is (and refused by the checks that follow)."""
    if data is None or is_source(data) or hasattr(data, "make_feed") or isinstance(data, (BatchStream, MapSource)):
        return data
    if isinstance(data, (str, os.PathLike)):
        raise DataError(f"{name} is a path ({data}); open it first: jaxtrain.data.HDF5Source(path, keys) for HDF5, "
                        "jaxtrain.data.NpySource(folder) for .npy/.npz shards")
    if _is_arrays(data) or np.isscalar(data):
        return data
    if isinstance(data, Mapping) and data and all(isinstance(v, (list, tuple)) for v in data.values()):
        return {k: np.asarray(v) for k, v in data.items()}  # columns as Python lists (Keras takes them too)
    if type(data).__name__ == "BatchMapDataset":  # a Grain MapDataset after .batch(n): its elements are batches
        return BatchStream(data, name, seed, allow_nan)
    if hasattr(data, "__len__") and hasattr(data, "__getitem__") and not hasattr(data, "keys"):
        return MapSource(data, name)
    if hasattr(data, "__iter__") or callable(data):
        return BatchStream(data, name, seed, allow_nan)
    return data
