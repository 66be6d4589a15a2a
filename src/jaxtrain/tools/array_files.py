"""Arrays in files for `jaxtrain predict`: inputs read from .npy (memory-mapped) or HDF5 a block at
a time, or from .npz (loaded whole); outputs written as they come (.npy and HDF5 on disk batch by
batch; .npz, a zip, at the end).

An output file appears whole or not at all: it is written beside its final name and renamed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import h5py
import jax
import numpy as np

from jaxtrain._src.data.sources import HDF5Source
from jaxtrain._src.errors import ConfigError, DataError

SUFFIXES = (".npy", ".npz", ".h5", ".hdf5")


def _suffix(path: Path, what: str) -> str:
    if path.suffix not in SUFFIXES:
        raise ConfigError(f"{what} {path} must end in {', '.join(SUFFIXES)}")
    return path.suffix


def read_inputs(path: str | os.PathLike, field: str, shape: tuple[int, ...], dtype: str) -> Any:
    """The inputs of `path` as `{field: rows}` (a memory-mapped array, or an HDF5 source read in
    blocks): the array named `field` in an .npz or HDF5 file, or its only array.

    Raises:
      ConfigError: a missing file, no such array, or rows of another shape or kind than `shape`
        and `dtype` (the model's input).
    """
    path = Path(path)
    suffix = _suffix(path, "--input")
    if not path.is_file():
        raise ConfigError(f"--input {path} does not exist")
    if suffix == ".npy":
        arrays = {field: np.load(path, mmap_mode="r")}
    elif suffix == ".npz":
        archive = np.load(path)
        arrays = {field: archive[_pick(list(archive.files), field, path)]}
    else:
        with h5py.File(path, "r") as f:
            names = [k for k, v in f.items() if isinstance(v, h5py.Dataset)]
        arrays = HDF5Source(path, {field: _pick(names, field, path)})
    first = arrays.read(0, 1)[field] if isinstance(arrays, HDF5Source) else arrays[field][:1]
    row = tuple(first.shape[1:])
    if row != tuple(shape):
        raise ConfigError(f"the rows of {path} have shape {row}; the model takes rows of shape {tuple(shape)}")
    if np.dtype(dtype).kind in "iu" and first.dtype.kind not in "iub":
        raise ConfigError(f"{path} holds {first.dtype} values; the model takes integers ({dtype})")
    return arrays


def _pick(names: list[str], field: str, path: Path) -> str:
    if field in names:
        return field
    if len(names) == 1:
        return names[0]
    raise ConfigError(f"{path} holds the arrays {', '.join(names) or '(none)'}; name the model's input {field!r}, "
                      "or keep only one")


def write_outputs(path: str | os.PathLike, batches: Iterable[Any], n: int) -> dict[str, tuple[int, ...]]:
    """Writes the outputs `batches` yields (NumPy pytrees of leading size ≤ the rows left; `n` in
    all) to `path`; returns each output's name and shape. One output is named `outputs`; several,
    by their place in the model's output (`0`, `1`, or a dict's keys)."""
    path = Path(path)
    suffix = _suffix(path, "--output")
    if not path.parent.is_dir():
        raise ConfigError(f"--output {path}: the directory {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.partial{suffix}")
    written: dict[str, Any] = {}
    f = h5py.File(tmp, "w") if suffix in (".h5", ".hdf5") else None
    row = 0
    try:
        for batch in batches:
            named = _named(batch)
            if not written:
                if suffix == ".npy" and len(named) != 1:
                    raise ConfigError(f"the model has {len(named)} outputs; an .npy file holds one: write .npz or .h5")
                for name, y in named.items():
                    shape, dtype = (n, *y.shape[1:]), y.dtype
                    written[name] = (f.create_dataset(name, shape, dtype) if f is not None
                                     else np.lib.format.open_memmap(tmp, "w+", dtype, shape) if suffix == ".npy"
                                     else np.empty(shape, dtype))
            for name, y in named.items():
                written[name][row: row + len(y)] = y
            row += len(next(iter(named.values())))
        shapes = {name: tuple(a.shape) for name, a in written.items()}
        if f is not None:
            f.close()
        elif suffix == ".npy":
            written["outputs"].flush()
        else:
            with open(tmp, "wb") as out:
                np.savez(out, **written)
        if row != n:
            raise DataError(f"wrote {row:,} rows of {n:,}")
        os.replace(tmp, path)
    except BaseException:
        if f is not None:
            f.close()
        tmp.unlink(missing_ok=True)
        raise
    return shapes


def _named(outputs: Any) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_leaves_with_path(outputs)
    if len(leaves) == 1 and not leaves[0][0]:
        return {"outputs": leaves[0][1]}
    return {jax.tree_util.keystr(p, simple=True, separator="."): y for p, y in leaves}
