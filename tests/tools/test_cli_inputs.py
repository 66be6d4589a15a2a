"""Inputs checked where they enter: each bad value is one line on stderr and exit code 2, no traceback,
before data are made or anything is written."""

import h5py
import numpy as np
import pytest

from jaxtrain.tools.cli import main

SMALL = ["train", "mlp-regression", "--epochs", "1", "--data.samples", "400", "--data.val-samples", "100",
         "--verbosity", "silent"]


def _one_line_exit_2(argv, capsys, *parts):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in err, err


@pytest.mark.parametrize("flags, parts", [
    (["--model.hidden", "0"], ["model.hidden=0", "must be an integer >= 1"]),
    (["--model.hidden", "-1"], ["model.hidden=-1", "must be an integer >= 1"]),
    (["--model.hidden", "1e12"], ["--model.hidden"]),
    (["--model.hidden", "1000000000000"], ["parameters", "more than this machine's", "lower model.hidden"]),
    (["--data.seed", "-1"], ["data.seed=-1 must be an integer >= 0"]),
    (["--seed", "4294967296"], ["seed=4294967296 must be an integer from 0 to 4294967295"]),
    (["--seed", "-1"], ["seed=-1 must be an integer from 0"]),
    (["--data.features", "1000000000000"], ["1,000,000,000,000 features", "more than this machine's"]),
    (["--data.samples", "1000000000000"], ["data.samples=1,000,000,000,000 rows", "more than this machine's"]),
    (["--data.label-noise", "nan"], ["data.label_noise=nan must be a finite number"]),
    (["--data.input-noise", "nan"], ["data.input_noise=nan must be a finite number"]),
    (["--data.input-noise", "inf"], ["data.input_noise=inf must be a finite number"]),
])
def test_out_of_range_flags_are_one_line(flags, parts, tmp_path, capsys):
    _one_line_exit_2([*SMALL, "--run-dir", str(tmp_path / "run"), *flags], capsys, *parts)
    assert not (tmp_path / "run").exists()


def test_a_tiny_memory_budget_is_honoured_not_replaced_by_the_default():
    """0 means the default; any positive budget is used as given (1e-12 GB is one byte: stream)."""
    import jax

    from jaxtrain import DataConfig, TrainConfig
    from jaxtrain._src.data import default_budget_bytes
    from jaxtrain._src.feeds import budget_bytes

    device = jax.local_devices()[0]
    assert budget_bytes(TrainConfig(data=DataConfig(memory_budget_gb=1e-12)), device) == 1
    assert budget_bytes(TrainConfig(data=DataConfig(memory_budget_gb=0.5)), device) == 2**29
    assert budget_bytes(TrainConfig(), device) == default_budget_bytes(device)


def test_a_run_dir_name_too_long_is_one_line(tmp_path, capsys):
    _one_line_exit_2([*SMALL, "--run-dir", str(tmp_path / ("a" * 300))], capsys,
                     "--run-dir holds a name of 300 bytes", "choose a shorter --run-dir")


def _h5(path, features, targets, **attrs):
    with h5py.File(path, "w") as f:
        f["features"], f["targets"] = features, targets
        f.attrs.update(attrs)
    return str(path)


def test_hdf5_with_one_dimensional_targets_is_one_line(tmp_path, capsys):
    rng = np.random.default_rng(0)
    path = _h5(tmp_path / "d.h5", rng.normal(size=(300, 8)).astype(np.float32), np.zeros(300, np.float32))
    _one_line_exit_2([*SMALL, "--data.path", path, "--run-dir", str(tmp_path / "run")], capsys,
                     "'targets' in", "has shape (300,)", "(samples, 1)")


def test_hdf5_statistics_that_cannot_normalise_are_refused_and_a_zero_std_is_not_a_million(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(300, 8)).astype(np.float32), rng.normal(size=(300, 2)).astype(np.float32)
    bad = _h5(tmp_path / "bad.h5", x, y, feature_mean=x.mean(0), feature_std=np.full(8, np.nan, np.float32))
    _one_line_exit_2([*SMALL, "--data.path", bad, "--run-dir", str(tmp_path / "r1")], capsys,
                     "the feature_std attribute of", "holds NaN/Inf")

    from jaxtrain._src.data import normalize
    out = normalize("x", np.array([5.0, 0.0]), np.array([0.0, 2.0]))({"x": np.array([[5.5, 1.0]], np.float32)})
    np.testing.assert_allclose(out["x"], [[0.5, 0.5]], rtol=1e-5)  # a std of 0 counts as 1, not 1e-6


def _sequences(path, tokens, labels, targets):
    with h5py.File(path, "w") as f:
        f["input_sequences"], f["labels"], f["targets"] = tokens, labels, targets
        f.attrs.update(alphabet_size=20, num_classes=4)
    return str(path)


def _seq_argv(path, task, run_dir):
    return ["train", "hdf5-sequence", "--data.path", path, "--data.val-samples", "50", "--data.task", task,
            "--epochs", "1", "--batch-size", "16", "--eval-batch-size", "50", "--model.channels", "8",
            "--model.embed", "8", "--model.layers", "1", "--verbosity", "silent", "--run-dir", str(run_dir)]


@pytest.mark.parametrize("change, task, parts", [
    (lambda t, lab, y: t.__setitem__((123, 5), 25), "regression",
     ["'input_sequences' in", "holds token 25 at row 123, outside 0..19", "alphabet_size is 20"]),
    (lambda t, lab, y: t.__setitem__((390, 0), -3), "regression", ["holds token -3 at row 390"]),  # in validation
    (lambda t, lab, y: lab.__setitem__(7, 4), "classification",
     ["'labels' in", "holds label 4 at row 7, outside 0..3", "num_classes is 4"]),  # was: "loss became nan"
])
def test_hdf5_sequence_tokens_and_labels_out_of_range_are_named(change, task, parts, tmp_path, capsys):
    rng = np.random.default_rng(0)
    tokens, labels = rng.integers(0, 20, (400, 16)).astype(np.int8), rng.integers(0, 4, 400).astype(np.int32)
    targets = rng.normal(size=(400, 2)).astype(np.float32)
    change(tokens, labels, targets)
    path = _sequences(tmp_path / "s.h5", tokens, labels, targets)
    _one_line_exit_2(_seq_argv(path, task, tmp_path / "run"), capsys, *parts)


def test_hdf5_sequence_with_one_dimensional_targets_is_one_line(tmp_path, capsys):
    rng = np.random.default_rng(0)
    path = _sequences(tmp_path / "s.h5", rng.integers(0, 20, (400, 16)).astype(np.int8), np.zeros(400, np.int32),
                      np.zeros(400, np.float32))
    _one_line_exit_2(_seq_argv(path, "regression", tmp_path / "run"), capsys, "'targets' has rows ()",
                     "(samples, 1)")


@pytest.mark.parametrize("recipe, make", [
    ("hdf5-sequence", lambda path: _sequences(path, np.zeros((300, 16), np.int8), np.zeros(300, np.int32),
                                              np.zeros((300, 2), np.float32))),
    ("mlp-regression", lambda path: main(["data", "generate", "mlp-regression", str(path), "--samples", "300"])),
])
def test_a_file_with_fewer_rows_than_val_samples_names_the_flag(recipe, make, tmp_path, capsys):
    path = tmp_path / "d.h5"
    make(path)
    capsys.readouterr()
    _one_line_exit_2(["train", recipe, "--data.path", str(path), "--run-dir", str(tmp_path / "run")], capsys,
                     f"{path} has 300 rows and --data.val-samples", "holds more than that out for validation, leaving "
                     "none to train on; pass --data.val-samples below 300 (e.g. 30)")
    assert not (tmp_path / "run").exists()
