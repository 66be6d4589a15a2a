"""The short run of `examples/shortrun_fit.py` written by hand: what an expert writes without jaxtrain.

The same data (made exactly as there), model (784-256-BatchNorm-ReLU-Dropout-10, Flax NNX,
`nnx.Rngs(seed)`), optimizer (Adam 1e-3), batch size (32), epochs (5 of 512 steps) and per-epoch
validation (loss and accuracy over every validation sample, BatchNorm's running averages, dropout
off). Data sit on the device; one jitted `lax.scan` trains a whole epoch with the parameters,
BatchNorm statistics and optimizer state donated; a reshuffle every epoch; metrics come back once
per epoch.

What it does not do that `fit` does: no K chooser, no progress, summary or profile, no checks.

    python examples/shortrun_script.py
    /usr/bin/time -v python examples/shortrun_script.py   # wall time and peak RSS

`jaxtrain bench shortrun` times it against examples/shortrun_fit.py, both as fresh processes.
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

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
    n, B = args.train_samples, args.batch_size
    steps = n // B  # the last partial batch is dropped
    train = jax.device_put({"x": x[:n], "y": y[:n]})
    val = jax.device_put({"x": x[n:], "y": y[n:]})

    model = Classifier(rngs=nnx.Rngs(args.seed))
    graphdef, params, stats = nnx.split(model, nnx.Param, ...)
    model.eval()
    eval_graphdef = nnx.split(model, nnx.Param, ...)[0]
    tx = optax.adam(1e-3)
    opt_state = tx.init(params)
    step_key, data_key = jax.random.split(jax.random.key(args.seed))

    def loss_fn(params, stats, x, y, key):  # x (B, F), y (B,)
        model = nnx.merge(graphdef, params, stats, copy=True)  # fresh Variables in this trace
        logits = model(x, key)  # (B, C)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, nnx.split(model, nnx.Param, ...)[2]  # the updated BatchNorm statistics

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def train_epoch(params, stats, opt_state, data, epoch):
        perm = jax.random.permutation(jax.random.fold_in(data_key, epoch), n)  # (N,)

        def step(carry, i):
            params, stats, opt_state = carry
            idx = jax.lax.dynamic_slice_in_dim(perm, i * B, B)  # (B,)
            key = jax.random.fold_in(step_key, (epoch - 1) * steps + i)
            (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                params, stats, data["x"][idx], data["y"][idx], key)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), stats, opt_state), loss

        (params, stats, opt_state), losses = jax.lax.scan(step, (params, stats, opt_state), jnp.arange(steps))
        return params, stats, opt_state, losses.mean()

    @jax.jit
    def evaluate(params, stats, data):  # every validation sample in one batch
        logits = nnx.merge(eval_graphdef, params, stats, copy=True)(data["x"])  # (V, C)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, data["y"]).mean()
        return loss, jnp.mean(jnp.argmax(logits, -1) == data["y"])

    for epoch in range(1, args.epochs + 1):
        t = time.perf_counter()
        params, stats, opt_state, train_loss = train_epoch(params, stats, opt_state, train, epoch)
        val_loss, val_acc = evaluate(params, stats, val)
        print(f"epoch {epoch}: train loss {float(train_loss):.4f}, val loss {float(val_loss):.4f}, "
              f"val accuracy {float(val_acc):.4f} ({time.perf_counter() - t:.2f} s)")
    print(f"final val accuracy {float(val_acc):.4f}, val loss {float(val_loss):.4f} "
          f"({time.perf_counter() - t0:.2f} s)")


if __name__ == "__main__":
    main()
