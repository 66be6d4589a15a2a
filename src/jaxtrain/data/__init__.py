"""Datasets, placement, in-graph preprocessing, and HDF5 streaming in bounded memory."""

from jaxtrain.data.arrays import (
    Placement,
    choose_placement,
    default_budget_bytes,
    is_source,
    nbytes,
    num_rows,
    num_samples,
)
from jaxtrain.data.datasets import CharTokenizer, fetch, load_mnist, load_tinyshakespeare, read_idx
from jaxtrain.data.generate import generate_dataset
from jaxtrain.data.inspect import inspect_file
from jaxtrain.data.sources import ArraySource, HDF5Source
from jaxtrain.data.stream import DevicePrefetcher, StreamLoader
from jaxtrain.data.synthetic import make_rows
from jaxtrain.data.transforms import compose, gaussian_noise, normalize

__all__ = [
    "ArraySource",
    "CharTokenizer",
    "DevicePrefetcher",
    "HDF5Source",
    "Placement",
    "StreamLoader",
    "choose_placement",
    "compose",
    "default_budget_bytes",
    "fetch",
    "gaussian_noise",
    "generate_dataset",
    "inspect_file",
    "is_source",
    "load_mnist",
    "load_tinyshakespeare",
    "make_rows",
    "nbytes",
    "normalize",
    "num_rows",
    "num_samples",
    "read_idx",
]
