"""The rungs of the optimization ladder: one training loop per variant, same math in each.

Every variant trains the MLP 128→512→512→64 (ReLU) with MSE and plain SGD (lr 0.001) from the
same initial weights, visiting batches in the same order (`epoch_permutation`, as `fit` does).
Inputs are normalised with the training-set statistics and, when `noise > 0`, get Gaussian
noise; the noise streams differ between variants, so validation runs use `noise = 0`.

A variant is a function `run(setup, steps, noise) -> Trained`: it trains `steps` steps and
reports its steady-state time per step, its compile time and the time to its first result.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

LR = 1e-3
EPS = 1e-6


@dataclasses.dataclass
class Setup:
    """What every variant starts from (NumPy arrays on the host)."""

    x: np.ndarray  # (N, 128) float32, raw features
    y: np.ndarray  # (N, 64) float32
    x_test: np.ndarray
    mean: np.ndarray  # (128,) training-set statistics for normalisation
    std: np.ndarray
    init: dict[str, np.ndarray]  # w1, b1, w2, b2, w3, b3
    batch_size: int
    seed: int

    @property
    def steps_per_epoch(self) -> int:
        return len(self.x) // self.batch_size

    def permutation(self, epoch: int) -> np.ndarray:
        """Epoch `epoch`'s sample order: the one `jaxtrain.fit` uses for this seed."""
        from jaxtrain._src.feeds import epoch_permutation

        return epoch_permutation(jax.random.split(jax.random.key(self.seed))[1], epoch, len(self.x))

    def batches(self, steps: int):
        """(step, epoch, row indices as NumPy) for `steps` steps across epochs."""
        spe = self.steps_per_epoch
        for step in range(steps):
            epoch, i = divmod(step, spe)
            if i == 0:
                perm = np.asarray(self.permutation(epoch + 1))
            yield step, perm[i * self.batch_size : (i + 1) * self.batch_size]


@dataclasses.dataclass
class Trained:
    """A variant's result: final parameters and how long its steps took.

    Attributes:
      params: the trained weights (w1, b1, ..., b3) as NumPy arrays.
      step_s: steady-state seconds per optimizer step (compile excluded).
      compile_s: seconds of compilation (0 for the un-jitted original).
      first_step_s: wall time until the first step's result was available (compile included).
      steps_per_call: optimizer steps per dispatched call.
    """

    params: dict[str, np.ndarray]
    step_s: float
    compile_s: float
    first_step_s: float
    steps_per_call: int


def _from_step_times(params: dict[str, Any], times: list[float]) -> Trained:
    """Timing from one wall time per step: the first includes compilation; the steady cost is the
    mean of the rest (a mean, not a median: pauses are part of what such a loop costs)."""
    steady = float(np.mean(times[1:])) if len(times) > 1 else times[0]
    return Trained(jax.tree.map(np.asarray, params), steady, max(times[0] - steady, 0.0), times[0], 1)


def mlp(params: dict[str, Any], x):  # (B, 128) -> (B, 64); works for jnp and NumPy-backed jax arrays
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    h = jax.nn.relu(h @ params["w2"] + params["b2"])
    return h @ params["w3"] + params["b3"]


def mse(params, x, y):
    return jnp.mean((mlp(params, x) - y) ** 2)


def _numpy_preprocess(setup: Setup, rows: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    x = (setup.x[rows] - setup.mean) / (setup.std + EPS)
    if noise:
        x = x + noise * rng.standard_normal(x.shape, dtype=np.float32)
    return x.astype(np.float32)


def _jax_preprocess(setup_mean, setup_std, x, noise: float, key):
    x = (x - setup_mean) / (setup_std + EPS)
    return x + noise * jax.random.normal(key, x.shape) if noise else x


def original(setup: Setup, steps: int, noise: float) -> Trained:
    """0: no jit; NumPy preprocessing and jnp.array conversion every batch; un-jitted
    jax.grad; a dict-comprehension update; the loss read back every step."""
    params = {k: jnp.array(v) for k, v in setup.init.items()}
    rng = np.random.default_rng(setup.seed)
    grad_fn = jax.value_and_grad(mse)
    times = []
    for _, rows in setup.batches(steps):
        t0 = time.perf_counter()
        x = jnp.array(_numpy_preprocess(setup, rows, noise, rng))
        y = jnp.array(setup.y[rows])
        loss, grads = grad_fn(params, x, y)
        params = {k: params[k] - LR * grads[k] for k in params}
        float(loss)  # the per-step host sync of the original loop
        times.append(time.perf_counter() - t0)
    result = _from_step_times(params, times)
    return dataclasses.replace(result, compile_s=0.0)  # nothing is compiled ahead; first-step cost is eager warm-up


def plus_jit(setup: Setup, steps: int, noise: float) -> Trained:
    """1: as 0, with the loss, gradient and update in one jitted step."""

    @jax.jit
    def step(params, x, y):
        loss, grads = jax.value_and_grad(mse)(params, x, y)
        return {k: params[k] - LR * grads[k] for k in params}, loss

    params = {k: jnp.array(v) for k, v in setup.init.items()}
    rng = np.random.default_rng(setup.seed)
    times = []
    for _, rows in setup.batches(steps):
        t0 = time.perf_counter()
        x = jnp.array(_numpy_preprocess(setup, rows, noise, rng))
        params, loss = step(params, x, jnp.array(setup.y[rows]))
        float(loss)
        times.append(time.perf_counter() - t0)
    return _from_step_times(params, times)


def _device_loop(setup: Setup, steps: int, noise: float, update: Callable, init_opt: Callable) -> Trained:
    """Variants 2 and 3: data on the device once, gather + preprocessing inside the jitted step."""
    x_all, y_all = jnp.asarray(setup.x), jnp.asarray(setup.y)
    mean, std = jnp.asarray(setup.mean), jnp.asarray(setup.std)
    B = setup.batch_size

    @jax.jit
    def step(params, opt_state, perm, i, key):
        rows = jax.lax.dynamic_slice_in_dim(perm, i * B, B)
        x = _jax_preprocess(mean, std, x_all[rows], noise, key)
        loss, grads = jax.value_and_grad(mse)(params, x, y_all[rows])
        params, opt_state = update(params, grads, opt_state)
        return params, opt_state, loss

    params = {k: jnp.array(v) for k, v in setup.init.items()}
    opt_state = init_opt(params)
    key = jax.random.key(setup.seed)
    spe = setup.steps_per_epoch
    perm = setup.permutation(1)
    t0 = time.perf_counter()
    params, opt_state, loss = step(params, opt_state, perm, 0, jax.random.fold_in(key, 0))
    jax.block_until_ready(loss)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in range(1, steps):  # dispatched asynchronously: losses stay on the device
        epoch, i = divmod(s, spe)
        if i == 0:
            perm = setup.permutation(epoch + 1)
        params, opt_state, loss = step(params, opt_state, perm, i, jax.random.fold_in(key, s))
    jax.block_until_ready(params)
    steady = (time.perf_counter() - t0) / max(steps - 1, 1) if steps > 1 else first
    return Trained(jax.tree.map(np.asarray, params), steady, max(first - steady, 0.0), first, 1)


def plus_device_data(setup: Setup, steps: int, noise: float) -> Trained:
    """2: data on the device once; preprocessing inside the compiled step; manual update."""

    def update(params, grads, opt_state):
        return {k: params[k] - LR * grads[k] for k in params}, opt_state

    return _device_loop(setup, steps, noise, update, lambda params: ())


def plus_optax(setup: Setup, steps: int, noise: float) -> Trained:
    """3: as 2, with the update from optax.sgd (the same math)."""
    tx = optax.sgd(LR)

    def update(params, grads, opt_state):
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return _device_loop(setup, steps, noise, update, tx.init)


def plus_fused(setup: Setup, steps: int, noise: float) -> Trained:
    """4: a per-sample forward vmapped over the batch; K steps per call with lax.scan (K = one
    epoch, or `steps` if fewer); the state donated."""
    x_all, y_all = jnp.asarray(setup.x), jnp.asarray(setup.y)
    mean, std = jnp.asarray(setup.mean), jnp.asarray(setup.std)
    B, spe = setup.batch_size, setup.steps_per_epoch
    K = min(spe, steps)
    tx = optax.sgd(LR)

    def loss_fn(params, x, y):
        per_sample = jax.vmap(lambda xi: mlp(params, xi[None])[0])(x)  # (B, 64)
        return jnp.mean((per_sample - y) ** 2)

    def multi_step(params, opt_state, perm, start, key):
        def body(carry, i):
            params, opt_state = carry
            rows = jax.lax.dynamic_slice_in_dim(perm, (start + i) * B, B)
            x = _jax_preprocess(mean, std, x_all[rows], noise, jax.random.fold_in(key, start + i))
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y_all[rows])
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), jnp.arange(K))
        return params, opt_state, losses

    params = {k: jnp.array(v) for k, v in setup.init.items()}
    opt_state = tx.init(params)
    key = jax.random.key(setup.seed)
    t0 = time.perf_counter()
    call = jax.jit(multi_step, donate_argnums=(0, 1)).lower(params, opt_state, setup.permutation(1), 0, key).compile()
    compile_s = time.perf_counter() - t0
    times = []
    for s in range(0, steps - steps % K, K):
        t0 = time.perf_counter()
        epoch, i = divmod(s, spe)
        params, opt_state, loss = call(params, opt_state, setup.permutation(epoch + 1), i, key)
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - t0)
    step_s = float(np.median(times)) / K
    return Trained(jax.tree.map(np.asarray, params), step_s, compile_s, compile_s + times[0], K)


def jaxtrain_fit(setup: Setup, steps: int, noise: float) -> Trained:
    """5: jaxtrain.fit with its default execution settings and the ladder's update rule."""
    import io

    from rich.console import Console

    from jaxtrain import OptimConfig, TrainConfig, data
    from jaxtrain._src.models import MLP
    from jaxtrain.engine import RunOptions, run

    model = MLP((128, 512, 512, 64), rngs=nnx.Rngs(0))
    for layer, n in zip(model.layers, (1, 2, 3)):
        layer.kernel[...] = jnp.asarray(setup.init[f"w{n}"])
        layer.bias[...] = jnp.asarray(setup.init[f"b{n}"])

    def loss_fn(model, batch, key):
        return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}

    spe = setup.steps_per_epoch
    if steps % spe:
        raise ValueError(f"jaxtrain.fit trains whole epochs: steps={steps} is not a multiple of {spe}")
    optim = OptimConfig(name="sgd", lr=LR)
    config = TrainConfig(epochs=steps // spe, batch_size=setup.batch_size, seed=setup.seed, optim=optim)
    result = run(
        model, loss_fn, {"x": setup.x, "y": setup.y}, None, config,
        preprocess=data.normalize("x", setup.mean, setup.std, EPS),
        augment=data.gaussian_noise("x", noise) if noise else None,
        verbosity="summary", session=RunOptions(console=Console(file=io.StringIO())),
    )
    params = {}
    for layer, n in zip(model.layers, (1, 2, 3)):
        params[f"w{n}"], params[f"b{n}"] = np.asarray(layer.kernel[...]), np.asarray(layer.bias[...])
    step_s = float(np.median([r["train_time_s"] for r in result.history])) / spe
    compile_s = result.summary["compile_time_s"]
    k = result.summary["steps_per_call"]
    return Trained(params, step_s, compile_s, compile_s + k * step_s, k)


VARIANTS: dict[int, tuple[str, Callable[[Setup, int, float], Trained]]] = {
    0: ("original", original),
    1: ("+jit", plus_jit),
    2: ("+device data", plus_device_data),
    3: ("+optax", plus_optax),
    4: ("+fused (vmap + scan)", plus_fused),
    5: ("jaxtrain", jaxtrain_fit),
}


def pytorch(setup: Setup, steps: int, noise: float, compiled: bool = False) -> Trained:
    """6 and 7: the same model, initial weights, batch order, preprocessing and SGD in PyTorch
    (eager, or with `torch.compile` on the model), threads = cores."""
    import os

    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(setup.seed)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 64))
    with torch.no_grad():
        for n, layer in zip((1, 2, 3), (model[0], model[2], model[4])):
            layer.weight.copy_(torch.from_numpy(setup.init[f"w{n}"].T.copy()))  # torch stores (out, in)
            layer.bias.copy_(torch.from_numpy(setup.init[f"b{n}"]))
    forward = torch.compile(model) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x_all, y_all = torch.from_numpy(setup.x), torch.from_numpy(setup.y)
    mean, std = torch.from_numpy(setup.mean), torch.from_numpy(setup.std)

    def step(rows: torch.Tensor) -> torch.Tensor:
        x = (x_all[rows] - mean) / (std + EPS)
        if noise:
            x = x + noise * torch.randn_like(x)
        loss = torch.mean((forward(x) - y_all[rows]) ** 2)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    B, spe = setup.batch_size, setup.steps_per_epoch
    perm = torch.from_numpy(np.asarray(setup.permutation(1)).astype(np.int64))
    t0 = time.perf_counter()
    step(perm[:B])
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in range(1, steps):
        epoch, i = divmod(s, spe)
        if i == 0:
            perm = torch.from_numpy(np.asarray(setup.permutation(epoch + 1)).astype(np.int64))
        step(perm[i * B : (i + 1) * B])
    steady = (time.perf_counter() - t0) / max(steps - 1, 1) if steps > 1 else first
    params = {}
    for n, layer in zip((1, 2, 3), (model[0], model[2], model[4])):
        params[f"w{n}"] = layer.weight.detach().numpy().T.copy()
        params[f"b{n}"] = layer.bias.detach().numpy().copy()
    return Trained(params, steady, max(first - steady, 0.0), first, 1)


VARIANTS[6] = ("PyTorch eager", pytorch)
VARIANTS[7] = ("torch.compile", lambda setup, steps, noise: pytorch(setup, steps, noise, compiled=True))
