"""`fit`: determinism, K-independence, evaluation, model state, NaN stop, run files."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import leaves_close, mse, regression_data, silent, small_mlp
from flax import nnx

from jaxtrain import NonFiniteLossError, OptimConfig, TrainConfig, fit
from jaxtrain._src.errors import ConfigError, DataError
from jaxtrain._src.feeds import epoch_permutation
from jaxtrain._src.loop import RunOptions, run


def _fit(train, val=None, seed=0, **overrides):
    config = TrainConfig(**{"epochs": 2, "batch_size": 16, "seed": seed, **overrides})
    return run(small_mlp(seed), mse, train, val, config, verbosity="summary", session=RunOptions(console=silent()))


def test_loss_decreases_and_model_is_updated_in_place():
    everything = regression_data(612)
    data = {k: v[:512] for k, v in everything.items()}
    val = {k: v[512:] for k, v in everything.items()}
    model = small_mlp()
    before = jax.tree.map(np.array, nnx.state(model, nnx.Param))
    config = TrainConfig(epochs=4, batch_size=32, optim=OptimConfig(lr=1e-2))
    result = run(model, mse, data, val, config, verbosity="summary", session=RunOptions(console=silent()))
    losses = [r["train_loss"] for r in result.history]
    assert losses[-1] < 0.5 * losses[0]
    assert result.history[-1]["val_loss"] < result.history[0]["val_loss"]
    assert result.model is model
    assert leaves_close(nnx.state(model, nnx.Param), result.state.params) == 0.0
    assert leaves_close(nnx.state(model, nnx.Param), before) > 1e-3


@pytest.mark.xla_defaults
def test_same_seed_gives_identical_losses():
    data = regression_data(300)
    a, b = _fit(data, seed=3), _fit(data, seed=3)
    assert [r["train_loss"] for r in a.history] == [r["train_loss"] for r in b.history]
    assert leaves_close(a.state.params, b.state.params) == 0.0
    c = _fit(data, seed=4)
    assert c.history[0]["train_loss"] != a.history[0]["train_loss"]


@pytest.mark.xla_defaults
def test_steps_per_call_does_not_change_the_result():
    data = regression_data(400)  # 25 steps per epoch: K=7 leaves a remainder call of 4
    one = _fit(data, steps_per_call=1, epochs=2)
    seven = _fit(data, steps_per_call=7, epochs=2)
    auto = _fit(data, steps_per_call=0, epochs=2)
    assert seven.summary["steps"] == one.summary["steps"] == 50
    assert leaves_close(seven.state.params, one.state.params) <= 1e-6
    assert leaves_close(auto.state.params, one.state.params) <= 1e-6


def test_more_epochs_do_not_compile_more():
    traces = []

    def counting_mse(model, batch, key):
        traces.append(1)
        return mse(model, batch, key)

    counts = []
    for epochs in (1, 3):
        traces.clear()
        config = TrainConfig(epochs=epochs, batch_size=16, steps_per_call=4)  # 12 steps/epoch: no remainder
        run(small_mlp(), counting_mse, regression_data(192), regression_data(20), config, verbosity="summary",
            session=RunOptions(console=silent()))
        counts.append(len(traces))
    assert counts[0] == counts[1] > 0


@pytest.mark.xla_defaults
def test_validation_loss_matches_numpy_with_partial_batch():
    train, val = regression_data(256), regression_data(37, seed=5)
    result = _fit(train, val, eval_batch_size=16)  # 2 full batches and 5 left over
    p = jax.tree.map(np.asarray, result.state.params)
    h = np.maximum(val["x"] @ p["layers"][0]["kernel"] + p["layers"][0]["bias"], 0)
    err = h @ p["layers"][1]["kernel"] + p["layers"][1]["bias"] - val["y"]
    np.testing.assert_allclose(result.summary["final_val_loss"], np.mean(err**2), rtol=1e-5)
    np.testing.assert_allclose(result.summary["final_val_mae"], np.mean(np.abs(err)), rtol=1e-5)


def test_dropped_training_samples_are_reported():
    result = _fit(regression_data(100), batch_size=32, epochs=1)
    assert result.history[0]["samples"] == 96
    assert result.history[0]["samples_dropped"] == 4
    assert result.summary["samples_per_epoch"] == 96


class _BNNet(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(8, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x, rngs=None):
        return self.out(self.dropout(jax.nn.relu(self.bn(self.linear(x))), rngs=rngs))


@pytest.mark.xla_defaults
def test_non_param_state_is_carried_and_eval_uses_eval_mode():
    def loss(model, batch, key):
        err = model(batch["x"], rngs=nnx.Rngs(dropout=key)) - batch["y"]
        return jnp.mean(err**2), {}

    data = regression_data(256)
    model = _BNNet(nnx.Rngs(0))
    result = run(model, loss, data, data, TrainConfig(epochs=1, batch_size=32), verbosity="summary",
                 session=RunOptions(console=silent()))
    mean = np.asarray(model.bn.mean[...])
    assert np.abs(mean).max() > 1e-3  # running statistics were updated through model_state
    # Evaluation runs in eval mode: deterministic dropout, running averages. Recompute it directly.
    model.eval()
    err = model(jnp.asarray(data["x"])) - data["y"]
    np.testing.assert_allclose(result.summary["final_val_loss"], float(jnp.mean(err**2)), rtol=1e-5)


def test_nan_loss_stops_training_and_names_the_step():
    data = regression_data(160)
    bad_row = 77
    data["x"][bad_row, 0] = 1e30  # finite data (NaN is refused where it enters fit) whose loss overflows to inf
    B, seed = 16, 2
    perm = np.asarray(epoch_permutation(jax.random.split(jax.random.key(seed))[1], 1, 160))
    expected_step = int(np.flatnonzero(perm == bad_row)[0]) // B + 1
    with pytest.raises(NonFiniteLossError) as info:
        _fit(data, seed=seed, batch_size=B)
    assert info.value.step == expected_step
    assert f"step {expected_step}" in str(info.value)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ConfigError, match="batch_size=64 is larger than the training set"):
        _fit(regression_data(50), batch_size=64)
    with pytest.raises(DataError, match="different numbers of rows"):
        _fit({"x": np.zeros((10, 8), np.float32), "y": np.zeros((9, 3), np.float32)}, batch_size=2)


def test_run_dir_files(tmp_path):
    config = TrainConfig(epochs=2, batch_size=16, log_every=5, steps_per_call=2)
    result = run(small_mlp(), mse, regression_data(160), regression_data(40, seed=1), config, run_dir=tmp_path,
                 verbosity="summary", session=RunOptions(name="unit", console=silent()))
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("recipe", "epochs", "steps", "final_train_loss", "final_val_loss", "best_val_loss",
                "total_time_s", "compile_time_s", "mean_epoch_time_s", "samples_per_s", "device",
                "jax_version", "final_val_mae"):
        assert key in summary, key
    assert summary["recipe"] == "unit" and summary["epochs"] == 2 and summary["steps"] == 20
    assert summary == json.loads(json.dumps(result.summary))
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines if r["kind"] == "epoch"] == [1, 2]
    assert len([r for r in lines if r["kind"] == "train"]) >= 2
    config_json = json.loads((tmp_path / "config.json").read_text())
    assert config_json["batch_size"] == 16 and config_json["optim"]["name"] == "adam"


def test_steps_per_call_choice_from_two_timed_lengths():
    from jaxtrain._src.choosers import AutoSteps, StepsPerCall

    chooser = StepsPerCall(0, 1000)
    lengths = []
    while chooser.measuring:
        k = chooser.next_length(1000)
        lengths.append(k)
        message = chooser.record(k, 0.002 + k * 0.001)  # 2 ms per call, 1 ms per step
    assert lengths == [16, 16, 16, 128, 128, 128]
    assert chooser.k == 128  # needs 100 (2 ms <= 2% of 100 x 1 ms); 128 is compiled already
    assert "K=128" in message and "2.000 ms per call" in message

    slow_calls = StepsPerCall(0, 5000)
    while slow_calls.measuring:
        slow_calls.record(k := slow_calls.next_length(5000), 0.01 + k * 0.001)
    assert slow_calls.k == 500  # 10 ms <= 2% of 500 x 1 ms
    assert chooser.next_length(30) == 30  # the end of an epoch

    cheap = StepsPerCall(0, 1000)
    while cheap.measuring:
        cheap.record(k := cheap.next_length(1000), 1e-6 + k * 0.001)
    assert cheap.k == 16

    # A length beyond K_b compiles one more program: only when it saves more than a compile.
    for total, compile_s, expected in ((3000, 0.5, 128), (3000, 0.01, 500), (200_000, 0.5, 500)):
        weighed = StepsPerCall(0, 5000, AutoSteps(short_run_calls=0), total_steps=total)
        while weighed.measuring:
            message = weighed.record(k := weighed.next_length(5000), 0.01 + k * 0.001, compile_s)
        # saving at 500 over 128: (total - 432 timed) x 10 ms x (1/128 - 1/500) = 0.15 s for 3000 steps
        assert weighed.k == expected, (total, compile_s, message)
        assert ("less than its compile" in message) == (expected == 128)

    assert StepsPerCall(7, 1000).k == 7 and not StepsPerCall(7, 1000).measuring
    assert StepsPerCall(0, 300).k == 16 and not StepsPerCall(0, 300).measuring  # too short to measure
    assert StepsPerCall(0, 10).k == 10
    # A run shorter than 32 calls of K_b is not measured: K_b (measuring could not repay a compile).
    short = StepsPerCall(0, 512, total_steps=2560)
    assert short.k == 128 and not short.measuring and "too short for measuring" in short.why(128)
    assert StepsPerCall(0, 512, total_steps=32 * 128).measuring
    assert short.checking and short.check(128, 0.5) is None and short.k == 128 and not short.checking
    slow = StepsPerCall(0, 512, total_steps=2560)
    assert "K=16" in slow.check(128, 5.0) and slow.k == 16  # slow steps: K_a keeps progress responsive
    patient = StepsPerCall(0, 512, AutoSteps(slow_call_s=8.0), total_steps=2560)  # a population of 8's call
    assert patient.check(128, 5.0) is None and patient.k == 128


@pytest.mark.xla_defaults
def test_a_short_run_with_slow_calls_runs_k_a_on_k_bs_program():
    from jaxtrain._src.choosers import AutoSteps

    data = regression_data(640)  # 40 steps per epoch of 16, 2 epochs: a short run, K_b = 40
    config = TrainConfig(epochs=2, batch_size=16, steps_per_call=0)
    slow = RunOptions(auto_steps=AutoSteps(slow_call_s=0.0))  # every call counts as slow
    auto = run(small_mlp(), mse, data, None, config, verbosity="silent", session=slow)
    one = fit(small_mlp(), mse, data, None, dataclasses.replace(config, steps_per_call=1), verbosity="silent")
    assert auto.summary["steps_per_call"] == 16
    assert [c["k"] for c in auto.summary["profile"]["compiles"] if c["what"] == "train call"] == [40]  # no second
    assert leaves_close(auto.state.params, one.state.params) <= 1e-6
