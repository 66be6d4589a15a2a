"""One `make_train_step` step against an independent float64 NumPy reference.

The reference computes the MLP forward pass, hand-written backprop of the MSE loss, and the SGD /
Adam / AdamW updates. The backprop itself is checked against central finite differences of the
NumPy loss. JAX runs in float32, so new parameters and losses agree to rtol 1e-5, atol 1e-6.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxtrain import OptimConfig, build_optimizer
from jaxtrain._src.models import MLP
from jaxtrain._src.state import init_state
from jaxtrain._src.step import make_train_step

pytestmark = pytest.mark.xla_defaults  # one step against a float64 NumPy reference

RTOL = 1e-5
ATOL = 1e-6  # float32 parameters of size ~0.5 and losses of size ~1
SIZES = (5, 8, 6, 3)  # D_in, two ReLU hidden layers, D_out
B = 16

Layers = list[tuple[np.ndarray, np.ndarray]]  # [(W (D_l, D_l+1), b (D_l+1,)), ...]


def mse(model, batch, key):
    err = model(batch["x"]) - batch["y"]  # (B, D_out)
    return jnp.mean(err**2), {}


def _batch(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(B, SIZES[0])).astype(np.float32),
            "y": rng.normal(size=(B, SIZES[-1])).astype(np.float32)}


def _setup(tx):
    """The MLP with non-zero biases (nnx initialises them to 0, which would hide a bias bug)."""
    model = MLP(SIZES, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(1)
    for layer in model.layers:
        layer.bias[...] = rng.normal(scale=0.5, size=layer.bias.shape).astype(np.float32)
    graphdef, state = init_state(model, tx, jax.random.key(0))
    return state, jax.jit(make_train_step(graphdef, mse, tx))


def _layers(params) -> Layers:
    return [(np.asarray(params["layers"][i]["kernel"][...], np.float64),
             np.asarray(params["layers"][i]["bias"][...], np.float64)) for i in range(len(SIZES) - 1)]


def _forward(layers: Layers, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Output (B, D_out), the inputs of each layer, and each hidden layer's pre-activation."""
    inputs, pre = [], []
    h = x.astype(np.float64)
    for i, (w, b) in enumerate(layers):
        inputs.append(h)
        z = h @ w + b
        if i < len(layers) - 1:
            pre.append(z)
            h = np.maximum(z, 0.0)
        else:
            h = z
    return h, inputs, pre


def _loss(layers: Layers, batch) -> float:
    out, _, _ = _forward(layers, batch["x"])
    return float(np.mean((out - batch["y"]) ** 2))


def _grads(layers: Layers, batch) -> Layers:
    """Backprop of mean((out - y)^2) by hand."""
    out, inputs, pre = _forward(layers, batch["x"])
    delta = 2.0 * (out - batch["y"]) / out.size  # dL/d(out), (B, D_out)
    grads: Layers = []
    for i in reversed(range(len(layers))):
        w, _ = layers[i]
        grads.append((inputs[i].T @ delta, delta.sum(axis=0)))
        if i > 0:
            delta = (delta @ w.T) * (pre[i - 1] > 0)  # through ReLU
    return grads[::-1]


def _adam(layers: Layers, grads: Layers, m: Layers, v: Layers, t: int, lr, b1, b2, eps, wd=0.0, min_ndim=2):
    """Bias-corrected Adam; with wd, AdamW's decoupled decay p -= lr * (u + wd * p) on parameters with
    ndim >= min_ndim (matrices only by default)."""
    new_layers, new_m, new_v = [], [], []
    for (w, b), (gw, gb), (mw, mb), (vw, vb) in zip(layers, grads, m, v):
        params, moments = [], ([], [])
        for p, g, mp, vp in ((w, gw, mw, vw), (b, gb, mb, vb)):
            mp = b1 * mp + (1 - b1) * g
            vp = b2 * vp + (1 - b2) * g**2
            u = (mp / (1 - b1**t)) / (np.sqrt(vp / (1 - b2**t)) + eps)
            decay = wd * p if p.ndim >= min_ndim else 0.0
            params.append(p - lr * (u + decay))
            moments[0].append(mp)
            moments[1].append(vp)
        new_layers.append(tuple(params))
        new_m.append(tuple(moments[0]))
        new_v.append(tuple(moments[1]))
    return new_layers, new_m, new_v


def _zeros(layers: Layers) -> Layers:
    return [(np.zeros_like(w), np.zeros_like(b)) for w, b in layers]


def _assert_layers_close(got_params, want: Layers):
    for i, ((gw, gb), (ww, wb)) in enumerate(zip(_layers(got_params), want, strict=True)):
        np.testing.assert_allclose(gw, ww, rtol=RTOL, atol=ATOL, err_msg=f"layer {i} kernel")
        np.testing.assert_allclose(gb, wb, rtol=RTOL, atol=ATOL, err_msg=f"layer {i} bias")


@pytest.mark.parametrize("entry", [(0, 0, (2, 3)), (0, 1, (4,)), (1, 0, (7, 1)), (1, 1, (0,)), (2, 0, (5, 2)),
                                   (2, 1, (2,))])
def test_numpy_backprop_matches_finite_differences(entry):
    """The reference's gradient is itself right: central differences of the float64 loss, h = 1e-6."""
    layer, which, index = entry
    state, _ = _setup(optax.sgd(0.1))
    layers, batch = _layers(state.params), _batch(0)
    analytic = _grads(layers, batch)[layer][which][index]
    h = 1e-6

    def shifted(delta):
        copy = [(w.copy(), b.copy()) for w, b in layers]
        copy[layer][which][index] += delta
        return _loss(copy, batch)

    numeric = (shifted(h) - shifted(-h)) / (2 * h)
    assert abs(analytic) > 1e-4  # an entry with a gradient worth checking (not a dead ReLU)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-9)


def test_sgd_step_matches_numpy():
    lr = 0.1
    state, train_step = _setup(optax.sgd(lr))
    layers, batch = _layers(state.params), _batch(0)
    new_state, metrics = train_step(state, batch)
    want = [(w - lr * gw, b - lr * gb) for (w, b), (gw, gb) in zip(layers, _grads(layers, batch))]
    np.testing.assert_allclose(float(metrics["loss"]), _loss(layers, batch), rtol=RTOL, atol=ATOL)
    _assert_layers_close(new_state.params, want)
    assert int(new_state.step) == 1


def test_two_adam_steps_match_numpy():
    """Two steps on different batches, so the second update depends on the first step's moments."""
    lr, b1, b2, eps = 0.01, 0.8, 0.95, 1e-7
    state, train_step = _setup(optax.adam(lr, b1=b1, b2=b2, eps=eps))
    layers = _layers(state.params)
    m, v = _zeros(layers), _zeros(layers)
    for t, seed in ((1, 0), (2, 1)):
        batch = _batch(seed)
        state, metrics = train_step(state, batch)
        np.testing.assert_allclose(float(metrics["loss"]), _loss(layers, batch), rtol=RTOL, atol=ATOL)
        layers, m, v = _adam(layers, _grads(layers, batch), m, v, t, lr, b1, b2, eps)
        _assert_layers_close(state.params, layers)
    assert int(state.step) == 2


def test_adamw_from_config_decays_matrices_but_not_biases():
    lr, wd, b1, b2, eps = 0.01, 0.1, 0.9, 0.999, 1e-8  # OptimConfig's defaults for b1, b2, eps
    tx = build_optimizer(OptimConfig(name="adamw", lr=lr, weight_decay=wd), total_steps=2)
    state, train_step = _setup(tx)
    start = _layers(state.params)
    # Three references: decay on matrices only (optax's convention via decay_mask), on nothing, on everything.
    refs = {min_ndim: (start, _zeros(start), _zeros(start)) for min_ndim in (2, 3, 1)}
    for t, seed in ((1, 0), (2, 1)):
        batch = _batch(seed)
        state, _ = train_step(state, batch)
        for min_ndim, (layers, m, v) in refs.items():
            refs[min_ndim] = _adam(layers, _grads(layers, batch), m, v, t, lr, b1, b2, eps, wd=wd, min_ndim=min_ndim)
    _assert_layers_close(state.params, refs[2][0])
    # The references differ by far more than the tolerance, so the match above pins where decay applies:
    # lr * wd * |p| ~ 5e-4 per step against a tolerance of ~6e-6.
    for (w, b), (w_none, _), (_, b_all) in zip(_layers(state.params), refs[3][0], refs[1][0]):
        assert np.max(np.abs(w - w_none)) > 100 * (ATOL + RTOL * np.max(np.abs(w)))  # matrices were decayed
        assert np.max(np.abs(b - b_all)) > 10 * (ATOL + RTOL * np.max(np.abs(b)))  # biases were not
