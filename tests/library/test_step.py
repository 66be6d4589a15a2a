"""The pure step builders: fused vs unfused, shuffling, evaluation, retracing."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import leaves_close, mse, regression_data, small_mlp

from jaxtrain._src.feeds import epoch_permutation
from jaxtrain._src.state import init_state
from jaxtrain._src.step import make_eval_step, make_evaluate, make_evaluate_sums, make_multi_step, make_train_step

pytestmark = pytest.mark.xla_defaults  # fused and separate steps alike, evaluation against NumPy


def _setup(seed=0):
    tx = optax.adam(1e-2)
    graphdef, state = init_state(small_mlp(seed), tx, jax.random.key(seed))
    return graphdef, state, make_train_step(graphdef, mse, tx)


def test_fused_steps_equal_separate_steps():
    data = jax.tree.map(jnp.asarray, regression_data(400))
    graphdef, state, train_step = _setup()
    perm = epoch_permutation(jax.random.key(1), 1, 400)
    B, steps = 8, 50

    separate = jax.jit(make_multi_step(train_step, B, 1))
    s1 = jax.tree.map(lambda x: x.copy(), state)
    for i in range(steps):
        s1, _ = separate(s1, data, perm, jnp.int32(i))

    fused = jax.jit(make_multi_step(train_step, B, 10))
    s10 = jax.tree.map(lambda x: x.copy(), state)
    for start in range(0, steps, 10):
        s10, metrics = fused(s10, data, perm, jnp.int32(start))

    assert metrics["loss"].shape == (10,)
    assert int(s10.step) == int(s1.step) == steps
    assert leaves_close(s10.params, s1.params) <= 1e-6
    assert leaves_close(s10.opt_state, s1.opt_state) <= 1e-6


def test_unfused_reference_is_plain_train_step():
    """K=1 through the scan equals calling train_step directly on the gathered batch."""
    data = jax.tree.map(jnp.asarray, regression_data(64))
    graphdef, state, train_step = _setup()
    perm = epoch_permutation(jax.random.key(1), 1, 64)
    direct, _ = jax.jit(train_step)(state, {k: v[perm[8:16]] for k, v in data.items()})
    via_scan, _ = jax.jit(make_multi_step(train_step, 8, 1))(state, data, perm, jnp.int32(1))
    assert leaves_close(direct.params, via_scan.params) <= 1e-6


def test_permutation_is_a_permutation_differs_per_epoch_and_is_reproducible():
    key = jax.random.key(3)
    p1 = np.asarray(epoch_permutation(key, 1, 1000))
    p2 = np.asarray(epoch_permutation(key, 2, 1000))
    assert sorted(p1.tolist()) == list(range(1000))
    assert sorted(p2.tolist()) == list(range(1000))
    assert (p1 != p2).mean() > 0.9
    np.testing.assert_array_equal(p1, np.asarray(epoch_permutation(jax.random.key(3), 1, 1000)))
    assert (p1 != np.asarray(epoch_permutation(jax.random.key(4), 1, 1000))).mean() > 0.9


def test_evaluate_with_partial_last_batch_matches_numpy():
    n, B = 103, 16  # 6 full batches and a remainder of 7
    data = regression_data(n)
    graphdef, state, _ = _setup()
    evaluate = jax.jit(make_evaluate(make_eval_step(graphdef, mse), n, B))
    got = jax.device_get(evaluate(state, jax.tree.map(jnp.asarray, data)))

    # NumPy reference: the same MLP computed by hand, averaged over every sample once.
    p = jax.tree.map(np.asarray, state.params)
    h = np.maximum(data["x"] @ p["layers"][0]["kernel"] + p["layers"][0]["bias"], 0)
    err = h @ p["layers"][1]["kernel"] + p["layers"][1]["bias"] - data["y"]
    np.testing.assert_allclose(got["loss"], np.mean(err**2), rtol=1e-5)
    np.testing.assert_allclose(got["mae"], np.mean(np.abs(err)), rtol=1e-5)


def test_validation_sums_add_the_batch_means_then_scale_them_as_runs_before_stats_did():
    # val_loss keeps its bits for runs that use no Stat: (m1 + m2) * 12 + m3 * 5, not m1 * 12 + m2 * 12 + m3 * 5.
    # Each batch's "mean" is its first row's value, so the means are exact and only the order of the sums rounds.
    means = np.float32([0.1, 0.5, 0.5])  # two full batches of 12 and a tail of 5
    data = {"v": np.repeat(means, [12, 12, 5])}
    sums = jax.jit(make_evaluate_sums(lambda state, batch: {"loss": batch["v"][0]}, 29, 12))(None, data)
    B, r = np.float32(12), np.float32(5)
    old_order = (means[0] + means[1]) * B + means[2] * r
    assert old_order != (means[0] * B + means[1] * B) + means[2] * r  # (the orders differ on these means)
    assert sums["loss"].dtype == np.float32 and float(sums["loss"]) == float(old_order)


def test_evaluate_handles_fewer_samples_than_a_batch():
    data = regression_data(5)
    graphdef, state, _ = _setup()
    full = jax.jit(make_evaluate(make_eval_step(graphdef, mse), 5, 5))(state, data)
    tail_only = jax.jit(make_evaluate(make_eval_step(graphdef, mse), 5, 8))(state, data)
    np.testing.assert_allclose(full["loss"], tail_only["loss"], rtol=1e-6)


def test_second_call_does_not_retrace():
    traces = []

    def counting_loss(model, batch, key):
        traces.append(1)
        return mse(model, batch, key)

    tx = optax.sgd(0.1)
    graphdef, state = init_state(small_mlp(), tx, jax.random.key(0))
    step = jax.jit(make_multi_step(make_train_step(graphdef, counting_loss, tx), 4, 3), donate_argnums=0)
    data = jax.tree.map(jnp.asarray, regression_data(40))
    perm = epoch_permutation(jax.random.key(0), 1, 40)
    state, _ = step(state, data, perm, jnp.int32(0))
    after_first = len(traces)
    state, _ = step(state, data, perm, jnp.int32(3))
    state, _ = step(state, data, epoch_permutation(jax.random.key(0), 2, 40), jnp.int32(0))
    assert after_first == 1  # the K=3 scan body is traced once, and the loss once inside it
    assert len(traces) == after_first


def test_step_keys_do_not_depend_on_grouping():
    """Augmentation keys come from fold_in(rng, step): K=1 and K=5 see the same noise."""
    seen = {}

    def augment(batch, key):
        return {**batch, "x": batch["x"] + jax.random.normal(key, batch["x"].shape)}

    tx = optax.sgd(0.05)
    data = jax.tree.map(jnp.asarray, regression_data(100))
    perm = epoch_permutation(jax.random.key(0), 1, 100)
    for k in (1, 5):
        graphdef, state = init_state(small_mlp(), tx, jax.random.key(7))
        step = jax.jit(make_multi_step(make_train_step(graphdef, mse, tx, augment=augment), 10, k))
        for start in range(0, 10, k):
            state, _ = step(state, data, perm, jnp.int32(start))
        seen[k] = state.params
    assert leaves_close(seen[5], seen[1]) <= 1e-6
