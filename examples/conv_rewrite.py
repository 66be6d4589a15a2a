"""How much `rewrite_convs` buys inside a `lax.scan` on XLA:CPU: Keras's MNIST convnet, batch 128, Adam.

XLA:CPU runs `lax.conv_general_dilated` about 9-14× slower inside a loop body than in a plain
jitted function (jax-ml/jax#12868). `rewrite_convs(loss)` computes every convolution as im2col +
one matmul (and max pooling as slices) before differentiation. This script times one training step
(value_and_grad over the nnx params + optax Adam update) in each form:

    a  plain jitted step, original convs, dispatched from Python
    b  rolled lax.scan of 8 steps, original
    c  rolled lax.scan of 8 steps, rewritten (convs and max pooling)
    c0 rolled lax.scan of 8 steps, rewritten convs only (max pooling as it is)
    d  plain jitted step, rewritten
    d0 plain jitted step, rewritten convs only
    e  fully unrolled lax.scan of 4 steps, original
    f  fully unrolled lax.scan of 4 steps, rewritten

Each form is compiled once, then timed `--repeats` times, the forms interleaved so that machine
noise hits them alike; the table gives the median ms/step, the spread and the compile seconds.

    python examples/conv_rewrite.py                 # about 3 minutes on 2 cores
    python examples/conv_rewrite.py --repeats 1 --only a,c,d   # a quick look

Synthetic data (random images and labels): the step's cost does not depend on the values.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxtrain._src.rewrite import rewrite_convs

B = 128  # batch, as Keras's example
SCAN = 8  # steps in the rolled scan
UNROLL = 4  # steps in the fully unrolled scan (compile time grows with it)


class KerasConvNet(nnx.Module):
    """Conv(32, 3×3) → ReLU → max-pool 2 → Conv(64, 3×3) → ReLU → max-pool 2 → Dropout(0.5) → Dense(10)."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 32, (3, 3), padding="VALID", rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, (3, 3), padding="VALID", rngs=rngs)
        self.dropout = nnx.Dropout(0.5)
        self.linear = nnx.Linear(5 * 5 * 64, 10, rngs=rngs)

    def __call__(self, x: jax.Array, key: jax.Array) -> jax.Array:  # (B, 28, 28, 1) -> (B, 10)
        x = nnx.max_pool(jax.nn.relu(self.conv1(x)), (2, 2), (2, 2))  # (B, 13, 13, 32)
        x = nnx.max_pool(jax.nn.relu(self.conv2(x)), (2, 2), (2, 2))  # (B, 5, 5, 64)
        x = self.dropout(x.reshape(x.shape[0], -1), rngs=key)  # (B, 1600)
        return self.linear(x)


def make_step(graphdef: Any, tx: optax.GradientTransformation, rewrite: bool, max_pool: bool = True) -> Callable:
    """One training step (params, opt_state, x, y, key) -> (params, opt_state, loss)."""

    def loss_fn(params: Any, x: jax.Array, y: jax.Array, key: jax.Array) -> jax.Array:
        logits = nnx.merge(graphdef, params)(x, key)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    if rewrite:
        loss_fn = rewrite_convs(loss_fn, max_pool=max_pool)

    def step(params: Any, opt_state: Any, x: jax.Array, y: jax.Array, key: jax.Array) -> tuple[Any, Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def make_scan(step: Callable, unroll: int | bool) -> Callable:
    """len(xs) steps in one `lax.scan` over stacked batches."""

    def run(params: Any, opt_state: Any, xs: jax.Array, ys: jax.Array, keys: jax.Array) -> tuple[Any, Any, jax.Array]:
        def body(carry: Any, batch: Any) -> tuple[Any, jax.Array]:
            params, opt_state = carry
            params, opt_state, loss = step(params, opt_state, *batch)
            return (params, opt_state), loss

        (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), (xs, ys, keys), unroll=unroll)
        return params, opt_state, losses

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per form (interleaved)")
    parser.add_argument("--only", default="a,b,c,c0,d,d0,e,f", help="comma-separated forms to run")
    args = parser.parse_args()
    forms = args.only.split(",")

    model = KerasConvNet(rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    tx = optax.adam(1e-3)
    opt_state = tx.init(params)
    rng = np.random.default_rng(0)
    xs = jnp.asarray(rng.standard_normal((SCAN, B, 28, 28, 1)), jnp.float32)
    ys = jnp.asarray(rng.integers(0, 10, (SCAN, B)), jnp.int32)
    keys = jax.random.split(jax.random.key(0), SCAN)

    one, scan, unrolled = (xs[0], ys[0], keys[0]), (xs, ys, keys), (xs[:UNROLL], ys[:UNROLL], keys[:UNROLL])
    original, rewritten = make_step(graphdef, tx, False), make_step(graphdef, tx, True)
    convs_only = make_step(graphdef, tx, True, max_pool=False)
    # form -> (label, function, its arguments after the state, steps per call, calls per round)
    specs = {
        "a": ("plain jit, original", original, one, 1, SCAN),
        "b": (f"scan {SCAN} rolled, original", make_scan(original, 1), scan, SCAN, 1),
        "c": (f"scan {SCAN} rolled, rewritten", make_scan(rewritten, 1), scan, SCAN, 1),
        "c0": (f"scan {SCAN} rolled, rewritten convs only", make_scan(convs_only, 1), scan, SCAN, 1),
        "d": ("plain jit, rewritten", rewritten, one, 1, SCAN),
        "d0": ("plain jit, rewritten convs only", convs_only, one, 1, SCAN),
        "e": (f"scan {UNROLL} unrolled, original", make_scan(original, True), unrolled, UNROLL, 1),
        "f": (f"scan {UNROLL} unrolled, rewritten", make_scan(rewritten, True), unrolled, UNROLL, 1),
    }

    compiled, compile_s, state, first_loss = {}, {}, {}, {}
    for form in forms:
        _, fn, batch, _, _ = specs[form]
        t0 = time.perf_counter()
        compiled[form] = jax.jit(fn, donate_argnums=(0, 1)).lower(params, opt_state, *batch).compile()
        compile_s[form] = time.perf_counter() - t0
        p, o = jax.tree.map(jnp.copy, (params, opt_state))
        p, o, loss = compiled[form](p, o, *batch)  # warm-up; every form's first step sees the same state and batch
        state[form] = jax.block_until_ready((p, o))
        first_loss[form] = float(jnp.ravel(loss)[0])

    times: dict[str, list[float]] = {form: [] for form in forms}
    for _ in range(args.repeats):
        for form in forms:
            _, _, batch, steps, calls = specs[form]
            p, o = state[form]
            t0 = time.perf_counter()
            for _ in range(calls):
                p, o, loss = compiled[form](p, o, *batch)
            jax.block_until_ready(loss)
            times[form].append((time.perf_counter() - t0) / (steps * calls) * 1e3)
            state[form] = (p, o)

    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, batch {B}, {args.repeats} rounds")
    print(f"{'form':<4} {'':<42} {'ms/step':>9} {'min-max':>15} {'compile s':>10} {'loss[0]':>9}")
    for form in forms:
        t, label = times[form], specs[form][0]
        print(f"{form:<4} {label:<42} {statistics.median(t):9.1f} {min(t):7.1f}-{max(t):<7.1f} "
              f"{compile_s[form]:10.1f} {first_loss[form]:9.5f}")
    # Ratios round by round (the two forms ran seconds apart), then the median over rounds.
    for num, den in [("b", "c"), ("a", "d"), ("c0", "c"), ("d0", "d"), ("a", "c"), ("e", "c"), ("d", "c"), ("f", "c")]:
        if num in times and den in times:
            ratio = statistics.median(x / y for x, y in zip(times[num], times[den]))
            print(f"{num}/{den} = {ratio:.2f}")


if __name__ == "__main__":
    main()
