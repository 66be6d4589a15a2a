"""`predict`, `predict_batches` and `export` of a model called with several arrays: `inputs=("a", "b")`."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

import jaxtrain
from jaxtrain.engine import predict_batches


class TwoTower(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.a, self.b = nnx.Linear(3, 2, rngs=rngs), nnx.Linear(5, 2, rngs=rngs)

    def __call__(self, a, b):
        return self.a(a) * self.b(b)


def _inputs(n=7):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 3)).astype(np.float32), rng.normal(size=(n, 5)).astype(np.float32)


def test_predict_calls_the_model_with_each_named_field_in_order():
    model, (a, b) = TwoTower(nnx.Rngs(0)), _inputs()
    want = np.asarray(model(a, b))
    got = jaxtrain.predict(model, {"b": b, "a": a}, inputs=("a", "b"), batch_size=4)
    np.testing.assert_allclose(got, want, rtol=1e-6)  # 2 batches, the second padded
    np.testing.assert_allclose(jaxtrain.predict(model, (a, b), inputs=("a", "b"), batch_size=4), want, rtol=1e-6)
    parts = list(predict_batches(model, {"a": a, "b": b}, inputs=["a", "b"], batch_size=4))
    np.testing.assert_allclose(np.concatenate(parts), want, rtol=1e-6)
    with pytest.raises(jaxtrain.ConfigError, match="one array but inputs"):
        jaxtrain.predict(model, a, inputs=("a", "b"))


def test_export_takes_several_arrays_sharing_the_batch_size(tmp_path):
    model, (a, b) = TwoTower(nnx.Rngs(0)), _inputs()
    signature = jaxtrain.export(model, (a, b), tmp_path / "out", inputs=("a", "b"))
    assert [(i["name"], i["shape"]) for i in signature["inputs"]] == [("a", ["batch", 3]), ("b", ["batch", 5])]
    forward = jax.export.deserialize((tmp_path / "out" / "model.jax_export").read_bytes())
    np.testing.assert_allclose(np.asarray(forward.call(a, b)), np.asarray(model(a, b)), rtol=1e-6)
    assert json.loads((tmp_path / "out" / "signature.json").read_text())["inputs"] == signature["inputs"]
    assert "outputs = forward.call(a, b)" in (tmp_path / "out" / "README.md").read_text()
    with pytest.raises(jaxtrain.ConfigError, match="1 example for 2 inputs"):
        jaxtrain.export(model, a, tmp_path / "other", inputs=("a", "b"))


def test_a_field_named_twice_is_refused():
    model, (a, b) = TwoTower(nnx.Rngs(0)), _inputs()
    with pytest.raises(jaxtrain.ConfigError, match="names a field twice"):
        jaxtrain.predict(model, (a, b), inputs=("p", "p"))


def test_a_model_that_cannot_be_hashed_predicts_and_its_forward_compiles_once():
    from jaxtrain.engine import Forward

    class Scaled(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(4, 2, rngs=rngs)
            self.cfg = {"scale": 2.0}  # a dict attribute: the model's graph cannot be a cache key

        def __call__(self, x):
            return self.linear(x) * self.cfg["scale"]

    model, x = Scaled(nnx.Rngs(0)), np.ones((6, 4), np.float32)
    forward = Forward(model, None, "x")
    for _ in range(2):
        got = np.concatenate(list(predict_batches(forward, x, batch_size=4)))
    np.testing.assert_allclose(got, np.asarray(model(x)), rtol=1e-6)
    assert forward.compiles() == 1  # one batch shape (the last batch is padded), compiled once
