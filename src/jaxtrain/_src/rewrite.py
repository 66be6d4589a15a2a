"""Rewrite the operations XLA:CPU runs slowly into ones it runs at full speed, inside a loop body too.

XLA:CPU runs `lax.conv_general_dilated` about 9-14× slower inside a `lax.scan`/while body than in
a plain jitted function (jax-ml/jax#12868), and jaxtrain fuses K steps into one `lax.scan`.
`rewrite_convs(loss)` traces `loss` to a jaxpr and evaluates it with an interpreter that replaces
every convolution by im2col — padding, one strided slice per kernel offset, concatenation — and
one `dot_general`, which XLA runs at full speed anywhere. It acts before differentiation:

    grads = jax.grad(rewrite_convs(loss))(params, batch)

so the backward pass is slices, pads and matmuls too, never a convolution. With `max_pool=True`
(the default) `reduce_window` max (`nnx.max_pool`) becomes a running maximum over strided slices:
its gradient is then selects, not XLA:CPU's `select_and_scatter_add`, which is slow in or out of a
loop (fwd+grad of a 2×2 pool of (128, 26, 26, 32): about 50 ms against 2 ms). On Keras's MNIST
convnet (`examples/conv_rewrite.py`) a rolled scan of rewritten steps runs 2-3× faster than the
plain jitted step and than the fully unrolled scan.

What is rewritten and what is not:

- Every `conv_general_dilated`, in any number of spatial dimensions (1-D, 2-D, 3-D), with any
  dimension numbers (NHWC/HWIO, NCHW/OIHW, ...), window strides, padding (negative too),
  lhs dilation (transposed convolution: interior padding, so the matmul also multiplies the
  inserted zeros), rhs dilation, feature groups (depthwise: a multiply-add over the kernel
  offsets instead of a matmul, accumulated in float32 at least) and batch groups. `precision` and
  `preferred_element_type` pass to the `dot_general`. A convolution with an empty output is
  left as it is (nothing to compute).
- `reduce_window_max` with base dilation (never produced by `nnx.max_pool`) or of a
  non-floating dtype is left as it is; so are the other windowed reductions (`avg_pool`'s
  `reduce_window_sum` with its gradient takes 2-5 ms on the shape above, in a scan or not).
- Inside `jit`, `closed_call`, `checkpoint`/`remat`, `cond`, `while`, `scan`, `custom_jvp`
  (primal and JVP rule) and `custom_vjp` (primal, forward and backward rule) the body is
  rewritten too; any other primitive holding a jaxpr (e.g. `custom_linear_solve`) runs as
  it is, convolutions inside included. Equations with nothing to rewrite are bound unchanged.

`fn` takes pytrees of arrays; their other leaves (strings, Python numbers, None) are static. NNX
objects (modules, `nnx.Rngs`) may be among the arguments: they pass as their state, and what `fn`
changes in them (batch-norm statistics, RNG counters) is written back. `fn` is traced again on
each call, so call the rewritten function under `jax.jit` (as a step function is).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax
from jax.extend import core as jex_core
from jax.extend import linear_util as lu
from jax.extend import source_info_util
from jax.extend.core import primitives as prims

from jaxtrain._src.slow_ops import count_primitives

Rule = Callable[..., Any]


def rewrite_convs(fn: Callable[..., Any], *, max_pool: bool = True) -> Callable[..., Any]:
    """`fn` with every convolution computed as im2col + one matmul (and max pooling as slices).

    Args:
      fn: a function of pytrees of arrays and NNX objects; non-array leaves of its arguments are
        static, and its changes to NNX objects are written back.
      max_pool: also rewrite `reduce_window` max (max pooling) as a running maximum over strided
        slices, whose gradient avoids `select_and_scatter_add`.

    Returns:
      A function with `fn`'s signature and outputs (equal within float rounding), whose jaxpr,
      and its gradient's, contain no `conv_general_dilated` (but for what the module docstring
      says is left as it is).

    Example:
      >>> step_loss = rewrite_convs(loss)  # then jax.value_and_grad(step_loss) inside the step
    """
    rules: dict[jex_core.Primitive, Rule] = {prims.conv_general_dilated_p: _conv_rule}
    if max_pool:
        rules[prims.reduce_window_max_p] = _max_pool_rule

    @functools.wraps(fn)
    def rewritten(*args: Any, **kwargs: Any) -> Any:
        leaves, in_tree = jax.tree.flatten((args, kwargs), is_leaf=_is_nnx)
        is_object = [_is_nnx(x) for x in leaves]
        if not any(is_object):
            return _call_rewritten(fn, rules, *args, **kwargs)
        # NNX objects (modules, Rngs) pass as their state and are merged inside; what `fn` changes
        # in them (batch-norm statistics, RNG counters) is written back, as `jaxtrain.remat.call` does.
        objects = tuple(x for x, o in zip(leaves, is_object) if o)
        graphdef, state = nnx.split(objects)

        def pure(state: nnx.State, others: list[Any]) -> tuple[Any, nnx.State]:
            objects = nnx.merge(graphdef, state, copy=True)
            merged, plain = iter(objects), iter(others)
            new_leaves = [next(merged) if o else next(plain) for o in is_object]
            a, kw = jax.tree.unflatten(in_tree, new_leaves)
            out = fn(*a, **kw)
            return out, nnx.state(tuple(x for x, o in zip(new_leaves, is_object) if o))

        out, new_state = _call_rewritten(pure, rules, state, [x for x, o in zip(leaves, is_object) if not o])
        nnx.update(objects, new_state)
        return out

    return rewritten


def conv_general_dilated_im2col(
    lhs: jax.Array,
    rhs: jax.Array,
    window_strides: Sequence[int],
    padding: str | Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    dimension_numbers: Any = None,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
    precision: lax.PrecisionLike = None,
    preferred_element_type: Any = None,
) -> jax.Array:
    """`lax.conv_general_dilated` (same arguments, same result) computed by im2col + `dot_general`.

    With the input in (N, *S, C) order and the kernel in (*k, Cg, F) order (both transposed there
    from `dimension_numbers` when needed), after dilating and padding the input:

        cols[n, *o, (j, c)] = x[n, *(o·s + j·r), c]         for every kernel offset j
        y[n, *o, f] = Σ_(j, c) cols[n, *o, (j, c)] · w[j, c, f]

    per feature group (and batch group).

    Args:
      lhs, rhs, ...: as `lax.conv_general_dilated`.

    Returns:
      The convolution, in `dimension_numbers`' output layout.
    """
    n = lhs.ndim - 2
    dnums = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    lhs_dilation = tuple(lhs_dilation) if lhs_dilation is not None else (1,) * n
    rhs_dilation = tuple(rhs_dilation) if rhs_dilation is not None else (1,) * n
    if isinstance(padding, str):  # as lax.conv_general_dilated resolves it
        if any(d != 1 for d in lhs_dilation):
            raise ValueError("string padding with lhs_dilation: give explicit (low, high) pairs")
        spatial = [lhs.shape[d] for d in dnums.lhs_spec[2:]]
        kernel = [(rhs.shape[d] - 1) * r + 1 for d, r in zip(dnums.rhs_spec[2:], rhs_dilation)]
        padding = lax.padtype_to_pads(spatial, kernel, window_strides, padding)
    return _im2col_conv(
        lhs, rhs, window_strides=tuple(window_strides), padding=tuple((lo, hi) for lo, hi in padding),
        lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation, dimension_numbers=dnums,
        feature_group_count=feature_group_count, batch_group_count=batch_group_count,
        precision=precision, preferred_element_type=preferred_element_type)


def max_pool_slices(
    x: jax.Array,
    window_dimensions: Sequence[int],
    window_strides: Sequence[int],
    padding: Sequence[tuple[int, int]],
    window_dilation: Sequence[int] | None = None,
) -> jax.Array:
    """`lax.reduce_window(x, -inf, lax.max, ...)` as a running maximum over strided slices.

    The first maximum of each window (in row-major window order) is selected, as XLA's
    `select_and_scatter_add` does, so the gradient is the same; NaN propagates. The gradient is
    selects and pads (elementwise), not a scatter.

    Args:
      x: any shape; a floating dtype.
      window_dimensions, window_strides: one per dimension of `x`.
      padding: (low, high) per dimension; padded cells are -inf.
      window_dilation: one per dimension of `x`; default 1.

    Returns:
      The windowed maxima.
    """
    window_dilation = tuple(window_dilation) if window_dilation is not None else (1,) * x.ndim
    if any(lo or hi for lo, hi in padding):
        x = lax.pad(x, jnp.array(-jnp.inf, x.dtype), [(lo, hi, 0) for lo, hi in padding])
    dims = zip(x.shape, window_dimensions, window_dilation, window_strides)
    out = [(s - (w - 1) * d - 1) // st + 1 for s, w, d, st in dims]
    best = None
    for offsets in itertools.product(*map(range, window_dimensions)):
        start = [j * d for j, d in zip(offsets, window_dilation)]
        limit = [b + (o - 1) * st + 1 for b, o, st in zip(start, out, window_strides)]
        window = lax.slice(x, start, limit, tuple(window_strides))
        if best is None:
            best = window
        else:
            take = lax.bitwise_or(lax.gt(window, best), lax.ne(window, window))  # later wins only if larger, or NaN
            best = lax.select(take, window, best)
    assert best is not None, "a pooling window has at least one element"
    return best


# --- the per-equation rules: return None to keep the equation as it is -----------------------


def _conv_rule(eqn: jex_core.JaxprEqn, lhs: jax.Array, rhs: jax.Array) -> jax.Array | None:
    out = eqn.outvars[0].aval
    if not isinstance(out, jax.core.ShapedArray) or math.prod(out.shape) == 0:
        return None
    params = {k: v for k, v in eqn.params.items() if k != "out_sharding"}
    return _im2col_conv(lhs, rhs, **params)


def _max_pool_rule(eqn: jex_core.JaxprEqn, x: jax.Array) -> jax.Array | None:
    p = eqn.params
    aval, out = eqn.invars[0].aval, eqn.outvars[0].aval
    if not isinstance(aval, jax.core.ShapedArray) or not isinstance(out, jax.core.ShapedArray):
        return None
    if any(d != 1 for d in p["base_dilation"]) or not jnp.issubdtype(aval.dtype, jnp.floating):
        return None
    if math.prod(out.shape) == 0:
        return None
    return max_pool_slices(x, p["window_dimensions"], p["window_strides"], p["padding"], p["window_dilation"])


def _transpose(x: jax.Array, perm: Sequence[int]) -> jax.Array:
    return x if tuple(perm) == tuple(range(x.ndim)) else lax.transpose(x, tuple(perm))


def _im2col_conv(lhs: jax.Array, rhs: jax.Array, *, window_strides: tuple[int, ...],
                 padding: tuple[tuple[int, int], ...], lhs_dilation: tuple[int, ...],
                 rhs_dilation: tuple[int, ...], dimension_numbers: Any, feature_group_count: int,
                 batch_group_count: int, precision: Any, preferred_element_type: Any) -> jax.Array:
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    n = len(lhs_spec) - 2
    x = _transpose(lhs, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))  # (N, *S, C)
    w = _transpose(rhs, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0]))  # (*k, Cg, F)
    N, C = x.shape[0], x.shape[-1]
    k, Cg, F = w.shape[:n], w.shape[n], w.shape[n + 1]
    G, B = feature_group_count, batch_group_count
    K = math.prod(k)

    # lhs dilation is interior padding; XLA pads after dilating, as lax.pad does (negative too).
    config = [(0, 0, 0), *[(lo, hi, d - 1) for (lo, hi), d in zip(padding, lhs_dilation)], (0, 0, 0)]
    if any(any(c) for c in config):
        x = lax.pad(x, jnp.zeros((), x.dtype), config)  # (N, *S', C)
    dims = zip(x.shape[1:-1], k, rhs_dilation, window_strides)
    o = [(s - (kk - 1) * r - 1) // st + 1 for s, kk, r, st in dims]  # output spatial sizes
    M = N * math.prod(o)
    cols = []
    for offsets in itertools.product(*map(range, k)):  # row-major, the kernel's (*k) order
        start = [0, *(j * r for j, r in zip(offsets, rhs_dilation)), 0]
        limit = [N, *(b + (oo - 1) * st + 1 for b, oo, st in zip(start[1:-1], o, window_strides)), C]
        cols.append(lax.slice(x, start, limit, (1, *window_strides, 1)))  # (N, *o, C)

    dot = functools.partial(lax.dot_general, precision=precision, preferred_element_type=preferred_element_type)
    if G == 1 and B == 1:
        patches = cols[0] if K == 1 else lax.concatenate(cols, n + 1)  # (N, *o, K·C), (j, c) order
        # One 2-D matmul: XLA:CPU compiles the 2-D form's weight gradient (colsᵀ dy) to its fast
        # matmul path (see models/cnn.py).
        y = dot(patches.reshape(M, K * C), w.reshape(K * C, F), (((1,), (0,)), ((), ())))  # (M, F)
        y = y.reshape(N, *o, F)
    elif B > 1:  # output feature group b reads batch group b (batch split group-major)
        patches = (cols[0] if K == 1 else lax.concatenate(cols, n + 1)).reshape(B, M // B, K * C)
        y = dot(patches, w.reshape(K * C, B, F // B), (((2,), (0,)), ((0,), (1,))))  # (B, M/B, F/B)
        y = _transpose(y, (1, 0, 2)).reshape(N // B, *o, F)
    elif Cg == 1:  # depthwise (channel multiplier F/G): a multiply-add per kernel offset, no matmul
        dtype = x.dtype if preferred_element_type is None else jnp.dtype(preferred_element_type)
        acc = jnp.promote_types(dtype, jnp.float32) if jnp.issubdtype(dtype, jnp.floating) else dtype  # as a matmul
        wk = w.reshape(K, G, F // G).astype(acc)  # (K, G, F/G)
        y = cols[0].astype(acc)[..., None] * wk[0]  # (N, *o, G, F/G)
        for j in range(1, K):
            y = y + cols[j].astype(acc)[..., None] * wk[j]
        y = y.astype(dtype).reshape(N, *o, F)
    else:  # G groups of Cg input channels: a matmul batched over groups
        patches = lax.concatenate([c.reshape(M, 1, G, Cg) for c in cols], 1)  # (M, K, G, Cg)
        y = dot(patches, w.reshape(K, Cg, G, F // G), (((1, 3), (0, 1)), ((2,), (2,))))  # (G, M, F/G)
        y = _transpose(y, (1, 0, 2)).reshape(N, *o, F)

    # y is (N, *o, F); out_spec names where each of those goes.
    perm = [0] * (n + 2)
    perm[out_spec[0]], perm[out_spec[1]] = 0, n + 1
    for i, d in enumerate(out_spec[2:]):
        perm[d] = i + 1
    return _transpose(y, perm)


# --- the interpreter -----------------------------------------------------------------------


def _is_nnx(leaf: Any) -> bool:
    return isinstance(leaf, nnx.Pytree)


def _is_dynamic(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic))


def _call_rewritten(fn: Callable[..., Any], rules: dict[jex_core.Primitive, Rule], *args: Any, **kwargs: Any) -> Any:
    """Trace `fn(*args, **kwargs)` (array leaves abstract, the rest static) and evaluate it rewritten."""
    leaves, in_tree = jax.tree.flatten((args, kwargs))
    dynamic = [_is_dynamic(x) for x in leaves]
    out_static: list[Any] = []  # filled while tracing: the output's tree and its non-array leaves

    def flat_fn(*dyn: Any) -> list[Any]:
        it = iter(dyn)
        a, kw = jax.tree.unflatten(in_tree, [next(it) if d else x for x, d in zip(leaves, dynamic)])
        out_leaves, out_tree = jax.tree.flatten(fn(*a, **kw))
        out_static[:] = [out_tree, [None if _is_dynamic(x) else x for x in out_leaves]]
        return [x for x in out_leaves if _is_dynamic(x)]

    dyn_args = [x for x, d in zip(leaves, dynamic) if d]
    closed = jax.make_jaxpr(flat_fn)(*dyn_args)
    out = iter(_Rewriter(rules).eval_jaxpr(closed.jaxpr, closed.consts, dyn_args))
    out_tree, static = out_static
    return jax.tree.unflatten(out_tree, [next(out) if s is None else s for s in static])


class _Rewriter:
    """Evaluates jaxprs, applying `rules` and rewriting the sub-jaxprs of higher-order primitives."""

    def __init__(self, rules: dict[jex_core.Primitive, Rule]):
        self.rules = rules
        self._has_target: dict[int, bool] = {}
        self._closed: dict[int, jex_core.ClosedJaxpr] = {}
        self._keep: list[Any] = []  # keeps the memos' keys (ids) alive

    def eval_jaxpr(self, jaxpr: jex_core.Jaxpr, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        env: dict[Any, Any] = {}

        def read(v: Any) -> Any:
            return v.val if isinstance(v, jex_core.Literal) else env[v]

        env.update(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, args))
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
            with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack), eqn.ctx.manager:
                ans = self.eval_eqn(eqn, invals)
            if eqn.primitive.multiple_results:
                env.update(zip(eqn.outvars, ans))
            else:
                env[eqn.outvars[0]] = ans
        return [read(v) for v in jaxpr.outvars]

    def eval_eqn(self, eqn: jex_core.JaxprEqn, invals: list[Any]) -> Any:
        prim, params = eqn.primitive, eqn.params
        rule = self.rules.get(prim)
        if rule is not None:
            ans = rule(eqn, *invals)
            if ans is not None:
                return ans
        elif self.eqn_has_target(eqn):
            if prim is prims.custom_jvp_call_p:
                params = self._custom_jvp_params(params)
            elif prim is prims.custom_vjp_call_p:
                params = self._custom_vjp_params(params)
            else:
                params = {k: self._param(v) for k, v in params.items()}
        return prim.bind(*invals, **prim.get_bind_params(params))

    # Which jaxprs hold something to rewrite.

    def has_target(self, jaxpr: jex_core.Jaxpr) -> bool:
        key = id(jaxpr)
        if key not in self._has_target:
            self._keep.append(jaxpr)
            self._has_target[key] = any(e.primitive in self.rules or self.eqn_has_target(e) for e in jaxpr.eqns)
        return self._has_target[key]

    def eqn_has_target(self, eqn: jex_core.JaxprEqn) -> bool:
        return any(self.has_target(j) for j in jex_core.jaxprs_in_params(eqn.params))

    # Rewritten sub-jaxprs: same inputs and outputs (avals), traced again through this interpreter.

    def closed(self, closed: jex_core.ClosedJaxpr) -> jex_core.ClosedJaxpr:
        key = id(closed)
        if key not in self._closed:
            self._keep.append(closed)
            self._closed[key] = self._retrace(closed) if self.has_target(closed.jaxpr) else closed
        return self._closed[key]

    def _retrace(self, closed: jex_core.ClosedJaxpr) -> jex_core.ClosedJaxpr:
        if not all(isinstance(a, jax.core.ShapedArray) for a in closed.in_avals):
            return closed  # tokens or refs: keep it as it is
        specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in closed.in_avals]
        new = jax.make_jaxpr(lambda *xs: self.eval_jaxpr(closed.jaxpr, closed.consts, xs))(*specs)
        if [(a.shape, a.dtype) for a in new.out_avals] != [(a.shape, a.dtype) for a in closed.out_avals]:
            return closed  # a rule changed a type: never expected, but then keep the original
        return new

    def _open(self, jaxpr: jex_core.Jaxpr) -> jex_core.Jaxpr:
        if jaxpr.constvars:
            return jaxpr
        new = self.closed(jex_core.ClosedJaxpr(jaxpr, ()))
        return jaxpr if new.consts else new.jaxpr  # an open jaxpr cannot take constants

    def _param(self, value: Any) -> Any:
        if isinstance(value, jex_core.ClosedJaxpr):
            return self.closed(value)
        if isinstance(value, jex_core.Jaxpr):
            return self._open(value)
        if isinstance(value, tuple) and value and all(isinstance(v, jex_core.ClosedJaxpr) for v in value):
            return tuple(self.closed(v) for v in value)  # cond's branches
        return value

    # custom_jvp / custom_vjp: the primal jaxpr and the rules, rewritten as they are produced.

    def _custom_jvp_params(self, params: dict[str, Any]) -> dict[str, Any]:
        jvp_jaxpr_fun = params["jvp_jaxpr_fun"]

        def rewritten_jvp(*zeros: Any) -> Any:
            jaxpr, consts, out_zeros = jvp_jaxpr_fun.call_wrapped(*zeros)
            new = self.closed(jex_core.ClosedJaxpr(jaxpr, consts))
            return new.jaxpr, new.consts, out_zeros

        return dict(params, call_jaxpr=self.closed(params["call_jaxpr"]),
                    jvp_jaxpr_fun=lu.wrap_init(rewritten_jvp, debug_info=jvp_jaxpr_fun.debug_info))

    def _custom_vjp_params(self, params: dict[str, Any]) -> dict[str, Any]:
        fwd_jaxpr_thunk, bwd = params["fwd_jaxpr_thunk"], params["bwd"]

        def rewritten_fwd(*nonzeros: Any) -> Any:
            jaxpr, consts = fwd_jaxpr_thunk.call_wrapped(*nonzeros)
            new = self.closed(jex_core.ClosedJaxpr(jaxpr, consts))
            return new.jaxpr, new.consts

        def rewritten_bwd(*args: Any) -> Any:  # residuals and cotangents -> input cotangents (Zero allowed)
            return _call_rewritten(lambda *a: list(bwd.call_wrapped(*a)), self.rules, *args)

        return dict(params, call_jaxpr=self.closed(params["call_jaxpr"]),
                    fwd_jaxpr_thunk=lu.wrap_init(rewritten_fwd, debug_info=fwd_jaxpr_thunk.debug_info),
                    bwd=lu.wrap_init(rewritten_bwd, debug_info=bwd.debug_info))


class LossRewrite(NamedTuple):
    """What `rewrite_loss` made of a loss.

    Attributes:
      loss: the loss to train: rewritten (`rewrite_convs`), or the user's own.
      rewrites: what was rewritten ("2 convolutions as im2col + matmul, ..."), or None.
      clean: the loss was traced and, as returned, holds neither convolutions nor max pools (so its
        step has none of the ops `slow_ops` names).
      declined: why a rewrite that the setting asked for did not happen (the trace failed), for one
        note and the run's summary; None when it happened, had nothing to do, or was not asked for.
    """

    loss: Callable[..., Any]
    rewrites: str | None = None
    clean: bool = False
    declined: str | None = None


def rewrite_loss(loss_fn: Callable[..., Any], model: nnx.Module, batch: Any, setting: str = "auto",
                 platform: str | None = None,
                 transform: Callable[[Any, jax.Array], Any] | None = None) -> LossRewrite:
    """The loss `fit` trains, with its convolutions and max pools rewritten (`rewrite_convs`) when
    `setting` is "on", or "auto" on the CPU (XLA:CPU's slow paths; off on other backends, where they
    were not measured slower) and the loss holds them; otherwise `loss_fn` itself.

    `batch` is a training batch as the data hold it (abstract shapes suffice) and `transform(batch,
    key)` what the step does to it before the loss (preprocess, then augment): the loss is traced on
    what it really receives, so a preprocess that changes the batch's shapes (a channel axis added)
    does not make the trace fail. A trace that fails all the same is a declined rewrite: the loss
    trains as written and `declined` says why."""
    if setting == "off" or (setting == "auto" and (platform or jax.default_backend()) != "cpu"):
        return LossRewrite(loss_fn)
    if batch is None:
        return LossRewrite(loss_fn, declined="the training data do not give the shapes of a batch before the run")
    key = jax.random.key(0)
    if transform is not None:
        try:
            batch = jax.eval_shape(transform, batch, key)
        except Exception as e:  # noqa: BLE001 - the user's preprocess or augment fails with its own error in the step
            return LossRewrite(loss_fn, declined=f"preprocess/augment did not trace on a batch ({_one_line(e)})")
    graphdef, state = nnx.split(model)
    try:
        jaxpr = jax.make_jaxpr(lambda s, b, k: loss_fn(nnx.merge(graphdef, s, copy=True), b, k))(state, batch, key)
    except Exception as e:  # noqa: BLE001 - a loss that does not trace here fails with its own error in the step
        return LossRewrite(loss_fn, declined=f"the loss did not trace on the batch it trains on ({_one_line(e)})")
    counts = count_primitives(jaxpr)
    convs, pools = counts.get("conv_general_dilated", 0), counts.get("reduce_window_max", 0)
    if not convs and not pools:
        return LossRewrite(loss_fn, clean=True)
    what = ", ".join(part for part in (f"{convs} convolutions as im2col + matmul" if convs else "",
                                       f"{pools} max pools as strided maxima" if pools else "") if part)
    return LossRewrite(rewrite_convs(loss_fn), what, True)


def _one_line(e: BaseException) -> str:
    """`TypeError: the first line of its message`, at most 200 characters."""
    lines = str(e).strip().splitlines()
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."
