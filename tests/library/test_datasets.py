"""Dataset files: IDX parsing, checksums, offline copies, downloads, the char tokenizer."""

import gzip
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from jaxtrain._src.data import datasets
from jaxtrain._src.data.datasets import CharTokenizer, fetch, load_mnist, load_tinyshakespeare, read_idx
from jaxtrain._src.errors import DataError

OFFLINE = os.environ.get("JAXTRAIN_DATA_DIR")
needs_data = pytest.mark.skipif(not OFFLINE, reason="JAXTRAIN_DATA_DIR (the offline datasets) is not set")


def _write_idx(path: Path, array: np.ndarray, truncate: int = 0) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = array.astype(np.uint8).tobytes()
    with gzip.open(path, "wb") as f:
        f.write(header + payload[: len(payload) - truncate])


def test_read_idx_of_a_handmade_file(tmp_path):
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "x.gz", array)
    np.testing.assert_array_equal(read_idx(tmp_path / "x.gz"), array)
    _write_idx(tmp_path / "short.gz", array, truncate=5)
    with pytest.raises(DataError, match="holds 19 data bytes, its header \\(2, 3, 4\\) says 24"):
        read_idx(tmp_path / "short.gz")
    (tmp_path / "bad.gz").write_bytes(gzip.compress(b"\x00\x00\x0d\x01\x00\x00\x00\x01x"))
    with pytest.raises(DataError, match="not an IDX file of unsigned bytes"):
        read_idx(tmp_path / "bad.gz")
    (tmp_path / "cut.gz").write_bytes(gzip.compress(bytes(100))[:20])
    with pytest.raises(DataError, match="corrupt or truncated"):
        read_idx(tmp_path / "cut.gz")


@needs_data
def test_mnist_headers_labels_and_pixels():
    train, test = load_mnist("mnist")
    assert train["image"].shape == (60000, 28, 28) and test["image"].shape == (10000, 28, 28)
    assert train["image"].dtype == np.uint8 and train["label"].dtype == np.int32
    # Published facts about MNIST: the first labels and the per-class counts.
    assert train["label"][:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert test["label"][:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert np.bincount(train["label"]).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert np.bincount(test["label"]).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    # Pixels against the raw bytes: header 16 bytes (magic 2051, 60000, 28, 28), then row-major.
    raw = gzip.open(Path(OFFLINE) / "mnist" / "train-images-idx3-ubyte.gz").read()
    assert struct.unpack(">4I", raw[:16]) == (2051, 60000, 28, 28)
    for n, r, c in [(0, 14, 14), (0, 6, 12), (123, 20, 9), (59999, 27, 27)]:
        assert train["image"][n, r, c] == raw[16 + n * 784 + r * 28 + c]
    assert train["image"][0].max() == 255 and train["image"][0, 0].sum() == 0


@needs_data
def test_fashion_mnist_labels():
    train, test = load_mnist("fashion_mnist")
    assert train["label"][:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    assert np.bincount(train["label"]).tolist() == [6000] * 10
    assert np.bincount(test["label"]).tolist() == [1000] * 10


@needs_data
def test_tinyshakespeare_split_and_tokenizer_round_trip():
    train, val, tokenizer = load_tinyshakespeare()
    assert tokenizer.vocab_size == 65 and len(train) + len(val) == 1_115_394 and len(train) == 1_003_854
    text = (Path(OFFLINE) / "tinyshakespeare" / "input.txt").read_text()
    assert tokenizer.decode(np.concatenate([train, val])) == text
    assert tokenizer.decode(train[:14]) == "First Citizen:"


def test_tokenizer_round_trip_and_unknown_characters():
    tokenizer = CharTokenizer.from_text("hello world")
    assert tokenizer.chars == " dehlorw"
    assert tokenizer.decode(tokenizer.encode("world hello")) == "world hello"
    with pytest.raises(DataError, match="not in the vocabulary"):
        tokenizer.encode("hi!")


@needs_data
def test_bad_offline_files_name_the_file_and_the_fix(tmp_path, monkeypatch):
    name = "t10k-labels-idx1-ubyte.gz"
    (tmp_path / "mnist").mkdir()
    monkeypatch.setenv("JAXTRAIN_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError, match=f"{tmp_path}/mnist/{name} is missing .*unset JAXTRAIN_DATA_DIR"):
        fetch("mnist", name)
    good = (Path(OFFLINE) / "mnist" / name).read_bytes()
    (tmp_path / "mnist" / name).write_bytes(good[:-10])
    with pytest.raises(DataError, match="has 4,532 bytes, expected 4,542 .*truncated"):
        fetch("mnist", name)
    (tmp_path / "mnist" / name).write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(DataError, match="has SHA-256 .* expected f7ae60f92e00ec6d.*replace it with the original"):
        fetch("mnist", name)


@needs_data
def test_download_verifies_and_caches(tmp_path, monkeypatch):
    name = "t10k-labels-idx1-ubyte.gz"
    source = Path(OFFLINE) / "mnist" / name
    remote = datasets.DATASETS["mnist"][name]
    monkeypatch.delenv("JAXTRAIN_DATA_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setitem(datasets.DATASETS["mnist"], name,
                        datasets.RemoteFile(name, source.resolve().as_uri(), remote.sha256, remote.size))
    path = fetch("mnist", name)
    assert path == tmp_path / "cache" / "jaxtrain" / "mnist" / name and path.read_bytes() == source.read_bytes()
    mtime = path.stat().st_mtime_ns
    assert fetch("mnist", name).stat().st_mtime_ns == mtime  # cached: not downloaded again

    shutil.copy(source, tmp_path / "corrupt.gz")
    with open(tmp_path / "corrupt.gz", "r+b") as f:
        f.seek(100)
        f.write(b"\xff")
    bad = datasets.RemoteFile(name, (tmp_path / "corrupt.gz").as_uri(), remote.sha256, remote.size)
    monkeypatch.setitem(datasets.DATASETS["mnist"], name, bad)
    path.unlink()
    with pytest.raises(DataError, match="SHA-256 .*the download from .* is damaged; try again"):
        fetch("mnist", name)
    assert not path.exists() and not list(path.parent.glob(".*"))  # nothing corrupt is cached

    missing = datasets.RemoteFile(name, (tmp_path / "nowhere.gz").as_uri(), remote.sha256, remote.size)
    monkeypatch.setitem(datasets.DATASETS["mnist"], name, missing)
    with pytest.raises(DataError, match="cannot download .*set JAXTRAIN_DATA_DIR"):
        fetch("mnist", name)
    assert not path.exists() and not list(path.parent.glob(".*"))  # no half-written file left
