"""Optimizers from config against hand-written NumPy references (rtol 1e-5, atol 1e-6)."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxtrain import OptimConfig, build_optimizer, build_schedule

pytestmark = pytest.mark.xla_defaults  # optimizers against NumPy references

RTOL = 1e-5
ATOL = 1e-6  # float32 results near zero


def _run(config, steps=5):
    """Minimise sum(w^2 * c) from w0; returns the parameter after each step."""
    c = np.array([1.0, 2.0, 0.5], np.float32)
    w = jnp.array([[1.0, -2.0, 3.0]])  # a (1, 3) matrix: weight decay applies to ndim >= 2
    tx = build_optimizer(config, total_steps=steps)
    state = tx.init(w)
    out = []
    for _ in range(steps):
        grad = 2 * c * w
        updates, state = tx.update(grad, state, w)
        w = w + updates
        out.append(np.asarray(w)[0])
    return c, out


def test_sgd_matches_numpy():
    c, got = _run(OptimConfig(name="sgd", lr=0.1))
    w = np.array([1.0, -2.0, 3.0])
    for g in got:
        w = w - 0.1 * 2 * c * w
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_sgd_momentum_and_l2_weight_decay_match_numpy():
    c, got = _run(OptimConfig(name="sgd", lr=0.1, momentum=0.9, weight_decay=0.01))
    w, v = np.array([1.0, -2.0, 3.0]), np.zeros(3)
    for g in got:
        v = 0.9 * v + (2 * c * w + 0.01 * w)
        w = w - 0.1 * v
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_adam_and_adamw_match_numpy(name):
    wd = 0.1 if name == "adamw" else 0.0
    c, got = _run(OptimConfig(name=name, lr=0.01, weight_decay=wd))
    w, m, v = np.array([1.0, -2.0, 3.0]), np.zeros(3), np.zeros(3)
    for t, g in enumerate(got, start=1):
        grad = 2 * c * w
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad**2
        update = (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        w = w - 0.01 * (update + wd * w)
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_clipping_limits_the_global_norm():
    c, got = _run(OptimConfig(name="sgd", lr=1.0, clip_norm=0.5), steps=1)
    w0 = np.array([1.0, -2.0, 3.0])
    grad = 2 * c * w0
    np.testing.assert_allclose(got[0], w0 - grad * 0.5 / np.linalg.norm(grad), rtol=RTOL)


def test_warmup_cosine_schedule():
    config = OptimConfig(lr=1.0, schedule="warmup-cosine", warmup_steps=10, min_lr=0.1)
    schedule = build_schedule(config, total_steps=110)
    np.testing.assert_allclose(float(schedule(0)), 0.0, atol=1e-7)
    np.testing.assert_allclose(float(schedule(5)), 0.5, rtol=RTOL)
    np.testing.assert_allclose(float(schedule(10)), 1.0, rtol=RTOL)
    # halfway through the decay: min + (max - min) * (1 + cos(pi/2)) / 2
    np.testing.assert_allclose(float(schedule(60)), 0.55, rtol=RTOL)
    np.testing.assert_allclose(float(schedule(110)), 0.1, rtol=RTOL)


def test_constant_schedule():
    assert float(build_schedule(OptimConfig(lr=0.3), total_steps=10)(7)) == pytest.approx(0.3)


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_weight_decay_skips_biases_and_norm_scales(name):
    """A 1-D parameter gets exactly the update it would get without weight decay."""
    params = {"w": jnp.ones((2, 3)), "b": jnp.ones((3,))}
    grads = {"w": jnp.full((2, 3), 0.5), "b": jnp.full((3,), 0.5)}
    updates = {}
    for wd in (0.0, 0.1):
        tx = build_optimizer(OptimConfig(name=name, lr=0.1, weight_decay=wd), total_steps=1)
        updates[wd], _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates[0.1]["b"], updates[0.0]["b"], rtol=RTOL)
    # A matrix gets the extra -lr * wd * w on its first step: sgd adds wd * w to the gradient before scaling by
    # -lr; adamw adds it to the normalised update before scaling by -lr.
    np.testing.assert_allclose(updates[0.1]["w"] - updates[0.0]["w"], np.full((2, 3), -0.1 * 0.1), rtol=RTOL)


def test_exponential_schedule_rises_from_min_lr_to_lr_by_one_factor_a_step():
    from jaxtrain._src.errors import ConfigError

    schedule = build_schedule(OptimConfig(schedule="exponential", lr=10.0, min_lr=1e-6, decay_steps=8), 100)
    values = [float(schedule(i)) for i in range(10)]
    expected = [1e-6 * 10.0**i for i in range(8)] + [10.0, 10.0]  # x10 a step: 1e-6 ... 10, then held
    assert values == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ConfigError, match="rises from optim.min_lr, which must be > 0"):
        OptimConfig(schedule="exponential", lr=1.0)


def test_transforms_that_take_the_loss_as_value_work_inside_fit():
    """`optax.contrib.reduce_on_plateau` needs the loss (`value=`) in its update: fit passes each step's
    loss; the reference is the same transform fed the losses fit logged (one step per epoch)."""
    import jax
    import optax
    from conftest import mse, regression_data, small_mlp

    import jaxtrain

    def plateau():
        return optax.contrib.reduce_on_plateau(factor=0.5, patience=1, rtol=0.05, accumulation_size=1)

    data = regression_data(32)
    config = jaxtrain.TrainConfig(epochs=8, batch_size=32, steps_per_call=1, tensorboard=False)
    result = jaxtrain.fit(small_mlp(), mse, data, config=config, verbosity="silent",
                          optimizer=optax.chain(optax.sgd(0.02), plateau()))
    state = [s for s in jax.tree.leaves(result.state.opt_state, is_leaf=lambda s: hasattr(s, "plateau_count"))
             if hasattr(s, "plateau_count")]
    assert len(state) == 1
    reference = plateau()
    expected = reference.init(None)
    for row in result.history:  # one step an epoch: the epoch's loss is the step's
        _, expected = reference.update(None, expected, value=jnp.float32(row["train_loss"]))
    assert float(state[0].scale) == float(expected.scale) < 1.0  # the plateau was seen, as by optax alone
