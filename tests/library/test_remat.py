"""Rematerialisation: the same loss and gradients (within 1e-6, float32), less compiled memory.

Tolerance: remat recomputes the same float32 operations in the same order, so loss and gradients
agree to within 1e-6 absolute (they are bit-identical in practice).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxtrain
from jaxtrain._src import remat
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.models import CNN, GPT, GPTConfig, SequenceCNN

ATOL = 1e-6
MODES = ["blocks", "full"]


def _value_and_grad(model: nnx.Module, loss, batch):
    graphdef, params = nnx.split(model)
    fn = jax.jit(jax.value_and_grad(lambda p, b: loss(nnx.merge(graphdef, p, copy=True), b)))
    return fn(params, batch)


def _assert_same(a, b):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    np.testing.assert_allclose(loss_a, loss_b, rtol=0, atol=ATOL)
    for x, y in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b), strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=ATOL)


def _gpt_loss(model, batch):
    logits = model(batch["tokens"][:, :-1], batch["key"])  # dropout on: the key must reach every block
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["tokens"][:, 1:]).mean()


def _gpt(mode, **kw):
    config = GPTConfig(**{"block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, "dropout": 0.1, **kw})
    return GPT(13, config, remat=mode, rngs=nnx.Rngs(0))


def _gpt_batch():
    return {"tokens": jax.random.randint(jax.random.key(1), (3, 17), 0, 13), "key": jax.random.key(2)}


@functools.cache
def _gpt_reference():
    """remat="none"'s loss and gradients: compiled once for both modes."""
    return _value_and_grad(_gpt("none"), _gpt_loss, _gpt_batch())


@pytest.mark.xla_defaults
@pytest.mark.parametrize("mode", MODES)
def test_gpt_loss_and_gradients_equal_remat_none(mode):
    _assert_same(_value_and_grad(_gpt(mode), _gpt_loss, _gpt_batch()), _gpt_reference())


def _image_loss(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()


def _image_batch():
    kx, ky = jax.random.split(jax.random.key(0))
    return {"x": jax.random.normal(kx, (4, 28, 28, 1)), "y": jax.random.randint(ky, (4,), 0, 10)}


@functools.cache
def _cnn_reference():
    return _value_and_grad(CNN(rngs=nnx.Rngs(0)), _image_loss, _image_batch())


@pytest.mark.xla_defaults
@pytest.mark.parametrize("mode", MODES)
def test_cnn_loss_and_gradients_equal_remat_none(mode):
    _assert_same(_value_and_grad(CNN(remat=mode, rngs=nnx.Rngs(0)), _image_loss, _image_batch()), _cnn_reference())


@pytest.mark.xla_defaults
@pytest.mark.parametrize("mode", MODES)
def test_sequence_cnn_loss_and_gradients_equal_remat_none(mode):
    def build(m):
        return SequenceCNN(20, 2, embed=8, channels=8, layers=2, kernel=3, remat=m, rngs=nnx.Rngs(0))

    batch = {"x": jax.random.randint(jax.random.key(0), (4, 12), 0, 20)}

    def loss(model, batch):
        return jnp.mean(model(batch["x"]) ** 2)

    _assert_same(_value_and_grad(build(mode), loss, batch), _value_and_grad(build("none"), loss, batch))


def _temp_bytes(mode: str) -> int:
    model = GPT(65, GPTConfig(block_size=128, n_layer=2, n_head=4, n_embd=64), remat=mode, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    tokens = jnp.zeros((4, 129), jnp.int32)

    def loss(p, tokens):
        logits = nnx.merge(graphdef, p, copy=True)(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    compiled = jax.jit(jax.value_and_grad(loss)).lower(params, tokens).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_remat_lowers_the_compiled_temporary_memory_of_a_gpt():
    """Block 128: the (B, nh, T, T) attention tensors of every layer are not all kept."""
    none, blocks, full = (_temp_bytes(m) for m in ("none", "blocks", "full"))
    assert full < none and blocks < none, (none, blocks, full)


@pytest.mark.xla_defaults
def test_a_user_model_remats_its_blocks_and_keeps_their_state_updates():
    """`jaxtrain.remat.call` in a model of one's own: a module with non-parameter state (a call
    counter, like batch-norm statistics) and a function of a module both work."""

    class Count(nnx.Variable):
        pass

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(4, 4, rngs=rngs)
            self.calls = Count(jnp.zeros((), jnp.int32))

        def __call__(self, x):
            self.calls[...] += 1
            return jnp.tanh(self.linear(x)) + x

    class Net(nnx.Module):
        def __init__(self, mode, rngs):
            self.mode = remat.check_mode(mode)
            self.blocks = nnx.List([Block(rngs) for _ in range(3)])

        def __call__(self, x):
            for block in self.blocks:
                x = jaxtrain.remat.call(block, x, mode=self.mode)
            return jaxtrain.remat.call(lambda b, x: b.linear(x) * 2, self.blocks[0], x, mode=self.mode)

    x = jax.random.normal(jax.random.key(0), (5, 4))
    for mode in MODES:
        model, plain = Net(mode, nnx.Rngs(0)), Net("none", nnx.Rngs(0))
        grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model)
        want = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(plain)
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=ATOL)
        np.testing.assert_allclose(model(x), plain(x), rtol=0, atol=ATOL)
        assert [int(b.calls[...]) for b in model.blocks] == [int(b.calls[...]) for b in plain.blocks] == [2, 2, 2]


def test_an_unknown_mode_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match="remat='sometimes' .* choose one of: none, blocks, full"):
        GPT(11, GPTConfig(block_size=8, n_layer=1, n_head=2, n_embd=16), remat="sometimes", rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="choose one of"):
        remat.call(lambda x: x, jnp.ones(2), mode="all")
    with pytest.raises(ConfigError, match="choose one of"):
        CNN(remat="yes", rngs=nnx.Rngs(0))


def test_mlp_regression_with_remat_is_a_config_error_and_exit_code_2(capsys):
    from jaxtrain.tools.cli import main
    from jaxtrain.tools.recipes.mlp_regression import RECIPE

    config = dataclasses.replace(RECIPE.config, remat="blocks")
    with pytest.raises(ConfigError, match="no repeated blocks"):
        RECIPE.model(config, {"features": 4, "targets": 2})
    with pytest.raises(ConfigError, match="no repeated blocks"):
        RECIPE.build(config)
    assert main(["train", "mlp-regression", "--remat", "full", "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "char-gpt" in err and "mnist-cnn" in err, err


def test_recipes_build_their_models_with_the_remat_setting():
    from jaxtrain.tools.recipes import char_gpt, hdf5_sequence, mnist_cnn

    gpt = char_gpt.build_model(dataclasses.replace(char_gpt.SEED, remat="blocks"), {"vocabulary": "abc"})
    cnn = mnist_cnn.build_model(dataclasses.replace(mnist_cnn.MNIST.config, remat="full"), {})
    seq = hdf5_sequence.build_model(dataclasses.replace(hdf5_sequence.RECIPE.config, remat="blocks"),
                                    {"vocab": 20, "outputs": 2})
    assert (gpt.remat, cnn.remat, seq.remat) == ("blocks", "full", "blocks")
    assert char_gpt.RECIPE.presets["long"].model.block_size == 1024


@pytest.mark.xla_defaults
def test_remat_trains_like_none_in_the_engine():
    """Through `make_train_step` inside `lax.scan` (how fit runs it): the same losses, 3 steps."""
    from jaxtrain._src.state import init_state
    from jaxtrain._src.step import make_train_step

    tokens = jax.random.randint(jax.random.key(3), (3, 4, 17), 0, 13)  # (K, B, T + 1)

    def loss_fn(model, batch, key):
        return _gpt_loss(model, {"tokens": batch, "key": key}), {}

    losses = {}
    for mode in ("none", "blocks"):
        model, tx = _gpt(mode), optax.adam(1e-2)
        graphdef, state = init_state(model, tx, jax.random.key(0))
        step = make_train_step(graphdef, loss_fn, tx)
        _, metrics = jax.jit(lambda s, b: jax.lax.scan(step, s, b))(state, tokens)
        losses[mode] = np.asarray(metrics["loss"])
    np.testing.assert_allclose(losses["blocks"], losses["none"], rtol=0, atol=ATOL)
