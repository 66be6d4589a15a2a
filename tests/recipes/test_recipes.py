"""The mlp-regression recipe: deterministic data, and training that learns."""

import dataclasses
import json
import os

import h5py
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtrain._src.data.datasets import load_mnist
from jaxtrain.tools import runs
from jaxtrain.tools.recipes import RECIPES
from jaxtrain.tools.recipes.mlp_regression import RegressionDataConfig, make_data


def test_data_is_deterministic_from_its_seed_and_split():
    config = RegressionDataConfig(samples=1000, val_samples=100)
    (tr1, va1), (tr2, _) = make_data(config), make_data(config)
    np.testing.assert_array_equal(tr1["x"], tr2["x"])
    assert tr1["x"].shape == (900, 128) and tr1["y"].shape == (900, 64) and va1["x"].shape == (100, 128)
    assert tr1["x"].dtype == np.float32
    other, _ = make_data(dataclasses.replace(config, seed=7))
    assert not np.array_equal(other["x"], tr1["x"])


def test_recipe_loss_decreases(tmp_path):
    recipe = RECIPES["mlp-regression"]
    config = dataclasses.replace(
        recipe.config, epochs=3, quiet=True, data=RegressionDataConfig(samples=4000, val_samples=500)
    )
    result = runs.train(recipe, config, tmp_path)
    losses = [r["train_loss"] for r in result.history]
    assert losses[0] > losses[1] > losses[2]
    assert result.history[-1]["val_loss"] < result.history[0]["val_loss"]
    # The teacher's targets have variance ~0.4 and label noise 0.1^2: learning beats predicting zero.
    _, val = make_data(config.data)
    assert result.summary["final_val_loss"] < 0.5 * float(np.mean(val["y"] ** 2))


@pytest.mark.skipif(not os.environ.get("JAXTRAIN_DATA_DIR"), reason="needs the offline MNIST files")
def test_mnist_cnn_smoke(tmp_path):
    recipe = RECIPES["mnist-cnn"]
    data = dataclasses.replace(recipe.config.data, limit=768)
    config = dataclasses.replace(recipe.config, epochs=1, batch_size=64, quiet=True, data=data)
    result = runs.train(recipe, config, tmp_path)
    assert result.summary["steps"] == 12
    assert result.history[0]["val_loss"] < 2.3  # below chance level (ln 10) after 12 steps
    # Independent recount: the trained model on the 768 // 6 = 128 held-out test images, standardised by hand.
    _, test = load_mnist("mnist")
    images = (test["image"][:128].astype(np.float32) / 255.0 - 0.1307) / 0.3081  # (128, 28, 28)
    logits = np.asarray(result.model(jnp.asarray(images[..., None])))  # (128, 10)
    correct = int(np.sum(np.argmax(logits, -1) == test["label"][:128]))
    # Within one image: a near-tie between two logits may break differently in the jitted evaluation.
    assert abs(result.summary["final_val_accuracy"] * 128 - correct) <= 1
    assert correct > 2 * 128 // 10  # well above chance (10%)


@pytest.mark.skipif(not os.environ.get("JAXTRAIN_DATA_DIR"), reason="needs the offline Tiny Shakespeare file")
def test_char_gpt_smoke_and_sample(tmp_path, capsys):
    from jaxtrain.tools.cli import main

    run_dir = tmp_path / "gpt"
    args = ["train", "char-gpt", "--preset", "seed", "--epochs", "2", "--steps-per-epoch", "10",
            "--data.limit", "20000", "--data.eval-batches", "4", "--quiet", "--run-dir", str(run_dir)]
    assert main(args) == 0
    history = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
               if r["kind"] == "epoch"]
    assert [r["step"] for r in history] == [10, 20]
    assert history[0]["val_loss"] < 4.2  # ln(65) = 4.17 at chance; the seed preset learns slowly
    config = json.loads((run_dir / "config.json").read_text())
    assert config["preset"] == "seed" and config["model"]["n_layer"] == 1 and config["batch_size"] == 16
    capsys.readouterr()
    sample = ["sample", str(run_dir), "--prompt", "ROMEO:", "--length", "40", "--seed", "3"]
    assert main(sample) == 0
    first = capsys.readouterr().out
    assert main(sample) == 0
    assert capsys.readouterr().out == first and first.startswith("ROMEO:") and len(first) == len("ROMEO:") + 40 + 1


def test_mlp_regression_from_an_hdf5_file_streams_or_holds_it(tmp_path, capsys):
    from jaxtrain.tools.cli import main

    path = tmp_path / "reg.h5"
    assert main(["data", "generate", "mlp-regression", str(path), "--samples", "3000", "--quiet"]) == 0
    # K = 13 divides the epoch (39 steps): one compiled call length per run.
    common = ["train", "mlp-regression", "--data.path", str(path), "--data.val-samples", "500", "--epochs", "2",
              "--batch-size", "64", "--steps-per-call", "13", "--verbosity", "summary"]
    assert main([*common, "--run-dir", str(tmp_path / "stream"), "--data.placement", "stream"]) == 0
    out = capsys.readouterr().out
    assert "2,500 train / 500 val samples; training data streamed" in out and "Input Wait:" in out
    assert main([*common, "--run-dir", str(tmp_path / "auto")]) == 0
    assert "on the device (" in capsys.readouterr().out
    with h5py.File(path) as f:
        val_y = f["targets"][-500:]  # (500, 64): the validation rows
    for run in ("stream", "auto"):
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["steps"] == 2 * (2500 // 64)
        # Learning: well below predicting zero on the file's last 500 rows (mean y^2 ~0.41; measured ~0.12).
        assert summary["final_val_loss"] < 0.5 * float(np.mean(val_y.astype(np.float64) ** 2))
    assert main(["eval", str(tmp_path / "stream")]) == 0  # validation rows come back from the file

    # The same rows as .npy shards (--data.npy): on the device, the same result as from the file.
    shards = tmp_path / "shards"
    assert main(["data", "generate", "mlp-regression", str(shards), "--samples", "3000", "--format", "npy",
                 "--shard-rows", "700", "--quiet"]) == 0
    assert len(list(shards.glob("features-*.npy"))) == 5 and (shards / "attrs.json").is_file()
    common[2:4] = ["--data.npy", str(shards)]
    assert main([*common, "--run-dir", str(tmp_path / "npy")]) == 0
    from_file, from_shards = (json.loads((tmp_path / r / "summary.json").read_text()) for r in ("auto", "npy"))
    assert from_shards["final_val_loss"] == from_file["final_val_loss"]
    assert main(["eval", str(tmp_path / "npy")]) == 0


def test_hdf5_sequence_recipe_learns_from_a_streamed_file(tmp_path, capsys):
    from jaxtrain.tools.cli import main

    path = tmp_path / "seq.h5"
    assert main(["data", "generate", "sequence", str(path), "--samples", "2500", "--seq-len", "32", "--quiet"]) == 0
    run = tmp_path / "run"
    assert main(["train", "hdf5-sequence", "--data.path", str(path), "--data.val-samples", "500",
                 "--data.task", "classification", "--epochs", "2", "--steps-per-call", "31",  # the epoch: one call
                 "--quiet", "--run-dir", str(run)]) == 0
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in history if r["kind"] == "epoch"]
    assert epochs[-1]["val_accuracy"] > 0.4  # 4 balanced classes: chance is 0.25
    import h5py

    assert not h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE)  # training closed the file it streamed from
    assert main(["eval", str(run)]) == 0
    assert not h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE)  # and so did evaluation
    assert main(["train", "hdf5-sequence", "--quiet"]) == 2
    assert "needs --data.path FILE.h5" in capsys.readouterr().err
    assert main(["train", "mlp-regression", "--data.path", str(tmp_path / "missing.h5"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.h5" in err[0]
    (tmp_path / "empty").mkdir()
    assert main(["train", "mlp-regression", "--data.npy", str(tmp_path / "empty"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no .npy or .npz files" in err[0]
