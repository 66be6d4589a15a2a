"""Minimal reproduction: XLA:CPU float32 matmuls of a small transformer's shapes against PyTorch's.

Written as a JAX bug report would be (docs/benchmarks.md, "Faster than PyTorch: what is left"):
the baby GPT's training step is a few dozen matmuls of (768, C) activations, and the step stays
slower than PyTorch's although XLA runs the rest of it (optimizer, dispatch) faster. Every matmul
of the step is here, forward (x @ W), input gradient (dy @ W^T) and weight gradient (x^T @ dy),
each timed alone: R back-to-back products inside one jitted `lax.fori_loop` (no dispatch cost in
the figure) against `torch.mm` on the same threads, and NumPy's BLAS.

    python examples/repro_xla_cpu_matmul.py            # needs jax; torch==2.13.0 optional

Only JAX, NumPy and (optionally) PyTorch; nothing from jaxtrain.
"""

from __future__ import annotations

import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

N = 768  # tokens per step: batch 12 x context 64
SHAPES = [(128, 384), (128, 128), (128, 512), (512, 128), (128, 65)]  # (C_in, C_out): qkv, proj, fc, fc-out, head
R = 20  # products per timed call
REPEATS = 15


def jax_loop(op):
    """R products in one compiled loop; each iteration's input depends on the last (no hoisting)."""

    def f(a, b):
        def body(i, c):
            return c + op(a * c, b)[0, 0] * 1e-30

        return jax.lax.fori_loop(0, R, body, jnp.ones((), a.dtype))

    return jax.jit(f)


def median_ms(run) -> float:
    run()
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3 / R


# Each product: its operands from (x, w, dy), and the product (the same expression for JAX, NumPy and torch).
PRODUCTS = {
    "fwd x@W": (lambda x, w, dy: (x, w), lambda a, b: a @ b),
    "dx dy@W^T": (lambda x, w, dy: (dy, w), lambda a, b: a @ b.T),
    "dW x^T@dy": (lambda x, w, dy: (x, dy), lambda a, b: a.T @ b),
}


def main() -> None:
    try:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
    except ImportError:
        torch = None
    print(f"jax {jax.__version__}, torch {torch.__version__ if torch else '-'}, numpy {np.__version__}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print(f"{'(N, C_in) -> C_out':20} {'product':10} {'jax ms':>8} {'torch ms':>9} {'numpy ms':>9} {'jax/torch':>9} "
          f"{'jax GFLOP/s':>11}")
    totals = {"jax": 0.0, "torch": 0.0}
    rng = np.random.default_rng(0)
    for c_in, c_out in SHAPES:
        x = rng.standard_normal((N, c_in), np.float32)
        w = rng.standard_normal((c_in, c_out), np.float32)
        dy = rng.standard_normal((N, c_out), np.float32)
        for name, (pick, product) in PRODUCTS.items():
            a, b = pick(x, w, dy)
            ja, jb, looped = jnp.asarray(a), jnp.asarray(b), jax_loop(product)
            t_jax = median_ms(lambda: looped(ja, jb).block_until_ready())
            t_np = median_ms(lambda: [product(a, b) for _ in range(R)])
            t_torch = float("nan")
            if torch is not None:
                ta, tb = torch.from_numpy(a), torch.from_numpy(b)
                t_torch = median_ms(lambda: [product(ta, tb) for _ in range(R)])
                totals["torch"] += t_torch
            totals["jax"] += t_jax
            gflops = 2 * N * c_in * c_out / t_jax / 1e6
            print(f"({N}, {c_in}) -> {c_out:<8} {name:10} {t_jax:8.3f} {t_torch:9.3f} {t_np:9.3f} "
                  f"{t_jax / t_torch:8.2f}x {gflops:11.1f}")
    if torch is not None:
        print(f"sum over the products: jax {totals['jax']:.2f} ms, torch {totals['torch']:.2f} ms "
              f"({totals['jax'] / totals['torch']:.2f}x)")


if __name__ == "__main__":
    main()
