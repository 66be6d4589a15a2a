"""Rematerialisation: recompute a block's activations in the backward pass instead of keeping them.

A model calls each of its repeated blocks through `call`; `mode` says what the forward pass keeps
for the backward pass of that block:

- `"none"`: everything (a plain call).
- `"blocks"`: the outputs of matmuls with no batch dimensions — the weight matmuls, `x @ W` —
  (`jax.checkpoint_policies.dots_with_no_batch_dims_saveable`); the rest (attention scores and
  probabilities, LayerNorm, GELU, im2col patches, pooling) is recomputed from them. The expensive
  work is not redone and the large cheap tensors are not kept: in a GPT block the (B, nh, T, T)
  attention tensors, which grow with T², are recomputed.
- `"full"`: only the block's inputs (`nothing_saveable`); the whole block runs again in the
  backward pass.

Where it pays (`jaxtrain bench remat`): on char-gpt at block 256, `blocks` keeps 0.35× the
temporaries of `none` for about +8% step time, and `full` saves no more; on the mnist CNN, whose
memory is the im2col patches each stage's backward needs anyway, `blocks` costs memory and `full`
saves 16%.

A block runs under `jax.checkpoint` inside a `custom_vjp` that makes its recomputation wait for the
backward pass to reach it (see `_checkpoint_in_order`: without that, XLA:CPU recomputes every block
early and keeps it all). A block may be an NNX module — its variables, and any updates it makes to
them, pass through — and arguments may be arrays, keys or None. In your own model:

    class Net(nnx.Module):
        def __init__(self, ..., remat: str = "none"):
            self.remat = jaxtrain.remat.check_mode(remat)
            self.blocks = nnx.List([Block(...) for _ in range(n)])

        def __call__(self, x):
            for block in self.blocks:
                x = jaxtrain.remat.call(block, x, mode=self.remat)
            return x

A function of several modules works too: `call(lambda conv, x: pool(relu(conv(x))), self.conv, x,
mode=...)`. Wrapping the whole loss in `jax.checkpoint` saves nothing: its backward pass
recomputes the whole forward pass with every residual live at once (`jaxtrain bench remat`,
docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any, Callable, Literal, get_args

import jax
import jax.numpy as jnp
from flax import nnx

from jaxtrain._src.errors import ConfigError
from jaxtrain._src.state import split_params

Mode = Literal["none", "blocks", "full"]
MODES: tuple[str, ...] = get_args(Mode)


def check_mode(mode: str) -> Mode:
    """`mode` if it is one of MODES; ConfigError (one line) otherwise."""
    if mode not in MODES:
        raise ConfigError(f"remat={mode!r} is not a rematerialisation mode; choose one of: {', '.join(MODES)}")
    return mode  # type: ignore[return-value]  # one of MODES: checked just above


def policy(mode: Mode) -> Callable[..., bool]:
    """The `jax.checkpoint` policy of `mode` ("blocks" or "full"): which intermediates are kept."""
    check_mode(mode)
    if mode == "none":
        raise ConfigError("remat='none' has no checkpoint policy: it does not rematerialise")
    if mode == "blocks":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    return jax.checkpoint_policies.nothing_saveable


def call(fn: Callable[..., Any], *args: Any, mode: Mode) -> Any:
    """`fn(*args)`, its intermediates recomputed in the backward pass as `mode` says.

    Args:
      fn: an NNX module (called as `fn(*args)`) or a function; NNX modules among `args` work too.
      *args: NNX modules and pytrees of arrays (keys and None included).
      mode: "none" (a plain call), "blocks" or "full" (see the module docstring).

    Returns:
      What `fn(*args)` returns. Reverse-mode differentiation only (`jax.grad`, `jax.vjp`) when
      mode is not "none".
    """
    check_mode(mode)
    if mode == "none":
        return fn(*args)
    if isinstance(fn, nnx.Module):
        fn, args = _call_module, (fn, *args)
    is_module = [isinstance(a, nnx.Module) for a in args]
    modules = tuple(a for a, m in zip(args, is_module) if m)
    graphdef, params, rest = split_params(modules)

    def pure(params: nnx.State, rest: nnx.State, others: tuple) -> tuple[Any, nnx.State]:
        merged_modules = nnx.merge(graphdef, params, rest, copy=True)
        merged, plain = iter(merged_modules), iter(others)
        new_modules = tuple(next(merged) if m else next(plain) for m in is_module)
        out = fn(*new_modules)
        return out, split_params(tuple(a for a, m in zip(new_modules, is_module) if m))[2]

    out, new_rest = _checkpoint_in_order(pure, policy(mode))(
        params, rest, tuple(a for a, m in zip(args, is_module) if not m))
    nnx.update(modules, new_rest)  # e.g. batch-norm statistics, RNG counters the block advanced
    return out


def _call_module(module: nnx.Module, *args: Any) -> Any:
    return module(*args)


def _checkpoint_in_order(f: Callable[..., Any], policy: Callable[..., bool]) -> Callable[..., Any]:
    """`jax.checkpoint(f, policy=policy)` whose recomputation waits for the output's cotangent.

    `jax.checkpoint` keeps the recomputation apart from the forward pass with optimization
    barriers, which XLA:CPU removes before scheduling; its scheduler then runs every block's
    recomputation right after the forward pass and keeps it all alive, so nothing is saved
    (measured: `jaxtrain bench remat`). Here the saved residuals pass through `r + 0·c`, c an element of
    the incoming cotangent: the same values (exactly, for finite c), but computed only once the
    backward pass reaches this block, on any backend and with any scheduler.
    """

    @jax.custom_vjp
    def g(*args: Any) -> Any:
        return f(*args)

    def fwd(*args: Any) -> tuple[Any, Any]:
        return jax.vjp(jax.checkpoint(f, policy=policy), *args)

    def bwd(vjp: Any, cotangent: Any) -> Any:
        return _after(vjp, cotangent)(cotangent)

    g.defvjp(fwd, bwd)
    return g


def _after(tree: Any, cotangent: Any) -> Any:
    """`tree` with each floating leaf made to depend on a floating leaf of `cotangent` (values unchanged)."""
    ct = [c for c in jax.tree.leaves(cotangent) if jnp.issubdtype(c.dtype, jnp.floating)]
    if not ct:
        return tree
    zero = ct[0].ravel()[0] * 0  # XLA does not fold x·0 for floats (NaN, Inf), so the dependency stays

    def tie(r: Any) -> Any:
        return r + zero.astype(r.dtype) if jnp.issubdtype(r.dtype, jnp.floating) else r

    return jax.tree.map(tie, tree)
