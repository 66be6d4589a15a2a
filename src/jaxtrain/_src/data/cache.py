"""A disk cache for expensive, static dataset transforms (decoding IDX files, tokenising text).

An entry is one uncompressed `.npz` file named by the transform and a SHA-256 key of
(transform name, transform version, the sources' contents). A changed source file or a bumped
version gives another key, so a stale entry is never read; old entries are simply not used any
more (delete the directory to reclaim the space).

Where: `$JAXTRAIN_CACHE_DIR` when set, else `preprocessed/` in the download cache
(`~/.cache/jaxtrain/preprocessed`). `JAXTRAIN_CACHE=0` turns the cache off.

The cache never fails a run: an unreadable entry is rebuilt, and a cache directory that cannot be
written (read-only, disk full) only means the arrays are computed each time; each says so in one
note on stderr.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import re
import struct
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxtrain._src.data.arrays import ALIGNMENT, is_aligned

CACHE_DIR_ENV = "JAXTRAIN_CACHE_DIR"  # where entries go (default: the download cache's preprocessed/)
CACHE_ENV = "JAXTRAIN_CACHE"  # 0, false, off or no: compute every time, read and write nothing
_OFF = ("0", "false", "off", "no")


def cache_dir() -> Path:
    """Where downloads are kept: `~/.cache/jaxtrain` (or `$XDG_CACHE_HOME/jaxtrain`)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "jaxtrain"


def cache_root() -> Path | None:
    """The directory of cached transforms, or None when `JAXTRAIN_CACHE` turns caching off."""
    if os.environ.get(CACHE_ENV, "").strip().lower() in _OFF:
        return None
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])

    return cache_dir() / "preprocessed"


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 hex digest of a file's contents, read in chunks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def cache_key(name: str, version: str, digests: Sequence[str]) -> str:
    """The SHA-256 hex key of a transform `name` at `version` applied to sources with `digests`."""
    digest = hashlib.sha256()
    for part in (name, version, *digests):
        digest.update(part.encode() + b"\0")  # separators: ("ab", "c") and ("a", "bc") differ
    return digest.hexdigest()


def cached(
    name: str,
    version: str,
    sources: Sequence[str | os.PathLike],
    build: Callable[[], Mapping[str, np.ndarray]],
    *,
    digests: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """`build()`, or the arrays it returned the last time for the same sources and version.

    Keying on the sources' full contents costs a read of each source per call. Measured on a
    2-core VM: SHA-256 of MNIST's four files takes 19 ms against 266 ms to decode them (Fashion-MNIST
    35 vs 323 ms, Tiny Shakespeare 2 vs 67 ms to tokenise; `jaxtrain bench preprocess` shows both),
    so the key is the content hash itself rather than a stat fingerprint (size, mtime) that can
    miss a file rewritten in place. `fetch` computes these hashes anyway to verify each file; pass
    them as `digests` so they are not computed twice.

    Args:
      name: the transform and its input, e.g. "mnist-idx"; letters, digits, `_`, `.` and `-`
        (it names the cache file).
      version: the transform's version; bump it whenever `build`'s output would change.
      sources: the files `build` reads.
      build: computes the arrays from `sources`; called only on a cache miss.
      digests: the SHA-256 hex digests of `sources`, in order, when the caller has just verified
        them; each source is hashed here otherwise.

    Returns:
      The arrays by name, equal (values, dtypes, shapes) to what `build()` returns.

    Example:
      >>> def tokenise():
      ...     text = Path("input.txt").read_text()
      ...     return {"ids": np.frombuffer(text.encode(), np.uint8).astype(np.int32)}
      >>> arrays = cached("text-bytes", "1", ["input.txt"], tokenise)  # second call: read from disk
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"cache entry name {name!r} may only hold letters, digits, '_', '.' and '-'")
    root = cache_root()
    if root is None:
        return _checked(build(), name)
    if digests is None:
        digests = [file_sha256(s) for s in sources]
    if len(digests) != len(sources):
        raise ValueError(f"{len(digests)} digests for {len(sources)} sources")
    path = root / f"{name}-{cache_key(name, version, digests)[:32]}.npz"  # 128 bits of the key
    try:
        return _read(path)
    except (FileNotFoundError, NotADirectoryError, _Unaligned):
        pass  # not cached yet, or written before members were aligned: written again
    except Exception as e:  # any damage (truncation, bad zip, bad header, bad CRC) means: rebuild
        _note(f"the cached {name} in {path} is unreadable ({type(e).__name__}: {e}); rebuilding it")
    arrays = _checked(build(), name)
    try:
        _write(path, arrays)
    except OSError as e:
        _note(f"cannot write the preprocessing cache in {root} ({e.strerror or e}); computing {name} "
              f"without it (set {CACHE_DIR_ENV} to a writable directory or {CACHE_ENV}=0)")
        return arrays
    try:  # the entry's mapped, aligned arrays rather than the built ones: one copy, usable in place
        return _read(path)
    except Exception:  # noqa: BLE001 - replaced or damaged meanwhile: the built arrays are as good
        return arrays


def _checked(arrays: Mapping[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    out = {}
    for key, value in arrays.items():
        if not isinstance(value, np.ndarray) or value.dtype.hasobject:
            what = f"an array of {value.dtype}" if isinstance(value, np.ndarray) else type(value).__name__
            raise TypeError(f"{name}: build() must return NumPy arrays without objects; {key!r} is {what}")
        out[key] = value
    return out


_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _read(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an entry as views of the memory-mapped file, each checked against its CRC-32.

    Not `np.load`: it copies every array into fresh memory that NumPy asks the kernel to back with
    huge pages, and on the 2-core VM of docs/benchmarks.md finding those cost 150-200 ms of kernel
    time per MNIST load while earlier arrays were alive (median 270 ms, against 46 ms for this;
    both read the 53 MB from the page cache). The mapping is copy-on-write: the arrays are
    writeable, and a write never reaches the file. The file is only ever replaced, never
    rewritten in place (`_write`), so the mapping stays valid.
    """
    arrays = {}
    with open(path, "rb") as f, zipfile.ZipFile(f) as zf:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        for info in zf.infolist():
            if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
                raise ValueError(f"{info.filename} is not an uncompressed .npy member")
            name_len, extra_len = struct.unpack("<HH", buffer[info.header_offset + 26 : info.header_offset + 30])
            start = info.header_offset + 30 + name_len + extra_len  # the member's bytes, after its local header
            member = np.frombuffer(buffer, np.uint8, info.file_size, start)
            if zlib.crc32(member.data) != info.CRC:
                raise ValueError(f"{info.filename} fails its CRC-32 check")
            with zf.open(info) as npy:
                shape, fortran_order, dtype = _HEADER_READERS[np.lib.format.read_magic(npy)](npy)
                offset = npy.tell()
            if dtype.hasobject or offset + dtype.itemsize * int(np.prod(shape)) != info.file_size:
                raise ValueError(f"{info.filename}: its header does not match its size")
            array = member[offset:].view(dtype).reshape(shape, order="F" if fortran_order else "C")
            if not is_aligned(array):  # a CPU device would copy it (`aligned_empty`)
                raise _Unaligned(info.filename)
            arrays[info.filename[:-4]] = array
    return arrays


class _Unaligned(Exception):
    """An entry whose arrays do not start on `ALIGNMENT`-byte boundaries (written by an older version)."""


def _write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Writes a temporary file beside `path` and renames it: a killed process leaves at most a
    `.tmp` file, never a half-written entry. No fsync: an entry damaged by a power cut is caught
    by the CRC check on reading and rebuilt."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            _write_zip(f, arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_zip(f: Any, arrays: dict[str, np.ndarray]) -> None:
    """The arrays as an uncompressed .npz (what `np.savez` writes) whose array data start on
    `ALIGNMENT`-byte boundaries of the file, so that `_read`'s views of the mapping are aligned too."""
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
        for key, value in arrays.items():
            value = value if value.flags.c_contiguous else value.copy(order="C")
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.file_size = _npy_header_size(value) + value.nbytes
            # Padding in the local header's extra field (id 0xD935, as Android's zipalign) puts the
            # member on an ALIGNMENT boundary; the .npy header is a multiple of 64 bytes long.
            end = f.tell() + 30 + len(info.filename.encode()) + 4
            info.extra = struct.pack("<HH", 0xD935, -end % ALIGNMENT) + bytes(-end % ALIGNMENT)
            with zf.open(info, "w") as member:
                np.lib.format.write_array(member, value, allow_pickle=False)


def _npy_header_size(array: np.ndarray) -> int:
    """Bytes of the .npy header (magic included) `np.lib.format.write_array` writes before `array`'s data."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(array))
    return header.tell()


def _note(text: str) -> None:
    from jaxtrain._src.report.notes import note  # here: the data layer does not import report at load time

    note(text)
