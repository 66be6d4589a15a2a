import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rich.console import Console

from jaxtrain.models import MLP


def mse(model, batch, key):
    err = model(batch["x"]) - batch["y"]
    return jnp.mean(err**2), {"mae": jnp.mean(jnp.abs(err))}


def regression_data(n: int, d_in: int = 8, d_out: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d_in)).astype(np.float32)
    w = rng.normal(size=(d_in, d_out)).astype(np.float32)
    return {"x": x, "y": np.tanh(x @ w).astype(np.float32)}


def small_mlp(seed: int = 0, d_in: int = 8, d_out: int = 3) -> MLP:
    return MLP((d_in, 16, d_out), rngs=nnx.Rngs(seed))


def silent() -> Console:
    return Console(file=io.StringIO(), width=100)


def leaves_close(a, b) -> float:
    """Largest relative difference between two pytrees of arrays."""
    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        worst = max(worst, float(np.max(np.abs(x - y)) / (np.max(np.abs(y)) + 1e-12)))
    return worst


@pytest.fixture
def data():
    return regression_data(200)
