"""`jaxtrain data generate` and `jaxtrain data inspect`: content, atomic writes, statistics, clear errors."""

import json

import h5py
import numpy as np
import pytest

from jaxtrain._src.data import generate as generate_module
from jaxtrain._src.data import generate_dataset, inspect_file, make_rows
from jaxtrain._src.data.inspect import sample_ranges
from jaxtrain._src.data.synthetic import ALPHABET, KYTE_DOOLITTLE
from jaxtrain._src.errors import ConfigError, DataError
from jaxtrain.tools.cli import main


def read_all(path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {name: f[name][...] for name in f}


def test_mlp_regression_file_matches_its_generator_and_stores_exact_statistics(tmp_path):
    a = generate_dataset("mlp-regression", tmp_path / "a.h5", 20_000, chunk_rows=1000, seed=3)
    b = generate_dataset("mlp-regression", tmp_path / "b.h5", 20_000, chunk_rows=333, compression="gzip", seed=3)
    assert a.samples == 20_000 and a.rows_per_s > 0 and a.bytes == (tmp_path / "a.h5").stat().st_size
    data = read_all(a.path)
    assert data["features"].shape == (20_000, 128) and data["targets"].shape == (20_000, 64)
    assert data["features"].dtype == data["targets"].dtype == np.float32
    expected = make_rows("mlp-regression", 3, 0, 20_000)
    for name in ("features", "targets"):  # chunking and compression do not change the rows
        np.testing.assert_array_equal(data[name], expected[name])
        np.testing.assert_array_equal(read_all(b.path)[name], data[name])
    np.testing.assert_array_equal(make_rows("mlp-regression", 3, 8000, 8100)["features"], data["features"][8000:8100])
    with h5py.File(a.path) as f:
        assert f["features"].chunks == (1000, 128)
        assert (f.attrs["workload"], f.attrs["seed"], f.attrs["samples"]) == ("mlp-regression", 3, 20_000)
        x = data["features"].astype(np.float64)
        np.testing.assert_allclose(f.attrs["feature_mean"], x.mean(0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(f.attrs["feature_std"], x.std(0), rtol=1e-12)
    # Per-feature offsets and scales, so normalisation matters; targets of order 1 plus noise.
    assert np.ptp(x.mean(0)) > 2 and x.std(0).min() > 0.4 and x.std(0).max() < 3.2
    assert 0.3 < data["targets"].std() < 1.5


def test_sequence_targets_are_the_documented_functions_of_the_tokens(tmp_path):
    result = generate_dataset("sequence", tmp_path / "s.h5", 20_000, seq_len=50, seed=1)
    data = read_all(result.path)
    tokens, targets, labels = data["input_sequences"], data["targets"], data["labels"]
    assert tokens.shape == (20_000, 50) and tokens.dtype == np.int8
    assert targets.shape == (20_000, 2) and targets.dtype == np.float32
    assert labels.shape == (20_000,) and labels.dtype == np.int32
    assert tokens.min() == 0 and tokens.max() == len(ALPHABET) - 1 == 19
    np.testing.assert_allclose(targets.mean(0), 0.0, atol=0.05)
    np.testing.assert_allclose(targets.std(0), np.sqrt(1.01), rtol=0.05)
    # targets[:, 0] is the standardised mean hydrophobicity plus noise 0.1.
    hydro = KYTE_DOOLITTLE[tokens].mean(1)
    z = (hydro - KYTE_DOOLITTLE.mean()) / (KYTE_DOOLITTLE.std() / np.sqrt(50))
    assert abs(np.std(targets[:, 0] - z) - 0.1) < 0.005
    # targets[:, 1] is an increasing function of the K/R-then-D/E motif count plus noise 0.1.
    pos, neg = np.isin(tokens, [ALPHABET.index("K"), ALPHABET.index("R")]), np.isin(tokens, [2, 3])
    count = (pos[:, :-1] & neg[:, 1:]).sum(1)
    slope, intercept = np.polyfit(count, targets[:, 1], 1)
    assert slope > 0 and abs(np.std(targets[:, 1] - (slope * count + intercept)) - 0.1) < 0.005
    # labels are the quartiles of targets[:, 0]: four balanced, ordered classes.
    np.testing.assert_allclose(np.bincount(labels) / 20_000, 0.25, atol=0.02)
    for c in range(3):
        assert targets[labels == c, 0].max() <= targets[labels == c + 1, 0].min()
    with h5py.File(result.path) as f:
        assert dict(f.attrs) == {"workload": "sequence", "seed": 1, "samples": 20_000, "seq_len": 50,
                                 "alphabet_size": 20, "alphabet": ALPHABET, "num_classes": 4}


def test_generate_then_inspect_both_workloads(tmp_path, capsys):
    for workload, names in (("mlp-regression", ["features", "targets"]),
                            ("sequence", ["input_sequences", "labels", "targets"])):
        out = tmp_path / f"{workload}.h5"
        assert main(["data", "generate", workload, str(out), "--samples", "3000", "--seq-len", "20",
                     "--chunk-rows", "256", "--compression", "lzf", "--quiet"]) == 0
        printed = capsys.readouterr().out
        assert f"wrote {out}: 3,000 rows in" in printed and "rows/s" in printed
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
        assert main(["data", "inspect", str(out), "--rows", "1000"]) == 0
        printed = capsys.readouterr().out
        for word in (*names, "lzf", "(256,", "mean", "NaN", "Inf", "rows sampled", "peak memory", "workload"):
            assert word in printed, (word, printed)
        if workload == "sequence":
            assert "values 0..19, 20 distinct" in printed and "values 0..3, 4 distinct" in printed


def test_inspect_statistics_come_from_chunk_aligned_samples(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, (10_000, 3)).astype(np.float32)
    x[5, 1], x[6, 1], x[7, 2] = np.nan, np.inf, -np.inf
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(128, 3))
        f.create_dataset("words", data=np.array([b"a", b"b"]))
    ranges = sample_ranges(10_000, 128, 1000)
    assert len(ranges) == 8 and ranges[0][0] == 0 and ranges[-1][1] <= 10_000
    assert all(a % 128 == 0 and b - a == 128 for a, b in ranges)
    assert all(ranges[i][1] <= ranges[i + 1][0] for i in range(len(ranges) - 1))
    assert sample_ranges(500, 128, 1000) == [(0, 500)]
    assert main(["data", "inspect", str(tmp_path / "x.h5"), "--rows", "1000", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (stats,) = [d for d in report["datasets"] if d["name"] == "x"]
    sample = np.concatenate([x[a:b] for a, b in ranges]).astype(np.float64)
    assert stats["sampled_rows"] == len(sample) == 1024 and stats["sample_ranges"] == 8
    for c in range(3):
        col = sample[:, c][np.isfinite(sample[:, c])]
        got = stats["columns"][c]
        np.testing.assert_allclose([got["mean"], got["std"], got["min"], got["max"]],
                                   [col.mean(), col.std(), col.min(), col.max()], rtol=1e-10)
    assert [(s["nan"], s["inf"]) for s in stats["columns"]] == [(0, 0), (1, 1), (0, 1)]
    finite = sample[np.isfinite(sample)]
    np.testing.assert_allclose([stats["overall"]["mean"], stats["overall"]["std"]], [finite.mean(), finite.std()])
    assert stats["storage_bytes"] > 0 and stats["nbytes"] == 10_000 * 3 * 4 and stats["chunks"] == [128, 3]
    assert report["peak_rss_bytes"] > report["sample_peak_bytes"] > 0 and report["seconds"] > 0
    words = next(d for d in report["datasets"] if d["name"] == "words")
    assert words["note"] == "no statistics for dtype |S1"
    assert inspect_file(tmp_path / "x.h5", rows=50_000)["datasets"][1]["sampled_rows"] == 10_000


def test_generate_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "d.h5"
    out.write_bytes(b"precious")
    args = ["data", "generate", "sequence", str(out), "--samples", "100", "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == f"error: {out} exists; pass --force to replace it, or choose another file name\n"
    assert out.read_bytes() == b"precious"
    assert main([*args, "--force"]) == 0
    assert read_all(out)["labels"].shape == (100,)


def _one_line(capsys, start: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(start) and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_failed_or_interrupted_generate_leaves_nothing_behind(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("not a directory")
    out = tmp_path / "file" / "d.h5"
    assert main(["data", "generate", "sequence", str(out), "--samples", "100", "--quiet"]) == 2
    _one_line(capsys, f"error: cannot write {out}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]

    old = tmp_path / "old.h5"
    generate_dataset("sequence", old, 50)
    before = old.read_bytes()
    calls = []

    def failing(*args, **kwargs):  # the second block of rows fails
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return make_rows(*args, **kwargs)

    monkeypatch.setattr(generate_module, "make_rows", failing)
    monkeypatch.setattr(generate_module, "WRITE_ROWS", 8192)
    args = ["data", "generate", "sequence", str(old), "--samples", "20000", "--force", "--quiet"]
    assert main(args) == 130
    assert capsys.readouterr().err == "interrupted\n"
    assert old.read_bytes() == before  # the old file is untouched until the new one is complete
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "old.h5"]
    calls.clear()
    monkeypatch.setattr(generate_module, "make_rows", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "No space")))
    assert main(args) == 2
    _one_line(capsys, f"error: cannot write {old}: No space; check that the directory exists, is writable")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "old.h5"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["data"], "error: unknown data command; choose one of: generate, inspect"),
        (["data", "plot"], "error: unknown data command 'plot'"),
        (["data", "generate", "mlp-regression"], "error: usage: jaxtrain data generate WORKLOAD OUT.h5 --samples N"),
        (["data", "generate", "images", "x.h5", "--samples", "5"],
         "error: unknown workload 'images'; choose one of: mlp-regression, sequence"),
        (["data", "generate", "sequence", "x.h5"], "error: Missing from jaxtrain data generate"),
        (["data", "generate", "sequence", "x.h5", "--samples", "0"], "error: samples=0 must be an integer >= 1"),
        (["data", "generate", "sequence", "x.h5", "--samples", "5", "--compression", "zip"],
         "error: invalid choice 'zip'"),
        (["data", "inspect"], "error: usage: jaxtrain data inspect FILE [--rows N] [--json]"),
        (["data", "inspect", "missing.h5"], "error: missing.h5 does not exist; check the path"),
        (["data", "inspect", "x.h5", "--rows", "0"], "error: rows=0 must be an integer >= 1"),
    ],
)
def test_data_command_errors_are_one_line_with_exit_code_2(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    _one_line(capsys, message)
    assert not list(tmp_path.iterdir())


def test_inspect_of_a_corrupt_file_is_one_line(tmp_path, capsys):
    (tmp_path / "junk.h5").write_bytes(bytes(range(256)) * 10)
    assert main(["data", "inspect", str(tmp_path / "junk.h5")]) == 2
    _one_line(capsys, f"error: cannot open {tmp_path / 'junk.h5'} as HDF5 (file signature not found)")


@pytest.mark.parametrize("format", ["hdf5", "npy"])
def test_sigterm_during_generate_removes_the_partial_file(tmp_path, monkeypatch, format):
    """SIGTERM (a scheduler's stop) while rows are written: the process ends 143 as it would, and
    no partial file or folder is left behind (`OUT.h5.partial` was left whole before)."""
    import os
    import signal

    calls = []

    def terminated(*args, **kwargs):  # the second block of rows: SIGTERM arrives
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return make_rows(*args, **kwargs)

    monkeypatch.setattr(generate_module, "make_rows", terminated)
    monkeypatch.setattr(generate_module, "WRITE_ROWS", 8192)
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e:
        generate_dataset("sequence", tmp_path / "d.h5", 20000, format=format, shard_rows=8192)
    assert e.value.code == 143
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is previous  # the handler is put back


def _seed(out) -> int:
    """The seed a generated file or folder was written with."""
    if out.is_dir():
        return json.loads((out / "attrs.json").read_text())["seed"]
    with h5py.File(out, "r") as f:
        return int(f.attrs["seed"])


def _partials(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial"))


@pytest.mark.parametrize("format", ["hdf5", "npy"])
def test_generate_follows_no_planted_link_and_refuses_an_out_that_is_a_link(tmp_path, capsys, format):
    """The fixed temporary name of before (`OUT.partial`) was opened for writing whatever a link
    there named; now each generation makes its own, and an `out` that is a link is one line."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "d"
    (tmp_path / "d.partial").symlink_to(victim)  # the old fixed name, planted
    generate_dataset("sequence", out, 50, seq_len=8, format=format, shard_rows=20)
    assert victim.read_text() == "precious" and _seed(out) == 0
    assert _partials(tmp_path) == ["d.partial"]  # the planted link is not ours: left, never followed

    for target in (victim, tmp_path / "nowhere"):  # a link to a file, and one to nothing yet
        link = tmp_path / "link"
        link.symlink_to(target)
        with pytest.raises(ConfigError) as e:
            generate_dataset("sequence", link, 50, seq_len=8, format=format, force=True)
        assert str(e.value) == (f"{link} is a symbolic link (to {target}); jaxtrain writes only its own files, never "
                                "through a link: remove the link, or choose another file name")
        assert victim.read_text() == "precious" and not (tmp_path / "nowhere").exists()
        link.unlink()
    link.symlink_to(victim)
    assert main(["data", "generate", "sequence", str(link), "--samples", "50", "--format", format, "--force",
                 "--quiet"]) == 2
    _one_line(capsys, f"error: {link} is a symbolic link (to {victim})")
    assert victim.read_text() == "precious" and _partials(tmp_path) == ["d.partial"]


@pytest.mark.parametrize("format", ["hdf5", "npy"])
def test_a_failed_generate_leaves_the_old_out_whole_and_no_partial(tmp_path, monkeypatch, format):
    out = tmp_path / "d"
    generate_dataset("sequence", out, 50, seq_len=8, format=format, seed=1)
    before = sorted(p.name for p in out.iterdir()) if format == "npy" else out.read_bytes()
    real, calls = make_rows, []

    def failing(*args, **kwargs):  # the second block of rows meets a full disk
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(generate_module, "make_rows", failing)
    monkeypatch.setattr(generate_module, "WRITE_ROWS", 8192)  # HDF5: blocks of 8192 rows; npy: shards of 20
    with pytest.raises(DataError) as e:
        generate_dataset("sequence", out, 8200, seq_len=8, format=format, shard_rows=20, force=True)
    assert str(e.value) == (f"cannot write {out}: No space left on device; check that the directory exists, is "
                            "writable and has space")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"] and _seed(out) == 1
    assert (sorted(p.name for p in out.iterdir()) if format == "npy" else out.read_bytes()) == before


@pytest.mark.parametrize("format", ["hdf5", "npy"])
def test_two_generations_of_one_out_never_share_a_temporary(tmp_path, format):
    """A second generation of `out` starts and ends while the first writes (as two processes may):
    each writes its own temporary, and `out` is the one that finished last, whole."""
    out = tmp_path / "d"
    seen = []

    def meanwhile(rows: int) -> None:
        if not seen:
            seen.append(_partials(tmp_path))  # the first generation's own temporary
            generate_dataset("mlp-regression", out, 40, format=format, shard_rows=20, seed=2, force=True)
            assert _seed(out) == 2 and _partials(tmp_path) == seen[0]

    generate_dataset("mlp-regression", out, 40, format=format, shard_rows=20, seed=1, force=True, on_rows=meanwhile)
    assert len(seen[0]) == 1 and seen[0][0].startswith(".d.") and seen[0][0].count("-") >= 2
    assert _seed(out) == 1 and _partials(tmp_path) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    if format == "npy":
        assert sorted(p.name for p in out.iterdir()) == ["attrs.json", "features-00000.npy", "features-00001.npy",
                                                         "targets-00000.npy", "targets-00001.npy"]
    else:
        np.testing.assert_array_equal(read_all(out)["features"], make_rows("mlp-regression", 1, 0, 40)["features"])
