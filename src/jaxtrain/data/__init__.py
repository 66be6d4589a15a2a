"""Datasets, placement and in-graph preprocessing."""

from jaxtrain.data.arrays import Placement, choose_placement, default_budget_bytes, nbytes, num_samples
from jaxtrain.data.datasets import CharTokenizer, fetch, load_mnist, load_tinyshakespeare, read_idx
from jaxtrain.data.transforms import compose, gaussian_noise, normalize

__all__ = [
    "CharTokenizer",
    "Placement",
    "choose_placement",
    "compose",
    "default_budget_bytes",
    "fetch",
    "gaussian_noise",
    "load_mnist",
    "load_tinyshakespeare",
    "nbytes",
    "normalize",
    "num_samples",
    "read_idx",
]
