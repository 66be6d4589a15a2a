"""`jaxtrain bench overhead`: what does jaxtrain's loop cost over a hand-written one?

1. One epoch of `mlp-regression` with `jaxtrain.fit` against a minimal hand-written loop
   (jit + `lax.scan` over the whole epoch + donation; same model, data, preprocessing,
   optimizer and batch size), interleaved in one process, several repetitions; compile time
   is excluded from both.
2. The whole process: `jaxtrain train mlp-regression --epochs 5 --quiet` against
   examples/mlp_regression_script.py (the same data, model, optimizer, batch size, epochs and
   per-epoch validation, written by hand with jit + `lax.scan`), each a fresh process timed from
   launch to exit, interleaved; jaxtrain's own summary.json splits its time into fit (compile,
   training, the rest) and the time outside fit (imports, data, model init, exit).
3. Per-call cost of one training step under `nnx.jit` (NNX objects in, object graph traversed
   in Python every call) against `jax.jit` on the split state pytree.
"""

from __future__ import annotations

import dataclasses
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from jaxtrain._src.config import OptimConfig, TrainConfig
from jaxtrain._src.errors import ConfigError, JaxtrainError
from jaxtrain.tools.recipes.mlp_regression import RegressionDataConfig, make_data, mse_loss

# JAX is imported where it runs: `jaxtrain bench overhead --help` needs none


@dataclasses.dataclass(frozen=True)
class OverheadConfig:
    """Settings of the overhead benchmark."""

    repeats: int = 5
    """Interleaved repetitions of each variant (medians are reported)."""
    samples: int = 50_000
    """Samples of the mlp-regression data, all used for training (no validation split)."""
    batch_size: int = 32
    """Batch size for both loops."""
    call_repeats: int = 2000
    """Calls timed per repetition for the nnx.jit-vs-jax.jit comparison."""
    epochs: int = 5
    """Epochs of the whole-process comparison (the recipe's default data: 45,000 train / 5,000 val)."""
    quick: bool = False
    """A cut-down run (small data, few repetitions) for smoke tests."""
    out: str | None = None
    """Write the results as JSON to this file."""


def _hand_written_epoch(graphdef, tx, preprocess, n: int, batch_size: int):
    """The reference: one jitted function that trains a whole epoch with lax.scan."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from jaxtrain._src.step import gather_batch

    steps = n // batch_size

    def epoch(params, opt_state, data, key):
        perm = jax.random.permutation(jax.random.fold_in(key, 1), n)  # the epoch's order, drawn in the program

        def body(carry, i):
            params, opt_state = carry
            batch = preprocess(gather_batch(data, jax.lax.dynamic_slice_in_dim(perm, i * batch_size, batch_size)))

            def loss(params):
                return jnp.mean((nnx.merge(graphdef, params)(batch["x"]) - batch["y"]) ** 2)

            value, grads = jax.value_and_grad(loss)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), value

        (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), jnp.arange(steps))
        return params, opt_state, losses

    return jax.jit(epoch, donate_argnums=(0, 1))


def _time_hand_written(train, preprocess, config: OverheadConfig, seed: int) -> float:
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from jaxtrain._src.models import MLP

    model = MLP((128, 512, 512, 64), rngs=nnx.Rngs(seed))
    tx = optax.adam(1e-3)
    graphdef, params = nnx.split(model)
    data = jax.device_put(jax.tree.map(jnp.asarray, train))
    epoch = _hand_written_epoch(graphdef, tx, preprocess, len(train["x"]), config.batch_size)
    key = jax.random.key(seed)
    compiled = epoch.lower(params, tx.init(params), data, key).compile()
    params, opt_state = jax.tree.map(lambda x: x.copy(), params), tx.init(params)
    t0 = time.perf_counter()
    params, opt_state, losses = compiled(params, opt_state, data, key)
    jax.block_until_ready(losses)
    return time.perf_counter() - t0


def _time_fit(train, preprocess, config: OverheadConfig, seed: int) -> tuple[float, int]:
    from flax import nnx

    from jaxtrain._src.models import MLP
    from jaxtrain.engine import RunOptions, run

    model = MLP((128, 512, 512, 64), rngs=nnx.Rngs(seed))
    optim = OptimConfig(name="adam", lr=1e-3)
    train_config = TrainConfig(epochs=1, batch_size=config.batch_size, seed=seed, optim=optim)
    silent = Console(file=io.StringIO())
    result = run(model, mse_loss, train, None, train_config, preprocess=preprocess, verbosity="summary",
                 session=RunOptions(console=silent))
    return result.history[0]["train_time_s"], result.summary["steps_per_call"]


def _per_call_times(config: OverheadConfig, train) -> dict[str, float]:
    """Median seconds per call of one training step: nnx.jit on objects vs jax.jit on pytrees."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from jaxtrain._src.models import MLP
    from jaxtrain._src.program import build_program
    from jaxtrain._src.sharding import make_layout

    batch = {k: jnp.asarray(v[: config.batch_size]) for k, v in train.items()}

    model = MLP((128, 512, 512, 64), rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    @nnx.jit
    def nnx_step(model, optimizer, batch):
        def loss(model):
            return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)

        value, grads = nnx.value_and_grad(loss)(model)
        optimizer.update(model, grads)
        return value

    program = build_program(MLP((128, 512, 512, 64), rngs=nnx.Rngs(0)), mse_loss, TrainConfig(),
                            optimizer=optax.adam(1e-3), total_steps=1, layout=make_layout("data=1"))
    state, jax_step = program.state, jax.jit(program.train_step, donate_argnums=0)

    def run_nnx(n):
        for _ in range(n):
            value = nnx_step(model, optimizer, batch)
        jax.block_until_ready(value)

    def run_jax(n):
        nonlocal state
        for _ in range(n):
            state, metrics = jax_step(state, batch)
        jax.block_until_ready(metrics)

    times: dict[str, list[float]] = {"nnx.jit": [], "jax.jit": []}
    runners = {"nnx.jit": run_nnx, "jax.jit": run_jax}
    for run in runners.values():
        run(10)  # compile and warm up
    for _ in range(config.repeats):
        for name, run in runners.items():
            t0 = time.perf_counter()
            run(config.call_repeats)
            times[name].append((time.perf_counter() - t0) / config.call_repeats)
    return {name: statistics.median(values) for name, values in times.items()}


# benchmarks/ -> the checkout
SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "mlp_regression_script.py"
PROCESS_TARGET = 0.95  # jaxtrain's whole process at >= 0.95x the hand-written script's speed
QUICK_DATA = (2_000, 200)  # samples, validation samples of --quick's process runs


def _process_commands(config: OverheadConfig, run_dir: Path) -> dict[str, list[str]]:
    """The two fresh-process commands: the jaxtrain CLI (writing into `run_dir`) and the script."""
    jaxtrain = [sys.executable, "-m", "jaxtrain", "train", "mlp-regression", "--epochs", str(config.epochs),
                "--quiet", "--run-dir", str(run_dir)]
    script = [sys.executable, str(SCRIPT), "--epochs", str(config.epochs)]
    if config.quick:
        samples, val = QUICK_DATA
        jaxtrain += ["--data.samples", str(samples), "--data.val-samples", str(val)]
        script += ["--samples", str(samples), "--val-samples", str(val)]
    return {"jaxtrain train": jaxtrain, "hand-written script": script}


def _time_process(command: list[str]) -> float:
    """Wall seconds of `command` from launch to exit; a failure is one line naming the command."""
    t0 = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise JaxtrainError(f"`{' '.join(command[1:4])} ...` exited with code {proc.returncode}: "
                            f"{lines[-1] if lines else 'no output'}")
    return seconds


def _whole_process(config: OverheadConfig, console: Console) -> dict[str, Any]:
    """Fresh-process wall times of the jaxtrain command and the hand-written script, interleaved
    (the order alternates between repetitions), plus jaxtrain's own split of each run."""
    if not SCRIPT.is_file():
        raise ConfigError(f"{SCRIPT} is missing; the whole-process comparison runs it (a source checkout of jaxtrain)")
    walls: dict[str, list[float]] = {"jaxtrain train": [], "hand-written script": []}
    parts: dict[str, list[float]] = {"fit": [], "compile": [], "train": []}
    with tempfile.TemporaryDirectory(prefix="jaxtrain-overhead-") as tmp:
        for rep in range(1 if config.quick else config.repeats):  # quick: one of each, seconds
            commands = _process_commands(config, Path(tmp) / f"run-{rep}")
            for name in sorted(commands, reverse=rep % 2 == 1):
                walls[name].append(_time_process(commands[name]))
            summary = json.loads((Path(tmp) / f"run-{rep}" / "summary.json").read_text())
            parts["fit"].append(summary["total_time_s"])
            parts["compile"].append(summary["compile_time_s"])
            parts["train"].append(summary["train_time_s"])
            console.print(f"  process {rep + 1}: jaxtrain train {walls['jaxtrain train'][-1]:.2f} s, "
                          f"hand-written script {walls['hand-written script'][-1]:.2f} s")
    return {"wall_s": walls, "jaxtrain_parts_s": parts}


def _print_whole_process(results: dict[str, Any], config: OverheadConfig, console: Console) -> float:
    """The whole-process table; returns the speed ratio (script wall / jaxtrain wall, medians)."""
    walls, parts = results["wall_s"], results["jaxtrain_parts_s"]
    median = {name: statistics.median(times) for name, times in walls.items()}
    table = Table(title=f"whole process, launch to exit: mlp-regression, {config.epochs} epochs "
                        f"({len(walls['jaxtrain train'])} interleaved fresh runs each, medians)")
    for column in ("process", "wall (s)", "min..max (s)"):
        table.add_column(column, justify="left" if column == "process" else "right")
    rows = [("hand-written script", walls["hand-written script"]), ("jaxtrain train", walls["jaxtrain train"])]
    outside = [w - f for w, f in zip(walls["jaxtrain train"], parts["fit"])]
    other = [f - c - t for f, c, t in zip(parts["fit"], parts["compile"], parts["train"])]
    rows += [("  outside fit: imports, data, model, exit", outside), ("  fit: waiting for compiles", parts["compile"]),
             ("  fit: training epochs", parts["train"]), ("  fit: the rest (eval, files, profile)", other)]
    for label, times in rows:
        table.add_row(label, f"{statistics.median(times):.2f}", f"{min(times):.2f}..{max(times):.2f}")
    console.print(table)
    console.print(f"  script: python {SCRIPT.relative_to(SCRIPT.parents[1])} --epochs {config.epochs}; jaxtrain: "
                  f"jaxtrain train mlp-regression --epochs {config.epochs} --quiet --run-dir DIR")
    ratio = median["hand-written script"] / median["jaxtrain train"]
    met = "met" if ratio >= PROCESS_TARGET else "MISSED"
    console.print(f"jaxtrain / hand-written whole-process speed: {ratio:.3f} (target >= {PROCESS_TARGET}: {met})")
    return ratio


def main(config: OverheadConfig) -> int:
    import jax

    from jaxtrain._src import data as data_lib
    from jaxtrain._src.report import device_description

    if config.quick:
        config = dataclasses.replace(config, repeats=2, samples=3_000, call_repeats=100, epochs=1)
    train, _ = make_data(RegressionDataConfig(samples=config.samples, val_samples=0))
    preprocess = data_lib.normalize("x", train["x"].mean(0), train["x"].std(0))
    console = Console(highlight=False)
    console.print(f"overhead benchmark: mlp-regression, {len(train['x']):,} samples, batch {config.batch_size}, "
                  f"{config.repeats} interleaved repetitions, device {device_description(jax.devices()[0])}")

    hand, ours, ks = [], [], []
    for rep in range(config.repeats):
        hand.append(_time_hand_written(train, preprocess, config, seed=rep))
        t, k = _time_fit(train, preprocess, config, seed=rep)
        ours.append(t)
        ks.append(k)
        console.print(f"  repetition {rep + 1}: hand-written {hand[-1]:.3f} s, jaxtrain.fit {ours[-1]:.3f} s (K={k})")
    steps = len(train["x"]) // config.batch_size
    hand_s, ours_s = statistics.median(hand), statistics.median(ours)
    ratio = hand_s / ours_s  # jaxtrain steps/s over hand-written steps/s

    table = Table(title="one epoch, compile excluded (medians)")
    for column in ("loop", "epoch time (s)", "steps/s", "min..max (s)"):
        table.add_column(column, justify="right" if column != "loop" else "left")
    rows = (("hand-written jit + lax.scan", hand), (f"jaxtrain.fit (K={statistics.median(ks):.0f})", ours))
    for label, times in rows:
        median = statistics.median(times)
        table.add_row(label, f"{median:.3f}", f"{steps / median:,.0f}", f"{min(times):.3f}..{max(times):.3f}")
    console.print(table)
    met = "met" if ratio >= 0.97 else "MISSED"
    console.print(f"jaxtrain / hand-written steps/s: {ratio:.3f} (target >= 0.97: {met})")

    processes = _whole_process(config, console)
    process_ratio = _print_whole_process(processes, config, console)

    calls = _per_call_times(config, train)
    table = Table(title=f"one training step per call, batch {config.batch_size} (medians)")
    table.add_column("step function")
    table.add_column("time per call (µs)", justify="right")
    for name, seconds in calls.items():
        table.add_row(name, f"{seconds * 1e6:.1f}")
    console.print(table)
    extra = calls["nnx.jit"] - calls["jax.jit"]
    console.print(f"nnx.jit costs {extra * 1e6:.1f} µs more per call than jax.jit on split state "
                  f"({calls['nnx.jit'] / calls['jax.jit']:.2f}x)")

    if config.out:
        results = {
            "device": device_description(jax.devices()[0]), "samples": len(train["x"]), "batch_size": config.batch_size,
            "hand_written_epoch_s": hand, "fit_epoch_s": ours, "steps_per_call": ks, "ratio": ratio,
            "per_call_s": calls, "jax_version": jax.__version__,
            "process": {**processes, "epochs": config.epochs, "ratio": process_ratio},
        }
        Path(config.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0
