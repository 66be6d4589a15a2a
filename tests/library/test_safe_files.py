"""The one writer (`safe_files.atomic_write`): whole or nothing, never through a link, never a
shared temporary name, nothing left on an error or SIGTERM; and the weights' checksum (a damaged
file is one line; files written before the checksum still load)."""

import errno
import hashlib
import json
import os
import signal
import struct
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from flax import nnx

from jaxtrain import ConfigError, load_weights, save_weights
from jaxtrain._src import safe_files
from jaxtrain._src.hooks.trackers import CSV, IDS, Tracker
from jaxtrain._src.report.plots import save_figure
from jaxtrain._src.safe_files import atomic_write, partial_folder, remove_partials, write_text
from jaxtrain._src.weights import flat_weights, read_safetensors
from jaxtrain.models import MLP


def _one_line(e: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(e.value)
    return str(e.value)


def _partials(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".partial")]


def test_a_write_is_whole_or_absent_and_leaves_nothing_on_an_error_or_ctrl_c(tmp_path):
    path = tmp_path / "out.bin"
    write_text(path, "old")
    for error in (ValueError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with atomic_write(path) as f:
                f.write(b"new, half written")
                assert len(_partials(tmp_path)) == 1 and path.read_text() == "old"  # beside it, under its own name
                raise error
        assert path.read_text() == "old" and _partials(tmp_path) == []
    write_text(path, "new")
    assert path.read_text() == "new" and _partials(tmp_path) == []


def test_links_are_refused_and_no_fixed_temporary_name_is_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "link").symlink_to(victim)
    with pytest.raises(ConfigError) as e:
        write_text(tmp_path / "link", "x")
    assert "link is a symbolic link (to" in _one_line(e) and victim.read_text() == "precious"
    for old in (".out.partial", ".out.tmp", ".out.partial.npy"):  # the names writers used before
        (tmp_path / old).symlink_to(victim)
    write_text(tmp_path / "out", "mine")
    assert (tmp_path / "out").read_text() == "mine" and victim.read_text() == "precious"
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match="it is a directory"):
        write_text(tmp_path / "folder", "x")
    with pytest.raises(ConfigError, match="its folder .* does not exist"):
        write_text(tmp_path / "missing" / "out", "x")


def test_a_refusing_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    real = safe_files._temporary
    monkeypatch.setattr(safe_files, "_temporary", lambda path: (_ for _ in ()).throw(
        PermissionError(errno.EACCES, "Permission denied")))  # a read-only folder (the tests run as root)
    with pytest.raises(ConfigError) as e:
        write_text(tmp_path / "out", "x", advice="write it elsewhere")
    assert _one_line(e) == f"cannot write {tmp_path / 'out'}: Permission denied; write it elsewhere"
    monkeypatch.setattr(safe_files, "_temporary", real)

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def flush(self):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    real_fdopen = safe_files.os.fdopen
    monkeypatch.setattr(safe_files.os, "fdopen", lambda fd, mode: Full(real_fdopen(fd, mode)))
    with pytest.raises(ConfigError) as e:
        write_text(tmp_path / "out", "x")
    assert "No space left on device; free space, or write it elsewhere" in _one_line(e)
    assert not (tmp_path / "out").exists() and _partials(tmp_path) == []


def test_two_writers_of_one_file_never_mix(tmp_path):
    """Threads of one process writing the same file at once: each write is one writer's, whole."""
    path = tmp_path / "out.bin"
    bodies = [bytes([i]) * (1 << 18) for i in range(4)]
    errors = []

    def write(body):
        try:
            for _ in range(5):
                with atomic_write(path) as f:
                    for k in range(0, len(body), 4096):
                        f.write(body[k: k + 4096])
                assert path.read_bytes() in bodies
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and path.read_bytes() in bodies and _partials(tmp_path) == []


def test_sigterm_during_a_write_removes_the_partial_file(tmp_path):
    """Where nobody handles SIGTERM, a write installs a handler that removes its temporary file
    (then ends the process by the signal); the command line's own handler calls `remove_partials`."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(ValueError):
            with atomic_write(tmp_path / "a") as f:
                assert signal.getsignal(signal.SIGTERM) is safe_files._on_sigterm
                with atomic_write(tmp_path / "b"):
                    pass
                assert signal.getsignal(signal.SIGTERM) is safe_files._on_sigterm  # still, for the outer write
                f.write(b"x")
                assert len(_partials(tmp_path)) == 1
                remove_partials()  # what either handler does first
                assert _partials(tmp_path) == []
                raise ValueError
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_trackers_and_plots_write_through_the_safe_writer(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    victim = tmp_path / "victim"
    victim.write_text("precious")
    run = SimpleNamespace(run_dir=tmp_path, resumed_step=None)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    (tmp_path / ".metrics.csv.partial").symlink_to(victim)  # the fixed temporary names of before
    (tmp_path / f".{IDS}.partial").symlink_to(victim)
    CSV()._write(run)
    Tracker()._save_id(run, "abc")
    assert (tmp_path / "metrics.csv").read_text().splitlines() == ["step,loss", "1,0.5"]
    assert json.loads((tmp_path / IDS).read_text()) == {"tracker": "abc"}
    (tmp_path / "curves.png").symlink_to(victim)
    with pytest.raises(ConfigError, match="curves.png is a symbolic link"):
        save_figure(plt.figure(), tmp_path / "curves.png")
    save_figure(plt.figure(), tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG" and victim.read_text() == "precious"


def _model(width: int = 8) -> MLP:
    return MLP((4, width, 2), rngs=nnx.Rngs(0))


def test_weights_carry_their_checksum_and_a_flipped_bit_is_refused(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    path = save_weights(_model(), tmp_path / "w.safetensors")
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    metadata = json.loads(data[8: 8 + n])["__metadata__"]
    assert metadata["sha256"] == hashlib.sha256(data[8 + n:]).hexdigest()  # of the tensors' bytes
    assert sorted(safetensors.load_file(str(path))) == sorted(flat_weights(_model())[0])  # others still read it
    load_weights(_model(), path)
    flipped = bytearray(data)
    flipped[-3] ^= 0x10  # one bit of the last tensor
    path.write_bytes(bytes(flipped))
    with pytest.raises(ConfigError) as e:
        load_weights(_model(), path)
    assert "is damaged: its tensors' SHA-256 is" in _one_line(e)


@pytest.mark.parametrize("edit", [(b'"dtype":"F32"', b'"dtype":"I32"'),  # the same bytes read as other numbers
                                  (b'"format":"jaxtrain"', b'"format":"jaxtrainx"')])
def test_weights_whose_header_was_edited_are_refused(tmp_path, edit):
    path = save_weights(_model(), tmp_path / "w.safetensors")
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8: 8 + n])
    assert header["__metadata__"]["header_sha256"]  # what the edit must match, and cannot
    old, new = edit
    assert data.count(old) >= 1
    edited = data[8: 8 + n].replace(old, new, 1)
    edited += b" " * (-len(edited) % 8)
    path.write_bytes(struct.pack("<Q", len(edited)) + edited + data[8 + n:])
    with pytest.raises(ConfigError) as e:
        load_weights(_model(), path)
    assert "is damaged: its header (names, dtypes, shapes, byte ranges) does not match" in _one_line(e)


def test_weights_written_before_the_checksum_still_load(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    model = _model()
    tensors, kinds = flat_weights(model)
    safetensors.save_file(tensors, str(tmp_path / "old.safetensors"), metadata={"variables": json.dumps(kinds)})
    loaded = load_weights(_model(), tmp_path / "old.safetensors")
    for name, value in flat_weights(loaded)[0].items():
        np.testing.assert_array_equal(value, tensors[name])


@pytest.mark.parametrize("header, message", [
    (b"null", "its header is NoneType, not a JSON object"),
    (b'{"__metadata__": "x"}', "its __metadata__ is not an object of strings"),
    (b'{"__metadata__": {"variables": "{nope"}}', "its metadata entry 'variables' is not a JSON object"),
    (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}', "is not a safetensors file"),
])
def test_damaged_weight_headers_are_one_line(tmp_path, header, message):
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(ConfigError) as e:
        load_weights(_model(), path)
    assert message in _one_line(e)
    path.write_bytes(struct.pack("<Q", 1 << 40) + header)  # a length past the end
    with pytest.raises(ConfigError, match="its header claims"):
        read_safetensors(path)


def test_the_partial_file_of_a_killed_writer_goes_at_the_next_write(tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()  # a process that has ended
    prefix = safe_files._prefix(tmp_path / "out")
    stale, live = tmp_path / f"{prefix}{dead}-0a0b0c0d.partial", tmp_path / f"{prefix}{os.getpid()}-0a0b0c0d.partial"
    stale.write_bytes(b"left by SIGKILL")
    live.write_bytes(b"another write of this process, still going")
    (tmp_path / f"{prefix}1-00000000.partial").symlink_to(tmp_path / "victim")  # not a file of ours: kept
    write_text(tmp_path / "out", "x")
    assert sorted(_partials(tmp_path)) == sorted([live.name, f"{prefix}1-00000000.partial"])


def test_a_partial_folder_replaces_its_folder_whole_and_a_killed_writers_folder_goes(tmp_path):
    """`partial_folder` (`data generate --format npy`): the same names and cleanup as a file's."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    out = tmp_path / "out"
    stale = tmp_path / f"{safe_files._prefix(out)}{dead}-0a0b0c0d.partial"
    stale.mkdir()
    (stale / "shard.npy").write_bytes(b"left by SIGKILL")
    with pytest.raises(ValueError):
        with partial_folder(out) as tmp:
            (tmp / "a").write_text("half")
            assert _partials(tmp_path) == [tmp.name] and tmp.name.startswith(".out.")  # the stale one went
            raise ValueError
    assert not out.exists() and _partials(tmp_path) == []
    for name in ("a", "b"):  # the second replaces the first, whole
        with partial_folder(out) as tmp:
            (tmp / name).write_text(name)
        assert [p.name for p in out.iterdir()] == [name] and _partials(tmp_path) == []
    with pytest.raises(KeyboardInterrupt):
        with partial_folder(out) as tmp:
            (tmp / "c").write_text("c")
            remove_partials()  # what a SIGTERM handler does first: the folder goes, its files too
            assert not tmp.exists()
            raise KeyboardInterrupt
    assert [p.name for p in out.iterdir()] == ["b"] and _partials(tmp_path) == []


def test_a_name_longer_than_the_filesystem_allows_is_one_line(tmp_path):
    from jaxtrain._src.safe_files import check_target

    with pytest.raises(ConfigError) as e:
        check_target(tmp_path / ("y" * 300 + ".npy"), "--output", "write the outputs elsewhere")
    assert _one_line(e).startswith("cannot write --output yyyyyyyyyyyyyyyyyyyyyyyy…: its name is 304 bytes, and the "
                                   "filesystem allows 255: choose a shorter name, or write the outputs elsewhere")
    assert list(tmp_path.iterdir()) == []
