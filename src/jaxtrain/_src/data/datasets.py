"""Public datasets in their original files: download from the canonical URL, verify SHA-256,
cache; or read an offline copy from `JAXTRAIN_DATA_DIR`.

Files are looked up as `<root>/<dataset dir>/<file>`, where root is `$JAXTRAIN_DATA_DIR` when
set (nothing is downloaded then) and the cache directory (`~/.cache/jaxtrain`) otherwise.

The decoded arrays (IDX files, tokenised text) are cached on disk keyed by the files' SHA-256 and
the transform's version below (`jaxtrain.data.cache`): a second load skips the decoding.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import shutil
import struct
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

from jaxtrain._src.data.cache import cache_dir, cached
from jaxtrain._src.errors import DataError

DATA_DIR_ENV = "JAXTRAIN_DATA_DIR"  # read here; the cache's two variables are read in data/cache.py

# Versions of the cached transforms: bump one whenever its output would change, so that entries
# written by the old code are not read.
IDX_DECODE_VERSION = "1"  # load_mnist: 4 IDX files -> uint8 images, int32 labels
CHAR_TOKENS_VERSION = "1"  # load_tinyshakespeare: UTF-8 text -> int32 character ids + vocabulary


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    """One original file: where it comes from and what it must hash to."""

    name: str
    url: str
    sha256: str
    size: int


def _files(base: str, table: list[tuple[str, str, int]]) -> dict[str, RemoteFile]:
    return {name: RemoteFile(name, base + name, sha, size) for name, sha, size in table}


# Checksums and sizes as listed in shared/data/README.md (checked there against upstream MD5s).
DATASETS: dict[str, dict[str, RemoteFile]] = {
    "mnist": _files("http://yann.lecun.com/exdb/mnist/", [
        ("train-images-idx3-ubyte.gz", "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609", 9912422),
        ("train-labels-idx1-ubyte.gz", "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c", 28881),
        ("t10k-images-idx3-ubyte.gz", "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6", 1648877),
        ("t10k-labels-idx1-ubyte.gz", "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6", 4542),
    ]),
    "fashion_mnist": _files("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/", [
        ("train-images-idx3-ubyte.gz", "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84", 26421880),
        ("train-labels-idx1-ubyte.gz", "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845", 29515),
        ("t10k-images-idx3-ubyte.gz", "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073", 4422102),
        ("t10k-labels-idx1-ubyte.gz", "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5", 5148),
    ]),
    "tinyshakespeare": _files("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/", [
        ("input.txt", "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed", 1115394),
    ]),
}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _verify(path: Path, remote: RemoteFile, fix: str) -> None:
    size = path.stat().st_size
    if size != remote.size:
        raise DataError(f"{path} has {size:,} bytes, expected {remote.size:,} (truncated or wrong file); {fix}")
    digest = _sha256(path)
    if digest != remote.sha256:
        raise DataError(f"{path} has SHA-256 {digest[:16]}..., expected {remote.sha256[:16]}...; {fix}")


def fetch(dataset: str, name: str, root: str | os.PathLike | None = None) -> Path:
    """The verified local path of file `name` of `dataset`, downloading it if needed.

    Args:
      dataset: a key of `DATASETS`.
      name: the file's name.
      root: where to look; default `$JAXTRAIN_DATA_DIR` (offline, never downloads) or the cache.

    Raises:
      DataError: a missing offline file, a failed download, a wrong size or checksum.
    """
    remote = DATASETS[dataset][name]
    offline = root is None and os.environ.get(DATA_DIR_ENV)
    base = Path(root or offline or cache_dir())
    path = base / dataset / name
    if offline or (root is not None and path.exists()):
        if not path.is_file():
            raise DataError(f"{path} is missing ({DATA_DIR_ENV}={offline or root}); put the original {name} "
                            f"there (SHA-256 {remote.sha256[:16]}...) or unset {DATA_DIR_ENV} to download it")
        _verify(path, remote, f"replace it with the original from {remote.url}")
        return path
    if not path.is_file():
        _download(remote, path)
    _verify(path, remote, "delete it to download it again")
    return path


def _download(remote: RemoteFile, path: Path) -> None:
    """Downloads to a temporary file beside `path`, verifies it, then renames: no partial or
    corrupt file is ever at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{remote.name}.", delete=False) as tmp:
        try:
            with urllib.request.urlopen(remote.url, timeout=60) as response:
                shutil.copyfileobj(response, tmp)
        except OSError as e:
            os.unlink(tmp.name)
            raise DataError(f"cannot download {remote.url}: {getattr(e, 'reason', None) or e}; "
                            f"or set {DATA_DIR_ENV} to a directory with an offline copy") from None
    try:
        _verify(Path(tmp.name), remote, f"the download from {remote.url} is damaged; try again")
    except DataError:
        os.unlink(tmp.name)
        raise
    os.replace(tmp.name, path)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An IDX file (optionally gzipped) as a NumPy array of unsigned bytes.

    The header is two zero bytes, a type byte (0x08: unsigned byte), the number of dimensions,
    then one big-endian uint32 per dimension; the payload must have exactly that many bytes.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read {path}: {e}; the file is corrupt or truncated") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path} is not an IDX file of unsigned bytes (magic {raw[:4].hex()})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise DataError(f"{path} holds {len(raw) - header:,} data bytes, its header {shape} says {expected:,}")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def load_mnist(dataset: str = "mnist", root: str | os.PathLike | None = None) -> tuple[dict, dict]:
    """MNIST or Fashion-MNIST as `(train, test)` dicts: `image` uint8 (N, 28, 28), `label` int32 (N,)."""
    if dataset not in ("mnist", "fashion_mnist"):
        raise DataError(f"unknown image dataset {dataset!r}; choose mnist or fashion_mnist")
    names = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    paths = [fetch(dataset, name, root) for name in names]  # each verified against its SHA-256

    def decode() -> dict[str, np.ndarray]:
        arrays = {}
        for split, (images_path, labels_path) in zip(("train", "test"), (paths[:2], paths[2:])):
            images, labels = read_idx(images_path), read_idx(labels_path)
            if len(images) != len(labels):
                raise DataError(f"{dataset} {split}: {len(images)} images but {len(labels)} labels")
            arrays[f"{split}_image"], arrays[f"{split}_label"] = images, labels.astype(np.int32)
        return arrays

    digests = [DATASETS[dataset][name].sha256 for name in names]  # what fetch just checked
    arrays = cached(f"{dataset}-idx", IDX_DECODE_VERSION, paths, decode, digests=digests)
    train, test = ({"image": arrays[f"{s}_image"], "label": arrays[f"{s}_label"]} for s in ("train", "test"))
    return train, test


@dataclasses.dataclass(frozen=True)
class CharTokenizer:
    """Characters to integer ids and back; the vocabulary is the sorted set of characters seen."""

    chars: str

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        index = {c: i for i, c in enumerate(self.chars)}
        unknown = set(text) - set(index)
        if unknown:
            raise DataError(f"characters {sorted(unknown)[:5]} are not in the vocabulary")
        return np.fromiter((index[c] for c in text), np.int32, len(text))

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def load_tinyshakespeare(root: str | os.PathLike | None = None, val_fraction: float = 0.1):
    """Tiny Shakespeare at character level: `(train_ids, val_ids, tokenizer)`, the first 90% of
    the text for training and the rest for validation (as nanoGPT's shakespeare_char does)."""
    path = fetch("tinyshakespeare", "input.txt", root)

    def tokenise() -> dict[str, np.ndarray]:
        text = path.read_text(encoding="utf-8")
        tokenizer = CharTokenizer.from_text(text)
        chars = np.array([ord(c) for c in tokenizer.chars], np.uint32)  # (V,) code points
        return {"ids": tokenizer.encode(text), "chars": chars}

    digests = [DATASETS["tinyshakespeare"]["input.txt"].sha256]  # what fetch just checked
    arrays = cached("tinyshakespeare-chars", CHAR_TOKENS_VERSION, [path], tokenise, digests=digests)
    ids, tokenizer = arrays["ids"], CharTokenizer("".join(map(chr, arrays["chars"].tolist())))
    n = int(len(ids) * (1 - val_fraction))
    return ids[:n], ids[n:], tokenizer
