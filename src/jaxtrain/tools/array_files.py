"""Arrays in files for `jaxtrain predict`: inputs read from .npy (memory-mapped) or HDF5 a block at
a time, or from .npz (loaded whole); outputs written as they come (.npy and HDF5 on disk batch by
batch; .npz, a zip, at the end).

Inputs are checked where they enter: never unpickled (`allow_pickle=False`), and a file that is
empty, truncated, not of its format, or holds objects, strings, complex numbers or rows of
another shape or kind than the model takes is refused in one line saying so. An output file is
written by plain writes (no memory map: a full disk is an error, not a SIGBUS) through
`jaxtrain.engine.atomic_write`: whole or not at all, never through a link, never over an input.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from pathlib import Path
from typing import Any, Iterable

import jax
import numpy as np

from jaxtrain import ConfigError, DataError
from jaxtrain.engine import atomic_write, check_target, hdf5_reason, refuse_same_file, rows_text

SUFFIXES = (".npy", ".npz", ".h5", ".hdf5")
_KINDS = {"O": "Python objects (pickled data is never loaded)", "U": "strings", "S": "byte strings",
          "c": "complex numbers", "V": "structured records", "M": "dates", "m": "time spans"}


def _suffix(path: Path, what: str) -> str:
    if path.suffix not in SUFFIXES:
        raise ConfigError(f"{what} {path} must end in {', '.join(SUFFIXES)}")
    return path.suffix


def read_inputs(path: str | os.PathLike, field: str, shape: tuple[int, ...], dtype: str) -> dict[str, Any]:
    """The inputs of `path` as `{field: rows}` (a memory-mapped array, an array, or an HDF5 dataset
    read in blocks): the array named `field` in an .npz or HDF5 file, or its only array. An HDF5
    file stays open until `close_inputs`.

    Raises:
      ConfigError: a missing, empty, truncated or damaged file, no such array, pickled objects, or
        rows of another shape or kind than `shape` and `dtype` (the model's input).
    """
    path = Path(path)
    suffix = _suffix(path, "--input")
    if not path.is_file():
        raise ConfigError(f"--input {path} does not exist" if not path.exists() else f"--input {path} is not a file")
    if path.stat().st_size == 0:
        raise ConfigError(f"--input {path} is empty (0 bytes)")
    if suffix == ".npy":
        rows: Any = _read_npy(path)
    elif suffix == ".npz":
        rows = _read_npz(path, field)
    else:
        rows = _HDF5Rows(path, field)
    try:
        _check_rows(path, rows.shape, rows.dtype, shape, np.dtype(dtype))
    except BaseException:
        close_inputs({field: rows})
        raise
    return {field: rows}


def close_inputs(inputs: dict[str, Any]) -> None:
    """Closes what `read_inputs` opened (an HDF5 file)."""
    for rows in inputs.values():
        if isinstance(rows, _HDF5Rows):
            rows.close()


def _read_npy(path: Path) -> np.ndarray:
    """The .npy file memory-mapped, once its header says it holds numbers and all its bytes are there."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if f.read(6) != np.lib.format.MAGIC_PREFIX:
            raise ConfigError(f"--input {path} is not a .npy file (it does not begin as NumPy's files do: another "
                              "format, or pickled data); save the inputs with numpy.save")
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            rows, _, dtype = read(f)
            offset = f.tell()
    except (ValueError, EOFError, OSError, SyntaxError) as e:
        raise ConfigError(f"--input {path} is not a .npy file ({_reason(e)}); save the inputs with "
                          "numpy.save") from None
    _check_kind(path, dtype)
    need = offset + int(np.prod(rows)) * dtype.itemsize
    if size < need:
        raise ConfigError(f"--input {path} is truncated: its header promises {need:,} bytes, the file holds {size:,}; "
                          "copy or save it again")
    if not rows or not np.prod(rows):
        return np.zeros(rows, dtype)  # nothing to map; _check_rows says what is wrong
    return np.load(path, mmap_mode="r", allow_pickle=False)


def _read_npz(path: Path, field: str) -> np.ndarray:
    if not zipfile.is_zipfile(path):
        raise ConfigError(f"--input {path} is not an .npz archive (not a zip file, or a truncated one); save the "
                          "inputs with numpy.savez")
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as e:
        raise ConfigError(f"--input {path} is not an .npz archive ({_reason(e)}); save the inputs with "
                          "numpy.savez") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ConfigError(f"--input {path} holds one .npy array, not an .npz archive; name it .npy")
    with archive:
        name = _pick(list(archive.files), field, path)
        try:
            return archive[name]
        except ValueError as e:
            if "allow_pickle" in str(e):
                raise ConfigError(f"--input {path}: its array {name!r} holds {_KINDS['O']}; save the inputs as "
                                  "numbers") from None
            raise ConfigError(f"--input {path}: its array {name!r} cannot be read ({_reason(e)}); the archive is "
                              "damaged or truncated: save it again") from None
        except (EOFError, OSError, zipfile.BadZipFile, zlib.error, KeyError) as e:
            raise ConfigError(f"--input {path}: its array {name!r} cannot be read ({_reason(e)}); the archive is "
                              "damaged or truncated: save it again") from None


class _HDF5Rows:
    """One dataset of an HDF5 file, sliced a block at a time; a block that cannot be read (a
    truncated or damaged file) is one line."""

    def __init__(self, path: Path, field: str):
        import h5py

        self.path = path
        try:
            self._file = h5py.File(path, "r")
        except OSError as e:
            raise ConfigError(f"--input {path} is not a readable HDF5 file ({hdf5_reason(e)}); it is another "
                              "format, or damaged or truncated: copy or save it again") from None
        try:
            names: list[str] = []
            self._file.visititems(lambda n, obj: names.append(n) if isinstance(obj, h5py.Dataset) else None)
            self.name = _pick(names, field, path)
            self._dataset = self._file[self.name]
            self.shape, self.dtype = tuple(self._dataset.shape), self._dataset.dtype
        except BaseException:
            self._file.close()
            raise

    def __getitem__(self, rows: slice) -> np.ndarray:
        try:
            return self._dataset[rows]
        except (OSError, RuntimeError, ValueError) as e:
            start, stop, _ = rows.indices(self.shape[0])
            raise DataError(f"cannot read {rows_text(start, stop)} of {self.name!r} in --input {self.path} "
                            f"({hdf5_reason(e)}); the file is damaged or truncated: copy or save it again") from None

    def close(self) -> None:
        if self._file.id.valid:
            self._file.close()


def _reason(e: BaseException) -> str:
    return (" ".join(str(e).split())[:160]) or type(e).__name__


def _check_kind(path: Path, dtype: np.dtype) -> None:
    if dtype.hasobject or dtype.kind in _KINDS:
        what = _KINDS["O"] if dtype.hasobject else f"{_KINDS[dtype.kind]} ({dtype})"
        raise ConfigError(f"--input {path} holds {what}; the model takes numbers: save the inputs as a numeric array")


def _check_rows(path: Path, rows: tuple[int, ...], dtype: np.dtype, shape: tuple[int, ...], want: np.dtype) -> None:
    """Refuses rows the model cannot take: no row axis, none at all, another shape or kind."""
    _check_kind(path, dtype)
    if not rows:
        raise ConfigError(f"--input {path} holds a single value, not rows of shape {tuple(shape)}")
    if rows[0] == 0:
        raise ConfigError(f"--input {path} holds no rows (shape {rows}); nothing to predict")
    if tuple(rows[1:]) != tuple(shape):
        raise ConfigError(f"the rows of {path} have shape {tuple(rows[1:])}; the model takes rows of shape "
                          f"{tuple(shape)}")
    if want.kind in "iu" and dtype.kind not in "iub":
        raise ConfigError(f"{path} holds {dtype} values; the model takes integers ({want})")


def _pick(names: list[str], field: str, path: Path) -> str:
    if field in names:
        return field
    if len(names) == 1:
        return names[0]
    raise ConfigError(f"{path} holds the arrays {', '.join(names) or '(none)'}; name the model's input {field!r}, "
                      "or keep only one")


def check_output(path: str | os.PathLike, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Refuses an output that cannot be written as one, before any work: a name of another kind, a
    link, a directory, a missing folder, or one of `inputs` (the same file, however named)."""
    path = Path(path)
    _suffix(path, "--output")
    check_target(path, "--output", "write the outputs elsewhere")
    refuse_same_file(path, list(inputs), "--output")
    return path


def write_outputs(path: str | os.PathLike, batches: Iterable[Any], n: int,
                  inputs: Iterable[str | os.PathLike] = ()) -> dict[str, tuple[int, ...]]:
    """Writes the outputs `batches` yields (NumPy pytrees of leading size ≤ the rows left; `n` in
    all) to `path`, whole or not at all; returns each output's name and shape. One output is named
    `outputs`; several, by their place in the model's output (`0`, `1`, or a dict's keys).
    `path` may not be one of `inputs`.

    Raises:
      ConfigError: see `check_output`; the disk refuses the file (full, read-only): one line, and
        no partial file is left.
    """
    path = check_output(path, inputs)
    suffix = path.suffix
    shapes: dict[str, tuple[int, ...]] = {}
    with atomic_write(path, advice="write the outputs elsewhere", what="--output") as f:
        h5 = None
        if suffix in (".h5", ".hdf5"):
            import h5py

            h5 = h5py.File(f, "w")
        try:
            written: dict[str, Any] = {}
            row = 0
            for batch in batches:
                named = _named(batch)
                if not written:
                    if suffix == ".npy" and len(named) != 1:
                        raise ConfigError(f"the model has {len(named)} outputs; an .npy file holds one: write .npz "
                                          "or .h5")
                    for name, y in named.items():
                        shape, dtype = (n, *y.shape[1:]), y.dtype
                        shapes[name] = shape
                        if h5 is not None:
                            written[name] = h5.create_dataset(name, shape, dtype)
                        elif suffix == ".npy":
                            np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                                     "fortran_order": False, "shape": shape})
                            written[name] = None
                        else:
                            written[name] = np.empty(shape, dtype)
                for name, y in named.items():
                    if suffix == ".npy":
                        f.write(np.ascontiguousarray(y).tobytes())
                    else:
                        written[name][row: row + len(y)] = y
                row += len(next(iter(named.values())))
            if row != n:
                raise DataError(f"wrote {row:,} rows of {n:,}")
            if suffix == ".npz":
                np.savez(f, **written)
        finally:
            if h5 is not None:
                h5.close()
    return shapes


def _named(outputs: Any) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_leaves_with_path(outputs)
    if len(leaves) == 1 and not leaves[0][0]:
        return {"outputs": leaves[0][1]}
    return {jax.tree_util.keystr(p, simple=True, separator="."): y for p, y in leaves}
