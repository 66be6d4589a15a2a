"""A user's `nnx.Conv` MNIST convnet (Keras's example shape) through `jaxtrain.fit`, ms per step.

Conv 32 3x3 → max-pool → Conv 64 3x3 → max-pool → Dropout 0.5 → Linear 10, batch 128, Adam 1e-3,
on random MNIST-shaped data (a step's cost does not depend on the values): 64-step epochs, 1000
validation rows. It prints each epoch's training ms per step (compile excluded), so the same script
times jaxtrain's code before and after a change:

    python examples/convnet_fit.py                                   # this checkout, 2 epochs
    PYTHONPATH=OTHER/src python examples/convnet_fit.py --epochs 1 --old   # an older checkout's fit
                                                                     # (no step_form setting)

`--form scan|unroll|step` pins the form of the compiled call (default: measured).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import optax
from flax import nnx

import jaxtrain


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.c1 = nnx.Conv(1, 32, (3, 3), padding="VALID", rngs=rngs)
        self.c2 = nnx.Conv(32, 64, (3, 3), padding="VALID", rngs=rngs)
        self.drop = nnx.Dropout(0.5)
        self.fc = nnx.Linear(1600, 10, rngs=rngs)

    def __call__(self, x, rngs=None):  # (B, 28, 28, 1) -> (B, 10)
        x = nnx.max_pool(nnx.relu(self.c1(x)), (2, 2), (2, 2))  # (B, 13, 13, 32)
        x = nnx.max_pool(nnx.relu(self.c2(x)), (2, 2), (2, 2))  # (B, 5, 5, 64)
        x = self.drop(x.reshape(x.shape[0], -1), rngs=rngs)  # (B, 1600)
        return self.fc(x)


def loss_fn(model: Net, batch: dict, key):
    logits = model(batch["x"], rngs=nnx.Rngs(dropout=key))
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss, {"accuracy": (logits.argmax(-1) == batch["y"]).mean()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--form", default="auto")
    parser.add_argument("--old", action="store_true", help="a jaxtrain without TrainConfig.step_form")
    args = parser.parse_args()
    rng, steps = np.random.default_rng(0), 64
    n = 128 * steps
    data = {"x": rng.random((n, 28, 28, 1), dtype=np.float32), "y": rng.integers(0, 10, n)}
    val = {k: v[:1000] for k, v in data.items()}
    extra = {} if args.old else {"step_form": args.form}
    config = jaxtrain.TrainConfig(epochs=args.epochs, batch_size=128,
                                  optim=jaxtrain.OptimConfig(name="adam", lr=1e-3), **extra)
    t0 = time.perf_counter()
    result = jaxtrain.fit(Net(nnx.Rngs(0)), loss_fn, data, val, config=config, verbosity="summary")
    per_step = ", ".join(f"{r['train_time_s'] / steps * 1e3:.1f}" for r in result.history)
    print(f"ms per training step, by epoch: {per_step} (wall {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
