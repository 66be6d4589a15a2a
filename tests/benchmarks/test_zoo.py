"""The model zoo: every model's loss traces to scalars (no compilation); the cheapest ones train."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from benchmarks.zoo import ZOO
from benchmarks.zoo.hand import hand_loop, hand_losses
from benchmarks.zoo.spectral_norm import SpectralMLP

NAMES = ["flax-mnist-cnn", "keras-convnet", "resnet-bn", "tiny-vit", "transformer-mha", "lstm", "mlp-mixer", "vae",
         "unet", "nanogpt", "gnn", "custom-variable"]


def test_zoo_holds_the_twelve_in_order():
    assert list(ZOO) == NAMES
    assert all(zm.name == name for name, zm in ZOO.items())


@pytest.mark.parametrize("name", NAMES)
def test_loss_traces_to_a_scalar_loss_and_scalar_metrics(name):
    zm = ZOO[name]
    assert zm.source.strip() and zm.batch_size > 0 and zm.hand_jit in ("jit", "nnx.jit")
    abstract = nnx.eval_shape(lambda: zm.make_model(0))  # shapes only: nothing is initialised
    graphdef, state = nnx.split(abstract)
    params = nnx.state(abstract, nnx.Param)
    assert sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params)) > 0
    batch = zm.make_data(zm.batch_size, 1)
    assert {len(v) for v in batch.values()} == {zm.batch_size}
    # The model is merged inside the traced function, so state the loss updates (BatchNorm
    # statistics, RNG counts, custom Variables) never leaks tracers into `abstract`.
    loss, metrics = jax.eval_shape(lambda s, b, k: zm.loss_fn(nnx.merge(graphdef, s), b, k),
                                   state, batch, jax.random.key(0))
    assert loss.shape == () and loss.dtype == jnp.float32
    assert all(m.shape == () for m in metrics.values()), metrics
    jax.eval_shape(zm.optimizer().init, params)


@pytest.mark.parametrize("name", ["transformer-mha", "gnn"])
def test_data_are_deterministic_per_seed(name):
    zm = ZOO[name]
    a, b, c = zm.make_data(4, 3), zm.make_data(4, 3), zm.make_data(4, 4)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert any(not np.array_equal(a[k], c[k], equal_nan=True) for k in a)


def test_both_hand_loops_train_custom_variables_identically():
    """custom-variable through its own jax.jit loop and through the nnx.jit loop: the same losses,
    and the custom Variables (call count, power-iteration vectors) carried through both."""
    # One hidden layer of 32, not two of 256: the same Variables, fewer shapes to compile an initialiser for.
    zm = dataclasses.replace(ZOO["custom-variable"], make_model=lambda seed: SpectralMLP((784, 32, 10),
                                                                                        rngs=nnx.Rngs(seed)))
    B = zm.batch_size
    data = zm.make_data(3 * B, 0)
    batches = [{k: v[i * B:(i + 1) * B] for k, v in data.items()} for i in range(3)]
    u0 = np.asarray(zm.make_model(0).layers[0].u[...])
    losses = {}
    for style in ("jit", "nnx.jit"):
        model = zm.make_model(0)
        losses[style] = hand_losses(dataclasses.replace(zm, hand_jit=style), model, batches)
        assert int(model.count[...]) == 3
        assert not np.allclose(np.asarray(model.layers[0].u[...]), u0)
    assert np.all(np.isfinite(losses["jit"])) and losses["jit"][-1] < losses["jit"][0]
    np.testing.assert_allclose(losses["jit"], losses["nnx.jit"], rtol=1e-5)


def test_vae_hand_loop_trains_with_the_loss_key():
    zm = ZOO["vae"]
    losses, seconds = hand_loop(zm, zm.make_data(2 * zm.batch_size, 0), steps=3, seed=0)
    assert len(losses) == 3 and np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert seconds > 0
