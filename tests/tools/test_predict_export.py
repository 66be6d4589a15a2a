"""Taking a trained model out: `jaxtrain predict`, `jaxtrain export` and the safetensors weights,
on runs of every recipe model that has a forward (tiny configurations, a few steps each)."""

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxtrain._src.data.datasets import load_mnist, load_tinyshakespeare
from jaxtrain._src.weights import flat_weights, load_weights, save_weights
from jaxtrain.tools import runs
from jaxtrain.tools.cli import main
from jaxtrain.tools.recipes.mlp_regression import make_data

HAVE_DATA = bool(os.environ.get("JAXTRAIN_DATA_DIR"))


def _train(tmp: Path, name: str, args: list[str]) -> Path:
    run_dir = tmp / name
    assert main(["train", *args, "--quiet", "--run-dir", str(run_dir)]) == 0
    return run_dir


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """A finished run of each recipe model with a forward (the data-dependent ones when the offline
    datasets are here), and the raw inputs to feed each: {name: run_dir}, inputs in run_dir/raw.npy."""
    tmp = tmp_path_factory.mktemp("runs")
    out = {}
    mlp = _train(tmp, "mlp", ["mlp-regression", "--data.samples", "1500", "--data.val-samples", "300",
                              "--epochs", "2", "--batch-size", "64", "--model.hidden", "32", "32"])
    _, val = make_data(runs.load_config(mlp)[1].data)
    np.save(mlp / "raw.npy", val["x"])
    np.save(mlp / "target.npy", val["y"])
    out["mlp"] = mlp
    path = tmp / "seq.h5"
    assert main(["data", "generate", "sequence", str(path), "--samples", "600", "--seq-len", "16", "--quiet"]) == 0
    seq = _train(tmp, "seq", ["hdf5-sequence", "--data.path", str(path), "--data.val-samples", "100", "--epochs", "1",
                              "--batch-size", "50", "--data.task", "classification"])
    with h5py.File(path) as f:
        np.save(seq / "raw.npy", f["input_sequences"][-37:])
    out["seq"] = seq
    if HAVE_DATA:
        cnn = _train(tmp, "cnn", ["mnist-cnn", "--data.limit", "256", "--epochs", "1", "--batch-size", "64"])
        np.save(cnn / "raw.npy", load_mnist("mnist")[1]["image"][:45])
        out["cnn"] = cnn
        gpt = _train(tmp, "gpt", ["char-gpt", "--preset", "seed", "--epochs", "1", "--steps-per-epoch", "4",
                                  "--data.limit", "20000", "--data.eval-batches", "2"])
        ids = load_tinyshakespeare()[1]
        block = runs.load_config(gpt)[1].model.block_size
        np.save(gpt / "raw.npy", np.stack([ids[i: i + block] for i in range(0, 33 * 7, 7)]).astype(np.int32))
        out["gpt"] = gpt
    return out


def _reference(name: str, run_dir: Path, raw: np.ndarray) -> np.ndarray:
    """The model's outputs computed by hand, with the preprocessing written out independently."""
    model = runs.load(run_dir)
    model.eval()
    if name == "mlp":
        _, config = runs.load_config(run_dir)
        train, _ = make_data(config.data)
        mean, std = train["x"].mean(0), train["x"].std(0)
        return np.asarray(model(jnp.asarray((raw - mean) / (std + 1e-6))))
    if name == "cnn":
        return np.asarray(model(jnp.asarray(((raw / 255.0 - 0.1307) / 0.3081)[..., None], jnp.float32)))
    return np.asarray(model(jnp.asarray(raw)))


def test_predict_reproduces_the_runs_validation_loss_from_raw_inputs(trained, tmp_path, capsys):
    run = trained["mlp"]
    for suffix in (".npy", ".npz", ".h5"):
        out = tmp_path / f"y{suffix}"
        assert main(["predict", str(run), "--input", str(run / "raw.npy"), "--output", str(out),
                     "--batch-size", "128"]) == 0  # 300 rows: the last batch of 44 padded
        assert "(300, 64) from 300 rows" in capsys.readouterr().out
        if suffix == ".npy":
            y = np.load(out)
        elif suffix == ".npz":
            y = np.load(out)["outputs"]
        else:
            with h5py.File(out) as f:
                y = f["outputs"][...]
        mse = float(np.mean((y.astype(np.float64) - np.load(run / "target.npy")) ** 2))
        summary = json.loads((run / "summary.json").read_text())
        assert mse == pytest.approx(summary["best_val_loss"], rel=1e-6, abs=0)
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]


def test_a_recipe_runs_predictions_from_python_take_its_preprocessing(trained):
    import jaxtrain

    run = trained["mlp"]
    raw = np.load(run / "raw.npy")
    y = jaxtrain.predict(runs.load(run), raw, preprocess=runs.preprocess_of(run))
    np.testing.assert_allclose(y, _reference("mlp", run, raw), rtol=1e-5, atol=1e-6)
    assert runs.preprocess_of(trained["seq"]) is None  # its model takes the raw token rows as they are


def test_predict_takes_inputs_from_hdf5_and_npz_named_as_the_model_input(trained, tmp_path):
    run = trained["mlp"]
    raw = np.load(run / "raw.npy")
    with h5py.File(tmp_path / "in.h5", "w") as f:
        f["x"], f["y"] = raw, np.zeros((len(raw), 2))
    np.savez(tmp_path / "in.npz", other=np.zeros(3), x=raw)
    results = []
    for source in ("in.h5", "in.npz"):
        assert main(["predict", str(run), "--input", str(tmp_path / source), "--output",
                     str(tmp_path / f"{source}.npy")]) == 0
        results.append(np.load(tmp_path / f"{source}.npy"))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_allclose(results[0], _reference("mlp", run, raw), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Each run exported by `jaxtrain export`, and every artifact served by one fresh process where
    flax, optax and jaxtrain cannot be imported (the artifact needs JAX alone; one process for all
    models, not one each): {name: (folder with artifact/, served.npy, three.npy), export's output}."""
    tmp = tmp_path_factory.mktemp("exports")
    out, code = {}, [
        "import sys\n"
        "for m in ('flax', 'optax', 'jaxtrain', 'orbax'): sys.modules[m] = None\n"
        "import numpy as np\nfrom jax import export\n"
    ]
    for name, run in trained.items():
        folder = tmp / name
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            assert main(["export", str(run), "--out", str(folder / "artifact")]) == 0
        out[name] = folder, printed.getvalue()
        code.append(
            f"f = export.deserialize(open({str(folder / 'artifact' / 'model.jax_export')!r}, 'rb').read())\n"
            f"x = np.load({str(run / 'raw.npy')!r})\n"
            f"np.save({str(folder / 'served.npy')!r}, np.asarray(f.call(x)))\n"
            f"np.save({str(folder / 'three.npy')!r}, np.asarray(f.call(x[:3])))\n"
        )
    env = {"PATH": os.environ.get("PATH", ""), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-I", "-c", "".join(code)], capture_output=True, text=True, env=env,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.parametrize("name", ["mlp", "seq", "cnn", "gpt"])
def test_predict_and_the_exported_artifact_agree_with_the_model(trained, exported, name, tmp_path):
    if name not in trained:
        pytest.skip("needs the offline datasets (JAXTRAIN_DATA_DIR)")
    run = trained[name]
    raw = np.load(run / "raw.npy")
    assert main(["predict", str(run), "--input", str(run / "raw.npy"), "--output", str(tmp_path / "y.npy"),
                 "--batch-size", "16"]) == 0
    predicted = np.load(tmp_path / "y.npy")
    np.testing.assert_allclose(predicted, _reference(name, run, raw), rtol=1e-5, atol=1e-5)
    folder, printed = exported[name]
    assert "model.jax_export" in printed
    signature = json.loads((folder / "artifact" / "signature.json").read_text())
    assert signature["inputs"][0]["shape"] == ["batch", *raw.shape[1:]]
    assert signature["outputs"][0]["shape"][0] == "batch"
    served = np.load(folder / "served.npy")
    np.testing.assert_allclose(served, predicted, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.load(folder / "three.npy"), predicted[:3], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["mlp", "seq", "cnn", "gpt"])
def test_weights_round_trip_exactly_and_other_tools_read_them(trained, name, tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    if name not in trained:
        pytest.skip("needs the offline datasets (JAXTRAIN_DATA_DIR)")
    model = runs.load(trained[name])
    path = save_weights(model, tmp_path / "w.safetensors")
    recipe, config = runs.load_config(trained[name])
    info = json.loads((trained[name] / "model.json").read_text())
    fresh = recipe.model(config, info)  # freshly initialised: other weights until loaded
    ours, _ = flat_weights(model)
    assert any(not np.array_equal(ours[k], v) for k, v in flat_weights(fresh)[0].items())
    load_weights(fresh, path)
    theirs = safetensors.load_file(str(path))  # the reference reader
    assert sorted(theirs) == sorted(ours)
    for k, v in flat_weights(fresh)[0].items():
        np.testing.assert_array_equal(v, ours[k])
        np.testing.assert_array_equal(theirs[k], ours[k])


def test_load_weights_refuses_a_file_of_another_model_in_one_line(tmp_path):
    from jaxtrain import ConfigError
    from jaxtrain.models import MLP

    save_weights(MLP((4, 8, 2), rngs=nnx.Rngs(0)), tmp_path / "w.safetensors")
    with pytest.raises(ConfigError) as e:
        load_weights(MLP((4, 16, 2), rngs=nnx.Rngs(0)), tmp_path / "w.safetensors")
    assert "layers.0.kernel is (4, 8) in the file, (4, 16) in the model" in str(e.value)
    assert "\n" not in str(e.value)
    (tmp_path / "bad.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{nope")
    with pytest.raises(ConfigError, match="is not a safetensors file"):
        load_weights(MLP((4, 8, 2), rngs=nnx.Rngs(0)), tmp_path / "bad.safetensors")


def test_predict_and_export_say_what_is_wrong_in_one_line(trained, tmp_path, capsys):
    run = trained["mlp"]
    np.save(tmp_path / "wide.npy", np.zeros((5, 7), np.float32))
    np.savez(tmp_path / "two.npz", a=np.zeros((5, 128)), b=np.zeros((5, 128)))
    cases = [
        (["predict", str(run), "--input", str(tmp_path / "wide.npy"), "--output", str(tmp_path / "o.npy")],
         "have shape (7,); the model takes rows of shape (128,)"),
        (["predict", str(run), "--input", str(tmp_path / "two.npz"), "--output", str(tmp_path / "o.npy")],
         "holds the arrays a, b; name the model's input 'x'"),
        (["predict", str(run), "--input", str(tmp_path / "none.npy"), "--output", str(tmp_path / "o.npy")],
         "does not exist"),
        (["predict", str(run), "--input", str(run / "raw.npy"), "--output", str(tmp_path / "o.csv")],
         "must end in .npy, .npz, .h5, .hdf5"),
        (["predict", str(run), "--input", str(run / "raw.npy")], "needs --input FILE"),
        (["predict", str(tmp_path), "--input", str(run / "raw.npy"), "--output", str(tmp_path / "o.npy")],
         "is not a jaxtrain run directory"),
        (["export", str(run)], "needs --out DIR"),
    ]
    for args, message in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (args, err)
    assert not (tmp_path / "o.npy").exists()


def test_library_predict_pads_the_last_batch_and_runs_in_eval_mode():
    import jaxtrain
    from jaxtrain._src.predict import Forward, predict_batches

    class Dropped(nnx.Module):
        def __init__(self):
            self.linear = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
            self.drop = nnx.Dropout(0.5, rngs=nnx.Rngs(1))

        def __call__(self, x):
            return self.drop(self.linear(x))

    model = Dropped()
    x = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
    forward = Forward(model, inputs="x")
    parts = list(predict_batches(forward, x, batch_size=4))
    assert [len(p) for p in parts] == [4, 4, 2] and forward.compiles() == 1  # padded, not recompiled
    expected = np.asarray(x @ np.asarray(model.linear.kernel[...]) + np.asarray(model.linear.bias[...]))
    np.testing.assert_allclose(np.concatenate(parts), expected, rtol=1e-6, atol=1e-6)  # no dropout
    y = jaxtrain.predict(model, {"x": x}, batch_size=3, preprocess=jaxtrain.data.normalize("x", 1.0, 2.0))
    np.testing.assert_allclose(y, ((x - 1.0) / (2.0 + 1e-6)) @ np.asarray(model.linear.kernel[...])
                               + np.asarray(model.linear.bias[...]), rtol=1e-5, atol=1e-6)
    with pytest.raises(jaxtrain.ConfigError, match="pass inputs= the one the model"):
        jaxtrain.predict(model, {"x": x, "y": x})


@pytest.mark.slow
@pytest.mark.devices(4)
def test_a_run_trained_sharded_on_4_devices_predicts_on_its_mesh_and_exports(tmp_path, capsys):
    import jax

    run = _train(tmp_path, "fsdp", ["mlp-regression", "--data.samples", "1000", "--data.val-samples", "200",
                                    "--epochs", "1", "--batch-size", "64", "--model.hidden", "256", "--mesh",
                                    "data=2,fsdp=2"])
    _, val = make_data(runs.load_config(run)[1].data)
    np.save(tmp_path / "raw.npy", val["x"][:50])
    forward, _, _ = runs.run_forward(run)
    assert forward.layout.num_devices == 4
    assert any("fsdp" in leaf.sharding.spec for leaf in jax.tree.leaves(forward.variables))  # split as trained
    assert main(["predict", str(run), "--input", str(tmp_path / "raw.npy"), "--output", str(tmp_path / "y.npy"),
                 "--batch-size", "10"]) == 0  # rounded up to 12: 3 rows per device, the last batch padded
    predicted = np.load(tmp_path / "y.npy")
    assert predicted.shape == (50, 64)
    np.testing.assert_allclose(predicted, _reference("mlp", run, val["x"][:50]), rtol=1e-5, atol=1e-5)
    assert main(["export", str(run), "--out", str(tmp_path / "artifact")]) == 0
    exported = jax.export.deserialize((tmp_path / "artifact" / "model.jax_export").read_bytes())
    np.testing.assert_allclose(np.asarray(exported.call(val["x"][:50])), predicted, rtol=1e-6, atol=1e-6)
