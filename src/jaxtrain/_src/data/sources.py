"""Row sources for streaming: a length and contiguous reads, `read(start, stop) -> {name: (n, ...)}`.

Contiguous row ranges are the only access pattern the streaming loader uses, so a source never
has to support (slow) random per-row reads. Rows are numbered from 0 within the source's row
range; error messages name rows as numbered in the file.

NaN/Inf policy: every floating-point block a source returns has been checked with `np.isfinite`.
A non-finite value raises `DataError` naming the dataset, the file and the row range, so a bad
row stops training at once with its location instead of turning the loss into NaN steps later.

Change policy: a file source records the file's `os.stat` fingerprint (size, mtime, inode,
device) when it opens it and compares it after every read. A file truncated, rewritten, touched,
replaced (`mv other.h5 data.h5`) or deleted since then raises `DataError`, so rows read after the
change never reach training (HDF5 reads past a truncated end as zeros, and a replaced file goes on
being read from the old inode: neither fails by itself).
"""

from __future__ import annotations

import math
import os
import shlex
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from jaxtrain._src.errors import DataError

if TYPE_CHECKING:  # h5py (11 MiB resident) is imported where a file is opened
    import h5py

SUPPORTED_DTYPES = tuple(np.dtype(t) for t in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "float16", "float32", "float64",
))
CONTIGUOUS_READ_BYTES = 1 << 20  # read size for datasets stored without chunks: large enough to amortise a call
MAX_CHUNK_ROWS = 1 << 20  # cap on the common multiple of several datasets' chunk sizes


class RowSource(Protocol):
    """What the streaming loader needs from a source.

    A source may also have `read_into(start, stop, out)`: the rows of `read` written into arrays
    the caller gives ({name: (stop - start, ...)}). The loader then reads straight into its
    window buffers, which it allocates once per stream, instead of a fresh array per read.
    """

    def __len__(self) -> int: ...

    @property
    def chunk_rows(self) -> int: ...

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]: ...


class DataSource(RowSource, Protocol):
    """A row source as `fit`, `predict` and the fingerprint take it (`is_source`): its rows' names,
    shapes, dtypes and size known without reading them."""

    @property
    def row_shapes(self) -> dict[str, tuple[int, ...]]: ...

    @property
    def dtypes(self) -> dict[str, np.dtype]: ...

    @property
    def row_nbytes(self) -> int: ...


class RowSourceInto(RowSource, Protocol):
    """A RowSource with `read_into` (see RowSource)."""

    def read_into(self, start: int, stop: int, out: dict[str, np.ndarray]) -> None: ...


def rows_text(start: int, stop: int) -> str:
    """`rows 1,024–2,047` for the half-open range [start, stop)."""
    return f"row {start:,}" if stop - start == 1 else f"rows {start:,}–{stop - 1:,}"


def check_finite(block: np.ndarray, name: str, start: int, where: str, allow_nan: bool = False) -> None:
    """Raises DataError if the float `block` (rows from `start` on) holds NaN or Inf (Inf only, with
    `allow_nan`: `DataConfig.allow_nan`, for a loader's batches).

    Args:
      block: (n, ...) rows just read; integer and bool blocks pass unchecked.
      name: the dataset's name, for the message.
      start: the row number of `block[0]`, as numbered in the file.
      where: the file (or "arrays") the rows came from.
    """
    if block.dtype.kind != "f" or np.isfinite(block).all() or (allow_nan and not np.isinf(block).any()):
        return
    rows = block.reshape(len(block), -1)
    bad = np.isinf(rows).any(axis=1) if allow_nan else ~np.isfinite(rows).all(axis=1)  # (n,)
    first = start + int(np.argmax(bad))
    verb = "contains" if len(block) == 1 else "contain"
    raise DataError(
        f"{rows_text(start, start + len(block))} of {name!r} in {where} {verb} NaN/Inf ({int(bad.sum()):,} "
        f"bad, first row {first:,}); clean the file or drop those rows (`jaxtrain data inspect` counts them)"
    )


def _row_range(start: int, stop: int | None, n: int, what: str) -> tuple[int, int]:
    """[start, stop) within [0, n) (negative values count from the end, as in slicing)."""
    lo = start + n if start < 0 else start
    hi = n if stop is None else (stop + n if stop < 0 else stop)
    if not 0 <= lo < hi <= n:
        raise DataError(f"{what} has {n:,} rows; the row range [{start}, {stop}) asks for rows it does not have "
                        "(or none); choose start and stop within the data")
    return lo, hi


def _check_dtype(dtype: np.dtype, name: str, where: str) -> None:
    if dtype.newbyteorder("=") not in SUPPORTED_DTYPES:
        raise DataError(f"{name!r} in {where} has dtype {dtype}, which cannot be streamed; store it as bool, "
                        "int8/16/32/64, uint8/16/32 or float16/32/64")


class ArraySource:
    """Rows [start, stop) of in-memory arrays that share a leading axis (for tests and small data).

    Args:
      arrays: batch name -> (N, ...) array.
      start, stop: the row range to serve (negative values count from the end).
      chunk_rows: the read granularity the loader aligns its blocks to.
    """

    def __init__(self, arrays: dict[str, np.ndarray], start: int = 0, stop: int | None = None, *,
                 chunk_rows: int = 1):
        if not arrays:
            raise DataError("ArraySource needs at least one array")
        lengths = {k: np.shape(v)[0] if np.ndim(v) else 0 for k, v in arrays.items()}
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{k}: {v:,}" for k, v in lengths.items())
            raise DataError(f"arrays have different numbers of rows ({detail}); they must match")
        self._arrays = {k: np.asarray(v) for k, v in arrays.items()}
        for k, v in self._arrays.items():
            _check_dtype(v.dtype, k, "arrays")
        self.start, self.stop = _row_range(start, stop, next(iter(lengths.values())), "arrays")
        self._chunk_rows = chunk_rows

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._arrays)

    @property
    def chunk_rows(self) -> int:
        return self._chunk_rows

    @property
    def row_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: v.shape[1:] for k, v in self._arrays.items()}

    @property
    def dtypes(self) -> dict[str, np.dtype]:
        return {k: v.dtype for k, v in self._arrays.items()}

    @property
    def row_nbytes(self) -> int:
        return sum(v.dtype.itemsize * math.prod(v.shape[1:]) for v in self._arrays.values())

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Rows [start, stop) of the range as copies: {name: (stop - start, ...)}."""
        lo, hi = self.start + start, self.start + stop
        out = {k: v[lo:hi].copy() for k, v in self._arrays.items()}
        for k, v in out.items():
            check_finite(v, k, lo, "arrays")
        return out

    def read_into(self, start: int, stop: int, out: dict[str, np.ndarray]) -> None:
        """`read(start, stop)` written into `out` ({name: (stop - start, ...)})."""
        lo, hi = self.start + start, self.start + stop
        for k, v in self._arrays.items():
            np.copyto(out[k], v[lo:hi])
            check_finite(out[k], k, lo, "arrays")

    def close(self) -> None:
        pass


def open_hdf5(path: str | os.PathLike) -> h5py.File:
    """Opens `path` read-only; a missing, non-HDF5, corrupt or truncated file is a DataError."""
    import h5py

    path = Path(path)
    if not path.exists():
        raise DataError(f"{path} does not exist; check the path or create it with `jaxtrain data generate`")
    if not path.is_file():
        raise DataError(f"{path} is not a file; pass the path of an HDF5 file")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise DataError(f"cannot open {path} as HDF5 ({hdf5_reason(e)}); the file is not HDF5, or it is "
                        "corrupt or truncated: re-copy or regenerate it") from None


def hdf5_reason(e: BaseException) -> str:
    """HDF5's message without h5py's wrapping, on one line."""
    text = " ".join(str(e).split())
    for prefix in ("Unable to synchronously open file ", "Unable to open file ", "Can't synchronously read data ",
                   "Can't read data "):
        text = text.removeprefix(prefix)
    return text.removeprefix("(").removesuffix(")") or type(e).__name__


def list_datasets(f: h5py.File) -> list[str]:
    """The paths of every dataset in `f`, in file order."""
    import h5py

    names: list[str] = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names


def stat_fingerprint(path: Path) -> os.stat_result | None:
    """The file's `os.stat`, or None when it is missing (see `describe_change`)."""
    try:
        return os.stat(path)
    except OSError:
        return None


def describe_change(before: os.stat_result | None, after: os.stat_result | None) -> str | None:
    """What changed between two `stat_fingerprint`s of a file, e.g. `size 1,024 -> 512 bytes; modified
    at 12:03:04`, or None when nothing did."""
    if before is None or after is None:
        return None if before is after else "deleted or moved away" if after is None else "created"
    changes = []
    if (before.st_ino, before.st_dev) != (after.st_ino, after.st_dev):
        changes.append("replaced by another file")
    if before.st_size != after.st_size:
        changes.append(f"size {before.st_size:,} -> {after.st_size:,} bytes")
    if before.st_mtime_ns != after.st_mtime_ns:
        when = time.localtime(after.st_mtime_ns / 1e9)
        same_day = when[:3] == time.localtime()[:3]
        changes.append("modified at " + time.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S", when))
    return "; ".join(changes) or None


class HDF5Source:
    """Rows [start, stop) of equally long datasets of one HDF5 file.

    The file stays open until `close()` (or the end of a `with` block). Reads may come from any
    thread: h5py serialises calls on its global lock and releases the GIL inside HDF5's read, so a
    background reader overlaps with the training thread; a lock of our own orders reads with close.
    Every read checks, after reading, that the file has not changed since it was opened (one
    `os.stat` per read; see the module docstring).

    Args:
      path: the HDF5 file.
      keys: batch name -> dataset path, e.g. {"x": "features", "y": "targets"}.
      start, stop: the row range to serve (negative values count from the end), e.g. `stop=-5000`
        to hold out the last 5,000 rows for validation.

    Raises:
      DataError: a missing, non-HDF5, corrupt or truncated file; a missing dataset; datasets of
        different lengths; a dtype that cannot be streamed; a row range the file does not have.
    """

    def __init__(self, path: str | os.PathLike, keys: dict[str, str], start: int = 0, stop: int | None = None):
        if not keys:
            raise DataError("HDF5Source needs at least one key (batch name -> dataset name)")
        self.path = Path(path)
        self._stat = stat_fingerprint(self.path)  # before opening: a change from here on is caught by `read`
        self._file = open_hdf5(path)
        self._lock = threading.Lock()
        try:
            self._datasets = self._open_datasets(keys)
            n = next(iter(self._datasets.values())).shape[0]
            self.start, self.stop = _row_range(start, stop, n, str(self.path))
            self._chunk_rows = self._common_chunk_rows()
            self.attrs = {k: attr_value(v) for k, v in self._file.attrs.items()}
        except BaseException:
            self._file.close()
            raise
        self.keys = dict(keys)

    def _open_datasets(self, keys: dict[str, str]) -> dict[str, h5py.Dataset]:
        import h5py

        datasets = {}
        for name, key in keys.items():
            obj = self._file.get(key)
            if not isinstance(obj, h5py.Dataset):
                have = ", ".join(list_datasets(self._file)[:20]) or "no datasets"
                raise DataError(f"{self.path} has no dataset {key!r} (it has: {have}); pass keys that exist, "
                                f"e.g. `jaxtrain data inspect {shlex.quote(str(self.path))}` lists them")
            if obj.ndim == 0:
                raise DataError(f"{key!r} in {self.path} is a scalar; datasets need a leading row axis")
            _check_dtype(obj.dtype, key, str(self.path))
            datasets[name] = obj
        lengths = {keys[k]: d.shape[0] for k, d in datasets.items()}
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{k}: {v:,}" for k, v in lengths.items())
            raise DataError(f"datasets in {self.path} have different numbers of rows ({detail}); they must match")
        return datasets

    def _common_chunk_rows(self) -> int:
        """Rows per read such that every read covers whole chunks of every dataset."""
        chunked = [d.chunks[0] for d in self._datasets.values() if d.chunks is not None]
        if not chunked:
            return max(1, CONTIGUOUS_READ_BYTES // max(1, self.row_nbytes))
        rows = math.lcm(*chunked)
        return rows if rows <= MAX_CHUNK_ROWS else max(chunked)

    def __len__(self) -> int:
        return self.stop - self.start

    def __enter__(self) -> "HDF5Source":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._file.id.valid:
                self._file.close()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._datasets)

    @property
    def chunk_rows(self) -> int:
        """Rows per HDF5 chunk along axis 0 (for contiguous datasets: rows in about 1 MiB)."""
        return self._chunk_rows

    @property
    def row_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: d.shape[1:] for k, d in self._datasets.items()}

    @property
    def dtypes(self) -> dict[str, np.dtype]:
        return {k: d.dtype.newbyteorder("=") for k, d in self._datasets.items()}

    @property
    def row_nbytes(self) -> int:
        return sum(d.dtype.itemsize * math.prod(d.shape[1:]) for d in self._datasets.values())

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Rows [start, stop) of the range: {name: (stop - start, ...)} in native byte order.

        Raises:
          DataError: the file changed since it was opened (checked after reading, so a change
            during the read counts), HDF5 cannot read the rows (a corrupt or truncated file), or
            they hold NaN/Inf.
        """
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"rows [{start}, {stop}) are outside this source's {len(self)} rows")
        out = {name: np.empty((stop - start, *d.shape[1:]), d.dtype.newbyteorder("="))
               for name, d in self._datasets.items()}
        self.read_into(start, stop, out)
        return out

    def read_into(self, start: int, stop: int, out: dict[str, np.ndarray]) -> None:
        """`read(start, stop)` written into `out` ({name: (stop - start, ...)} C-contiguous arrays):
        HDF5 reads straight into them (what the streaming loader's window buffers use).

        Raises:
          DataError: as `read`.
        """
        lo, hi = self.start + start, self.start + stop
        if not self.start <= lo <= hi <= self.stop:
            raise IndexError(f"rows [{start}, {stop}) are outside this source's {len(self)} rows")
        with self._lock:
            if not self._file.id.valid:
                raise DataError(f"{self.path} was closed; open a new HDF5Source to read it")
            for name, ds in self._datasets.items():
                block = out[name]
                if hi > lo:
                    try:
                        ds.read_direct(block, np.s_[lo:hi])
                    except (OSError, RuntimeError, ValueError) as e:
                        corrupt = DataError(f"cannot read {rows_text(lo, hi)} of {ds.name.lstrip('/')!r} in "
                                            f"{self.path} ({hdf5_reason(e)}); the file is corrupt or truncated: "
                                            "re-copy or regenerate it")
                        raise self._change_error() or corrupt from None  # cut short under us: say that
        if (changed := self._change_error()) is not None:  # after the read: a change during it counts too
            raise changed
        for name in self._datasets:
            check_finite(out[name], self.keys[name], lo, str(self.path))

    def _change_error(self) -> DataError | None:
        """The error to raise when the file is no longer the one opened (rows read now may be another's)."""
        change = describe_change(self._stat, stat_fingerprint(self.path))
        if change is None:
            return None
        return DataError(f"{self.path} changed while it was being read ({change}): a dataset must not change "
                         "during a run; restore it or start a new run on the new file")


def attr_value(value):
    """An HDF5 attribute as a plain Python value (lists for arrays, str for bytes)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
