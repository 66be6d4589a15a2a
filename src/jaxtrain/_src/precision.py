"""Mixed precision: a dtype policy and dynamic loss scaling.

The parameters and the optimizer state stay float32. Inside the train step the floating
parameters and floating inputs are cast to the compute dtype (bfloat16 or float16), so the
forward and the backward run in it; gradients come back float32 through the cast, and the loss
is float32. Flax's normalisation layers compute their statistics in float32; recipe models keep
their logits float32.

float16 overflows above 65504, so its gradients are taken of `loss * scale` and divided by the
scale afterwards (dynamic loss scaling, as `torch.amp.GradScaler`): an update whose gradients are
not finite is skipped and the scale halved; after `period` good steps the scale doubles. The
scale lives in the optimizer state (`LossScaleState`, the outermost optimizer wrapper), so it is
checkpointed and resumed with it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.extend.core import jaxprs_in_params

from jaxtrain._src.errors import ConfigError, setting
from jaxtrain._src.report.notes import note
from jaxtrain._src.state import split_params

DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class Policy:
    """What the train step computes in.

    Attributes:
      name: fp32, bf16 or fp16.
      loss_scale_init: fp16: the first loss scale.
      loss_scale_period: fp16: good steps after which the scale doubles.
    """

    name: str = "fp32"
    loss_scale_init: float = 2.0**15
    loss_scale_period: int = 2000

    def __post_init__(self) -> None:
        if self.name not in DTYPES:
            raise ConfigError(f"precision={self.name!r} is not allowed; choose one of {', '.join(DTYPES)}")

    @property
    def compute_dtype(self) -> Any:
        return DTYPES[self.name]

    @property
    def scaled(self) -> bool:
        """Whether the loss is scaled (fp16)."""
        return self.name == "fp16"

    def cast(self, tree: Any) -> Any:
        """Floating arrays of `tree` in the compute dtype; other arrays (integers, keys) unchanged."""
        if self.name == "fp32":
            return tree
        dtype = self.compute_dtype
        return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)

    def wrap(self, tx: optax.GradientTransformation) -> optax.GradientTransformation:
        """`tx` with dynamic loss scaling around it (fp16), else `tx`."""
        return loss_scaling(tx, self.loss_scale_init, self.loss_scale_period) if self.scaled else tx


FLOAT32_SHARE_NOTED = 0.5  # above this share of the products' FLOPs in float32, a mixed-precision run says so


def float32_share(loss_fn: Callable[..., Any], model: nnx.Module, batch: Any, policy: Policy) -> float | None:
    """The share of the loss's matrix-product FLOPs (`dot_general`, `conv_general_dilated`, forward
    pass, counted in its jaxpr, scans times their length) whose operands are still float32 when the
    parameters and the batch are cast to `policy`'s dtype, as the train step casts them; None for
    fp32, a loss without products, or one that does not trace here. `batch`: abstract shapes suffice.

    A layer that fixes its compute dtype when it is built undoes the cast for everything after it:
    `nnx.Embed` computes in its table's dtype at build (float32) unless given `dtype`, and a float32
    constant, carry or input mixed into a product promotes it to float32."""
    if policy.name == "fp32":
        return None
    graphdef, params, rest = split_params(model)
    try:
        jaxpr = jax.make_jaxpr(lambda p, r, b, k: loss_fn(nnx.merge(graphdef, policy.cast(p), r, copy=True),
                                                          policy.cast(b), k))(params, rest, batch, jax.random.key(0))
    except Exception:  # noqa: BLE001 - a loss that does not trace here fails with its own error in the step
        return None
    flops = {"float32": 0.0, "other": 0.0}
    _count_products(jaxpr, 1.0, flops)
    total = flops["float32"] + flops["other"]
    return flops["float32"] / total if total else None


def _count_products(jaxpr: Any, times: float, flops: dict[str, float]) -> None:
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        name = eqn.primitive.name
        if name in ("dot_general", "conv_general_dilated"):
            lhs, rhs, out = eqn.invars[0].aval, eqn.invars[1].aval, eqn.outvars[0].aval
            if name == "dot_general":
                (contracting, _), _ = eqn.params["dimension_numbers"]
                inner = math.prod(lhs.shape[d] for d in contracting)
            else:  # per output element: the kernel's input features (per group) times its window
                inner = math.prod(rhs.shape[d] for d in eqn.params["dimension_numbers"].rhs_spec[1:])
            kind = "float32" if lhs.dtype == jnp.float32 and rhs.dtype == jnp.float32 else "other"
            flops[kind] += 2.0 * times * math.prod(out.shape) * inner
        inner_times = times * eqn.params.get("length", 1) if name == "scan" else times
        for sub in jaxprs_in_params(eqn.params):
            _count_products(sub, inner_times, flops)


def note_float32_products(loss_fn: Callable[..., Any], model: nnx.Module, batch: Any, policy: Policy) -> None:
    """Notes, in one line, a mixed-precision run whose products mostly stay float32 (`float32_share`
    above `FLOAT32_SHARE_NOTED`): it would train as fp32 does while its header says bf16."""
    share = float32_share(loss_fn, model, batch, policy)
    if share is not None and share > FLOAT32_SHARE_NOTED:
        dtype = {"bf16": "bfloat16", "fp16": "float16"}[policy.name]
        note(f"{setting('precision', policy.name)}: {share:.0%} of the loss's matrix products (FLOPs) still run in "
             f"float32: a layer keeps the dtype it was built with (nnx.Embed does unless given dtype=jnp.{dtype}; "
             f"so does a float32 carry or constant) and everything after it computes in float32; give such layers "
             f"dtype=jnp.{dtype} (their parameters stay float32)")


def policy_of(config: Any) -> Policy:
    """The policy of a `TrainConfig`."""
    return Policy(config.precision, config.loss_scale_init, config.loss_scale_period)


class LossScaleState(NamedTuple):
    """Dynamic loss scaling's state, around the wrapped optimizer's.

    Attributes:
      scale: float32, the factor the loss is multiplied by.
      good_steps: int32, finite steps since the scale last changed.
      skipped: int32, updates skipped for non-finite gradients so far.
      inner: the wrapped optimizer's state.
    """

    scale: jax.Array
    good_steps: jax.Array
    skipped: jax.Array
    inner: optax.OptState


def loss_scaling(tx: optax.GradientTransformation, init: float, period: int,
                 factor: float = 2.0) -> optax.GradientTransformation:
    """Wraps `tx` to take unscaled gradients, skip non-finite updates and adapt the scale.

    `update(grads, state, params)` expects the gradients already divided by `state.scale`. When
    any is not finite the update is zero, the inner state is kept, the scale is divided by
    `factor` (not below 1) and `skipped` counts it; otherwise `tx` updates as usual and the scale
    is multiplied by `factor` after `period` finite steps in a row.
    """

    inner_tx = optax.with_extra_args_support(tx)

    def init_fn(params: optax.Params) -> LossScaleState:
        return LossScaleState(jnp.asarray(init, jnp.float32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32),
                              inner_tx.init(params))

    def update_fn(grads: optax.Updates, state: LossScaleState, params: optax.Params | None = None,
                  **extra_args: Any):
        finite = jnp.all(jnp.asarray([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
        safe = jax.tree.map(lambda g: jnp.where(finite, g, 0), grads)  # no NaN enters the inner update
        updates, inner = inner_tx.update(safe, state.inner, params, **extra_args)
        updates = jax.tree.map(lambda u: jnp.where(finite, u, 0), updates)
        inner = jax.tree.map(lambda new, old: jnp.where(finite, new, old), inner, state.inner)
        grow = finite & (state.good_steps + 1 >= period)
        scale = jnp.where(finite, jnp.where(grow, state.scale * factor, state.scale),
                          jnp.maximum(state.scale / factor, 1.0))
        good = jnp.where(finite & ~grow, state.good_steps + 1, 0)
        skipped = state.skipped + (~finite).astype(jnp.int32)
        return updates, LossScaleState(scale, good, skipped, inner)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def current_scale(opt_state: optax.OptState) -> jax.Array | None:
    """The loss scale held by `opt_state` (a `LossScaleState`), or None."""
    return opt_state.scale if isinstance(opt_state, LossScaleState) else None
