"""`jaxtrain bench precision`: what --precision and --grad-accum cost and save, per training step.

For the char-gpt (baby) and mnist-cnn recipe models, one jitted training step (forward, backward,
optimizer update; state donated) is compiled for each setting: fp32, bf16 and fp16 at the recipe's
batch, and gradient accumulation (4 micro-batches of the recipe's batch against one batch of 4x)
in fp32. For each: the compiled memory analysis (temporaries: activations and intermediates; peak:
arguments + outputs - donated + temporaries) and the median time of `--repeats` timed steps
(random batches; only time and memory are measured). bf16 and fp16 are emulated on CPUs without
half-precision arithmetic units, so they may be slower there; the memory is what a GPU would hold.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # JAX and NumPy are imported where they run: `jaxtrain bench precision --help` needs none
    import numpy as np


@dataclasses.dataclass(frozen=True)
class PrecisionBenchConfig:
    """Settings of the precision benchmark."""

    repeats: int = 10
    """Timed steps of each setting (the median is reported), after one warm-up step."""
    quick: bool = False
    """A cut-down run for smoke tests (a tiny GPT only, 2 repeats)."""


def _workloads(quick: bool) -> list[tuple[str, object, object, object, dict[str, np.ndarray]]]:
    """(name, recipe config, model, loss_fn, preprocess, one batch of the recipe's size)."""
    import numpy as np

    from jaxtrain._src.data.transforms import standardize_images
    from jaxtrain.tools.recipes import char_gpt, mnist_cnn

    gpt = char_gpt.BABY if not quick else dataclasses.replace(
        char_gpt.SEED, batch_size=2, model=dataclasses.replace(char_gpt.SEED.model, block_size=16))
    cnn = mnist_cnn.MNISTConfig(batch_size=128 if not quick else 4)
    rng = np.random.default_rng(0)
    text = {"tokens": rng.integers(0, 65, (gpt.batch_size * 4, gpt.model.block_size + 1)).astype(np.uint8)}
    images = {"image": rng.integers(0, 256, (cnn.batch_size * 4, 28, 28)).astype(np.uint8),
              "label": rng.integers(0, 10, (cnn.batch_size * 4,)).astype(np.int32)}
    workloads = [
        ("char-gpt", gpt, lambda c: char_gpt.build_model(c, {"vocabulary": "x" * 65}), char_gpt.lm_loss, None, text),
        ("mnist-cnn", cnn, lambda c: mnist_cnn.build_model(c, {}), mnist_cnn.cross_entropy,
         standardize_images("image", *mnist_cnn.NORMALISATION["mnist"]), images),
    ]
    return workloads[:1] if quick else workloads


def _measure(config, build_model, loss_fn, preprocess, data, repeats: int) -> dict:
    """Compiles one training step for `config` and times it: memory and ms per step."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxtrain._src.memory import compiled_memory
    from jaxtrain._src.program import build_program
    from jaxtrain._src.sharding import make_layout

    program = build_program(build_model(config), loss_fn, config, preprocess=preprocess, total_steps=1000,
                            layout=make_layout("data=1"))
    batch = jax.tree.map(lambda x: jnp.asarray(x[: config.samples_per_step]), data)
    compiled, state = program.compile_step(batch), program.state
    state, metrics = compiled(state, batch)  # warm-up
    jax.block_until_ready(metrics)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
    return {"ms": statistics.median(times) * 1e3, "memory": compiled_memory(compiled),
            "finite": bool(np.isfinite(float(metrics["loss"])))}


def main(config: PrecisionBenchConfig) -> int:
    import jax

    from jaxtrain._src.memory import format_bytes

    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 130  # a file or pipe: one line per row
    repeats = 2 if config.quick else config.repeats
    table = Table(title=f"One training step, compiled; median of {repeats} ({jax.devices()[0].platform})")
    for column in ("workload", "setting", "samples", "ms/step", "time vs", "temporaries", "memory vs", "peak",
                   "finite"):
        table.add_column(column, justify="left" if column in ("workload", "setting") else "right")
    for name, base, build_model, loss_fn, preprocess, data in _workloads(config.quick):
        B = base.batch_size
        # (label, overrides, the row it is compared with: same samples per step)
        settings = [("fp32", {}, None), ("bf16", {"precision": "bf16"}, "fp32"),
                    ("fp16", {"precision": "fp16"}, "fp32"), (f"batch {4 * B}", {"batch_size": 4 * B}, None),
                    (f"{B} x accum 4", {"grad_accum": 4}, f"batch {4 * B}")]
        rows: dict[str, dict] = {}
        for label, overrides, against in settings:
            cfg = dataclasses.replace(base, **overrides)
            r = rows[label] = _measure(cfg, build_model, loss_fn, preprocess, data, repeats)
            memory, ref = r["memory"] or {}, rows.get(against, {})
            ref_memory = ref.get("memory") or {}
            table.add_row(name, label, str(cfg.samples_per_step), f"{r['ms']:.2f}",
                          f"{r['ms'] / ref['ms']:.2f}x" if ref else "-",
                          format_bytes(memory.get("temp_bytes", 0)),
                          f"{memory['temp_bytes'] / ref_memory['temp_bytes']:.2f}x" if ref_memory else "-",
                          format_bytes(memory.get("peak_bytes", 0)), str(r["finite"]))
    console.print(table)
    console.print("samples: per optimizer step; time vs / memory vs: against the row with the same samples per step "
                  "(bf16 and fp16 against fp32; accumulation against the batch of 4x it replaces). Memory from XLA's "
                  "compiled memory analysis.")
    return 0
