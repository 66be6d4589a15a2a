"""`jaxtrain bench scan`: one training step jitted alone against the same step inside `lax.scan`.

XLA:CPU runs `lax.conv` far slower inside a loop body than outside one (jax-ml/jax#12868);
jaxtrain fuses K steps into a scan, so its CNNs use im2col convolutions (`models.Conv2D`). This
measures, per model, milliseconds per step of (a) a jitted single step and (b) K steps in a
jitted `lax.scan`: the mnist CNN with `lax.conv` + `reduce_window` pooling, the same CNN with
im2col + reshape pooling (jaxtrain's), and char-gpt baby (to see whether its step is slow for
the same reason). Batches are random; only time is measured. Median of `--repeats` calls.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # JAX is imported where it runs: `jaxtrain bench scan --help` needs none
    import jax
    from flax import nnx


@dataclasses.dataclass(frozen=True)
class ScanBenchConfig:
    """Settings of the scan benchmark."""

    steps: int = 8
    """K: steps per scanned call."""
    repeats: int = 5
    """Timed calls of each kind (the median is reported)."""
    quick: bool = False
    """A cut-down run for smoke tests (K=2, 1 repeat, small batches, a 1-layer char-gpt)."""


def _lax_cnn(rngs: nnx.Rngs) -> nnx.Module:
    """jaxtrain's CNN with its convolutions and pooling swapped for lax.conv and reduce_window."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxtrain._src.models import CNN

    class _LaxConv(nnx.Module):
        """A stride-1 SAME convolution through `lax.conv_general_dilated`, as `nnx.Conv` computes it."""

        def __init__(self, c_in: int, c_out: int, rngs: nnx.Rngs):
            self.kernel = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (3, 3, c_in, c_out)))
            self.bias = nnx.Param(jnp.zeros((c_out,)))

        def __call__(self, x: jax.Array) -> jax.Array:
            dims = ("NHWC", "HWIO", "NHWC")
            y = jax.lax.conv_general_dilated(x, self.kernel[...], (1, 1), "SAME", dimension_numbers=dims)
            return y + self.bias[...]

    model = CNN(rngs=rngs)
    model.conv1, model.conv2 = _LaxConv(1, 32, rngs), _LaxConv(32, 64, rngs)
    return model


def _lax_pool(x: jax.Array) -> jax.Array:
    import jax

    return jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4


def _cnn_loss(pool):
    import jax
    import optax

    def loss(model: nnx.Module, batch: dict) -> jax.Array:
        x = pool(jax.nn.relu(model.conv1(batch["x"])))
        x = pool(jax.nn.relu(model.conv2(x)))
        logits = model.dense2(jax.nn.relu(model.dense1(x.reshape(x.shape[0], -1))))
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    return loss


def _gpt_loss(model: nnx.Module, batch: dict) -> jax.Array:
    import optax

    logits = model(batch["x"][:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["x"][:, 1:]).mean()


def _time(fn, args, repeats: int) -> float:
    import jax

    jax.block_until_ready(fn(*args))  # compile
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(model: nnx.Module, loss, batch: dict, steps: int, repeats: int) -> tuple[float, float]:
    """(ms per step of a jitted single SGD step, ms per step inside a K-step lax.scan)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, params = nnx.split(model)

    def step(params, batch):
        grads = jax.grad(lambda p: loss(nnx.merge(graphdef, p, copy=True), batch))(params)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

    def scanned(params, batches):
        return jax.lax.scan(lambda p, b: (step(p, b), None), params, batches)[0]

    batches = jax.tree.map(lambda x: jnp.stack([x] * steps), batch)
    single = _time(jax.jit(step), (params, batch), repeats)
    fused = _time(jax.jit(scanned), (params, batches), repeats) / steps
    return single * 1e3, fused * 1e3


def main(config: ScanBenchConfig) -> int:
    import jax
    from flax import nnx

    from jaxtrain._src.models import CNN, GPT, GPTConfig
    from jaxtrain._src.models.cnn import avg_pool_2x2
    from jaxtrain._src.report import device_description

    if config.quick:
        config = dataclasses.replace(config, steps=2, repeats=1)
    B_img, B_txt = (2, 2) if config.quick else (128, 12)
    # quick: one transformer block compiles the same kinds of ops as the baby's four, in a quarter of the time
    gpt_config = GPTConfig(n_layer=1) if config.quick else GPTConfig()
    key_x, key_y = jax.random.split(jax.random.key(0))
    images = {"x": jax.random.normal(key_x, (B_img, 28, 28, 1)), "y": jax.random.randint(key_y, (B_img,), 0, 10)}
    text = {"x": jax.random.randint(key_x, (B_txt, 65), 0, 65)}
    cases = [
        ("mnist CNN, lax.conv + reduce_window", _lax_cnn(nnx.Rngs(0)), _cnn_loss(_lax_pool), images),
        ("mnist CNN, im2col + reshape pool (jaxtrain)", CNN(rngs=nnx.Rngs(0)), _cnn_loss(avg_pool_2x2), images),
        (f"char-gpt baby{' (1 layer)' if config.quick else ''}", GPT(65, gpt_config, rngs=nnx.Rngs(0)), _gpt_loss,
         text),
    ]
    console = Console(highlight=False)
    table = Table(title=f"ms per training step: jitted alone vs inside lax.scan (K={config.steps}), "
                        f"median of {config.repeats}, {device_description(jax.devices()[0])}")
    for column in ("model", "jit, one step", "lax.scan, per step", "scan / single"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for name, model, loss, batch in cases:
        single, fused = measure(model, loss, batch, config.steps, config.repeats)
        table.add_row(name, f"{single:.1f}", f"{fused:.1f}", f"{fused / single:.2f}x")
    console.print(table)
    return 0
