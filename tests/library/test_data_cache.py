"""The disk cache of preprocessed datasets: hits, keys, damaged entries, unwritable directories."""

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from jaxtrain._src.data import cache
from jaxtrain._src.data.arrays import is_aligned
from jaxtrain._src.data.cache import cached
from jaxtrain._src.data.datasets import load_mnist, load_tinyshakespeare

OFFLINE = os.environ.get("JAXTRAIN_DATA_DIR")
needs_data = pytest.mark.skipif(not OFFLINE, reason="JAXTRAIN_DATA_DIR (the offline datasets) is not set")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("JAXTRAIN_CACHE_DIR", str(directory))
    monkeypatch.delenv("JAXTRAIN_CACHE", raising=False)
    return directory


class CountingBuild:
    """A transform of a text file into arrays that counts its calls."""

    def __init__(self, source: Path):
        self.source, self.calls = source, 0

    def __call__(self) -> dict[str, np.ndarray]:
        self.calls += 1
        data = np.frombuffer(self.source.read_bytes(), np.uint8)
        return {"bytes": data.astype(np.int32), "grid": np.arange(6.0, dtype=np.float32).reshape(2, 3) * len(data)}

    def expected(self) -> dict[str, np.ndarray]:
        calls = self.calls
        try:
            return self()
        finally:
            self.calls = calls


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "input.txt"
    path.write_text("the quick brown fox")
    return path


def assert_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        np.testing.assert_array_equal(a[key], b[key])


def notes(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]


def test_a_second_call_reads_the_entry_instead_of_building(cache_dir, source, capsys):
    build = CountingBuild(source)
    first = cached("text", "1", [source], build)
    second = cached("text", "1", [source], build)
    assert build.calls == 1
    assert_equal(first, build.expected())
    assert_equal(second, build.expected())
    assert [p.name[:5] for p in cache_dir.iterdir()] == ["text-"]  # one entry, no temporary file left
    assert notes(capsys) == []
    second["bytes"][0] = -1  # read arrays are writeable; the entry is mapped copy-on-write
    assert cached("text", "1", [source], build)["bytes"][0] == ord("t") and build.calls == 1


def test_a_changed_source_or_version_rebuilds(cache_dir, source):
    build = CountingBuild(source)
    cached("text", "1", [source], build)
    source.write_text("the quick brown fox!")  # same name, other content
    assert_equal(cached("text", "1", [source], build), build.expected())
    assert build.calls == 2
    assert_equal(cached("text", "2", [source], build), build.expected())  # a bumped version
    assert build.calls == 3
    cached("text", "2", [source], build)
    cached("text", "1", [source], build)
    assert build.calls == 3  # both versions are cached
    source.write_text("the quick brown fox")  # back to the first content: its entry is still there
    assert_equal(cached("text", "1", [source], build), build.expected())
    assert build.calls == 3


def test_given_digests_key_the_entry_without_hashing(cache_dir, source, monkeypatch):
    build = CountingBuild(source)
    digest = cache.file_sha256(source)
    monkeypatch.setattr(cache, "file_sha256", lambda path: pytest.fail("hashed a source whose digest was given"))
    cached("text", "1", [source], build, digests=[digest])
    cached("text", "1", [source], build, digests=[digest])
    assert build.calls == 1
    cached("text", "1", [source], build, digests=["0" * 64])
    assert build.calls == 2


def test_entries_hold_aligned_arrays_and_older_unaligned_ones_are_written_again(cache_dir, source, capsys):
    build = CountingBuild(source)
    built = cached("text", "1", [source], build)
    (entry,) = cache_dir.glob("*.npz")
    read = cached("text", "1", [source], build)
    assert build.calls == 1 and all(is_aligned(a) for a in [*built.values(), *read.values()])  # used in place
    with np.load(entry) as z:  # a plain .npz that NumPy reads
        assert_equal(dict(z), build.expected())
    with entry.open("wb") as f:
        np.savez(f, **build.expected())  # as entries were written before: members at any offset
    with pytest.raises(cache._Unaligned):
        cache._read(entry)
    assert_equal(cached("text", "1", [source], build), build.expected())
    assert build.calls == 2 and notes(capsys) == []  # rebuilt quietly, once
    assert all(is_aligned(a) for a in cached("text", "1", [source], build).values()) and build.calls == 2


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "garbage", "empty"])
def test_a_damaged_entry_is_rebuilt_with_one_note(cache_dir, source, capsys, damage):
    build = CountingBuild(source)
    cached("text", "1", [source], build)
    (entry,) = cache_dir.glob("*.npz")
    raw = entry.read_bytes()
    npy = raw.index(b"\x93NUMPY")  # the first array: magic, version, header length, header, data
    data = npy + 10 + int.from_bytes(raw[npy + 8 : npy + 10], "little")
    damaged = {"truncated": raw[: len(raw) // 2], "garbage": b"not a zip file", "empty": b"",
               "flipped byte": raw[:data] + bytes([raw[data] ^ 0xFF]) + raw[data + 1 :]}[damage]
    entry.write_bytes(damaged)
    capsys.readouterr()
    assert_equal(cached("text", "1", [source], build), build.expected())
    assert build.calls == 2
    (line,) = notes(capsys)
    assert f"the cached text in {entry} is unreadable" in line and "rebuilding it" in line
    assert entry.read_bytes() == raw  # rewritten whole
    cached("text", "1", [source], build)
    assert build.calls == 2 and notes(capsys) == []


def _read_only(cache_dir: Path, monkeypatch) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    cache_dir.mkdir()
    cache_dir.chmod(0o555)


def _not_a_directory(cache_dir: Path, monkeypatch) -> None:
    cache_dir.write_text("a file where the cache directory should be")


def _read_only_filesystem(cache_dir: Path, monkeypatch) -> None:
    def write_zip(file, arrays):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(cache, "_write_zip", write_zip)


def _disk_full(cache_dir: Path, monkeypatch) -> None:
    def write_zip(file, arrays):
        file.write(b"PK\x03\x04 half an entry")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cache, "_write_zip", write_zip)


@pytest.mark.parametrize("unwritable", [_read_only, _not_a_directory, _read_only_filesystem, _disk_full])
def test_an_unwritable_cache_still_returns_the_arrays(cache_dir, source, capsys, monkeypatch, unwritable):
    unwritable(cache_dir, monkeypatch)
    build = CountingBuild(source)
    assert_equal(cached("text", "1", [source], build), build.expected())
    assert_equal(cached("text", "1", [source], build), build.expected())
    assert build.calls == 2
    lines = notes(capsys)
    assert len(lines) == 2 and all("cannot write the preprocessing cache" in line for line in lines)
    assert not cache_dir.is_dir() or list(cache_dir.iterdir()) == []  # no entry, no temporary file


def test_an_interrupted_write_leaves_no_entry(cache_dir, source, monkeypatch):
    def write_zip(file, arrays):
        file.write(b"PK\x03\x04 half an entry")
        raise KeyboardInterrupt

    build = CountingBuild(source)
    with monkeypatch.context() as m:
        m.setattr(cache, "_write_zip", write_zip)
        with pytest.raises(KeyboardInterrupt):
            cached("text", "1", [source], build)
    assert list(cache_dir.iterdir()) == []
    assert_equal(cached("text", "1", [source], build), build.expected())
    assert build.calls == 2


def test_a_failing_build_writes_nothing(cache_dir, source):
    def build():
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        cached("text", "1", [source], build)
    assert not cache_dir.exists()


@pytest.mark.parametrize("off", ["0", "false", "off", "NO"])
def test_the_cache_can_be_turned_off(cache_dir, source, monkeypatch, off):
    monkeypatch.setenv("JAXTRAIN_CACHE", off)
    build = CountingBuild(source)
    cached("text", "1", [source], build)
    cached("text", "1", [source], build)
    assert build.calls == 2 and not cache_dir.exists()


def test_the_default_directory_is_in_the_download_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("JAXTRAIN_CACHE_DIR", raising=False)
    monkeypatch.delenv("JAXTRAIN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_root() == tmp_path / "jaxtrain" / "preprocessed"


def test_bad_names_and_arguments_are_refused(cache_dir, source):
    with pytest.raises(ValueError, match="may only hold"):
        cached("../escape", "1", [source], CountingBuild(source))
    with pytest.raises(ValueError, match="1 digests for 2 sources"):
        cached("text", "1", [source, source], CountingBuild(source), digests=["0" * 64])
    with pytest.raises(TypeError, match="NumPy arrays without objects"):
        cached("text", "1", [source], lambda: {"x": np.array([object()])})


@needs_data
def test_cached_mnist_and_shakespeare_equal_the_uncached_ones(cache_dir, monkeypatch):
    monkeypatch.setenv("JAXTRAIN_CACHE", "0")
    reference = load_mnist("mnist"), load_tinyshakespeare()
    monkeypatch.setenv("JAXTRAIN_CACHE", "1")
    for _ in ("cold", "warm"):
        mnist, (train_ids, val_ids, tokenizer) = load_mnist("mnist"), load_tinyshakespeare()
        for split, expected in zip(mnist, reference[0]):
            assert_equal(split, expected)
        assert_equal({"train": train_ids, "val": val_ids}, {"train": reference[1][0], "val": reference[1][1]})
        assert tokenizer == reference[1][2]
    assert sorted(p.name.split("-")[0] for p in cache_dir.iterdir()) == ["mnist", "tinyshakespeare"]
