"""Misuse of `fit` is one clear line (ConfigError or DataError) before anything is compiled or written."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mse, regression_data, silent, small_mlp
from flax import nnx

from jaxtrain import TrainConfig
from jaxtrain._src.checks import abstract_batch, check_finite_arrays, check_fit_inputs
from jaxtrain._src.data import ArraySource
from jaxtrain._src.errors import ConfigError, DataError
from jaxtrain._src.loop import RunOptions, run

B = 16


def _err(model, batch):
    return model(batch["x"]) - batch["y"]  # (B, 3)


def per_sample_loss(model, batch, key):
    return jnp.mean(_err(model, batch) ** 2, axis=-1), {}  # (B,): not reduced


def loss_only(model, batch, key):
    return jnp.mean(_err(model, batch) ** 2)


def list_metrics(model, batch, key):
    return jnp.mean(_err(model, batch) ** 2), [jnp.mean(jnp.abs(_err(model, batch)))]


def per_sample_metric(model, batch, key):
    err = _err(model, batch)
    return jnp.mean(err**2), {"abs": jnp.mean(jnp.abs(err), axis=-1)}  # (B,)


def integer_loss(model, batch, key):
    return jnp.sum(jnp.argmax(model(batch["x"]), -1)), {}


def tuple_loss(model, batch, key):
    return mse(model, {"x": batch["x"], "y": batch["y"]}, key)  # but the batch is a tuple


def _fit(loss_fn=mse, train=None, val=None, **kwargs):
    train = regression_data(64) if train is None else train
    return run(small_mlp(), loss_fn, train, val, TrainConfig(epochs=1, batch_size=B), verbosity="summary", **kwargs,
               session=RunOptions(console=silent()))


def _one_line(excinfo, *parts):
    message = str(excinfo.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, message


data = regression_data(64)


@pytest.mark.parametrize("loss_fn, parts", [
    (per_sample_loss, ["loss a scalar", "shape (16,)", "jnp.mean"]),
    (loss_only, ["must return (loss, metrics)", "one array of shape ()", "(loss, {})"]),
    (list_metrics, ["dict of scalar batch means", "metrics are a list"]),
    (per_sample_metric, ["metric 'abs' has shape (16,)", "one value per sample", "scalar batch mean"]),
    (integer_loss, ["dtype int32", "float scalar"]),
])
def test_loss_fn_that_returns_the_wrong_thing_is_a_config_error(loss_fn, parts, tmp_path):
    with pytest.raises(ConfigError) as excinfo:
        _fit(loss_fn, val=data, run_dir=tmp_path / "run")
    _one_line(excinfo, *parts)
    assert not (tmp_path / "run").exists()  # raised before anything was written


@pytest.mark.parametrize("val, parts", [
    ({"a": data["x"], "b": data["y"]}, ["validation data have keys ['a', 'b']", "training data have ['x', 'y']"]),
    ({"x": data["x"][:, :5], "y": data["y"]}, ["'x' have rows of shape (5,)", "training data 'x' have (8,)"]),
    ({"x": data["x"], "y": data["y"].astype(np.int32)}, ["'y' are int32 (integer)", "are float32 (float)"]),
    ((data["x"], data["y"]), ["validation data have arrays ['0', '1']", "same structure"]),
])
def test_validation_data_unlike_the_training_data_is_a_data_error(val, parts):
    with pytest.raises(DataError) as excinfo:
        _fit(val=val)
    _one_line(excinfo, *parts)


@pytest.mark.parametrize("loss_fn, train, parts", [
    (mse, {"inputs": data["x"], "y": data["y"]}, ["loss_fn asked a training batch for key 'x'",
                                                   "its keys are ['inputs', 'y']"]),
    (mse, {"x": data["x"][:, :5], "y": data["y"]}, ["x: float32 (16, 5)", "dot_general", "got (5,) and (8,)"]),
    (tuple_loss, (data["x"], data["y"]), ["indexes a training batch by name", "a tuple of 2 arrays"]),
])
def test_training_batch_the_loss_cannot_take_is_a_data_error(loss_fn, train, parts):
    with pytest.raises(DataError) as excinfo:
        _fit(loss_fn, train=train)
    _one_line(excinfo, *parts)


def test_a_failing_preprocess_is_named():
    def preprocess(batch):  # statistics of the wrong width
        return {**batch, "x": (batch["x"] - jnp.zeros(5)) / jnp.ones(5)}

    with pytest.raises(DataError) as excinfo:
        _fit(preprocess=preprocess)
    _one_line(excinfo, "preprocess failed on a training batch of x: float32 (16, 8)", "shapes")


class _BNNet(nnx.Module):
    def __init__(self, vocab: int, rngs: nnx.Rngs):
        self.linear = nnx.Linear(vocab, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x, rngs=None):
        return self.out(self.dropout(jax.nn.relu(self.bn(self.linear(x))), rngs=rngs))


def _host(tree):
    def host(x):
        return np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)

    return jax.tree.map(host, tree)


def test_legitimate_uses_pass_and_leave_the_model_alone():
    """Integer inputs one-hot encoded by preprocess, augment, tuple batches, a row source, BatchNorm
    and Dropout state, bool metrics: all pass, and the trace does not touch the model's state."""
    rng = np.random.default_rng(0)
    tokens, y = rng.integers(0, 5, size=(40,), dtype=np.uint8), rng.normal(size=(40, 3)).astype(np.float32)

    def preprocess(batch):
        tokens, y = batch
        return jax.nn.one_hot(tokens, 5), y  # (B,) uint8 -> (B, 5) float32

    def augment(batch, key):
        x, y = batch
        return x + 0.01 * jax.random.normal(key, x.shape), y

    def loss(model, batch, key):
        x, y = batch
        err = model(x, rngs=nnx.Rngs(dropout=key)) - y
        return jnp.mean(err**2), {"small": jnp.all(jnp.abs(err) < 1), "n": 1.0}

    model = _BNNet(5, nnx.Rngs(0))
    before = _host(nnx.state(model))
    check_fit_inputs(model, loss, (tokens, y), (tokens[:7].astype(np.int64), y[:7]), B, preprocess, augment)
    assert jax.tree.all(jax.tree.map(np.array_equal, _host(nnx.state(model)), before))  # RNG counts too

    source = ArraySource({"x": data["x"], "y": data["y"]})
    assert abstract_batch(source, B) == {"x": jax.ShapeDtypeStruct((B, 8), np.float32),
                                         "y": jax.ShapeDtypeStruct((B, 3), np.float32)}
    check_fit_inputs(small_mlp(), mse, source, {k: v.astype(np.float64) for k, v in data.items()}, B)


def _with_nan(row: int, key: str = "x", bad: float = np.nan) -> dict:
    out = {k: v.copy() for k, v in data.items()}
    out[key][row, 1] = bad
    return out


@pytest.mark.parametrize("train, val, parts", [
    (None, _with_nan(37), ["val_data['x'] contains NaN/Inf", "first bad row 37"]),  # was: val loss nan every epoch
    (_with_nan(5, "y", np.inf), None, ["train_data['y'] contains NaN/Inf", "first bad row 5"]),
    ({k: jnp.asarray(v) for k, v in _with_nan(9).items()}, None, ["train_data['x']", "first bad row 9"]),
])
def test_nan_in_array_data_is_named_where_it_enters_fit(train, val, parts, tmp_path):
    with pytest.raises(DataError) as excinfo:
        _fit(train=train, val=val, run_dir=tmp_path / "run")
    _one_line(excinfo, *parts)
    assert not (tmp_path / "run").exists()


def test_nan_in_a_large_array_is_found_by_sampling():
    x = np.ones((10_000, 3), np.float32)
    x[-1, 0] = np.inf  # the last block is always among the sampled ones
    with pytest.raises(DataError, match=r"train_data\['x'\] contains NaN/Inf, first bad row 9,999 \(rows sampled"):
        check_finite_arrays({"x": x}, "train_data", max_elements=300)
    check_finite_arrays({"x": np.arange(5), "y": x[:10]}, "train_data")  # integers and clean floats pass


def test_a_list_of_row_dicts_is_one_short_line():
    rows = [{"x": data["x"][i], "y": data["y"][i]} for i in range(64)]
    with pytest.raises(DataError) as excinfo:
        _fit(train=rows)
    _one_line(excinfo, "train_data is a list of 64 dicts, one per sample", "np.stack")
    assert len(str(excinfo.value)) < 300


class _EvalOnlyBug(nnx.Module):
    """A model whose evaluation mode (its own `use_running_average`, which `Module.eval()` sets) takes
    a path that fails: the training pass alone would not find it."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.dense = nnx.Linear(8, 3, rngs=rngs)
        self.shift = nnx.Variable(jnp.zeros(4))
        self.use_running_average = False

    def __call__(self, x):
        return self.dense(x - self.shift[...] if self.use_running_average else x)  # (B, 8) - (4,): fails


def test_a_model_that_fails_only_in_evaluation_mode_is_refused_before_training():
    from jaxtrain import LambdaHook

    calls = []
    data = regression_data(64)
    with pytest.raises(DataError, match=r"loss_fn failed on a validation batch of x: float32 \(16, 8\), "
                                        r"y: float32 \(16, 3\) with the model in evaluation mode, as validation runs "
                                        r"it: .*shapes"):
        run(_EvalOnlyBug(rngs=nnx.Rngs(0)), mse, data, data, TrainConfig(epochs=1, batch_size=16),
            hooks=[LambdaHook(after_call=lambda run, *rest: calls.append(run.step))], verbosity="silent",
            session=RunOptions(console=silent()))
    assert calls == []  # refused before the first training call
    # Without validation data nothing runs it in evaluation mode: it trains.
    run(_EvalOnlyBug(rngs=nnx.Rngs(0)), mse, data, None, TrainConfig(epochs=1, batch_size=16), verbosity="silent",
        session=RunOptions(console=silent()))


def test_a_loss_fn_that_cannot_take_model_batch_and_key_is_one_line():
    data = regression_data(32)
    for loss_fn, takes in ((lambda model, batch: (jnp.zeros(()), {}), "(model, batch)"),
                           (lambda model: (jnp.zeros(()), {}), "(model)")):
        with pytest.raises(ConfigError, match=rf"loss_fn must take \(model, batch, key\) and return \(loss, metrics\); "
                                              rf"it takes {re.escape(takes)}: add the arguments it lacks"):
            run(small_mlp(), loss_fn, data, None, TrainConfig(epochs=1, batch_size=16), verbosity="silent",
                session=RunOptions(console=silent()))
    keyed = lambda model, batch, key=None, *rest: mse(model, batch, key)  # noqa: E731 - extra optional ones are fine
    run(small_mlp(), keyed, data, None, TrainConfig(epochs=1, batch_size=16), verbosity="silent",
        session=RunOptions(console=silent()))
