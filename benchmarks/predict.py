"""`jaxtrain bench predict`: `jaxtrain.predict` against a hand-written `jax.jit` forward over the
same batches.

For mlp-regression's model (128→512→512→64, its inputs normalised) and the mnist CNN (uint8 images
standardised), both with their recipe's preprocessing inside the compiled forward: rows per second
of `jaxtrain.predict(model, x, batch_size=B, preprocess=...)` and of the loop a user writes by
hand, `jax.jit(forward)` called on each host slice `x[i:i+B]` and its output copied back with
`np.asarray` (the last, shorter batch compiled for its own shape, as such a loop does). Both are
warmed up first (compilation excluded), run interleaved in this process, and the median of
`--repeats` is reported. Weights and inputs are random: only speed is measured.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import TYPE_CHECKING, Any, Callable

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # JAX and NumPy are imported where they run: `jaxtrain bench predict --help` needs none
    import numpy as np
    from flax import nnx

TARGET = 0.9


@dataclasses.dataclass(frozen=True)
class PredictBenchConfig:
    """Settings of the predict benchmark."""

    rows: int = 20_000
    """Input rows per workload (not a multiple of the batch: the last batch is partial)."""
    batch_size: int = 256
    """Rows per compiled call, for both."""
    repeats: int = 5
    """Interleaved timed passes of each variant (the median is reported)."""
    workloads: str = "mlp-regression,mnist-cnn"
    """Comma-separated: mlp-regression, mnist-cnn."""
    quick: bool = False
    """A cut-down run for smoke tests (few rows, 1 repeat)."""


def _workload(name: str, rows: int) -> tuple[nnx.Module, Any, Callable, str]:
    """(model, raw inputs, preprocessing, the field it reads)."""
    import numpy as np
    from flax import nnx

    from jaxtrain._src.data.transforms import normalize, standardize_images
    from jaxtrain._src.models import CNN, MLP

    rng = np.random.default_rng(0)
    if name == "mlp-regression":
        x = (rng.normal(size=(rows, 128)) * 3 + 1).astype(np.float32)
        return MLP((128, 512, 512, 64), rngs=nnx.Rngs(0)), x, normalize("x", x.mean(0), x.std(0)), "x"
    if name == "mnist-cnn":
        images = rng.integers(0, 256, (rows, 28, 28)).astype(np.uint8)
        return CNN(rngs=nnx.Rngs(0)), images, standardize_images("image", 0.1307, 0.3081), "image"
    raise ValueError(f"unknown workload {name!r}; choose mlp-regression or mnist-cnn")


def _by_hand(model: nnx.Module, preprocess: Callable, field: str) -> Callable[[np.ndarray, int], np.ndarray]:
    """The loop a user writes: a jitted eval-mode forward over host slices."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    model.eval()
    graphdef, state = nnx.split(model)
    model.train()
    forward = jax.jit(lambda state, x: nnx.merge(graphdef, state)(preprocess({field: x})[field]))

    def run(x: np.ndarray, batch_size: int) -> np.ndarray:
        return np.concatenate([np.asarray(forward(state, jnp.asarray(x[i: i + batch_size])))
                               for i in range(0, len(x), batch_size)])

    return run


def measure(name: str, config: PredictBenchConfig) -> dict[str, Any]:
    import numpy as np

    from jaxtrain._src.predict import predict

    model, x, preprocess, field = _workload(name, config.rows)
    B = config.batch_size
    hand = _by_hand(model, preprocess, field)
    ours = lambda: predict(model, x, batch_size=B, preprocess=preprocess, inputs=field)  # noqa: E731
    np.testing.assert_allclose(ours(), hand(x, B), rtol=1e-5, atol=1e-5)  # warm-up, and the same outputs
    times: dict[str, list[float]] = {"jaxtrain.predict": [], "jax.jit by hand": []}
    for _ in range(config.repeats):
        for variant, fn in (("jaxtrain.predict", ours), ("jax.jit by hand", lambda: hand(x, B))):
            t0 = time.perf_counter()
            fn()
            times[variant].append(time.perf_counter() - t0)
    rates = {v: config.rows / statistics.median(ts) for v, ts in times.items()}
    return {"workload": name, "rows": config.rows, "batch_size": B, "rows_per_s": rates,
            "all_s": times, "ratio": rates["jaxtrain.predict"] / rates["jax.jit by hand"]}


def main(config: PredictBenchConfig) -> int:
    import jax

    if config.quick:
        config = dataclasses.replace(config, rows=700, repeats=1)
    console = Console(highlight=False)
    table = Table(title=f"predict: rows/s, {config.rows:,} rows in batches of {config.batch_size} (median of "
                        f"{config.repeats}, interleaved; compile excluded); {jax.devices()[0].platform}")
    for column in ("workload", "jaxtrain.predict", "jax.jit by hand", "ratio", f"target ≥ {TARGET}"):
        table.add_column(column)
    for name in (w.strip() for w in config.workloads.split(",") if w.strip()):
        r = measure(name, config)
        rates = r["rows_per_s"]
        table.add_row(name, f"{rates['jaxtrain.predict']:,.0f}", f"{rates['jax.jit by hand']:,.0f}",
                      f"{r['ratio']:.3f}×", "met" if r["ratio"] >= TARGET else "missed")
    console.print(table)
    return 0
