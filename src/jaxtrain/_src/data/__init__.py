"""Datasets, placement, in-graph preprocessing, HDF5 and shard streaming in bounded memory, and
adapters for others' datasets and loaders."""

from jaxtrain._src.data.adapters import BatchStream, MapSource, NpySource
from jaxtrain._src.data.arrays import (
    ALIGNMENT,
    Placement,
    aligned_empty,
    choose_placement,
    default_budget_bytes,
    is_aligned,
    is_source,
    nbytes,
    num_rows,
    num_samples,
)
from jaxtrain._src.data.datasets import CharTokenizer, fetch, load_mnist, load_tinyshakespeare, read_idx
from jaxtrain._src.data.generate import generate_dataset
from jaxtrain._src.data.inspect import inspect_file
from jaxtrain._src.data.sources import ArraySource, HDF5Source
from jaxtrain._src.data.stream import DevicePrefetcher, StreamLoader
from jaxtrain._src.data.synthetic import make_rows
from jaxtrain._src.data.transforms import compose, gaussian_noise, normalize, standardize_images

__all__ = [
    "ALIGNMENT",
    "ArraySource",
    "BatchStream",
    "CharTokenizer",
    "DevicePrefetcher",
    "HDF5Source",
    "MapSource",
    "NpySource",
    "Placement",
    "StreamLoader",
    "aligned_empty",
    "choose_placement",
    "compose",
    "default_budget_bytes",
    "fetch",
    "gaussian_noise",
    "generate_dataset",
    "inspect_file",
    "is_aligned",
    "is_source",
    "load_mnist",
    "load_tinyshakespeare",
    "make_rows",
    "nbytes",
    "normalize",
    "num_rows",
    "num_samples",
    "read_idx",
    "standardize_images",
]
