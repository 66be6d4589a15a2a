"""`jaxtrain bench remat`: what `--remat` saves in memory and costs in time.

For each workload — char-gpt's baby model at block 256 (batch 12), char-gpt's `long` preset
(block 1024, batch 4) and the mnist CNN (batch 128) — one jitted training step (forward,
backward, the AdamW/Adam update) is compiled with the model built at `remat` none, blocks and
full, and once more with `jax.checkpoint` (nothing saved) around the whole loss instead. For
each: XLA's compiled memory (`memory_analysis()`: arguments, temporaries), milliseconds per step
(calls interleaved, median of `--repeats`) and the largest absolute difference of the gradients
from remat none's. Data are random tokens and images; only memory and time are measured.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import TYPE_CHECKING, Any, Callable

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # JAX is imported where it runs: `jaxtrain bench remat --help` needs none
    import jax
    import optax
    from flax import nnx

VARIANTS = ("none", "blocks", "full", "whole loss")
MiB = 2**20


@dataclasses.dataclass(frozen=True)
class RematBenchConfig:
    """Settings of the remat benchmark."""

    repeats: int = 5
    """Interleaved timed steps of each variant (the median is reported)."""
    quick: bool = False
    """A cut-down run for smoke tests (tiny shapes, 1-layer GPTs, 1 repeat)."""


@dataclasses.dataclass(frozen=True)
class Workload:
    """A model builder, a loss and a batch."""

    name: str
    build: Callable[[str], nnx.Module]
    """`build(remat)`: the model."""
    loss: Callable[[nnx.Module, dict], jax.Array]
    batch: dict[str, jax.Array]
    tx: optax.GradientTransformation


def _lm_loss(model: nnx.Module, batch: dict) -> jax.Array:
    import jax.numpy as jnp
    import optax

    logits = model(batch["tokens"][:, :-1]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["tokens"][:, 1:]).mean()


def _image_loss(model: nnx.Module, batch: dict) -> jax.Array:
    import jax.numpy as jnp
    import optax

    logits = model(batch["image"]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()


def workloads(quick: bool) -> list[Workload]:
    """char-gpt at block 256, char-gpt long (block 1024), the mnist CNN; tiny versions when quick."""
    import jax
    import optax
    from flax import nnx

    from jaxtrain._src.models import CNN, GPT
    from jaxtrain.tools.recipes.char_gpt import BABY, LONG

    key = jax.random.key(0)
    out = []
    for label, preset, T, B in (("char-gpt baby", BABY, 256, 12), ("char-gpt long", LONG, 1024, LONG.batch_size)):
        gpt_config = dataclasses.replace(preset.model, block_size=T)
        if quick:
            T, B = T // 16, 2
            gpt_config = dataclasses.replace(gpt_config, block_size=T, n_layer=1)
        out.append(Workload(
            f"{label}, block {T}, batch {B}",
            lambda remat, c=gpt_config: GPT(65, c, remat=remat, rngs=nnx.Rngs(0)),
            _lm_loss, {"tokens": jax.random.randint(key, (B, T + 1), 0, 65)},
            optax.adamw(1e-3, b1=0.9, b2=0.99, weight_decay=0.1),
        ))
    B = 8 if quick else 128
    kx, ky = jax.random.split(key)
    out.append(Workload(
        f"mnist CNN, batch {B}", lambda remat: CNN(remat=remat, rngs=nnx.Rngs(0)), _image_loss,
        {"image": jax.random.normal(kx, (B, 28, 28, 1)), "label": jax.random.randint(ky, (B,), 0, 10)},
        optax.adam(1e-3),
    ))
    return out


def _compile(workload: Workload, variant: str) -> tuple[Any, Callable, tuple]:
    """(compiled step, jitted gradient function, step arguments) of one variant."""
    import jax
    import optax
    from flax import nnx

    graphdef, params = nnx.split(workload.build("none" if variant == "whole loss" else variant))

    def loss(params: nnx.State, batch: dict) -> jax.Array:
        return workload.loss(nnx.merge(graphdef, params, copy=True), batch)

    if variant == "whole loss":
        loss = jax.checkpoint(loss, policy=jax.checkpoint_policies.nothing_saveable)

    def step(params: nnx.State, opt_state: optax.OptState, batch: dict):
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, opt_state = workload.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    args = (params, workload.tx.init(params), workload.batch)
    return jax.jit(step).lower(*args).compile(), jax.jit(jax.grad(loss)), args


def measure(workload: Workload, repeats: int) -> list[dict[str, Any]]:
    """One row per variant: memory (MiB), ms per step, max |grad - grad of remat none|."""
    import jax
    import numpy as np

    compiled = {v: _compile(workload, v) for v in VARIANTS}
    grads = {v: g(*args[::2]) for v, (_, g, args) in compiled.items()}  # grad(params, batch)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for step, _, args in compiled.values():
        jax.block_until_ready(step(*args))  # warm up
    for _ in range(repeats):
        for v, (step, _, args) in compiled.items():
            t0 = time.perf_counter()
            jax.block_until_ready(step(*args))
            times[v].append(time.perf_counter() - t0)
    rows = []
    for v, (step, _, _) in compiled.items():
        memory = step.memory_analysis()
        diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                   for a, b in zip(jax.tree.leaves(grads[v]), jax.tree.leaves(grads["none"]), strict=True))
        rows.append({"variant": v, "argument_mib": memory.argument_size_in_bytes / MiB,
                     "temp_mib": memory.temp_size_in_bytes / MiB, "ms": statistics.median(times[v]) * 1e3,
                     "max_grad_diff": diff})
    return rows


def main(config: RematBenchConfig) -> int:
    import jax

    from jaxtrain._src.report import device_description

    repeats = 1 if config.quick else config.repeats
    console = Console(highlight=False)
    for workload in workloads(config.quick):
        rows = measure(workload, repeats)
        none = rows[0]
        table = Table(title=f"{workload.name}: one training step, compiled memory and ms per step "
                            f"(median of {repeats}), {device_description(jax.devices()[0])}")
        for column in ("remat", "args MiB", "temp MiB", "temp/none", "ms/step", "time/none", "max |Δgrad|"):
            table.add_column(column, justify="left" if column == "remat" else "right")
        for r in rows:
            table.add_row(r["variant"], f"{r['argument_mib']:.1f}", f"{r['temp_mib']:.1f}",
                          f"{r['temp_mib'] / none['temp_mib']:.2f}x", f"{r['ms']:.1f}",
                          f"{r['ms'] / none['ms']:.2f}x", f"{r['max_grad_diff']:.1e}")
        console.print(table)
    return 0
