"""What leaves a run is as safe as the run: `jaxtrain predict` never writes over its input or
through a link, reads nothing pickled and names what is wrong with an input in one line (non-finite
rows included), writes its output whole or not at all (a full disk is one line, not a SIGBUS);
`jaxtrain export` refuses links, files and unknown platforms, and its signature carries checksums.
(Kills and two predicts at once: the slow tests at the end of this file.)"""

import concurrent.futures
import contextlib
import hashlib
import json
import os
import pickle
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from _runs import mount_tmpfs, unmount

import jaxtrain
from jaxtrain._src import export as export_module
from jaxtrain._src import safe_files
from jaxtrain.tools import runs
from jaxtrain.tools.array_files import write_outputs
from jaxtrain.tools.cli import main

ROWS = 40


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished tiny mlp-regression run (rows of 128 floats in, 64 out) and good inputs in x.npy."""
    run_dir = tmp_path_factory.mktemp("runs") / "mlp"
    assert main(["train", "mlp-regression", "--data.samples", "300", "--data.val-samples", "100", "--epochs", "1",
                 "--batch-size", "50", "--model.hidden", "8", "--quiet", "--run-dir", str(run_dir)]) == 0
    np.save(run_dir / "x.npy", np.random.default_rng(0).normal(size=(ROWS, 128)).astype(np.float32))
    return run_dir


def _error(capsys, args) -> str:
    """The one line `jaxtrain ARGS` prints, exiting 2."""
    assert main(args) == 2, args
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), (args, err)
    return err[0]


def _predict(run, source, out, *more):
    return ["predict", str(run), "--input", str(source), "--output", str(out), *more]


def _partials(folder) -> list[str]:
    return [p.name for p in folder.iterdir() if ".partial" in p.name]


def test_predict_never_writes_over_its_input(run, tmp_path, capsys):
    x = tmp_path / "x.npy"
    shutil.copy(run / "x.npy", x)
    before = x.read_bytes()
    os.link(x, tmp_path / "same.npy")  # another name of the same file
    for out in (x, tmp_path / "same.npy", tmp_path / "." / "x.npy"):
        assert f"--output {out} is the input {x}" in _error(capsys, _predict(run, x, out))
    assert x.read_bytes() == before and _partials(tmp_path) == []


def test_predict_writes_no_file_through_a_link(run, tmp_path, capsys):
    victim = tmp_path / "victim.npy"
    victim.write_bytes(b"precious")
    (tmp_path / "y.npy").symlink_to(victim)
    assert "y.npy is a symbolic link" in _error(capsys, _predict(run, run / "x.npy", tmp_path / "y.npy"))
    (tmp_path / ".z.npy.partial.npy").symlink_to(victim)  # the fixed temporary name of before
    assert main(_predict(run, run / "x.npy", tmp_path / "z.npy")) == 0
    assert np.load(tmp_path / "z.npy").shape == (ROWS, 64) and victim.read_bytes() == b"precious"


def _bad_inputs(folder, good: np.ndarray) -> list[tuple[str, str]]:
    """(file name, what the one line says) for inputs predict must refuse; the files made in `folder`."""
    npy = (folder / "good.npy")
    np.save(npy, good)
    np.savez(folder / "good.npz", x=good)
    with h5py.File(folder / "good.h5", "w") as f:
        f["x"] = good
    (folder / "empty.npy").write_bytes(b"")
    (folder / "truncated.npy").write_bytes(npy.read_bytes()[:1000])
    (folder / "random.npy").write_bytes(np.random.default_rng(1).bytes(4000))
    (folder / "random.npz").write_bytes(np.random.default_rng(2).bytes(4000))
    (folder / "random.h5").write_bytes(np.random.default_rng(3).bytes(4000))
    (folder / "pickled.npy").write_bytes(pickle.dumps(good))
    np.save(folder / "objects.npy", np.array([{"a": 1}] * 3, dtype=object), allow_pickle=True)
    np.savez(folder / "objects.npz", x=np.array([{"a": 1}] * 3, dtype=object))
    np.save(folder / "strings.npy", np.full((3, 128), "a"))
    np.save(folder / "complex.npy", good.astype(np.complex64))
    np.save(folder / "wide.npy", good[:, :7])
    np.save(folder / "scalar.npy", np.float32(1))
    np.save(folder / "norows.npy", good[:0])
    with h5py.File(folder / "strings.h5", "w") as f:
        f["x"] = np.array([b"abc"] * 4)
    (folder / "truncated.h5").write_bytes((folder / "good.h5").read_bytes()[:3000])
    (folder / "truncated.npz").write_bytes((folder / "good.npz").read_bytes()[:3000])
    return [
        ("empty.npy", "is empty (0 bytes)"),
        ("truncated.npy", "is truncated: its header promises 20,608 bytes, the file holds 1,000"),
        ("random.npy", "is not a .npy file"),
        ("random.npz", "is not an .npz archive"),
        ("random.h5", "is not a readable HDF5 file"),
        ("pickled.npy", "is not a .npy file (it does not begin as NumPy's files do: another format, or pickled"),
        ("objects.npy", "holds Python objects (pickled data is never loaded)"),
        ("objects.npz", "its array 'x' holds Python objects"),
        ("strings.npy", "holds strings (<U1)"),
        ("complex.npy", "holds complex numbers (complex64)"),
        ("wide.npy", "have shape (7,); the model takes rows of shape (128,)"),
        ("scalar.npy", "holds a single value, not rows"),
        ("norows.npy", "holds no rows"),
        ("strings.h5", "holds byte strings"),
        ("truncated.h5", "is not a readable HDF5 file (truncated file"),
        ("truncated.npz", "is not an .npz archive"),
    ]


def test_predict_names_what_is_wrong_with_an_input_in_one_line(run, tmp_path, capsys):
    good = np.load(run / "x.npy")
    for name, message in _bad_inputs(tmp_path, good):
        assert message in _error(capsys, _predict(run, tmp_path / name, tmp_path / "out.npy")), name
    assert not (tmp_path / "out.npy").exists() and _partials(tmp_path) == []
    for name in ("good.npy", "good.npz", "good.h5"):  # the same rows in each format read the same
        assert main(_predict(run, tmp_path / name, tmp_path / f"{name}.npy")) == 0
    capsys.readouterr()
    np.testing.assert_array_equal(np.load(tmp_path / "good.npz.npy"), np.load(tmp_path / "good.npy.npy"))
    np.testing.assert_array_equal(np.load(tmp_path / "good.h5.npy"), np.load(tmp_path / "good.npy.npy"))


def test_non_finite_rows_are_refused_by_row_unless_allowed(run, tmp_path, capsys):
    x = np.load(run / "x.npy")
    x[3, 5], x[17, 0] = np.nan, np.inf
    np.save(tmp_path / "x.npy", x)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["x"] = x
    for source in ("x.npy", "x.h5"):
        line = _error(capsys, _predict(run, tmp_path / source, tmp_path / "y.npy"))
        assert "input rows 3, 17 (field 'x') hold NaN or Inf" in line and "--allow-nonfinite" in line
        assert not (tmp_path / "y.npy").exists()
    assert main(_predict(run, tmp_path / "x.h5", tmp_path / "y.h5", "--allow-nonfinite")) == 0
    with h5py.File(tmp_path / "y.h5") as f:
        y = f["outputs"][...]
    assert not np.isfinite(y[3]).all() and np.isfinite(np.delete(y, [3, 17], axis=0)).all()
    model = runs.load(run)  # the Python API: the same refusal, and the same keyword
    with pytest.raises(jaxtrain.DataError, match=r"input rows 3, 17 .* pass allow_nonfinite=True"):
        jaxtrain.predict(model, x)
    assert jaxtrain.predict(model, x, allow_nonfinite=True).shape == (ROWS, 64)


def test_an_output_that_cannot_be_written_is_one_line(run, tmp_path, capsys, monkeypatch):
    (tmp_path / "folder.npy").mkdir()
    assert "folder.npy: it is a directory" in _error(capsys, _predict(run, run / "x.npy", tmp_path / "folder.npy"))
    assert "its folder" in _error(capsys, _predict(run, run / "x.npy", tmp_path / "none" / "y.npy"))
    monkeypatch.setattr(safe_files, "_temporary", lambda path: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied")))  # a read-only folder (chmod does not stop root)
    assert f"cannot write --output {tmp_path / 'y.npy'}: Permission denied" in _error(
        capsys, _predict(run, run / "x.npy", tmp_path / "y.npy"))


@contextlib.contextmanager
def _disk_holds(nbytes: int):
    """Writes past `nbytes` of any file fail as on a full disk (EFBIG, the kernel's file-size limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".h5"])
def test_a_full_disk_is_one_line_and_the_earlier_output_stays(tmp_path, suffix):
    out = tmp_path / f"y{suffix}"
    rows = np.arange(4000 * 64, dtype=np.float32).reshape(4000, 64)
    assert write_outputs(out, iter([rows[:100]]), 100) == {"outputs": (100, 64)}
    before = out.read_bytes()
    with pytest.raises(jaxtrain.ConfigError) as e, _disk_holds(256 << 10):
        write_outputs(out, (rows[i: i + 500] for i in range(0, 4000, 500)), 4000)  # 1 MiB
    assert str(e.value).startswith(f"cannot write --output {out}: File too large; free space, or write")
    assert "\n" not in str(e.value) and out.read_bytes() == before and _partials(tmp_path) == []


def test_predict_json_damaged_or_a_run_from_python_is_one_line(run, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    for text in ('{"inputs": "x", "sha', "", "[1, 2]"):
        (copy / "predict.json").write_text(text)
        line = _error(capsys, _predict(copy, run / "x.npy", tmp_path / "y.npy"))
        assert "predict.json" in line and ("cannot be read" in line or "is not what a run saves" in line)
    (tmp_path / "python").mkdir()
    (tmp_path / "python" / "config.json").write_text('{"recipe": "fit"}')
    assert "predict it from Python: jaxtrain.predict(jaxtrain.load(run_dir, model=template)" in _error(
        capsys, _predict(tmp_path / "python", run / "x.npy", tmp_path / "y.npy"))


def test_export_refuses_links_files_and_unknown_platforms(run, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "README.md").write_text("mine")
    (tmp_path / "link").symlink_to(elsewhere)
    (tmp_path / "file").write_text("mine")
    assert "link is a symbolic link" in _error(capsys, ["export", str(run), "--out", str(tmp_path / "link")])
    assert "file is a file, not a folder; choose another --out" in _error(
        capsys, ["export", str(run), "--out", str(tmp_path / "file")])
    line = _error(capsys, ["export", str(run), "--out", str(tmp_path / "a"), "--platforms", "cpu,tpu9"])
    assert "unknown platform 'tpu9' for --platforms; jax.export knows cpu, cuda, rocm, tpu" in line
    assert "(gpu is cuda or rocm)" in _error(capsys, ["export", str(run), "--out", str(tmp_path / "a"),
                                                      "--platforms", "gpu"])
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").symlink_to(elsewhere / "README.md")
    assert "README.md is a symbolic link" in _error(capsys, ["export", str(run), "--out", str(out)])
    assert (elsewhere / "README.md").read_text() == "mine" and (tmp_path / "file").read_text() == "mine"
    assert not (tmp_path / "a").exists() and _partials(out) == []


def test_export_carries_checksums_that_the_loaders_verify(run, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    written = export_module.write_text
    seen = []  # a new folder is written beside its name: a kill before the rename leaves no folder

    def watched(path, text, *args, **kwargs):
        seen.append((Path(path).parent != out, out.exists()))
        return written(path, text, *args, **kwargs)

    monkeypatch.setattr(export_module, "write_text", watched)
    assert main(["export", str(run), "--out", str(out), "--platforms", "cpu,CUDA"]) == 0
    assert seen == [(True, False), (True, False)]  # README.md, signature.json: elsewhere, `out` not there yet
    signature = json.loads((out / "signature.json").read_text())
    assert signature["platforms"] == ["cpu", "cuda"]
    assert signature["artifact_sha256"] == hashlib.sha256((out / "model.jax_export").read_bytes()).hexdigest()
    _, metadata = jaxtrain._src.weights.read_safetensors(out / "weights.safetensors")
    assert signature["weights_sha256"] == metadata["sha256"]
    assert "hashlib.sha256(blob).hexdigest() ==" in (out / "README.md").read_text()  # its snippet checks
    model = runs.load(run)
    jaxtrain.load_weights(model, out / "weights.safetensors")
    data = bytearray((out / "weights.safetensors").read_bytes())
    data[-1] ^= 1
    (out / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(jaxtrain.ConfigError, match="is damaged: its tensors' SHA-256"):
        jaxtrain.load_weights(model, out / "weights.safetensors")
    with pytest.raises(jaxtrain.ConfigError) as e, _disk_holds(4096):  # a full disk: the new folder goes again
        jaxtrain.export(model, np.zeros((1, 128), np.float32), tmp_path / "full")
    assert "File too large" in str(e.value) and "\n" not in str(e.value) and not (tmp_path / "full").exists()


def _cli(*args):
    return subprocess.Popen([sys.executable, "-m", "jaxtrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_for_partial(folder, proc, timeout=120.0) -> bool:
    """Polls until the process has a partial output file beside it (or has ended)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if _partials(folder):
            return True
        time.sleep(0.002)
    return False


@pytest.fixture(scope="module")
def big_inputs(run, tmp_path_factory):
    """Two inputs of 30,000 rows and their outputs, predicted in this process (as the command does)."""
    folder = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(4)
    for name in ("a", "b"):
        np.save(folder / f"{name}.npy", rng.normal(size=(30_000, 128)).astype(np.float32))
        runs.predict_files(run, folder / f"{name}.npy", folder / f"{name}-y.npy", batch_size=64)
    return folder


@pytest.mark.slow
def test_predict_killed_at_a_random_moment_leaves_its_output_whole_or_absent(run, big_inputs, tmp_path):
    """SIGTERM and SIGKILL while the output is being written: the output is absent or whole; after
    SIGTERM no partial file is left either. (`jaxtrain predict` killed 20 times: see the report.)"""
    reference = np.load(big_inputs / "a-y.npy")
    procs = {}
    for signum in (signal.SIGTERM, signal.SIGKILL):  # both at once, each in a folder of its own: their starts overlap
        (tmp_path / signum.name).mkdir()
        procs[signum] = _cli("predict", str(run), "--input", str(big_inputs / "a.npy"), "--output",
                             str(tmp_path / signum.name / "y.npy"), "--batch-size", "64")

    def kill(signum: signal.Signals, delay: float) -> None:
        _wait_for_partial(tmp_path / signum.name, procs[signum])
        time.sleep(delay)
        procs[signum].send_signal(signum)

    with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:
        list(pool.map(kill, procs, np.random.default_rng().uniform(0, 0.1, len(procs))))
    for signum, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        out = tmp_path / signum.name / "y.npy"
        if out.exists():
            np.testing.assert_array_equal(np.load(out), reference)
        if signum == signal.SIGTERM and proc.returncode != 0:
            assert proc.returncode == 128 + signum and err.strip() == "stopped by SIGTERM", err
            assert _partials(out.parent) == []


@pytest.mark.slow
def test_two_predicts_into_one_output_each_write_it_whole(run, big_inputs, tmp_path):
    outputs = [np.load(big_inputs / f"{name}-y.npy") for name in ("a", "b")]
    out = tmp_path / "y.npy"
    procs = [_cli("predict", str(run), "--input", str(big_inputs / f"{name}.npy"), "--output", str(out),
                  "--batch-size", "64") for name in ("a", "b")]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    y = np.load(out)
    assert any(np.array_equal(y, o) for o in outputs) and _partials(tmp_path) == []


@pytest.mark.slow
def test_sigterm_of_a_python_write_removes_its_partial_file(tmp_path):
    """A library caller with SIGTERM's default handler: the write's own handler removes the
    temporary file, then the process ends by the signal as it would have."""
    code = ("import sys, time\nfrom jaxtrain._src.safe_files import atomic_write\n"
            f"with atomic_write({str(tmp_path / 'out')!r}) as f:\n"
            "    f.write(b'x'); print('writing', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "writing\n" and len(_partials(tmp_path)) == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    proc.stdout.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_predict_onto_a_full_disk_is_one_line(run, big_inputs, tmp_path, capsys):
    disk = tmp_path / "disk"
    if not mount_tmpfs(disk, "256k"):
        pytest.skip("needs a tmpfs mount (root)")
    try:
        line = _error(capsys, _predict(run, big_inputs / "a.npy", disk / "y.npy"))  # 7.7 MB of outputs
        assert f"cannot write --output {disk / 'y.npy'}: No space left on device; free space, or write" in line
        assert os.listdir(disk) == []
    finally:
        unmount(disk)
