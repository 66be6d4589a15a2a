"""The zoo's shared types and synthetic data.

The data are synthetic but shaped as the sources' datasets (MNIST 28x28x1 in [0, 1], CIFAR-sized
32x32x3, character streams over Tiny Shakespeare's 65 symbols, ...) and carry a signal a model can
learn within a few hundred steps: images are a per-class template plus noise, token streams come
from a sparse random Markov chain. Templates and transition tables come from a fixed generator, so
two calls with different seeds draw different samples of the same task (train and validation).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np
import optax
from flax import nnx

Batch = dict[str, jax.Array]
LossFn = Callable[[nnx.Module, Batch, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]

TASK_SEED = 20240601  # the fixed generator behind every template and transition table


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """A model ported from a public example, with the pieces its training script used.

    Attributes:
      name: the registry key.
      source: where it was ported from (repository and path, or URL).
      make_model: seed -> the model, in training mode as built.
      loss_fn: jaxtrain's form, `(model, batch, key) -> (loss, {name: scalar mean})`.
      make_data: `(num_samples, seed) -> {name: array}`, one row per sample.
      optimizer: `() -> optax transformation`, the source's optimizer.
      batch_size: the source's batch size (or the shrunken one its module names).
      hand_jit: "jit" (split once, `jax.jit` over pytrees with donation) or "nnx.jit" (NNX
        objects through `nnx.jit`): how the source's own loop compiles its step.
    """

    name: str
    source: str
    make_model: Callable[[int], nnx.Module]
    loss_fn: LossFn
    make_data: Callable[[int, int], dict[str, np.ndarray]]
    optimizer: Callable[[], optax.GradientTransformation]
    batch_size: int
    hand_jit: str

    def __post_init__(self) -> None:
        if self.hand_jit not in ("jit", "nnx.jit"):
            raise ValueError(f"{self.name}: hand_jit={self.hand_jit!r} must be 'jit' or 'nnx.jit'")
        if not self.source:
            raise ValueError(f"{self.name}: source must name where the model was ported from")


def class_images(n: int, seed: int, shape: tuple[int, ...], num_classes: int = 10,
                 signal: float = 0.6) -> tuple[np.ndarray, np.ndarray]:
    """Images in [0, 1] of `shape` (H, W, C): `signal` x the class's template + the rest noise.

    Returns:
      (images float32 (n, *shape), labels int32 (n,)).
    """
    templates = np.random.default_rng(TASK_SEED).uniform(size=(num_classes, *shape)).astype(np.float32)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, size=n).astype(np.int32)
    noise = rng.uniform(size=(n, *shape)).astype(np.float32)
    return signal * templates[labels] + (1.0 - signal) * noise, labels


def one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """float32 (n, num_classes), as Keras's `to_categorical` and TFDS pipelines make them."""
    return np.eye(num_classes, dtype=np.float32)[labels]


def markov_stream(length: int, vocab: int, seed: int, first: int = 0, branching: int = 3) -> np.ndarray:
    """A token stream over [first, vocab) where each token has `branching` likely successors.

    A character model's loss falls from ln(vocab - first) towards about ln(branching) as it learns
    the table, which takes a few hundred steps.
    """
    table_rng = np.random.default_rng(TASK_SEED + vocab)
    successors = table_rng.integers(first, vocab, size=(vocab, branching))
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, branching, size=length)
    out = np.empty(length, np.int32)
    out[0] = rng.integers(first, vocab)
    for t in range(1, length):
        out[t] = successors[out[t - 1], picks[t]]
    return out
