"""Inputs to `fit` from Python that JAX would refuse deep inside a trace, or that would train wrongly,
are checked by their kind before anything is compiled or written (issue 63's probe): parameters that are
not floats or absent, strings and objects among the arrays, bools and NumPy scalars as config numbers,
and columns given as Python lists. Inputs to `predict` so large that the outputs overflow get a note."""

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mse, regression_data, small_mlp
from flax import nnx

import jaxtrain
from jaxtrain import ConfigError, DataError, OptimConfig, TrainConfig

DATA = regression_data(64)
CONFIG = TrainConfig(epochs=1, batch_size=16, steps_per_call=2, tensorboard=False)


class _IntWeights(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.ones((8, 3), jnp.int32))

    def __call__(self, x):
        return x @ self.w


class _NoWeights(nnx.Module):
    def __call__(self, x):
        return x[:, :3]


def _one_line(e: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("model, message", [
    (_IntWeights, "model parameter w is int32: gradients need floating-point parameters"),
    (_NoWeights, "the model (_NoWeights) has no nnx.Param to train"),
])
def test_parameters_that_cannot_train_are_one_line_before_the_run_directory(tmp_path, model, message):
    with pytest.raises(ConfigError) as e:
        jaxtrain.fit(model(), mse, DATA, config=CONFIG, run_dir=tmp_path / "run", verbosity="silent")
    assert message in _one_line(e)
    assert not (tmp_path / "run").exists()  # nothing half-written


@pytest.mark.parametrize("dtype, what", [(object, "Python objects"), (str, "strings (<U")])
def test_string_and_object_arrays_are_one_line(dtype, what):
    for data, val, name in [({**DATA, "x": DATA["x"].astype(dtype)}, None, "train_data['x']"),
                            (DATA, {**DATA, "y": DATA["y"].astype(dtype)}, "val_data['y']")]:
        with pytest.raises(DataError) as e:
            jaxtrain.fit(small_mlp(), mse, data, val, config=CONFIG, verbosity="silent")
        assert f"{name} holds {what}" in _one_line(e) and "turn it into numbers first" in _one_line(e)


def test_columns_given_as_python_lists_train_like_their_arrays():
    lists = {k: v.tolist() for k, v in DATA.items()}
    by_lists = jaxtrain.fit(small_mlp(), mse, lists, config=CONFIG, verbosity="silent")
    by_arrays = jaxtrain.fit(small_mlp(), mse, DATA, config=CONFIG, verbosity="silent")
    assert by_lists.final_train_loss == by_arrays.final_train_loss


def test_config_numbers_take_numpy_scalars_and_refuse_bools():
    config = TrainConfig(epochs=np.int64(3), batch_size=np.int32(16), optim=OptimConfig(lr=np.float32(0.01)))
    assert (type(config.epochs), type(config.batch_size), type(config.optim.lr)) == (int, int, float)
    assert config.optim.lr == pytest.approx(0.01)
    with pytest.raises(ConfigError) as e:
        TrainConfig(batch_size=True)  # would train as batch 1
    assert "batch_size=True must be an integer, not True or False" in _one_line(e)
    with pytest.raises(ConfigError, match="weight_decay=False must be a number, not True or False"):
        OptimConfig(weight_decay=False)


def test_predict_notes_rows_whose_finite_inputs_overflow(capsys):
    model = small_mlp()
    x = DATA["x"][:10].copy()
    x[[3, 7]] = 3e38  # finite, and far outside anything trained on
    y = jaxtrain.predict(model, x, batch_size=4)
    assert np.isfinite(y[[0, 1, 2, 4, 5, 6, 8, 9]]).all() and not np.isfinite(y[[3, 7]]).all(axis=1).any()
    assert capsys.readouterr().err.strip() == (
        "note: the outputs of 2 of 10 rows are NaN or Inf (first: row 3) although their inputs are finite: values "
        "far outside the training data's range overflow the model; check the inputs' scale and preprocessing")
    jaxtrain.predict(model, DATA["x"][:10])
    assert capsys.readouterr().err == ""  # nothing to say


class _Divides(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.ones((8, 3)))

    def __call__(self, x):
        scale = 1 / (x.shape[1] - 8)  # a bug in the user's own model: ZeroDivisionError for 8 features
        return x @ self.w * scale


def test_any_exception_the_users_model_raises_in_the_pre_check_is_one_line_naming_it(tmp_path):
    with pytest.raises(ConfigError) as e:
        jaxtrain.fit(_Divides(), mse, DATA, config=CONFIG, run_dir=tmp_path / "run", verbosity="silent")
    line = _one_line(e)
    assert line.startswith("loss_fn raised ZeroDivisionError at test_inputs.py:")
    assert "(in __call__) on a training batch of " in line and ": division by zero (one step is traced" in line
    assert isinstance(e.value.__cause__, ZeroDivisionError)  # the whole traceback, for whoever wants it
    assert not (tmp_path / "run").exists()
