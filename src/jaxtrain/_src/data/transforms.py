"""JAX-native preprocessing and augmentation that run inside the compiled step.

A preprocessing function maps `batch -> batch` and runs for training and evaluation; an
augmentation maps `(batch, key) -> batch` and runs for training only. Both are traced into
the fused step, so they cost no host work per step.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp


def normalize(field: str, mean: Any, std: Any, eps: float = 1e-6) -> Callable[[dict], dict]:
    """`batch[field] <- (batch[field] - mean) / (std + eps)`, with statistics fixed at build time.

    A std below `eps` (a constant feature, or a statistic of 0) counts as 1: such a feature is
    centred, not multiplied by 1/eps.

    Args:
      field: key of the array to normalise in a dict batch.
      mean, std: arrays broadcastable to one sample of `batch[field]` (e.g. shape (D,)).
    """
    mean = jnp.asarray(mean, jnp.float32)
    std = jnp.asarray(std, jnp.float32)
    scale = 1.0 / (jnp.where(std < eps, 1.0, std) + eps)

    def preprocess(batch: dict) -> dict:
        return {**batch, field: (batch[field] - mean) * scale}

    return preprocess


def gaussian_noise(field: str, std: float) -> Callable[[dict, jax.Array], dict]:
    """`batch[field] <- batch[field] + std * N(0, 1)`: a training-only augmentation."""

    def augment(batch: dict, key: jax.Array) -> dict:
        x = batch[field]
        return {**batch, field: x + std * jax.random.normal(key, x.shape, x.dtype)}

    return augment


def compose(*fns: Callable) -> Callable:
    """Chains preprocessing functions (`batch -> batch`) or augmentations (`(batch, key) -> batch`).

    Augmentations each get their own key, split from the step's key.
    """
    if not fns:
        raise ValueError("compose() needs at least one function")

    def composed(batch, *key):
        keys = jax.random.split(key[0], len(fns)) if key else [None] * len(fns)
        for fn, k in zip(fns, keys):
            batch = fn(batch) if k is None else fn(batch, k)
        return batch

    return composed
