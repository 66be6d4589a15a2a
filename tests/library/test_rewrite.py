"""`rewrite_convs`: the same values and gradients as the original convolutions, and no convolution left.

Reference: the original function (`lax.conv_general_dilated`, `reduce_window` max) run by XLA.
Tolerance: float32 results agree within 1e-5 of the array's largest magnitude (the im2col matmul
sums the same products in another order; measured differences are below 5e-7 of it); bfloat16 ones
within 1e-2 of it (bfloat16 keeps 8 bits of mantissa). Trained through `fit`, see TRAINED_TOL.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax
from jax.extend.core import jaxprs_in_params

from jaxtrain._src import remat
from jaxtrain._src.rewrite import conv_general_dilated_im2col, max_pool_slices, rewrite_convs

pytestmark = pytest.mark.xla_defaults  # the XLA:CPU rewrite against the original convolutions

TOL = 1e-5
SLOW_PRIMITIVES = {"conv_general_dilated", "reduce_window_max", "select_and_scatter_add", "select_and_gather_add"}


def _assert_close(actual, expected):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        assert a.shape == e.shape and a.dtype == e.dtype
        scale = max(float(np.abs(np.asarray(e, np.float64)).max(initial=0.0)), 1.0)
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(e, np.float64), rtol=0, atol=TOL * scale)


def _primitives(jaxpr) -> set[str]:
    """Names of all primitives in `jaxpr` and its sub-jaxprs."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in jaxprs_in_params(eqn.params):
            names |= _primitives(sub)
    return names


def _pool_2x2(x):  # nnx.max_pool(x, (2, 2), (2, 2))
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def _build(module_type):
    """A module_type(rngs) with random parameters, without its initialisers' (slow) eager random calls.

    Its RNG streams are of the "rbg" implementation: XLA:CPU compiles their random bits in half the
    time of threefry's (the rewrite neither knows nor cares which)."""
    rngs = lambda: nnx.Rngs(jax.random.key(0, impl="rbg"))  # noqa: E731
    graphdef, shapes = nnx.split(nnx.eval_shape(lambda: module_type(rngs())))

    def value(s):
        if jnp.issubdtype(s.dtype, jax.dtypes.prng_key):
            return jax.random.wrap_key_data(np.zeros((4,), np.uint32), impl="rbg")
        if jnp.issubdtype(s.dtype, jnp.floating):
            return _normal(s.shape, 2, scale=0.3)
        return np.zeros(s.shape, s.dtype)

    return nnx.merge(graphdef, jax.tree.map(value, shapes))


def _value_and_grads(f, *args):
    """f(*args) and the gradient of <f(*args), r> for a fixed random r, w.r.t. every argument."""
    out = jax.eval_shape(f, *args)
    r = np.random.default_rng(1).standard_normal(out.shape).astype(out.dtype)
    return f(*args), jax.grad(lambda *a: jnp.vdot(f(*a), r), argnums=tuple(range(len(args))))(*args)


def _check_rewrite(f, *args):
    """The rewritten f equals f, forward and gradients, and its gradient's jaxpr has no slow primitive."""
    g = rewrite_convs(f)
    _assert_close(*jax.jit(lambda *a: (_value_and_grads(g, *a), _value_and_grads(f, *a)))(*args))  # one compile
    jaxpr = jax.make_jaxpr(jax.grad(lambda *a: g(*a).sum(), argnums=tuple(range(len(args)))))(*args).jaxpr
    assert not _primitives(jaxpr) & SLOW_PRIMITIVES


def _normal(shape, seed=0, scale=1.0, dtype=np.float32):  # drawn by NumPy: no eager JAX op (each a compile)
    return jnp.asarray((np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype))


NHWC, NCHW = ("NHWC", "HWIO", "NHWC"), ("NCHW", "OIHW", "NCHW")  # Flax's layout, PyTorch's
# name -> (dimension numbers, lhs shape, rhs shape, other conv_general_dilated arguments)
# Each feature at least once, several in a case where one program can hold them; small kernels
# where the case is about something else (a program's compile grows with the kernel's offsets).
CONVS = {
    "nhwc-same": (NHWC, (2, 8, 8, 3), (3, 3, 3, 5), dict(window_strides=(1, 1), padding="SAME")),
    "nhwc-valid-strides-odd-sizes": (NHWC, (3, 11, 8, 5), (3, 2, 5, 7), dict(window_strides=(2, 3), padding="VALID")),
    "nhwc-asymmetric-padding-rhs-dilation": (NHWC, (2, 9, 10, 3), (3, 2, 3, 4),
                                             dict(window_strides=(1, 2), padding=((2, 0), (1, 3)),
                                                  rhs_dilation=(2, 3))),
    "nhwc-1x1": (NHWC, (2, 5, 5, 6), (1, 1, 6, 4), dict(window_strides=(1, 1), padding="VALID")),
    "nhwc-groups": (NHWC, (2, 7, 7, 6), (2, 3, 2, 9),
                    dict(window_strides=(1, 2), padding="SAME", feature_group_count=3)),
    "nhwc-depthwise": (NHWC, (2, 7, 8, 4), (3, 2, 1, 8),  # channel multiplier 2
                       dict(window_strides=(1, 1), padding="SAME", feature_group_count=4)),
    "nhwc-transposed": (NHWC, (2, 5, 4, 3), (3, 3, 3, 4),  # lhs dilation, negative padding
                        dict(window_strides=(1, 1), padding=((2, 1), (1, -1)), lhs_dilation=(2, 3))),
    "nhwc-batch-groups": (NHWC, (4, 6, 6, 3), (2, 2, 3, 6),
                          dict(window_strides=(1, 1), padding="VALID", batch_group_count=2)),
    "nchw-in-nhwc-out-same-stride": (("NCHW", "OIHW", "NHWC"), (2, 3, 9, 7), (5, 3, 3, 2),  # SAME pads (0, 1) on W
                                     dict(window_strides=(2, 3), padding="SAME")),
    "nchw-dilated-groups": (NCHW, (2, 4, 9, 8), (6, 2, 3, 2),
                            dict(window_strides=(1, 1), padding=((1, 2), (0, 1)), rhs_dilation=(2, 1),
                                 feature_group_count=2)),
    "1d": (("NWC", "WIO", "NWC"), (2, 11, 3), (3, 3, 4), dict(window_strides=(2,), padding="SAME")),
    "3d": (("NDHWC", "DHWIO", "NDHWC"), (2, 5, 6, 4, 2), (2, 1, 3, 2, 3),
           dict(window_strides=(1, 2, 1), padding="SAME")),
}


@pytest.mark.parametrize("name", list(CONVS))
def test_conv_matches_original(name):
    layout, lhs_shape, rhs_shape, kwargs = CONVS[name]

    def conv(x, w):
        return lax.conv_general_dilated(x, w, dimension_numbers=layout, **kwargs)

    _check_rewrite(conv, _normal(lhs_shape, 0), _normal(rhs_shape, 1))


def test_im2col_function_matches_lax():
    x, w = _normal((2, 3, 9, 8)), _normal((5, 3, 3, 3), 1)
    kwargs = dict(window_strides=(2, 1), padding="SAME", rhs_dilation=(1, 2), dimension_numbers=NCHW,
                  precision=lax.Precision.HIGHEST)
    _assert_close(*jax.jit(lambda x, w: (conv_general_dilated_im2col(x, w, **kwargs),
                                         lax.conv_general_dilated(x, w, **kwargs)))(x, w))


def test_precision_and_preferred_element_type_reach_the_matmul():
    x, w = _normal((2, 6, 6, 3), dtype=jnp.bfloat16), _normal((3, 3, 3, 4), 1, dtype=jnp.bfloat16)

    def conv(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC,
                                        precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)

    jaxpr = jax.make_jaxpr(rewrite_convs(conv))(x, w).jaxpr
    (dot,) = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    assert dot.params["preferred_element_type"] == jnp.float32
    assert dot.params["precision"] == (lax.Precision.HIGHEST, lax.Precision.HIGHEST)


@pytest.mark.parametrize("groups", [1, 3])  # one matmul; depthwise (multiply-adds)
@pytest.mark.parametrize("preferred", [None, jnp.float32])
def test_bfloat16_convs_match_the_original(groups, preferred):
    x, w = _normal((2, 6, 6, 3), dtype=jnp.bfloat16), _normal((3, 3, 3 // groups, 6), 1, dtype=jnp.bfloat16)

    def conv(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC, feature_group_count=groups,
                                        preferred_element_type=preferred)

    out, expected = jax.jit(lambda x, w: (rewrite_convs(conv)(x, w), conv(x, w)))(x, w)
    assert out.dtype == expected.dtype == (preferred or jnp.bfloat16)
    out, expected = np.asarray(out, np.float32), np.asarray(expected, np.float32)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-2 * np.abs(expected).max())


@pytest.mark.parametrize("window, strides, padding", [  # nnx.max_pool((2, 2)): the ties test below
    ((1, 3, 3, 1), (1, 1, 1, 1), "SAME"),  # overlapping windows, -inf padding
    ((1, 3, 2, 1), (1, 2, 1, 1), ((0, 0), (1, 0), (0, 1), (0, 0))),
])
def test_max_pool_matches_original(window, strides, padding):

    def pool(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, window, strides, padding)

    _check_rewrite(pool, _normal((2, 7, 9, 3)))


def test_max_pool_ties_send_the_gradient_to_the_first_maximum_as_xla():
    """nnx.max_pool((2, 2)) on an odd input size (a row and column left out), with many ties in a window:
    the same maxima and the same gradient, to the bit, and no slow primitive left."""
    x = np.round(np.random.default_rng(0).standard_normal((2, 7, 9, 3)), 0).astype(np.float32)
    dy = np.broadcast_to(np.arange(1.0, 13.0, dtype=np.float32).reshape(1, 3, 4, 1), (2, 3, 4, 3))  # one per window

    def value_and_grad(f, x):
        y, back = jax.vjp(f, x)
        return y, back(dy)[0]

    pool = rewrite_convs(_pool_2x2)
    (y, dx), (y_xla, dx_xla) = jax.jit(lambda x: [value_and_grad(f, x) for f in (pool, _pool_2x2)])(x)
    np.testing.assert_array_equal(y, y_xla)
    np.testing.assert_array_equal(dx, dx_xla)
    assert not _primitives(jax.make_jaxpr(jax.grad(lambda x: pool(x).sum()))(x).jaxpr) & SLOW_PRIMITIVES


def test_max_pool_propagates_nan():
    x = np.random.default_rng(0).standard_normal((1, 4, 4, 1)).astype(np.float32)
    x[0, 1, 3, 0] = np.nan
    out = jax.jit(lambda x: max_pool_slices(x, (1, 2, 2, 1), (1, 2, 2, 1), ((0, 0),) * 4))(x)
    assert np.isnan(out[0, 0, 1, 0]) and np.isfinite(np.delete(np.asarray(out).ravel(), 1)).all()


def test_max_pool_false_keeps_reduce_window():
    jaxpr = jax.make_jaxpr(rewrite_convs(_pool_2x2, max_pool=False))(_normal((1, 4, 4, 1))).jaxpr
    assert "reduce_window_max" in _primitives(jaxpr)


class _Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(3, 8, (3, 3), padding="SAME", rngs=rngs)
        self.conv2 = nnx.Conv(8, 8, (2, 2), strides=2, padding="VALID", feature_group_count=2, rngs=rngs)
        self.linear = nnx.Linear(8, 4, rngs=rngs)

    def __call__(self, x):  # (B, 9, 9, 3) -> (B, 4)
        x = nnx.max_pool(jax.nn.relu(self.conv1(x)), (2, 2), (1, 1))  # (B, 8, 8, 8)
        x = remat.call(lambda conv, x: jax.nn.gelu(conv(x)), self.conv2, x, mode="full")  # custom_vjp + checkpoint
        return self.linear(x.mean(axis=(1, 2)))


def test_nnx_model_loss_and_grads_through_jit():
    graphdef, params = nnx.split(_build(_Net))
    x, y = _normal((4, 9, 9, 3)), _normal((4, 4), 1)

    def loss(params, batch):
        return jnp.mean((nnx.merge(graphdef, params)(batch["x"]) - batch["y"]) ** 2)

    both = jax.jit(lambda params, batch: [jax.value_and_grad(f)(params, batch) for f in (rewrite_convs(loss), loss)])
    _assert_close(*both(params, {"x": x, "y": y}))
    grad_jaxpr = jax.make_jaxpr(jax.grad(rewrite_convs(loss)))(params, {"x": x, "y": y}).jaxpr
    assert not _primitives(grad_jaxpr) & SLOW_PRIMITIVES


def test_sub_jaxprs_of_control_flow_are_rewritten():
    def conv(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC)

    @jax.custom_jvp
    def custom(x, w):
        return conv(x, w)

    @custom.defjvp
    def _(primals, tangents):
        (x, w), (dx, dw) = primals, tangents
        return custom(x, w), conv(dx, w) + conv(x, dw)

    def f(x, w):
        x = jax.jit(conv)(x, w)
        x = jax.checkpoint(conv)(x, w)
        x = lax.cond(x.sum() > 0, conv, lambda x, w: -x, x, w)
        x = lax.scan(lambda c, _: (conv(c, w) * 0.5, None), x, None, length=2)[0]
        return custom(x, w)

    def loop(x, w):  # forward only: a while loop has no reverse-mode derivative
        return lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, conv(c[1], w) * 0.5), (0, x))[1]

    x, w = _normal((2, 5, 5, 3)), _normal((2, 2, 3, 3), 1, scale=0.3)  # 2x2: 4 slices a conv, quicker to compile
    _check_rewrite(f, x, w)
    _assert_close(*jax.jit(lambda x, w: (rewrite_convs(loop)(x, w), loop(x, w)))(x, w))  # one compile
    assert "conv_general_dilated" not in _primitives(jax.make_jaxpr(rewrite_convs(loop))(x, w).jaxpr)


def test_function_without_conv_is_unchanged():
    def mlp(params, x):
        h = jax.nn.gelu(x @ params["w1"])
        return jax.nn.log_softmax(lax.scan(lambda c, _: (jnp.tanh(c), None), h, None, length=2)[0] @ params["w2"])

    params, x = {"w1": _normal((5, 6)), "w2": _normal((6, 3), 1)}, _normal((4, 5), 2)
    assert str(jax.make_jaxpr(rewrite_convs(mlp))(params, x)) == str(jax.make_jaxpr(mlp)(params, x))
    np.testing.assert_array_equal(jax.jit(rewrite_convs(mlp))(params, x), jax.jit(mlp)(params, x))


def test_pytrees_static_leaves_kwargs_and_closures():
    w = _normal((3, 3, 3, 4), 1)

    def f(batch, *, layout, scale):  # dict in; static kwargs; a string and None out
        y = lax.conv_general_dilated(batch["x"], w, (1, 1), "VALID", dimension_numbers=layout) * scale
        return y.sum(), {"y": y, "name": layout[0], "nothing": None}

    def both(x):
        out, expected = (fn({"x": x}, layout=NHWC, scale=2.0) for fn in (rewrite_convs(f), f))
        assert out[1]["name"] == "NHWC" and out[1]["nothing"] is None  # static outputs come back as they are
        return (out[0], out[1]["y"]), (expected[0], expected[1]["y"])

    x = _normal((1, 5, 5, 3))
    _assert_close(*jax.jit(both)(x))

    # A kernel closed over from an outer trace (a grad tracer) is a constant of the inner jaxpr.
    def inner(w):
        return lambda x: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC)

    grads = jax.jit(lambda w: [jax.grad(lambda w: g(inner(w))(x).sum())(w) for g in (rewrite_convs, lambda fn: fn)])
    _assert_close(*grads(w))


def test_second_jitted_call_does_not_retrace():
    traces = []

    def f(x, w):
        traces.append(1)
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC).sum()

    step = jax.jit(jax.grad(rewrite_convs(f)))
    x, w = _normal((1, 5, 5, 3)), _normal((3, 3, 3, 2), 1)
    step(x, w)
    step(x + 1, w)
    assert len(traces) == 1


def test_empty_output_and_base_dilation_fall_back_to_the_original():
    def empty(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=NHWC)

    def dilated(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 1, 1, 1), "VALID", base_dilation=(1, 2, 2, 1))

    x, w = _normal((1, 2, 2, 1)), _normal((3, 3, 1, 1), 1)
    assert rewrite_convs(empty)(x, w).shape == (1, 0, 0, 1)
    x = _normal((1, 3, 3, 1))
    np.testing.assert_array_equal(rewrite_convs(dilated)(x), dilated(x))


class _StatefulNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.conv = nnx.Conv(3, 4, (3, 3), rngs=rngs)
        self.norm = nnx.BatchNorm(4, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.dropout(self.norm(self.conv(x)))


def test_nnx_objects_as_arguments_keep_their_updates():
    def loss(model, x):
        return jnp.mean(model(x) ** 2)

    @nnx.jit
    def both(original, rewritten, x):  # BatchNorm's statistics and Dropout's RNG counter change
        return nnx.value_and_grad(loss)(original, x), nnx.value_and_grad(rewrite_convs(loss))(rewritten, x)

    def state(module):  # as arrays: key data for the RNG key
        return [jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
                for x in jax.tree.leaves(nnx.state(module))]

    original, rewritten = _build(_StatefulNet), _build(_StatefulNet)
    before = state(original)
    expected, actual = both(original, rewritten, _normal((2, 6, 6, 3)))
    _assert_close(actual, expected)
    _assert_close(state(rewritten), state(original))
    assert any((np.asarray(a) != np.asarray(b)).any() for a, b in zip(state(original), before))


# Trained through the rewrite against without it, per compute dtype (parameters stay float32): float32
# and float16 within TOL; bfloat16 (8 bits of mantissa, its own rounding 2**-9 = 2e-3) within BF16_TOL, as
# its activations round in another order (measured 9e-6 on this test's model after its 8 Adam steps).
TRAINED_TOL = {"fp32": TOL, "fp16": TOL, "bf16": 1e-2}


class _PoolNet(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(1, 4, (3, 3), padding="VALID", rngs=rngs)
        self.out = nnx.Linear(3 * 3 * 4, 3, rngs=rngs)

    def __call__(self, x):  # (B, 8, 8, 1) -> (B, 3)
        h = nnx.max_pool(nnx.relu(self.conv(x)), (2, 2), strides=(2, 2))  # (B, 3, 3, 4)
        return self.out(h.reshape(h.shape[0], -1))


def _xent(model, batch, key):
    logits = model(batch["x"]).astype(jnp.float32)
    return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, batch["y"][:, None], -1)[:, 0]), {}


POOL_NET_REWRITES = "1 convolutions as im2col + matmul, 1 max pools as strided maxima"


@pytest.mark.parametrize("precision,pixels", [("fp32", True), ("bf16", False), ("fp16", False)])
def test_fit_rewrites_a_conv_models_loss_on_the_cpu_and_trains_to_the_same_weights(precision, pixels, capsys):
    """With `pixels`, (B, 8, 8) uint8 images that `standardize_images` makes (B, 8, 8, 1) float32 inside
    the step: the loss is traced on the batch it receives (traced on the stored batch, the rewrite was
    skipped)."""
    from conftest import leaves_close

    from jaxtrain import TrainConfig, fit
    from jaxtrain.data import standardize_images

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (64, 8, 8)).astype(np.uint8) if pixels else rng.normal(size=(64, 8, 8, 1))
    x = x if pixels else x.astype(np.float32)
    data = {"x": x, "y": rng.integers(0, 3, 64).astype(np.int32)}
    preprocess = standardize_images("x", 0.5, 0.25) if pixels else None
    config = {r: TrainConfig(epochs=2, batch_size=16, rewrite=r, step_form="scan", precision=precision)
              for r in ("auto", "off")}
    results = {r: fit(_build(_PoolNet), _xent, data, data, config[r], preprocess=preprocess, verbosity="silent")
               for r in ("auto", "off")}
    assert results["auto"].summary["rewrites"] == POOL_NET_REWRITES
    assert results["auto"].summary["rewrite_declined"] is None and "rewritten" not in capsys.readouterr().err
    assert results["off"].summary["rewrites"] is None
    tol = TRAINED_TOL[precision]
    assert leaves_close(results["auto"].state.params, results["off"].state.params) <= tol
    assert results["auto"].history[-1]["val_loss"] == pytest.approx(results["off"].history[-1]["val_loss"], rel=tol)


def test_a_rewrite_whose_trace_fails_is_declined_with_the_reason():
    from jaxtrain._src.rewrite import rewrite_loss

    model, batch = _build(_PoolNet), {"x": jax.ShapeDtypeStruct((4, 8, 8, 1), jnp.float32),
                                      "y": jax.ShapeDtypeStruct((4,), jnp.int32)}

    def broken(batch, key):
        raise ZeroDivisionError("no pixels\nsecond line")

    def loss(model, batch, key):
        return _xent(model, {"x": batch["x"][..., 0], "y": batch["y"]}, key)  # a 3-D input to a 2-D conv

    for fn, transform, why in [(_xent, broken, "preprocess/augment did not trace on a batch (ZeroDivisionError: "
                                                "no pixels)"),
                               (loss, None, "the loss did not trace on the batch it trains on (")]:
        rewrite = rewrite_loss(fn, model, batch, "auto", platform="cpu", transform=transform)
        assert rewrite.loss is fn and rewrite.rewrites is None and not rewrite.clean
        assert rewrite.declined.startswith(why) and "\n" not in rewrite.declined
    for setting, platform in [("off", "cpu"), ("auto", "gpu")]:  # not asked for: nothing declined
        assert rewrite_loss(loss, model, batch, setting, platform=platform).declined is None
    assert rewrite_loss(_xent, model, batch, "on", platform="gpu").rewrites == POOL_NET_REWRITES


def test_a_declined_rewrite_is_one_note_and_in_the_summary(monkeypatch, capsys):
    from jaxtrain import TrainConfig, fit
    from jaxtrain._src import program
    from jaxtrain._src.report import final_block
    from jaxtrain._src.rewrite import LossRewrite

    monkeypatch.setattr(program, "rewrite_loss", lambda loss, *a, **k: LossRewrite(loss, declined="it would not"))
    data = {"x": np.zeros((8, 3), np.float32), "y": np.zeros(8, np.int32)}  # the plumbing alone: a small model
    result = fit(nnx.Linear(3, 3, rngs=nnx.Rngs(0)), lambda m, b, k: _xent(lambda x: m(x), b, k), data, None,
                 TrainConfig(epochs=1, batch_size=8, step_form="step"), verbosity="silent")
    notes = [line for line in capsys.readouterr().err.splitlines() if "rewrite" in line]
    assert notes == ["note: the loss was not rewritten for XLA:CPU (TrainConfig.rewrite): it would not; it trains as "
                     "written, any convolution or max pool in it at XLA:CPU's slower speed "
                     "(TrainConfig(rewrite=\"off\") skips the attempt)"]
    assert result.summary["rewrites"] is None and result.summary["rewrite_declined"] == "it would not"
    assert "  Not Rewritten:        it would not" in final_block(result.summary).splitlines()
