"""`jaxtrain bench overhead`: what does jaxtrain's loop cost over a hand-written one?

1. One epoch of `mlp-regression` with `jaxtrain.fit` against a minimal hand-written loop
   (jit + `lax.scan` over the whole epoch + donation; same model, data, preprocessing,
   optimizer and batch size), interleaved in one process, several repetitions; compile time
   is excluded from both.
2. Per-call cost of one training step under `nnx.jit` (NNX objects in, object graph traversed
   in Python every call) against `jax.jit` on the split state pytree.
"""

from __future__ import annotations

import dataclasses
import io
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from rich.console import Console
from rich.table import Table

from jaxtrain import data as data_lib
from jaxtrain.config import OptimConfig, TrainConfig
from jaxtrain.loop import fit
from jaxtrain.models import MLP
from jaxtrain.recipes.mlp_regression import RegressionDataConfig, make_data, mse_loss
from jaxtrain.report import device_description
from jaxtrain.state import init_state
from jaxtrain.step import epoch_permutation, gather_batch, make_train_step


@dataclasses.dataclass(frozen=True)
class OverheadConfig:
    """Settings of the overhead benchmark."""

    repeats: int = 5
    """Interleaved repetitions of each variant (medians are reported)."""
    samples: int = 50_000
    """Samples of the mlp-regression data, all used for training (no validation split)."""
    batch_size: int = 32
    """Batch size for both loops."""
    call_repeats: int = 2000
    """Calls timed per repetition for the nnx.jit-vs-jax.jit comparison."""
    quick: bool = False
    """A cut-down run (small data, few repetitions) for smoke tests."""
    out: str | None = None
    """Write the results as JSON to this file."""


def _hand_written_epoch(graphdef, tx, preprocess, n: int, batch_size: int):
    """The reference: one jitted function that trains a whole epoch with lax.scan."""
    steps = n // batch_size

    def epoch(params, opt_state, data, key):
        perm = epoch_permutation(key, 1, n)

        def body(carry, i):
            params, opt_state = carry
            batch = preprocess(gather_batch(data, jax.lax.dynamic_slice_in_dim(perm, i * batch_size, batch_size)))

            def loss(params):
                return jnp.mean((nnx.merge(graphdef, params)(batch["x"]) - batch["y"]) ** 2)

            value, grads = jax.value_and_grad(loss)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), value

        (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), jnp.arange(steps))
        return params, opt_state, losses

    return jax.jit(epoch, donate_argnums=(0, 1))


def _time_hand_written(train, preprocess, config: OverheadConfig, seed: int) -> float:
    model = MLP((128, 512, 512, 64), rngs=nnx.Rngs(seed))
    tx = optax.adam(1e-3)
    graphdef, params = nnx.split(model)
    data = jax.device_put(jax.tree.map(jnp.asarray, train))
    epoch = _hand_written_epoch(graphdef, tx, preprocess, len(train["x"]), config.batch_size)
    key = jax.random.key(seed)
    compiled = epoch.lower(params, tx.init(params), data, key).compile()
    params, opt_state = jax.tree.map(lambda x: x.copy(), params), tx.init(params)
    t0 = time.perf_counter()
    params, opt_state, losses = compiled(params, opt_state, data, key)
    jax.block_until_ready(losses)
    return time.perf_counter() - t0


def _time_fit(train, preprocess, config: OverheadConfig, seed: int) -> tuple[float, int]:
    model = MLP((128, 512, 512, 64), rngs=nnx.Rngs(seed))
    optim = OptimConfig(name="adam", lr=1e-3)
    train_config = TrainConfig(epochs=1, batch_size=config.batch_size, seed=seed, optim=optim)
    silent = Console(file=io.StringIO())
    result = fit(model, mse_loss, train, None, train_config, preprocess=preprocess, quiet=True, console=silent)
    return result.history[0]["train_time_s"], result.summary["steps_per_call"]


def _per_call_times(config: OverheadConfig, train) -> dict[str, float]:
    """Median seconds per call of one training step: nnx.jit on objects vs jax.jit on pytrees."""
    batch = {k: jnp.asarray(v[: config.batch_size]) for k, v in train.items()}

    model = MLP((128, 512, 512, 64), rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    @nnx.jit
    def nnx_step(model, optimizer, batch):
        def loss(model):
            return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)

        value, grads = nnx.value_and_grad(loss)(model)
        optimizer.update(model, grads)
        return value

    tx = optax.adam(1e-3)
    graphdef, state = init_state(MLP((128, 512, 512, 64), rngs=nnx.Rngs(0)), tx, jax.random.key(0))
    jax_step = jax.jit(make_train_step(graphdef, mse_loss, tx), donate_argnums=0)

    def run_nnx(n):
        for _ in range(n):
            value = nnx_step(model, optimizer, batch)
        jax.block_until_ready(value)

    def run_jax(n):
        nonlocal state
        for _ in range(n):
            state, metrics = jax_step(state, batch)
        jax.block_until_ready(metrics)

    times: dict[str, list[float]] = {"nnx.jit": [], "jax.jit": []}
    runners = {"nnx.jit": run_nnx, "jax.jit": run_jax}
    for run in runners.values():
        run(10)  # compile and warm up
    for _ in range(config.repeats):
        for name, run in runners.items():
            t0 = time.perf_counter()
            run(config.call_repeats)
            times[name].append((time.perf_counter() - t0) / config.call_repeats)
    return {name: statistics.median(values) for name, values in times.items()}


def main(config: OverheadConfig) -> int:
    if config.quick:
        config = dataclasses.replace(config, repeats=2, samples=3_000, call_repeats=100)
    train, _ = make_data(RegressionDataConfig(samples=config.samples, val_samples=0))
    preprocess = data_lib.normalize("x", train["x"].mean(0), train["x"].std(0))
    console = Console(highlight=False)
    console.print(f"overhead benchmark: mlp-regression, {len(train['x']):,} samples, batch {config.batch_size}, "
                  f"{config.repeats} interleaved repetitions, device {device_description(jax.devices()[0])}")

    hand, ours, ks = [], [], []
    for rep in range(config.repeats):
        hand.append(_time_hand_written(train, preprocess, config, seed=rep))
        t, k = _time_fit(train, preprocess, config, seed=rep)
        ours.append(t)
        ks.append(k)
        console.print(f"  repetition {rep + 1}: hand-written {hand[-1]:.3f} s, jaxtrain.fit {ours[-1]:.3f} s (K={k})")
    steps = len(train["x"]) // config.batch_size
    hand_s, ours_s = statistics.median(hand), statistics.median(ours)
    ratio = hand_s / ours_s  # jaxtrain steps/s over hand-written steps/s

    table = Table(title="one epoch, compile excluded (medians)")
    for column in ("loop", "epoch time (s)", "steps/s", "min..max (s)"):
        table.add_column(column, justify="right" if column != "loop" else "left")
    rows = (("hand-written jit + lax.scan", hand), (f"jaxtrain.fit (K={statistics.median(ks):.0f})", ours))
    for label, times in rows:
        median = statistics.median(times)
        table.add_row(label, f"{median:.3f}", f"{steps / median:,.0f}", f"{min(times):.3f}..{max(times):.3f}")
    console.print(table)
    met = "met" if ratio >= 0.97 else "MISSED"
    console.print(f"jaxtrain / hand-written steps/s: {ratio:.3f} (target >= 0.97: {met})")

    calls = _per_call_times(config, train)
    table = Table(title=f"one training step per call, batch {config.batch_size} (medians)")
    table.add_column("step function")
    table.add_column("time per call (µs)", justify="right")
    for name, seconds in calls.items():
        table.add_row(name, f"{seconds * 1e6:.1f}")
    console.print(table)
    extra = calls["nnx.jit"] - calls["jax.jit"]
    console.print(f"nnx.jit costs {extra * 1e6:.1f} µs more per call than jax.jit on split state "
                  f"({calls['nnx.jit'] / calls['jax.jit']:.2f}x)")

    if config.out:
        results = {
            "device": device_description(jax.devices()[0]), "samples": len(train["x"]), "batch_size": config.batch_size,
            "hand_written_epoch_s": hand, "fit_epoch_s": ours, "steps_per_call": ks, "ratio": ratio,
            "per_call_s": calls, "jax_version": jax.__version__,
        }
        Path(config.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0
