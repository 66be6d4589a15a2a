"""The synthetic workloads: rows as pure functions of (seed, row index), in memory or via `generate_dataset`.

Rows are made in generation blocks of `GEN_BLOCK_ROWS` rows, block i from a generator seeded by
(seed, 1, i), so row r depends on the seed and r only: not on how many rows are asked for, nor
on the chunking, compression or write size of a file.

Workloads:
  mlp-regression: `features` float32 (N, F) and `targets` float32 (N, T), by default F = 128,
    T = 64. z ~ N(0, 1)^F, features = z * scale + offset (per-feature offsets ~ N(0, 2), scales
    ~ U(0.5, 3)), targets = tanh(z W1) W2 + noise N(0, 1) with a fixed random teacher W1 (F x H),
    W2 (H x T), H = 256, drawn from (seed, 0). The `mlp-regression` recipe's in-memory data are
    these rows, and so are the files of `jaxtrain data generate mlp-regression`.
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

import dataclasses
import math
from typing import Callable

import numpy as np

from jaxtrain._src.errors import ConfigError

WORKLOADS = ("mlp-regression", "sequence")
GEN_BLOCK_ROWS = 8192  # rows per generator seed: part of the data's definition (changing it changes the rows)

# mlp-regression
FEATURES, TARGETS, TEACHER_WIDTH, LABEL_NOISE = 128, 64, 256, 0.1

# sequence
ALPHABET = "ACDEFGHIKLMNPQRSTVWY"
KYTE_DOOLITTLE = np.array([1.8, 2.5, -3.5, -3.5, 2.8, -0.4, -3.2, 4.5, -3.9, 3.8,
                           1.9, -3.5, -1.6, -3.5, -4.5, -0.8, -0.7, 4.2, -0.9, -1.3])  # in ALPHABET order
POSITIVE, NEGATIVE = [ALPHABET.index(c) for c in "KR"], [ALPHABET.index(c) for c in "DE"]
SEQUENCE_NOISE = 0.1
NUM_CLASSES = 4

Layout = dict[str, tuple[tuple[int, ...], np.dtype]]  # dataset name -> (row shape, dtype)


@dataclasses.dataclass(frozen=True)
class Teacher:
    """The fixed parameters of the mlp-regression process."""

    offset: np.ndarray  # (F,)
    scale: np.ndarray  # (F,)
    w1: np.ndarray  # (F, H)
    w2: np.ndarray  # (H, T)


def regression_teacher(seed: int, features: int = FEATURES, targets: int = TARGETS,
                       width: int = TEACHER_WIDTH) -> Teacher:
    """The per-feature offsets and scales and the tanh teacher of seed `seed`."""
    rng = np.random.default_rng((seed, 0))
    F, H, T = features, width, targets
    return Teacher(
        offset=rng.normal(0.0, 2.0, F).astype(np.float32),
        scale=rng.uniform(0.5, 3.0, F).astype(np.float32),
        w1=rng.normal(0.0, 1.0 / np.sqrt(F), (F, H)).astype(np.float32),
        w2=rng.normal(0.0, 1.0 / np.sqrt(H), (H, T)).astype(np.float32),
    )


def regression_rows(seed: int, start: int, stop: int, *, features: int = FEATURES, targets: int = TARGETS,
                    teacher_width: int = TEACHER_WIDTH, label_noise: float = LABEL_NOISE) -> dict[str, np.ndarray]:
    """Rows [start, stop) of the mlp-regression process of seed `seed`.

    With the default sizes these are the rows `generate_dataset("mlp-regression", ..., seed=seed)` writes.

    Returns:
      {"features": (n, F) float32, "targets": (n, T) float32}, n = stop - start.
    """
    teacher = regression_teacher(seed, features, targets, teacher_width)

    def block(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        z = rng.standard_normal((n, features), dtype=np.float32)  # (n, F): the teacher sees standardised inputs
        noise = rng.standard_normal((n, targets), dtype=np.float32)  # (n, T)
        y = np.tanh(z @ teacher.w1) @ teacher.w2 + label_noise * noise  # (n, T)
        return {"features": z * teacher.scale + teacher.offset, "targets": y.astype(np.float32)}

    return _rows(seed, start, stop, block, _regression_layout(features, targets))


def _sequence_moments(seq_len: int) -> tuple[float, float, float, float]:
    """Exact mean and std of the mean hydrophobicity and of the motif count for uniform symbols."""
    p = 1.0 / len(ALPHABET)
    h_mean, h_std = KYTE_DOOLITTLE.mean(), KYTE_DOOLITTLE.std() / math.sqrt(seq_len)
    q = (len(POSITIVE) * p) * (len(NEGATIVE) * p)  # P(motif starts at a position)
    # Motif starts at i and i+1 exclude each other (position i+1 cannot be positive and negative).
    var = (seq_len - 1) * q * (1 - q) - 2 * max(seq_len - 2, 0) * q * q
    return h_mean, h_std, (seq_len - 1) * q, math.sqrt(var) if var > 0 else 1.0


def sequence_rows(seed: int, start: int, stop: int, seq_len: int = 128) -> dict[str, np.ndarray]:
    """Rows [start, stop) of the sequence process of seed `seed`.

    Returns:
      {"input_sequences": (n, L) int8, "targets": (n, 2) float32, "labels": (n,) int32}, n = stop - start.
    """
    h_mean, h_std, m_mean, m_std = _sequence_moments(seq_len)

    def block(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        tokens = rng.integers(0, len(ALPHABET), (n, seq_len), dtype=np.int8)  # (n, L)
        hydro = KYTE_DOOLITTLE[tokens].mean(axis=1)  # (n,)
        motif = (np.isin(tokens[:, :-1], POSITIVE) & np.isin(tokens[:, 1:], NEGATIVE)).sum(axis=1)  # (n,)
        noise = SEQUENCE_NOISE * rng.standard_normal((n, 2))
        targets = np.stack([(hydro - h_mean) / h_std, (motif - m_mean) / m_std], axis=1) + noise  # (n, 2)
        edges = np.array([-0.6744897501960817, 0.0, 0.6744897501960817]) * math.sqrt(1 + SEQUENCE_NOISE**2)
        labels = np.searchsorted(edges, targets[:, 0]).astype(np.int32)  # (n,) quartile of N(0, 1.01)
        return {"input_sequences": tokens, "targets": targets.astype(np.float32), "labels": labels}

    return _rows(seed, start, stop, block, _sequence_layout(seq_len))


def make_rows(workload: str, seed: int, start: int, stop: int, seq_len: int = 128) -> dict[str, np.ndarray]:
    """Rows [start, stop) of a workload's dataset (default sizes), exactly as `generate_dataset` writes them.

    Returns:
      mlp-regression: {"features": (n, 128) float32, "targets": (n, 64) float32};
      sequence: {"input_sequences": (n, L) int8, "targets": (n, 2) float32, "labels": (n,) int32}.
    """
    if workload == "mlp-regression":
        return regression_rows(seed, start, stop)
    if workload == "sequence":
        return sequence_rows(seed, start, stop, seq_len)
    raise ConfigError(f"unknown workload {workload!r}; choose one of: {', '.join(WORKLOADS)}")


def row_layout(workload: str, seq_len: int = 128) -> Layout:
    """Dataset name -> (row shape, dtype) of a workload (default sizes)."""
    return _regression_layout(FEATURES, TARGETS) if workload == "mlp-regression" else _sequence_layout(seq_len)


def _regression_layout(features: int, targets: int) -> Layout:
    return {"features": ((features,), np.dtype(np.float32)), "targets": ((targets,), np.dtype(np.float32))}


def _sequence_layout(seq_len: int) -> Layout:
    return {"input_sequences": ((seq_len,), np.dtype(np.int8)), "targets": ((2,), np.dtype(np.float32)),
            "labels": ((), np.dtype(np.int32))}


def _rows(seed: int, start: int, stop: int, block: Callable[[np.random.Generator, int], dict[str, np.ndarray]],
          layout: Layout) -> dict[str, np.ndarray]:
    """Rows [start, stop) cut from the generation blocks that hold them."""
    parts = []
    for i in range(start // GEN_BLOCK_ROWS, -(-stop // GEN_BLOCK_ROWS)):
        rows = block(np.random.default_rng((seed, 1, i)), GEN_BLOCK_ROWS)
        lo, hi = max(start - i * GEN_BLOCK_ROWS, 0), min(stop - i * GEN_BLOCK_ROWS, GEN_BLOCK_ROWS)
        parts.append({k: v[lo:hi] for k, v in rows.items()})
    if not parts:
        return {k: np.empty((0, *shape), dtype) for k, (shape, dtype) in layout.items()}
    return {k: np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in parts[0]}
