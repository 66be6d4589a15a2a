"""Datasets, placement and in-graph preprocessing."""

from jaxtrain.data.arrays import Placement, choose_placement, default_budget_bytes, nbytes, num_samples
from jaxtrain.data.transforms import compose, gaussian_noise, normalize

__all__ = [
    "Placement",
    "choose_placement",
    "compose",
    "default_budget_bytes",
    "gaussian_noise",
    "nbytes",
    "normalize",
    "num_samples",
]
