"""`custom-variable`: an MLP whose state lives in user-defined `nnx.Variable` subclasses.

Sources: the custom Variable pattern and its training loop are Flax's
`examples/nnx_toy_examples/01_functional_api.py` (a `Count(nnx.Variable)` incremented in `__call__`,
`nnx.split(model, nnx.Param, Count)`, a `jax.jit` step that merges, runs and returns the new
counts; SGD 0.1, batch 32; as written it raises TraceContextError on Flax 0.12.8, because `nnx.merge`
reuses the jit-level Variables under `jax.grad`: `hand.py` merges with `copy=True`) and
`docs_nnx/nnx_basics.md` ("Stateful computation"). The state
updated in `__call__` is spectral normalisation's power iteration as PyTorch implements it
(pytorch/pytorch `torch/nn/utils/spectral_norm.py`, Miyato et al. 2018): each layer keeps unit
vectors u (out) and v (in) as buffers, does one power-iteration step per training forward without
gradient, and divides the weight by sigma = u^T W v. Here u and v are a `PowerIterate(nnx.Variable)`
and the call count a `Count(nnx.Variable)`; neither is a Param, BatchStat or RNG state, so a
trainer has to carry them through the step by their own type. MNIST-shaped inputs, flattened.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.zoo.base import Batch, ZooModel, class_images

SOURCE = ("google/flax examples/nnx_toy_examples/01_functional_api.py (custom Count variable) + "
          "pytorch/pytorch torch/nn/utils/spectral_norm.py (power iteration)")


class Count(nnx.Variable):
    """How many times the model ran in training mode."""


class PowerIterate(nnx.Variable):
    """A unit vector of spectral normalisation's power iteration, carried between steps."""


def _normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
    return x / jnp.maximum(jnp.linalg.norm(x), eps)  # torch.nn.functional.normalize


class SpectralLinear(nnx.Module):
    """`nnx.Linear` whose kernel is divided by its largest singular value (estimated)."""

    def __init__(self, in_features: int, out_features: int, *, rngs: nnx.Rngs):
        self.linear = nnx.Linear(in_features, out_features, rngs=rngs)
        self.u = PowerIterate(_normalize(jax.random.normal(rngs.params(), (out_features,))))
        self.v = PowerIterate(_normalize(jax.random.normal(rngs.params(), (in_features,))))
        self.use_running_average = False  # True (eval): use the stored u, v without updating them

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, in) -> (B, out)
        kernel = self.linear.kernel[...]  # (in, out) = torch's weight (out, in) transposed
        u, v = self.u[...], self.v[...]
        if not self.use_running_average:
            v = _normalize(kernel @ u)  # W^T u, (in,)
            u = _normalize(kernel.T @ v)  # W v, (out,)
            u, v = jax.lax.stop_gradient(u), jax.lax.stop_gradient(v)
            self.u[...] = u
            self.v[...] = v
        sigma = u @ (kernel.T @ v)  # u^T W v, differentiated through the kernel
        return x @ (kernel / sigma) + self.linear.bias[...]


class SpectralMLP(nnx.Module):
    """Flattened images (B, 28, 28, 1) -> logits (B, 10) through spectrally normalised layers."""

    def __init__(self, sizes: tuple[int, ...] = (784, 256, 256, 10), *, rngs: nnx.Rngs):
        self.count = Count(jnp.array(0))
        self.layers = nnx.List([SpectralLinear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:])])

    def __call__(self, x: jax.Array) -> jax.Array:
        if not self.layers[0].use_running_average:
            self.count[...] += 1
        x = x.reshape(x.shape[0], -1)  # (B, 784)
        for layer in self.layers[:-1]:
            x = nnx.relu(layer(x))
        return self.layers[-1](x)


def loss_fn(model: SpectralMLP, batch: Batch, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Softmax cross-entropy; also the accuracy."""
    logits = model(batch["image"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
    return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"])}


def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
    """MNIST-shaped: image float32 (28, 28, 1) in [0, 1], label int32."""
    image, label = class_images(n, seed, (28, 28, 1))
    return {"image": image, "label": label}


MODEL = ZooModel(
    name="custom-variable",
    source=SOURCE,
    make_model=lambda seed: SpectralMLP(rngs=nnx.Rngs(seed)),
    loss_fn=loss_fn,
    make_data=make_data,
    optimizer=lambda: optax.sgd(0.1),
    batch_size=32,
    hand_jit="jit",
)
