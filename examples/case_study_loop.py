"""The case study's original training loop, as a plain script: what `jaxtrain scan` looks for.

Variant 0 of `jaxtrain bench ladder` (benchmarks/ladder_variants.py) written out: an MLP
128→512→512→64 (ReLU), MSE, plain SGD (lr 0.001), batch 32, inputs normalised with the training
set's statistics plus Gaussian noise. Written the way the case study's lab wrote it: NumPy
preprocessing and a `jnp.array` copy of every batch, an un-jitted `jax.value_and_grad`, a
hand-written update, the loss read back every step. It trains (slowly: about 10x slower per step
than the same math in `jaxtrain.fit`). `jaxtrain scan examples/case_study_loop.py` lists what makes
it slow; examples/case_study_fixed.py is the same workload with `jaxtrain.fit`.

    python examples/case_study_loop.py --steps 20
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

SIZES = (128, 512, 512, 64)
LR = 1e-3
EPS = 1e-6


def make_data(samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic regression: features with per-feature offsets and scales (so normalisation
    matters), targets from a random tanh teacher plus noise. (N, 128) and (N, 64), float32."""
    rng = np.random.default_rng(seed)
    scale, offset = rng.uniform(0.5, 5.0, SIZES[0]), rng.uniform(-3.0, 3.0, SIZES[0])
    x = rng.standard_normal((samples, SIZES[0])) * scale + offset
    teacher = rng.standard_normal((SIZES[0], SIZES[-1])) / np.sqrt(SIZES[0])
    y = np.tanh(((x - offset) / scale) @ teacher) + 0.1 * rng.standard_normal((samples, SIZES[-1]))
    return x.astype(np.float32), y.astype(np.float32)


def init_params(seed: int) -> dict[str, np.ndarray]:
    """He-normal weights, zero biases: w1, b1, w2, b2, w3, b3."""
    rng = np.random.default_rng(seed)
    params = {}
    for n, (fan_in, fan_out) in enumerate(zip(SIZES[:-1], SIZES[1:]), start=1):
        params[f"w{n}"] = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        params[f"b{n}"] = np.zeros(fan_out, np.float32)
    return params


def mlp(params, x):  # (B, 128) -> (B, 64)
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    h = jax.nn.relu(h @ params["w2"] + params["b2"])
    return h @ params["w3"] + params["b3"]


def mse(params, x, y):
    return jnp.mean((mlp(params, x) - y) ** 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--noise", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    x_train, y_train = make_data(args.samples, args.seed + 1)
    mean, std = x_train.mean(0), x_train.std(0)
    params = {k: jnp.array(v) for k, v in init_params(args.seed).items()}
    rng = np.random.default_rng(args.seed)
    grad_fn = jax.value_and_grad(mse)
    B = args.batch_size
    steps_per_epoch = len(x_train) // B
    losses = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        i = step % steps_per_epoch
        if i == 0:
            perm = rng.permutation(len(x_train))
        rows = perm[i * B : (i + 1) * B]
        xb = (x_train[rows] - mean) / (std + EPS)  # NumPy preprocessing, every step
        xb = xb + args.noise * rng.standard_normal(xb.shape)
        x = jnp.array(xb.astype(np.float32))  # host -> device copy, every step
        y = jnp.array(y_train[rows])
        loss, grads = grad_fn(params, x, y)  # the gradient, op by op: nothing is compiled
        params = {k: params[k] - LR * grads[k] for k in params}  # hand-written SGD
        losses.append(float(loss))  # waits for the step to finish, every step
        if step % 100 == 0:
            print(f"step {step:5d}  loss {losses[-1]:.4f}")
    seconds = time.perf_counter() - t0
    print(f"{args.steps} steps in {seconds:.2f} s ({1e3 * seconds / args.steps:.2f} ms/step, first step "
          f"included); loss {np.mean(losses[:10]):.4f} (first 10) -> {np.mean(losses[-10:]):.4f} (last 10)")


if __name__ == "__main__":
    main()
