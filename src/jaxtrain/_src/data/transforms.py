"""JAX-native preprocessing and augmentation that run inside the compiled step.

A preprocessing function maps `batch -> batch` and runs for training, evaluation and prediction;
an augmentation maps `(batch, key) -> batch` and runs for training only. Both are traced into
the fused step, so they cost no host work per step.

The preprocessing built here (`normalize`, `standardize_images` and a `compose` of them) can be
saved: `to_spec(fn)` gives a JSON-ready description with its statistics, which `fit` writes to a
run directory's preprocess.json, and `from_spec` rebuilds the same function from it, so that
prediction and export apply exactly the training run's preprocessing without its training data.
Any other callable works in training and evaluation and is simply not saved.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain._src.errors import ConfigError


def _floats(x: Any) -> list | float:
    """`x` as JSON numbers; float32 values survive the round trip through Python floats exactly."""
    return np.asarray(x, np.float32).tolist()


@dataclasses.dataclass(frozen=True, eq=False)
class Normalize:
    """`batch[field] <- (batch[field] - mean) / (std + eps)` (see `normalize`)."""

    field: str
    mean: np.ndarray
    std: np.ndarray
    eps: float = 1e-6

    def __call__(self, batch: dict) -> dict:
        mean = jnp.asarray(self.mean, jnp.float32)
        std = jnp.asarray(self.std, jnp.float32)
        scale = 1.0 / (jnp.where(std < self.eps, 1.0, std) + self.eps)
        return {**batch, self.field: (batch[self.field] - mean) * scale}

    def spec(self) -> dict[str, Any]:
        return {"kind": "normalize", "field": self.field, "mean": _floats(self.mean), "std": _floats(self.std),
                "eps": self.eps}


@dataclasses.dataclass(frozen=True, eq=False)
class StandardizeImages:
    """Integer pixels to standardised float32 with a channel axis (see `standardize_images`)."""

    field: str
    mean: float
    std: float
    max_value: float = 255.0

    def __call__(self, batch: dict) -> dict:
        image = (batch[self.field].astype(jnp.float32) / self.max_value - self.mean) / self.std
        return {**batch, self.field: image if image.ndim >= 4 else image[..., None]}  # (B, H, W, C) has its C

    def spec(self) -> dict[str, Any]:
        return {"kind": "standardize_images", "field": self.field, "mean": self.mean, "std": self.std,
                "max_value": self.max_value}


@dataclasses.dataclass(frozen=True, eq=False)
class Compose:
    """Functions applied in order (see `compose`)."""

    fns: tuple[Callable, ...]

    def __call__(self, batch: Any, *key: jax.Array) -> Any:
        keys = jax.random.split(key[0], len(self.fns)) if key else [None] * len(self.fns)
        for fn, k in zip(self.fns, keys):
            batch = fn(batch) if k is None else fn(batch, k)
        return batch

    def spec(self) -> dict[str, Any] | None:
        parts = [to_spec(fn) for fn in self.fns]
        return None if any(p is None for p in parts) else {"kind": "compose", "parts": parts}


def normalize(field: str, mean: Any, std: Any, eps: float = 1e-6) -> Normalize:
    """`batch[field] <- (batch[field] - mean) / (std + eps)`, with statistics fixed at build time.

    A std below `eps` (a constant feature, or a statistic of 0) counts as 1: such a feature is
    centred, not multiplied by 1/eps. Saved with a run (see the module's docstring).

    Args:
      field: key of the array to normalise in a dict batch.
      mean, std: arrays broadcastable to one sample of `batch[field]` (e.g. shape (D,)).
    """
    return Normalize(field, np.asarray(mean, np.float32), np.asarray(std, np.float32), float(eps))


def standardize_images(field: str, mean: float, std: float, max_value: float = 255.0) -> StandardizeImages:
    """`batch[field] <- (batch[field] / max_value - mean) / std` as float32, with a trailing channel
    axis where there is none: (B, H, W) integer pixels become (B, H, W, 1); (B, H, W, C) images keep
    their shape. Saved with a run.

    Args:
      field: key of the images in a dict batch.
      mean, std: the pixel statistics on the [0, 1] scale (e.g. MNIST's 0.1307 and 0.3081).
      max_value: the largest pixel value (255 for uint8 images).
    """
    return StandardizeImages(field, float(mean), float(std), float(max_value))


def gaussian_noise(field: str, std: float) -> Callable[[dict, jax.Array], dict]:
    """`batch[field] <- batch[field] + std * N(0, 1)`: a training-only augmentation."""

    def augment(batch: dict, key: jax.Array) -> dict:
        x = batch[field]
        return {**batch, field: x + std * jax.random.normal(key, x.shape, x.dtype)}

    return augment


def compose(*fns: Callable) -> Compose:
    """Chains preprocessing functions (`batch -> batch`) or augmentations (`(batch, key) -> batch`).

    Augmentations each get their own key, split from the step's key. A composition of saveable
    functions is saveable.
    """
    if not fns:
        raise ValueError("compose() needs at least one function")
    return Compose(tuple(fns))


def to_spec(fn: Callable | None) -> dict[str, Any] | None:
    """The JSON-ready description of a saveable preprocessing function; None for any other."""
    spec = getattr(fn, "spec", None)
    return spec() if callable(spec) else None


def from_spec(spec: dict[str, Any]) -> Callable:
    """The preprocessing function `spec` (from `to_spec`) describes.

    Raises:
      ConfigError: an unknown kind or missing fields (a file edited by hand, or a newer jaxtrain's).
    """
    try:
        kind = spec["kind"]
        if kind == "normalize":
            return normalize(spec["field"], spec["mean"], spec["std"], spec["eps"])
        if kind == "standardize_images":
            return standardize_images(spec["field"], spec["mean"], spec["std"], spec["max_value"])
        if kind == "compose":
            return compose(*(from_spec(part) for part in spec["parts"]))
    except (KeyError, TypeError) as e:
        raise ConfigError(f"the saved preprocessing {spec!r:.200} is incomplete ({e!r})") from None
    raise ConfigError(f"the saved preprocessing is of kind {kind!r}, which this jaxtrain does not know "
                      f"(normalize, standardize_images, compose)")
