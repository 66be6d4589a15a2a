"""An exponential moving average of the weights (`TrainConfig(ema=...)`): the update against a
NumPy reference, its evaluation beside the raw weights, and its place in checkpoints."""

import jax
import numpy as np
import pytest
from conftest import mse, regression_data, small_mlp
from flax import nnx

import jaxtrain
from jaxtrain import TrainConfig
from jaxtrain._src.optim import ema_params

pytestmark = pytest.mark.xla_defaults  # the average against a NumPy reference


def _numpy_params(params):
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(params)]


@pytest.mark.parametrize("on_nan", ["stop", "skip"])
def test_the_average_follows_the_update_rule_step_by_step(on_nan):
    decay = 0.9
    data = regression_data(96)
    model = small_mlp()
    initial = _numpy_params(nnx.state(model, nnx.Param))
    trajectory = []
    hook = jaxtrain.LambdaHook(after_call=lambda run, k, metrics: trajectory.append(_numpy_params(run.state.params)))
    config = TrainConfig(epochs=2, batch_size=16, steps_per_call=1, ema=decay, on_nan=on_nan, eval_every=1)
    result = jaxtrain.fit(model, mse, data, data, config, hooks=[hook], verbosity="silent")
    assert len(trajectory) == 12
    expected = initial
    for params in trajectory:  # the reference: ema <- d * ema + (1 - d) * params after each update
        expected = [decay * e + (1 - decay) * p for e, p in zip(expected, params)]
    got = _numpy_params(ema_params(result.state.opt_state))
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)
    assert not np.allclose(got[0], trajectory[-1][0])  # an average, not the last weights


def test_the_average_is_evaluated_beside_the_raw_weights():
    data, val = regression_data(128), regression_data(64, seed=1)
    config = TrainConfig(epochs=2, batch_size=16, ema=0.5)
    result = jaxtrain.fit(small_mlp(), mse, data, val, config, verbosity="silent")
    record = result.history[-1]
    assert {"val_loss", "val_mae", "val_ema_loss", "val_ema_mae"} <= set(record)
    assert result.summary["final_val_ema_loss"] == record["val_ema_loss"]
    # Independently: the average's weights in a model of their own, its loss by NumPy.
    model = small_mlp()
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    averaged = nnx.merge(graphdef, ema_params(result.state.opt_state), rest)
    err = np.asarray(averaged(val["x"]), np.float64) - val["y"]
    assert record["val_ema_loss"] == pytest.approx(float(np.mean(err**2)), rel=1e-5)
    assert record["val_ema_loss"] != record["val_loss"]


def test_ema_is_checked():
    for bad in (1.0, -0.1, 2):
        with pytest.raises(jaxtrain.ConfigError, match="must be 0 \\(off\\) or a decay in \\(0, 1\\)"):
            TrainConfig(ema=bad)


def test_predict_and_export_use_the_average_when_asked(tmp_path, capsys):
    import json

    from jaxtrain.tools import runs
    from jaxtrain.tools.cli import main
    from jaxtrain.tools.recipes.mlp_regression import make_data

    common = ["train", "mlp-regression", "--data.samples", "1200", "--data.val-samples", "200", "--epochs", "2",
              "--model.hidden", "32", "--quiet"]
    assert main([*common, "--ema", "0.9", "--run-dir", str(tmp_path / "ema")]) == 0
    assert main([*common, "--run-dir", str(tmp_path / "plain")]) == 0
    _, val = make_data(runs.load_config(tmp_path / "ema")[1].data)
    np.save(tmp_path / "x.npy", val["x"])
    summary = json.loads((tmp_path / "ema" / "summary.json").read_text())
    for weights, key in (("ema", "final_val_ema_loss"), ("raw", "final_val_loss")):
        out = tmp_path / f"{weights}.npy"
        assert main(["predict", str(tmp_path / "ema"), "--input", str(tmp_path / "x.npy"), "--output", str(out),
                     "--checkpoint", "latest", "--weights", weights]) == 0
        mse = float(np.mean((np.load(out).astype(np.float64) - val["y"]) ** 2))
        assert mse == pytest.approx(summary[key], rel=1e-6)  # the run's own evaluation of those weights
    assert summary["final_val_ema_loss"] != summary["final_val_loss"]
    assert main(["export", str(tmp_path / "ema"), "--out", str(tmp_path / "art"), "--weights", "ema"]) == 0
    assert json.loads((tmp_path / "art" / "signature.json").read_text())["weights"] == "ema"
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "plain"), "--input", str(tmp_path / "x.npy"), "--output",
                 str(tmp_path / "p.npy"), "--weights", "ema"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no average of the weights: the run was trained without --ema" in err[0]
