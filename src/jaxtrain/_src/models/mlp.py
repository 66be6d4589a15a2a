"""A multilayer perceptron."""

from __future__ import annotations

from collections.abc import Sequence

import jax
from flax import nnx


class MLP(nnx.Module):
    """`Linear → ReLU → ... → Linear`: sizes[0] inputs, sizes[-1] outputs.

    Args:
      sizes: layer widths, e.g. (128, 512, 512, 64).
      rngs: initialisation keys.
    """

    def __init__(self, sizes: Sequence[int], *, rngs: nnx.Rngs):
        self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:])])

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, D_in) -> (B, D_out)
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
        return self.layers[-1](x)
