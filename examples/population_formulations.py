"""How to train P trials of one shape at once on this backend: five formulations, timed side by side.

mlp-regression's MLP (128→512→512→64, batch 32, Adam through `optax.inject_hyperparams`, each
member its own learning rate and initialisation) built by jaxtrain's program builder; K steps
fused with `lax.scan`, each formulation run `REPEATS` times, interleaved, medians:

  lone      one member per compiled call, the P members one after another (what P sequential
            trials compute);
  vmap      `jax.vmap` of the train step over the members' stacked states, one shared batch;
  vmap-own  the same with each member's own batch (each member its own data order);
  devices   the members split over 2 virtual CPU devices (`shard_map`), `vmap` within each;
  lone-config as lone, each member's program built from its config (the config's Adam, which
            holds its rate in its state and its betas in the program; earlier tables' lone-const
            held the rate as a constant, before issue 38);
  tuple     each member's own train step (its own program's, as lone-config), the P of them in one
            scanned program, their states a tuple.

Prints member-steps per second and the ratio to `lone`, and checks each member of `vmap` and of
`tuple` against its lone run (largest parameter difference). XLA_FLAGS is set here, before JAX
starts.

    python examples/population_formulations.py [P ...] [--only lone,vmap] [--steps K] [--repeats R]
"""

import argparse
import dataclasses
import os
import statistics
import time

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from jaxtrain import CheckpointConfig, TrainConfig  # noqa: E402
from jaxtrain._src.program import build_program  # noqa: E402
from jaxtrain.data import make_rows  # noqa: E402
from jaxtrain.models import MLP  # noqa: E402

parser = argparse.ArgumentParser(description="P trials of one shape at once: formulations timed side by side")
parser.add_argument("populations", nargs="*", type=int, default=[4, 8, 16], help="P, one table each")
parser.add_argument("--only", default="", help="comma-separated formulations (default: all)")
parser.add_argument("--steps", type=int, default=100, help="K steps fused per timed call")
parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (medians)")
args = parser.parse_args()
K, REPEATS, BATCH = args.steps, args.repeats, 32
POPULATIONS = args.populations


def loss(model, batch, key):
    return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}


def member(seed: int, lr: float, inject: bool = True):
    """One member's program: its own initialisation and learning rate (held in the optimizer state
    with `inject`, else the config's Adam, as `fit` builds it)."""
    config = TrainConfig(batch_size=BATCH, seed=seed, checkpoint=CheckpointConfig(enabled=False), mesh="data=1")
    config = dataclasses.replace(config, optim=dataclasses.replace(config.optim, lr=lr))
    model = MLP((128, 512, 512, 64), rngs=nnx.Rngs(seed))
    tx = optax.inject_hyperparams(optax.adam)(learning_rate=lr) if inject else None
    return build_program(model, loss, config, optimizer=tx, total_steps=K)


rows = make_rows("mlp-regression", 0, 0, K * BATCH * max(16, *POPULATIONS))  # a block of K batches per member
x = jnp.asarray(rows["features"]).reshape(-1, K, BATCH, 128)
y = jnp.asarray(rows["targets"]).reshape(-1, K, BATCH, 64)


def scanned(step):
    def run(state, xs, ys):
        return jax.lax.scan(lambda s, b: (step(s, {"x": b[0], "y": b[1]})[0], None), state, (xs, ys))[0]
    return run


def timed(fn, *args):
    jax.block_until_ready(fn(*args))  # compiled and warm
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


stack = lambda states: jax.tree.map(lambda *a: jnp.stack(a), *states)  # noqa: E731
for P in POPULATIONS:
    programs = [member(seed, lr) for seed, lr in zip(range(P), np.geomspace(1e-4, 1e-2, P))]
    step = programs[0].train_step  # the optimizer reads each member's rate from its own state
    states = [p.state for p in programs]
    lone = jax.jit(scanned(step))
    vmapped = jax.jit(scanned(jax.vmap(step, in_axes=(0, None))))
    own = jax.jit(lambda s, xs, ys: scanned(jax.vmap(step))(s, xs, ys))
    mesh = Mesh(np.array(jax.devices()[:2]), ("members",))
    split = jax.jit(jax.shard_map(scanned(jax.vmap(step, in_axes=(0, None))), mesh=mesh,
                                  in_specs=(PartitionSpec("members"), PartitionSpec(), PartitionSpec()),
                                  out_specs=PartitionSpec("members")))
    wanted = args.only.split(",") if args.only else ["lone-config", "tuple"]
    solo = ([member(seed, lr, inject=False) for seed, lr in zip(range(P), np.geomspace(1e-4, 1e-2, P))]
            if {"lone-config", "tuple"} & set(wanted) else [])  # P programs built: only when timed
    solo_runs = [jax.jit(scanned(p.train_step)) for p in solo]

    def steps(states, b):
        return tuple(p.train_step(s, {"x": b["x"], "y": b["y"]})[0] for p, s in zip(solo, states))

    tupled = jax.jit(scanned(lambda states, b: (steps(states, b), None)))
    solo_states = tuple(p.state for p in solo)
    together = stack(states)
    on_devices = jax.device_put(together, NamedSharding(mesh, PartitionSpec("members")))
    xs_own = jnp.swapaxes(x[:P], 0, 1)  # (K, P, batch, features): member i reads block i
    ys_own = jnp.swapaxes(y[:P], 0, 1)
    runs = {
        "lone": lambda: sum(timed(lone, s, x[0], y[0]) for s in states),
        "vmap": lambda: timed(vmapped, together, x[0], y[0]),
        "vmap-own": lambda: timed(own, together, xs_own, ys_own),
        "devices": lambda: timed(split, on_devices, x[0], y[0]) if P % 2 == 0 else float("nan"),
        "lone-config": lambda: sum(timed(f, s, x[0], y[0]) for f, s in zip(solo_runs, solo_states)),
        "tuple": lambda: timed(tupled, solo_states, x[0], y[0]),
    }
    if args.only:
        runs = {name: run for name, run in runs.items() if name in args.only.split(",")}
    seconds = {name: [] for name in runs}
    for _ in range(REPEATS):
        for name, run in runs.items():
            seconds[name].append(run())
    base = statistics.median(seconds["lone"]) if "lone" in seconds else float("nan")
    print(f"P={P}: {K} steps of batch {BATCH} per member; {REPEATS} interleaved repeats, medians")
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"  {name:11s} {P * K / median:9,.0f} member-steps/s  {base / median:5.2f}x lone")
    if "vmap" in runs:  # each member of the stacked program against its lone run
        alone = [lone(s, x[0], y[0]) for s in states]
        batched = vmapped(together, x[0], y[0])
        diff = max(float(jnp.max(jnp.abs(a - b[i]))) for i, one in enumerate(alone)
                   for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(batched.params)))
        print(f"  vmap member vs its lone run: largest parameter difference {diff:.2e}")
    if "tuple" in runs:
        alone = [f(s, x[0], y[0]) for f, s in zip(solo_runs, solo_states)]
        joint = tupled(solo_states, x[0], y[0])
        diff = max(float(jnp.max(jnp.abs(a - b))) for one, other in zip(alone, joint)
                   for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(other.params)))
        print(f"  tuple member vs its lone run: largest parameter difference {diff:.2e}")
