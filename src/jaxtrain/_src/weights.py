"""A model's weights in the safetensors format, with flat, readable names.

`save_weights(model, path)` writes every variable of a Flax NNX model (its parameters and its
other state, such as batch-norm statistics) under a dotted name (`layers.0.kernel`); other tools
read the file (`safetensors.numpy.load_file`, PyTorch, Hugging Face). `load_weights(model, path)`
fills a freshly built model of the same structure from it, checking every name and shape.

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length, a
JSON header giving each tensor's dtype, shape and byte range, then the tensors' bytes, C order.
It is written here (a few lines) rather than through the `safetensors` package, which the tests
use as the independent reader. The header's `__metadata__` records each name's variable type
(`Param`, `BatchStat`, ...), `sha256`, the SHA-256 of the tensors' bytes (everything after the
header), and `header_sha256`, the SHA-256 of the header itself (its canonical JSON without that
entry: the names, dtypes, shapes, byte ranges and metadata that say how to read the bytes). Reading
checks both: a file damaged on the disk or in transfer, or whose header was edited (a dtype changed
from F32 to I32 reads the same bytes as other numbers), is refused in one line (a file written
before a checksum was kept reads as before). PRNG keys are stored as their raw
key data. Files are written whole or not at all (`jaxtrain._src.safe_files`).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from jaxtrain._src.errors import ConfigError
from jaxtrain._src.safe_files import atomic_write

__all__ = ["flat_weights", "load_weights", "read_safetensors", "save_weights", "write_safetensors",
           "write_weights"]

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": jax.numpy.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}
_KEY = "key:"  # the metadata kind of a PRNG key stored as its key data: "key:<impl>"
SHA256 = "sha256"  # the metadata entry holding the SHA-256 of the tensors' bytes
HEADER_SHA256 = "header_sha256"  # the one holding the SHA-256 of the header without this entry


def _header_digest(header: dict[str, Any]) -> str:
    """SHA-256 of `header` (tensor entries and `__metadata__`, without HEADER_SHA256) as canonical JSON:
    the same for the header written and the header read back, whatever its key order or spacing."""
    metadata = {k: v for k, v in header.get("__metadata__", {}).items() if k != HEADER_SHA256}
    canonical = json.dumps({**header, "__metadata__": metadata}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def write_safetensors(path: str | os.PathLike, tensors: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> str:
    """Writes `tensors` to `path` in the safetensors format, whole or not at all, with the SHA-256
    of their bytes (`sha256`) and of the header (`header_sha256`) in the metadata; returns the first."""
    header: dict[str, Any] = {"__metadata__": dict(metadata or {})}
    offset = 0
    arrays = []
    digest = hashlib.sha256()
    for name, array in tensors.items():
        array = np.asarray(array, order="C")  # not ascontiguousarray: it makes a scalar (an RNG count) 1-d
        if array.dtype not in _NAMES:
            raise ConfigError(f"weight {name!r} has dtype {array.dtype}, which safetensors cannot hold")
        header[name] = {"dtype": _NAMES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        data = array.tobytes()
        digest.update(data)
        arrays.append(data)
    header["__metadata__"][SHA256] = digest.hexdigest()
    header["__metadata__"][HEADER_SHA256] = _header_digest(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the tensors' bytes start 8-byte aligned
    with atomic_write(path, advice="write the weights elsewhere") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in arrays:
            f.write(data)
    return header["__metadata__"][SHA256]


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """`(tensors, metadata)` of a safetensors file, its checksum verified when it carries one.

    Raises:
      ConfigError: a missing file, one that is not in the format, or whose tensors' bytes do not
        match the checksum its metadata records (one line saying what is wrong).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"weights file {path} does not exist")
    data = path.read_bytes()
    try:
        if len(data) < 8:
            raise ValueError(f"{len(data)} bytes: too short for a header")
        (n,) = struct.unpack("<Q", data[:8])
        if n > len(data) - 8:
            raise ValueError(f"its header claims {n:,} bytes, the file holds {len(data) - 8:,} after the length")
        header = json.loads(data[8: 8 + n])
        if not isinstance(header, dict):
            raise ValueError(f"its header is {type(header).__name__}, not a JSON object")
        metadata = header.get("__metadata__", {}) or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise ValueError("its __metadata__ is not an object of strings")
        if HEADER_SHA256 in metadata and _header_digest(header) != metadata[HEADER_SHA256]:
            raise _EditedHeader
        header.pop("__metadata__", None)
        body = memoryview(data)[8 + n:]
        tensors = {}
        for name, t in header.items():
            begin, end = t["data_offsets"]
            dtype = np.dtype(_DTYPES[t["dtype"]])
            if not 0 <= begin <= end <= len(body) or end - begin != dtype.itemsize * int(np.prod(t["shape"])):
                raise ValueError(f"{name}: byte range {begin}-{end} does not hold its shape {t['shape']}")
            tensors[name] = np.frombuffer(body[begin:end], dtype).reshape(t["shape"]).copy()
    except _EditedHeader:
        raise ConfigError(f"{path} is damaged: its header (names, dtypes, shapes, byte ranges) does not match the "
                          "SHA-256 it records; copy or export the weights again") from None
    except (struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path} is not a safetensors file ({str(e).splitlines()[0][:200]})") from None
    if SHA256 in metadata:
        found = hashlib.sha256(body).hexdigest()
        if found != metadata[SHA256]:
            raise ConfigError(f"{path} is damaged: its tensors' SHA-256 is {found[:12]}..., its header records "
                              f"{metadata[SHA256][:12]}...; copy or export the weights again")
    return tensors, metadata


class _EditedHeader(Exception):
    """A header whose recorded SHA-256 does not match it (raised and caught inside read_safetensors)."""


def _name(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def flat_weights(model: nnx.Module) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """`(tensors, kinds)`: every variable of `model` by dotted name, as NumPy arrays, and each
    name's variable type (`Param`, `BatchStat`, ...; `key:<impl>` for a PRNG key)."""
    tensors, kinds = {}, {}
    for path, variable in nnx.to_flat_state(nnx.state(model)):
        value = variable.get_value()
        name, kind = _name(path), type(variable).__name__
        if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            kind = _KEY + str(jax.random.key_impl(value))
            value = jax.random.key_data(value)
        tensors[name], kinds[name] = np.asarray(value), kind
    return tensors, kinds


def save_weights(model: nnx.Module, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> Path:
    """Writes `model`'s variables to the safetensors file `path`; returns the path.

    `metadata` (strings) joins the file's header beside jaxtrain's `variables` entry (each name's
    variable type, as JSON) and `sha256` (the checksum `load_weights` verifies)."""
    write_weights(model, path, metadata)
    return Path(path)


def write_weights(model: nnx.Module, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> str:
    """`save_weights`, returning the SHA-256 of the tensors' bytes that the file records."""
    tensors, kinds = flat_weights(model)
    return write_safetensors(path, tensors, {**(metadata or {}), "format": "jaxtrain", "variables": json.dumps(kinds)})


def load_weights(model: nnx.Module, path: str | os.PathLike) -> nnx.Module:
    """Fills `model` (built with the same structure, e.g. freshly initialised) with the weights in
    the safetensors file `path` (from `save_weights` or `jaxtrain export`) and returns it.

    Raises:
      ConfigError: names or shapes that differ between the file and the model (one line naming the
        first few), a file that is not safetensors, or one whose bytes fail its checksum.
    """
    tensors, metadata = read_safetensors(path)
    try:
        kinds = json.loads(metadata.get("variables", "{}"))
        if not isinstance(kinds, dict) or not all(isinstance(v, str) for v in kinds.values()):
            raise ValueError("not an object of strings")
    except ValueError as e:
        raise ConfigError(f"{path}: its metadata entry 'variables' is not a JSON object of variable types ({e}); "
                          "save the weights again with jaxtrain.save_weights") from None
    state = nnx.state(model)
    flat = list(nnx.to_flat_state(state))
    names = {_name(p) for p, _ in flat}
    missing, unexpected = sorted(names - set(tensors)), sorted(set(tensors) - names)
    problems = []
    if missing:
        problems.append(f"missing {_few(missing)}")
    if unexpected:
        problems.append(f"not in the model {_few(unexpected)}")
    for p, variable in flat:
        name = _name(p)
        value = variable.get_value()
        if name in tensors:
            want = jax.random.key_data(value).shape if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key) \
                else value.shape
            if tuple(tensors[name].shape) != tuple(want):
                problems.append(f"{name} is {tuple(tensors[name].shape)} in the file, {tuple(want)} in the model")
    if problems:
        raise ConfigError(f"{path} does not fit this model: {'; '.join(problems[:4])}"
                          f"{f' (and {len(problems) - 4} more)' if len(problems) > 4 else ''}; build the model "
                          "with the configuration the weights were trained with")
    for p, variable in flat:
        name, value = _name(p), variable.get_value()
        saved = tensors[name]
        if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            impl = kinds.get(name, "")[len(_KEY):] or None
            variable.set_value(jax.random.wrap_key_data(jax.numpy.asarray(saved), impl=impl))
        else:
            variable.set_value(jax.numpy.asarray(saved, value.dtype))
    nnx.update(model, state)
    return model


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
