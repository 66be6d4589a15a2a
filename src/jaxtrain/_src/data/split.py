"""`TrainConfig.val_split`: the last rows of the training data held out for validation.

The last rows, as Keras's `validation_split` takes them, and not a seeded shuffle: a script ported
from Keras validates on the same rows; arrays are split by slicing (views, no copy of the data)
and a row source by a row range (nothing read); and time-ordered data validate on their latest
rows, with no future rows in training. Data ordered by class must be shuffled first, as in Keras.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from jaxtrain._src.data.arrays import is_source, num_samples
from jaxtrain._src.errors import ConfigError, DataError, setting


def held_out_rows(n: int, fraction: float) -> int:
    """Rows of `n` that `val_split=fraction` validates on: Keras 3's count, `n - floor(n * (1 - fraction))`."""
    return n - math.floor(n * (1.0 - fraction))


def split_validation(train_data: Any, fraction: float) -> tuple[Any, Any]:
    """`(train, val)`: `train_data` (a pytree of arrays or a row source) without and with its last
    `held_out_rows` rows.

    Raises:
      ConfigError: data that are not rows (a loader's batches, data made during the run).
      DataError: a split that leaves no row on either side.
    """
    asked = setting("val_split", fraction)
    if hasattr(train_data, "make_feed") or not (is_source(train_data) or _arrays(train_data)):
        raise ConfigError(f"{asked} holds out rows of train_data, which yields batches rather than rows "
                          f"({type(train_data).__name__}); pass val_data instead")
    n = len(train_data) if is_source(train_data) else num_samples(train_data, "train_data")
    held = held_out_rows(n, fraction)
    if not 0 < held < n:
        raise DataError(f"{asked} of {n:,} training rows holds out {held:,} and trains on {n - held:,}; "
                        "choose a fraction that leaves rows on both sides")
    if is_source(train_data):
        return RowRange(train_data, 0, n - held), RowRange(train_data, n - held, n)
    return (jax.tree.map(lambda x: x[: n - held], train_data), jax.tree.map(lambda x: x[n - held :], train_data))


def _arrays(data: Any) -> bool:
    leaves = jax.tree.leaves(data)
    return bool(leaves) and all(hasattr(x, "shape") and hasattr(x, "dtype") for x in leaves)


class RowRange:
    """Rows [start, stop) of a row source, served as a row source of their own (nothing is read
    until the loader reads). Closing it leaves the source open: the other part still reads it."""

    def __init__(self, source: Any, start: int, stop: int):
        self.source, self.start, self.stop = source, start, stop
        self.path = getattr(source, "path", None)  # the fingerprint's file, as the source's

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def chunk_rows(self) -> int:
        return self.source.chunk_rows

    @property
    def row_shapes(self) -> dict[str, tuple[int, ...]]:
        return self.source.row_shapes

    @property
    def dtypes(self) -> dict[str, np.dtype]:
        return self.source.dtypes

    @property
    def row_nbytes(self) -> int:
        return self.source.row_nbytes

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        self._check(start, stop)
        return self.source.read(self.start + start, self.start + stop)

    def read_into(self, start: int, stop: int, out: dict[str, np.ndarray]) -> None:
        self._check(start, stop)
        if hasattr(self.source, "read_into"):
            self.source.read_into(self.start + start, self.start + stop, out)
            return
        for name, block in self.read(start, stop).items():
            out[name][...] = block

    def _check(self, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= len(self):
            raise DataError(f"rows [{start}, {stop}) are outside the {len(self):,} rows of this part of the data")

    def close(self) -> None:
        """Nothing: the source stays open for the other part (its owner closes it)."""

    def __getattr__(self, name: str) -> Any:  # the source's other attributes (names, attrs, ...)
        if name in ("source", "start", "stop") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.source, name)
