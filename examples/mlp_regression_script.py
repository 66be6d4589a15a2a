"""mlp-regression written by hand: what an expert writes without jaxtrain.

The same work as `jaxtrain train mlp-regression --epochs 5 --quiet`: the recipe's synthetic data
(made here exactly as `jaxtrain.data.synthetic.regression_rows` makes them, without importing
jaxtrain), normalised with the training set's statistics inside the compiled step; the MLP
128→512→512→64 with ReLU, initialised like the recipe's (Flax NNX `Linear`, `nnx.Rngs(seed)`);
MSE, Adam 1e-3 with a constant schedule, batch 32, a reshuffle every epoch; after each epoch the
training loss (mean over the epoch's steps) and the validation loss and MAE over every
validation sample. Data sit on the device; one jitted `lax.scan` trains a whole epoch with the
parameters and optimizer state donated; metrics come back once per epoch.

What it does not do that jaxtrain does: no run directory (config, metrics.jsonl, summary),
no checkpoints, no TensorBoard events, no loss plot, no progress or profile report.

    python examples/mlp_regression_script.py --epochs 5

`jaxtrain bench overhead` times it against the jaxtrain command, both as fresh processes.
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

GEN_BLOCK_ROWS = 8192  # rows per generator seed: part of the data's definition


def make_rows(seed: int, n: int, features: int = 128, targets: int = 64, width: int = 256,
              label_noise: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """The first n rows of the recipe's regression process: (x (n, F), y (n, T)), float32."""
    rng = np.random.default_rng((seed, 0))  # the fixed teacher
    offset = rng.normal(0.0, 2.0, features).astype(np.float32)  # (F,)
    scale = rng.uniform(0.5, 3.0, features).astype(np.float32)  # (F,)
    w1 = rng.normal(0.0, 1.0 / np.sqrt(features), (features, width)).astype(np.float32)  # (F, H)
    w2 = rng.normal(0.0, 1.0 / np.sqrt(width), (width, targets)).astype(np.float32)  # (H, T)
    xs, ys = [], []
    for i in range(-(-n // GEN_BLOCK_ROWS)):
        block = np.random.default_rng((seed, 1, i))
        z = block.standard_normal((GEN_BLOCK_ROWS, features), dtype=np.float32)  # (R, F)
        noise = block.standard_normal((GEN_BLOCK_ROWS, targets), dtype=np.float32)  # (R, T)
        xs.append(z * scale + offset)
        ys.append((np.tanh(z @ w1) @ w2 + label_noise * noise).astype(np.float32))
    return np.concatenate(xs)[:n], np.concatenate(ys)[:n]


class MLP(nnx.Module):
    def __init__(self, sizes: tuple[int, ...], *, rngs: nnx.Rngs):
        self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:])])

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, F) -> (B, T)
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
        return self.layers[-1](x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=50_000, help="in all; the last --val-samples validate")
    parser.add_argument("--val-samples", type=int, default=5_000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0, help="initialisation and shuffling")
    parser.add_argument("--data-seed", type=int, default=1234)
    args = parser.parse_args()
    t0 = time.perf_counter()

    x, y = make_rows(args.data_seed, args.samples)
    n = args.samples - args.val_samples
    mean, std = x[:n].mean(0), x[:n].std(0)  # (F,) training-set statistics
    inv_std = 1.0 / (std + 1e-6)
    train = jax.device_put({"x": x[:n], "y": y[:n]})
    val = jax.device_put({"x": x[n:], "y": y[n:]})
    B, steps = args.batch_size, n // args.batch_size  # the last partial batch is dropped

    model = MLP((x.shape[1], 512, 512, y.shape[1]), rngs=nnx.Rngs(args.seed))
    graphdef, params = nnx.split(model)
    tx = optax.adam(args.lr)
    opt_state = tx.init(params)
    _, data_key = jax.random.split(jax.random.key(args.seed))

    def loss_fn(params, x, y):  # x (B, F) raw features, y (B, T)
        err = nnx.merge(graphdef, params)((x - mean) * inv_std) - y  # (B, T)
        return jnp.mean(err**2), jnp.mean(jnp.abs(err))

    @jax.jit
    def epoch_order(epoch):  # (N,) sample order of one epoch
        return jax.random.permutation(jax.random.fold_in(data_key, epoch), n)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_epoch(params, opt_state, data, perm):
        def step(carry, i):
            params, opt_state = carry
            idx = jax.lax.dynamic_slice_in_dim(perm, i * B, B)  # (B,)
            (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, data["x"][idx], data["y"][idx])
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), jnp.arange(steps))
        return params, opt_state, losses.mean()

    @jax.jit
    def evaluate(params, data):
        return loss_fn(params, data["x"], data["y"])  # every validation sample in one batch

    print(f"data and model ready in {time.perf_counter() - t0:.2f} s: {n:,} train / {args.val_samples:,} val, "
          f"{steps} steps of {B} per epoch")
    for epoch in range(1, args.epochs + 1):
        t = time.perf_counter()
        params, opt_state, train_loss = train_epoch(params, opt_state, train, epoch_order(epoch))
        val_loss, val_mae = evaluate(params, val)
        print(f"epoch {epoch}: train loss {float(train_loss):.6f}, val loss {float(val_loss):.6f}, "
              f"val MAE {float(val_mae):.6f} ({time.perf_counter() - t:.2f} s)")
    print(f"done in {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
