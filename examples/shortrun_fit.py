"""A short run of a small classifier through `jaxtrain.fit`, as a user writes it.

The model, data and settings of `examples/shortrun_script.py` (the same training written by hand
with jit + `lax.scan`): a 784-256-BatchNorm-ReLU-Dropout-10 classifier on synthetic, MNIST-shaped
data made deterministically below (10 class prototypes plus Gaussian noise), Adam 1e-3, batch 32,
5 epochs of 512 steps (2,560 steps), validation after every epoch. `fit` runs with its defaults
(automatic K, no run directory, a printed summary and profile).

    python examples/shortrun_fit.py
    /usr/bin/time -v python examples/shortrun_fit.py   # wall time and peak RSS

`jaxtrain bench shortrun` times it against the hand-written script, both as fresh processes.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jaxtrain

FEATURES, CLASSES, HIDDEN = 784, 10, 256


def make_data(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n MNIST-shaped samples: x (n, 784) float32 = a class prototype + unit noise, y (n,) int32."""
    rng = np.random.default_rng(seed)
    prototypes = rng.normal(0.0, 0.1, (CLASSES, FEATURES)).astype(np.float32)  # (C, F)
    y = rng.integers(0, CLASSES, n).astype(np.int32)  # (N,)
    x = prototypes[y] + rng.standard_normal((n, FEATURES), dtype=np.float32)  # (N, F)
    return x, y


class Classifier(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(FEATURES, HIDDEN, rngs=rngs)
        self.bn = nnx.BatchNorm(HIDDEN, rngs=rngs)
        self.drop = nnx.Dropout(0.2)
        self.fc2 = nnx.Linear(HIDDEN, CLASSES, rngs=rngs)

    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:  # (B, F) -> (B, C)
        h = self.drop(jax.nn.relu(self.bn(self.fc1(x))), rngs=key)  # dropout off in eval mode
        return self.fc2(h)


def loss_fn(model: Classifier, batch: dict[str, jax.Array], key: jax.Array):
    logits = model(batch["x"], key)  # (B, C)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["y"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--train-samples", type=int, default=16_384)
    parser.add_argument("--val-samples", type=int, default=4_096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    t0 = time.perf_counter()
    x, y = make_data(1234, args.train_samples + args.val_samples)
    n = args.train_samples
    train, val = {"x": x[:n], "y": y[:n]}, {"x": x[n:], "y": y[n:]}
    model = Classifier(rngs=nnx.Rngs(args.seed))
    config = jaxtrain.TrainConfig(epochs=args.epochs, batch_size=args.batch_size, seed=args.seed)
    result = jaxtrain.fit(model, loss_fn, train, val, config)
    print(f"final val accuracy {result.history[-1]['val_accuracy']:.4f}, val loss "
          f"{result.history[-1]['val_loss']:.4f} ({time.perf_counter() - t0:.2f} s)")


if __name__ == "__main__":
    main()
