"""`jaxtrain bench ladder`: the case study's optimization ladder, rung by rung.

Each variant of `ladder_variants` runs in a fresh process (no compile cache shared). Each one
is timed on the `mlp-regression` workload, then trained again for one epoch with input noise off
from the same initial weights in the same batch order; its test-set predictions are compared
with the original's. A variant 0–5 that disagrees by more than 1e-5 fails the benchmark.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.child import child_main, run_child, torch_available

TOLERANCE = 1e-5  # max |prediction difference| against the original, float32
FLOP_PER_SAMPLE = 3 * 2 * (128 * 512 + 512 * 512 + 512 * 64)  # forward + backward ≈ 3 × forward matmuls


@dataclasses.dataclass(frozen=True)
class LadderConfig:
    """Settings of the optimization-ladder benchmark."""

    variants: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7)
    """Variants to run: 0 original, 1 +jit, 2 +device data, 3 +optax, 4 +fused, 5 jaxtrain,
    6 PyTorch eager, 7 torch.compile."""
    epochs: int = 1
    """Epochs timed per variant (the original is timed on original_steps and extrapolated)."""
    batch_size: int = 32
    """Batch size (the case study's 32)."""
    samples: int = 50_000
    """Training samples: 45,000 train + 5,000 test by default."""
    test_samples: int = 5_000
    """Held-out samples for the prediction check and the test metric."""
    original_steps: int = 300
    """Steps timed for the original (variant 0); its epoch time is extrapolated from them."""
    noise: float = 0.01
    """Std of the Gaussian input noise in the timed runs (validation runs use none)."""
    validate: bool = True
    """Train every variant for one epoch from the same weights and order and compare predictions."""
    seed: int = 0
    """Seed of the batch order and the noise."""
    out: str = "bench-results/ladder"
    """Directory for results.json, results.md and ladder.png."""
    quick: bool = False
    """A cut-down run (3,000 samples, 30 original steps, no torch.compile) for smoke tests."""


def _setup(config: LadderConfig):
    from flax import nnx

    from benchmarks.ladder_variants import Setup
    from jaxtrain._src.models import MLP
    from jaxtrain.tools.recipes.mlp_regression import RegressionDataConfig, make_data

    train, test = make_data(RegressionDataConfig(samples=config.samples, val_samples=config.test_samples))
    model = MLP((128, 512, 512, 64), rngs=nnx.Rngs(0))
    init = {}
    for n, layer in zip((1, 2, 3), model.layers):
        init[f"w{n}"], init[f"b{n}"] = np.asarray(layer.kernel[...]), np.asarray(layer.bias[...])
    mean, std = train["x"].mean(0), train["x"].std(0)
    setup = Setup(train["x"], train["y"], test["x"], mean, std, init, config.batch_size, config.seed)
    return setup, test["y"]


def predict(setup, params: dict[str, np.ndarray]) -> np.ndarray:
    """Test-set predictions in NumPy float32 (one routine for every variant)."""
    from benchmarks.ladder_variants import EPS

    h = (setup.x_test - setup.mean) / (setup.std + EPS)
    h = np.maximum(h @ params["w1"] + params["b1"], 0)
    h = np.maximum(h @ params["w2"] + params["b2"], 0)
    return (h @ params["w3"] + params["b3"]).astype(np.float32)


def worker(variant: int, config: LadderConfig) -> dict:
    """Runs one variant in this (fresh) process; saves its predictions; returns its figures."""
    from benchmarks.ladder_variants import VARIANTS

    name, run = VARIANTS[variant]
    setup, y_test = _setup(config)
    spe = setup.steps_per_epoch
    steps = config.original_steps if variant == 0 else config.epochs * spe
    t0 = time.perf_counter()
    timed = run(setup, steps, config.noise)
    result = {
        "variant": variant, "name": name, "timed_steps": steps, "extrapolated": variant == 0 and steps < spe,
        "step_s": timed.step_s, "epoch_s": timed.step_s * spe, "compile_s": timed.compile_s,
        "first_step_s": timed.first_step_s, "steps_per_call": timed.steps_per_call,
        "wall_s": time.perf_counter() - t0, "steps_per_epoch": spe,
    }
    if config.validate:
        checked = run(setup, spe, 0.0)
        predictions = predict(setup, checked.params)
        np.save(Path(config.out) / f"predictions-{variant}.npy", predictions)
        result["test_mse"] = float(np.mean((predictions - y_test) ** 2))
    return result


def _child(payload: dict) -> dict:
    config = LadderConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in payload["config"].items()})
    return worker(payload["variant"], config)


def measure_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """This machine's float32 matmul rate, from a large jitted matmul (median of `repeats`)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    matmul = jax.jit(jnp.dot)
    matmul(a, a).block_until_ready()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul(a, a).block_until_ready()
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


def main(config: LadderConfig) -> int:
    from rich.console import Console

    from benchmarks import ladder_report

    if config.quick:
        variants = tuple(v for v in config.variants if v != 7)
        config = dataclasses.replace(config, samples=3_000, test_samples=500, original_steps=30, variants=variants)
    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    Path(config.out).mkdir(parents=True, exist_ok=True)
    peak = measure_peak_gflops()
    console.print(f"optimization ladder: mlp-regression, {config.samples - config.test_samples:,} train samples, "
                  f"batch {config.batch_size}; matmul peak measured {peak:.0f} GFLOP/s")
    results = []
    for variant in config.variants:
        if variant >= 6 and not torch_available():
            results.append({"variant": variant, "skipped": "torch is not installed (pip install torch==2.13.0)"})
            console.print(f"  variant {variant}: skipped, torch is not installed (pip install torch==2.13.0)")
            continue
        console.print(f"  variant {variant}: running in a fresh process ...")
        payload = {"variant": variant, "config": dataclasses.asdict(config)}
        results.append({"variant": variant, **run_child("benchmarks.ladder", payload)})
        if "error" in results[-1]:
            console.print(f"    failed: {results[-1]['error']}")

    ok = ladder_report.add_derived(results, config, peak, TOLERANCE, FLOP_PER_SAMPLE)
    ladder_report.write(results, config, peak, console)
    if not ok:
        console.print(f"[red]validation FAILED[/red]: a variant's predictions differ from the original's by more "
                      f"than {TOLERANCE:g}, or a variant failed to run")
        return 1
    return 0


if __name__ == "__main__":
    child_main(_child)
