"""Synthetic HDF5 datasets of any size, written block by block in bounded memory.

The rows are those of `jaxtrain.data.synthetic` (a pure function of the seed and the row index),
so a file's content depends on the workload, its seed and its row count only, not on chunking,
compression or write size. mlp-regression files also carry, as root attributes, the exact
per-feature mean and std (ddof 0, float64 accumulation) of all N rows, so a recipe can normalise
without reading the file first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterator

import numpy as np

from jaxtrain._src.data.synthetic import (
    ALPHABET,
    FEATURES,
    GEN_BLOCK_ROWS,
    LABEL_NOISE,
    NUM_CLASSES,
    WORKLOADS,
    make_rows,
    row_layout,
)
from jaxtrain._src.errors import ConfigError, DataError, argument
from jaxtrain._src.safe_files import partial_file, partial_folder, refuse_link

if TYPE_CHECKING:  # h5py (11 MiB resident) is imported where a file is opened
    import h5py

WRITE_ROWS = 65536  # rows generated and written per step: bounds the writer's memory
CHUNK_BYTES = 1 << 19  # default HDF5 chunk: about 512 KiB of the widest dataset
MAX_CHUNK_BYTES = 1 << 30
SHARD_ROWS = 131072  # rows per .npy shard (about 100 MB of mlp-regression rows)
ADVICE = "choose another file name"  # what a refused `out` says to do


class _MomentAccumulator:
    """Per-column mean and M2 over blocks (Chan et al.'s pairwise update, float64)."""

    def __init__(self, columns: int):
        self.n, self.mean, self.m2 = 0, np.zeros(columns), np.zeros(columns)

    def update(self, x: np.ndarray) -> None:
        x = x.astype(np.float64)  # (n, C)
        n, mean = len(x), x.mean(axis=0)
        m2 = ((x - mean) ** 2).sum(axis=0)
        total = self.n + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta**2 * (self.n * n / total)
        self.n = total

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(self.m2 / max(self.n, 1))


@dataclasses.dataclass(frozen=True)
class GenerateResult:
    """What `generate_dataset` wrote."""

    path: Path
    samples: int
    seconds: float
    bytes: int

    @property
    def rows_per_s(self) -> float:
        return self.samples / max(self.seconds, 1e-9)


def default_chunk_rows(workload: str, samples: int, seq_len: int = 128) -> int:
    """A power of two with chunks of about 512 KiB for the widest dataset (at most `samples`)."""
    widest = max(dtype.itemsize * math.prod(shape) for shape, dtype in row_layout(workload, seq_len).values())
    rows = 1 << max(0, int(math.log2(max(1, CHUNK_BYTES // widest))))
    return max(1, min(rows, samples))


def generate_dataset(workload: str, out: str | os.PathLike, samples: int, *, seq_len: int = 128,
             chunk_rows: int | None = None, compression: str = "none", seed: int = 0, force: bool = False,
             on_rows: Callable[[int], None] | None = None, format: str = "hdf5",
             shard_rows: int = SHARD_ROWS) -> GenerateResult:
    """Writes `samples` rows of a synthetic workload to the HDF5 file `out`, atomically (or, with
    `format="npy"`, to the folder `out` as .npy shards `NAME-00000.npy`, ... of `shard_rows` rows,
    with the file's attributes in `attrs.json`: what `jaxtrain.data.NpySource` reads).

    Rows go to a temporary file (folder) beside `out`, made exclusively under a name of this call
    (`safe_files.partial_file`, `partial_folder`: no planted link is followed, and two generations
    of one `out` never share it), which replaces `out` only once complete; any error, Ctrl-C or
    SIGTERM removes it. An `out` that is a symbolic link is refused. Memory is bounded by
    `WRITE_ROWS` rows, whatever `samples` is.

    Args:
      workload: "mlp-regression" or "sequence".
      out: the file to write.
      samples: rows N.
      seq_len: sequence length L (sequence workload).
      chunk_rows: rows per HDF5 chunk; default chunks of about 512 KiB.
      compression: "none", "gzip" or "lzf".
      seed: the dataset seed.
      force: replace an existing `out`.
      on_rows: called with the number of rows written so far, after each write.

    Raises:
      ConfigError: a bad argument, `out` is a symbolic link, or `out` exists and `force` is False.
      DataError: the file cannot be written (a missing or read-only directory, a full disk).
    """
    chunk_rows = check_arguments(workload, out, samples, seq_len, chunk_rows, compression, seed, force)
    if format == "npy":
        return _generate_shards(workload, Path(out), samples, seq_len, seed, shard_rows, on_rows)
    if format != "hdf5":
        raise ConfigError(f"unknown format {format!r}; choose hdf5 or npy")
    layout = row_layout(workload, seq_len)
    widest = max(dtype.itemsize * math.prod(shape) for shape, dtype in layout.values())
    out = Path(out)
    t0 = time.perf_counter()
    try:
        # The HDF5 file closes (its last bytes written) before partial_file renames it.
        with _term_raises(), partial_file(out, advice=ADVICE) as tmp, _create(tmp, chunk_rows * widest) as f:
            _write(f, workload, samples, seq_len, min(chunk_rows, samples), compression, seed, layout, on_rows)
    except OSError as e:
        raise _write_error(out, e) from None
    return GenerateResult(out, samples, time.perf_counter() - t0, out.stat().st_size)


def _generate_shards(workload: str, out: Path, samples: int, seq_len: int, seed: int, shard_rows: int,
                     on_rows: Callable[[int], None] | None) -> GenerateResult:
    """`generate_dataset`'s rows as .npy shards in the folder `out`, written in a temporary folder
    beside it first (`partial_folder`)."""
    if shard_rows < 1:
        raise ConfigError(f"shard_rows={shard_rows} must be an integer >= 1")
    t0 = time.perf_counter()
    moments = _MomentAccumulator(FEATURES) if workload == "mlp-regression" else None
    try:
        with _term_raises(), partial_folder(out, advice=ADVICE) as tmp:  # the folder is ours, new and empty
            for i, start in enumerate(range(0, samples, shard_rows)):
                stop = min(start + shard_rows, samples)
                rows = make_rows(workload, seed, start, stop, seq_len)
                for name, values in rows.items():
                    np.save(tmp / f"{name}-{i:05d}.npy", values)
                if moments is not None:
                    moments.update(rows["features"])
                if on_rows is not None:
                    on_rows(stop)
            attrs = {"workload": workload, "seed": seed, "samples": samples}
            if moments is not None:
                attrs.update(feature_mean=moments.mean.tolist(), feature_std=moments.std.tolist(),
                             label_noise=LABEL_NOISE)
            else:
                attrs.update(seq_len=seq_len, alphabet_size=len(ALPHABET), alphabet=ALPHABET, num_classes=NUM_CLASSES)
            (tmp / "attrs.json").write_text(json.dumps(attrs))
    except OSError as e:  # `force` was checked: partial_folder replaces an old folder
        raise _write_error(out, e) from None
    size = sum(f.stat().st_size for f in out.iterdir())
    return GenerateResult(out, samples, time.perf_counter() - t0, size)


@contextlib.contextmanager
def _term_raises() -> Iterator[None]:
    """SIGTERM ends the process as it would anyway (exit 128 + 15), but as an exception, so the
    partial file is removed on the way out (in the main thread; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def check_arguments(workload: str, out: str | os.PathLike, samples: int, seq_len: int, chunk_rows: int | None,
                    compression: str, seed: int, force: bool) -> int:
    """Validates `generate_dataset`'s arguments; returns the chunk rows to use.

    Raises:
      ConfigError: the first bad argument, or `out` exists and `force` is False.
    """
    if workload not in WORKLOADS:
        raise ConfigError(f"unknown workload {workload!r}; choose one of: {', '.join(WORKLOADS)}")
    if compression not in ("none", "gzip", "lzf"):
        raise ConfigError(f"unknown compression {compression!r}; choose none, gzip or lzf")
    for name, value in (("samples", samples), ("seq_len", seq_len)):
        if value < 1:
            raise ConfigError(f"{name}={value} must be an integer >= 1")
    if seed < 0:
        raise ConfigError(f"seed={seed} must be >= 0")
    widest = max(dtype.itemsize * math.prod(shape) for shape, dtype in row_layout(workload, seq_len).values())
    chunk_rows = chunk_rows or default_chunk_rows(workload, samples, seq_len)
    if chunk_rows < 1 or chunk_rows * widest > MAX_CHUNK_BYTES:
        raise ConfigError(f"chunk_rows={chunk_rows} must be >= 1 and give chunks of at most 1 GiB "
                          f"({MAX_CHUNK_BYTES // widest:,} rows here)")
    refuse_link(out, advice=ADVICE)  # before `exists`, which follows it
    if Path(out).exists() and not force:
        raise ConfigError(f"{out} exists; pass {argument('force', True)} to replace it, or choose another file name",
                          path=Path(out))
    return chunk_rows


def _create(file: BinaryIO, chunk_bytes: int) -> h5py.File:
    """An HDF5 file written through `file` (the temporary file that `partial_file` made), never
    opened again by name."""
    import h5py

    # A chunk cache that holds a chunk split over two writes, so no chunk is read back.
    return h5py.File(file, "w", rdcc_nbytes=max(1 << 20, 4 * chunk_bytes), rdcc_nslots=10007)


def _reason(e: OSError) -> str:
    return e.strerror or " ".join(str(e).split())


def _write_error(out: Path, e: OSError) -> DataError:
    return DataError(f"cannot write {out}: {_reason(e)}; check that the directory exists, is writable and has space")


def _write(f: h5py.File, workload: str, samples: int, seq_len: int, chunk_rows: int, compression: str, seed: int,
           layout: dict, on_rows: Callable[[int], None] | None) -> None:
    options = {} if compression == "none" else {"compression": compression}
    datasets = {name: f.create_dataset(name, (samples, *shape), dtype, chunks=(chunk_rows, *shape), **options)
                for name, (shape, dtype) in layout.items()}
    moments = _MomentAccumulator(FEATURES) if workload == "mlp-regression" else None
    step = max(GEN_BLOCK_ROWS, WRITE_ROWS // GEN_BLOCK_ROWS * GEN_BLOCK_ROWS)
    for start in range(0, samples, step):
        stop = min(start + step, samples)
        rows = make_rows(workload, seed, start, stop, seq_len)
        for name, values in rows.items():
            datasets[name][start:stop] = values
        if moments is not None:
            moments.update(rows["features"])
        if on_rows is not None:
            on_rows(stop)
    f.attrs.update({"workload": workload, "seed": seed, "samples": samples})
    if moments is not None:
        f.attrs.update({"feature_mean": moments.mean, "feature_std": moments.std, "label_noise": LABEL_NOISE})
    else:
        f.attrs.update({"seq_len": seq_len, "alphabet_size": len(ALPHABET), "alphabet": ALPHABET,
                        "num_classes": NUM_CLASSES})
