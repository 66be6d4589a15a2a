"""Synthetic HDF5 datasets of any size, written block by block in bounded memory.

Each workload is a pure function of (seed, start, stop) -> rows: rows are made in generation
blocks of `GEN_BLOCK_ROWS` rows, block i from a generator seeded by (seed, 1, i), so a file's
content depends on the seed and its row count only, not on chunking, compression or block size.

Workloads:
  mlp-regression: `features` float32 (N, 128) and `targets` float32 (N, 64). z ~ N(0, 1)^128,
    features = z * scale + offset (per-feature offsets ~ N(0, 2), scales ~ U(0.5, 3)), targets =
    tanh(z W1) W2 + 0.1 N(0, 1) with a fixed random teacher W1 (128x256), W2 (256x64) drawn from
    (seed, 0) -- the process of `recipes/mlp_regression.make_data`. The root attributes carry the
    exact per-feature mean and std (ddof 0, float64 accumulation) of all N rows, so a recipe can
    normalise without reading the file first.
  sequence: `input_sequences` int8 (N, L), i.i.d. uniform symbols of a 20-letter amino-acid
    alphabet; `targets` float32 (N, 2) and `labels` int32 (N,):
      targets[:, 0] = mean Kyte-Doolittle hydrophobicity of the sequence, standardised with its
                      exact mean and std under uniform symbols (a linear function of the counts);
      targets[:, 1] = the number of positions where a positive residue (K, R) is followed by a
                      negative one (D, E), standardised with its exact mean and std (a motif a
                      width-2 convolution finds);
      both plus 0.1 N(0, 1) noise, so each has variance about 1.01;
      labels = the quartile of targets[:, 0] under N(0, 1.01): 4 balanced classes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Callable, Literal, Sequence

import h5py
import numpy as np

from jaxtrain.errors import ConfigError, DataError

WORKLOADS = ("mlp-regression", "sequence")
GEN_BLOCK_ROWS = 8192  # rows per generator seed: part of the file format (changing it changes the data)
WRITE_ROWS = 65536  # rows generated and written per step: bounds the writer's memory
CHUNK_BYTES = 1 << 19  # default HDF5 chunk: about 512 KiB of the widest dataset
MAX_CHUNK_BYTES = 1 << 30

# mlp-regression
FEATURES, TARGETS, TEACHER_WIDTH, LABEL_NOISE = 128, 64, 256, 0.1

# sequence
ALPHABET = "ACDEFGHIKLMNPQRSTVWY"
KYTE_DOOLITTLE = np.array([1.8, 2.5, -3.5, -3.5, 2.8, -0.4, -3.2, 4.5, -3.9, 3.8,
                           1.9, -3.5, -1.6, -3.5, -4.5, -0.8, -0.7, 4.2, -0.9, -1.3])  # in ALPHABET order
POSITIVE, NEGATIVE = [ALPHABET.index(c) for c in "KR"], [ALPHABET.index(c) for c in "DE"]
SEQUENCE_NOISE = 0.1
NUM_CLASSES = 4


@dataclasses.dataclass(frozen=True)
class Teacher:
    """The fixed parameters of the mlp-regression process."""

    offset: np.ndarray  # (F,)
    scale: np.ndarray  # (F,)
    w1: np.ndarray  # (F, H)
    w2: np.ndarray  # (H, T)


def regression_teacher(seed: int) -> Teacher:
    """The per-feature offsets and scales and the tanh teacher of seed `seed`."""
    rng = np.random.default_rng((seed, 0))
    F, H, T = FEATURES, TEACHER_WIDTH, TARGETS
    return Teacher(
        offset=rng.normal(0.0, 2.0, F).astype(np.float32),
        scale=rng.uniform(0.5, 3.0, F).astype(np.float32),
        w1=rng.normal(0.0, 1.0 / np.sqrt(F), (F, H)).astype(np.float32),
        w2=rng.normal(0.0, 1.0 / np.sqrt(H), (H, T)).astype(np.float32),
    )


def _regression_block(teacher: Teacher, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    z = rng.standard_normal((n, FEATURES), dtype=np.float32)  # (n, F): the teacher sees standardised inputs
    noise = rng.standard_normal((n, TARGETS), dtype=np.float32)  # (n, T)
    y = np.tanh(z @ teacher.w1) @ teacher.w2 + LABEL_NOISE * noise  # (n, T)
    return {"features": z * teacher.scale + teacher.offset, "targets": y.astype(np.float32)}


def _sequence_moments(seq_len: int) -> tuple[float, float, float, float]:
    """Exact mean and std of the mean hydrophobicity and of the motif count for uniform symbols."""
    p = 1.0 / len(ALPHABET)
    h_mean, h_std = KYTE_DOOLITTLE.mean(), KYTE_DOOLITTLE.std() / math.sqrt(seq_len)
    q = (len(POSITIVE) * p) * (len(NEGATIVE) * p)  # P(motif starts at a position)
    # Motif starts at i and i+1 exclude each other (position i+1 cannot be positive and negative).
    var = (seq_len - 1) * q * (1 - q) - 2 * max(seq_len - 2, 0) * q * q
    return h_mean, h_std, (seq_len - 1) * q, math.sqrt(var) if var > 0 else 1.0


def _sequence_block(seq_len: int, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    tokens = rng.integers(0, len(ALPHABET), (n, seq_len), dtype=np.int8)  # (n, L)
    h_mean, h_std, m_mean, m_std = _sequence_moments(seq_len)
    hydro = KYTE_DOOLITTLE[tokens].mean(axis=1)  # (n,)
    motif = (np.isin(tokens[:, :-1], POSITIVE) & np.isin(tokens[:, 1:], NEGATIVE)).sum(axis=1)  # (n,)
    noise = SEQUENCE_NOISE * rng.standard_normal((n, 2))
    targets = np.stack([(hydro - h_mean) / h_std, (motif - m_mean) / m_std], axis=1) + noise  # (n, 2)
    edges = np.array([-0.6744897501960817, 0.0, 0.6744897501960817]) * math.sqrt(1 + SEQUENCE_NOISE**2)
    labels = np.searchsorted(edges, targets[:, 0]).astype(np.int32)  # (n,) quartile of N(0, 1.01)
    return {"input_sequences": tokens, "targets": targets.astype(np.float32), "labels": labels}


def _layout(workload: str, seq_len: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Dataset name -> (row shape, dtype)."""
    if workload == "mlp-regression":
        return {"features": ((FEATURES,), np.dtype(np.float32)), "targets": ((TARGETS,), np.dtype(np.float32))}
    return {"input_sequences": ((seq_len,), np.dtype(np.int8)), "targets": ((2,), np.dtype(np.float32)),
            "labels": ((), np.dtype(np.int32))}


def make_rows(workload: str, seed: int, start: int, stop: int, seq_len: int = 128) -> dict[str, np.ndarray]:
    """Rows [start, stop) of a workload's dataset, exactly as `generate_dataset` writes them.

    Returns:
      mlp-regression: {"features": (n, 128) float32, "targets": (n, 64) float32};
      sequence: {"input_sequences": (n, L) int8, "targets": (n, 2) float32, "labels": (n,) int32}.
    """
    if workload not in WORKLOADS:
        raise ConfigError(f"unknown workload {workload!r}; choose one of: {', '.join(WORKLOADS)}")
    teacher = regression_teacher(seed) if workload == "mlp-regression" else None
    parts = []
    for block in range(start // GEN_BLOCK_ROWS, -(-stop // GEN_BLOCK_ROWS)):
        rng = np.random.default_rng((seed, 1, block))
        rows = (_regression_block(teacher, rng, GEN_BLOCK_ROWS) if teacher is not None
                else _sequence_block(seq_len, rng, GEN_BLOCK_ROWS))
        lo, hi = max(start - block * GEN_BLOCK_ROWS, 0), min(stop - block * GEN_BLOCK_ROWS, GEN_BLOCK_ROWS)
        parts.append({k: v[lo:hi] for k, v in rows.items()})
    if not parts:
        return {k: np.empty((0, *shape), dtype) for k, (shape, dtype) in _layout(workload, seq_len).items()}
    return {k: np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in parts[0]}


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
    widest = max(dtype.itemsize * math.prod(shape) for shape, dtype in _layout(workload, seq_len).values())
    rows = 1 << max(0, int(math.log2(max(1, CHUNK_BYTES // widest))))
    return max(1, min(rows, samples))


def generate_dataset(workload: str, out: str | os.PathLike, samples: int, *, seq_len: int = 128,
             chunk_rows: int | None = None, compression: str = "none", seed: int = 0, force: bool = False,
             on_rows: Callable[[int], None] | None = None) -> GenerateResult:
    """Writes `samples` rows of a synthetic workload to the HDF5 file `out`, atomically.

    Rows go to `out + ".partial"`, which replaces `out` only once complete; any error or Ctrl-C
    removes it. Memory is bounded by `WRITE_ROWS` rows, whatever `samples` is.

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
      ConfigError: a bad argument, or `out` exists and `force` is False.
      DataError: the file cannot be written (a missing or read-only directory, a full disk).
    """
    chunk_rows = check_arguments(workload, out, samples, seq_len, chunk_rows, compression, seed, force)
    layout = _layout(workload, seq_len)
    widest = max(dtype.itemsize * math.prod(shape) for shape, dtype in layout.values())
    out = Path(out)
    tmp = out.with_name(out.name + ".partial")
    t0 = time.perf_counter()
    try:
        with _create(tmp, chunk_rows * widest) as f:
            _write(f, workload, samples, seq_len, min(chunk_rows, samples), compression, seed, layout, on_rows)
        os.replace(tmp, out)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError):
            raise DataError(f"cannot write {out}: {_reason(e)}; check that the directory exists, is writable and "
                            "has space") from None
        raise
    return GenerateResult(out, samples, time.perf_counter() - t0, out.stat().st_size)


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
    widest = max(dtype.itemsize * math.prod(shape) for shape, dtype in _layout(workload, seq_len).values())
    chunk_rows = chunk_rows or default_chunk_rows(workload, samples, seq_len)
    if chunk_rows < 1 or chunk_rows * widest > MAX_CHUNK_BYTES:
        raise ConfigError(f"chunk_rows={chunk_rows} must be >= 1 and give chunks of at most 1 GiB "
                          f"({MAX_CHUNK_BYTES // widest:,} rows here)")
    if Path(out).exists() and not force:
        raise ConfigError(f"{out} exists; pass --force to replace it, or choose another file name")
    return chunk_rows


def _create(path: Path, chunk_bytes: int) -> h5py.File:
    # A chunk cache that holds a chunk split over two writes, so no chunk is read back.
    return h5py.File(path, "w", rdcc_nbytes=max(1 << 20, 4 * chunk_bytes), rdcc_nslots=10007)


def _reason(e: OSError) -> str:
    return e.strerror or " ".join(str(e).split())


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


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
    """Options of `jaxtrain data generate WORKLOAD OUT.h5`."""

    samples: int
    """Rows to write (up to 10^8; memory stays bounded)."""
    seq_len: int = 128
    """Sequence length L (sequence workload)."""
    chunk_rows: int | None = None
    """Rows per HDF5 chunk; default chunks of about 512 KiB."""
    compression: Literal["none", "gzip", "lzf"] = "none"
    """Chunk compression."""
    seed: int = 0
    """Dataset seed."""
    force: bool = False
    """Replace OUT.h5 if it exists."""
    quiet: bool = False
    """No progress bar."""


def command(args: Sequence[str]) -> int:
    """`jaxtrain data generate WORKLOAD OUT.h5 --samples N [OPTIONS]`: writes a dataset with a progress bar."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from jaxtrain.cli import parse_config

    prog = "jaxtrain data generate WORKLOAD OUT.h5"
    positional = [a for a in args[:2] if not a.startswith("-")]
    if len(positional) < 2 and not ("-h" in args or "--help" in args):
        raise ConfigError(f"usage: {prog} --samples N [OPTIONS]; WORKLOAD is one of: {', '.join(WORKLOADS)}")
    o = parse_config(GenerateOptions, None, list(args[len(positional):]), prog)
    workload, out = positional
    check_arguments(workload, out, o.samples, o.seq_len, o.chunk_rows, o.compression, o.seed, o.force)
    console = Console()
    progress = Progress(TextColumn(f"[bold]{workload}"), BarColumn(), MofNCompleteColumn(), TextColumn("rows ETA"),
                        TimeRemainingColumn(), console=console, disable=o.quiet)
    with progress:
        task = progress.add_task("generate", total=o.samples)
        result = generate_dataset(workload, out, o.samples, seq_len=o.seq_len, chunk_rows=o.chunk_rows,
                                  compression=o.compression, seed=o.seed, force=o.force,
                                  on_rows=lambda rows: progress.update(task, completed=rows))
    console.print(f"wrote {result.path}: {result.samples:,} rows in {result.seconds:.1f} s "
                  f"({result.rows_per_s:,.0f} rows/s), {result.bytes / 1024**2:,.1f} MiB on disk", markup=False,
                  soft_wrap=True)
    return 0
