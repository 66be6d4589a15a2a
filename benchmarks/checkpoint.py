"""`jaxtrain bench checkpoint`: what checkpointing costs, and whether kill-and-resume is exact.

1. Overhead: `mlp-regression` trained with a checkpoint at every epoch end against the same run
   with checkpoints off, interleaved, several repetitions; time is the run's total minus its
   compile time (so the saves and the final wait for the last one are included).
2. Kill-and-resume trial: a training process is killed with SIGKILL at random moments and
   resumed until it finishes, several times; the final parameters are compared bit for bit with
   an uninterrupted run's, and the time from relaunch to the resumed header is recorded.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from jaxtrain._src.config import CheckpointConfig

if TYPE_CHECKING:  # JAX and NumPy are imported where they run: `jaxtrain bench checkpoint --help` needs none
    import numpy as np


@dataclasses.dataclass(frozen=True)
class CheckpointBenchConfig:
    """Settings of the checkpoint benchmark."""

    repeats: int = 3
    """Interleaved repetitions of the overhead comparison."""
    epochs: int = 3
    """Epochs per overhead run (a checkpoint at each epoch end)."""
    samples: int = 50_000
    """Dataset size of the overhead runs (45,000 train + 5,000 validation by default)."""
    kills: int = 5
    """Processes killed in the kill-and-resume trial."""
    seed: int = 0
    """Seed of the kill moments."""
    quick: bool = False
    """A cut-down run for smoke tests (one repetition, no kill trial: `bench faults` has one)."""
    out: str | None = None
    """Write the results as JSON to this file."""


def _overhead_run(config: CheckpointBenchConfig, run_dir: str | None) -> float:
    from jaxtrain.tools import runs
    from jaxtrain.tools.recipes import get_recipe

    recipe = get_recipe("mlp-regression")
    data = dataclasses.replace(recipe.config.data, samples=config.samples, val_samples=config.samples // 10)
    cfg = dataclasses.replace(recipe.config, epochs=config.epochs, quiet=True, data=data,
                              checkpoint=CheckpointConfig(enabled=run_dir is not None))
    result = runs.train(recipe, cfg, run_dir or tempfile.mkdtemp(), console=Console(file=io.StringIO()))
    return result.summary["total_time_s"] - result.summary["compile_time_s"]


def save_cost(directory: Path, repeats: int = 5) -> dict[str, float]:
    """Median seconds of `Checkpointer.save` returning, and of a save written to the end, for
    the mlp-regression model's train state (MLP 128-512-512-64 with Adam)."""
    import jax
    from flax import nnx

    from jaxtrain._src.checkpoint import Checkpointer
    from jaxtrain._src.config import TrainConfig
    from jaxtrain._src.models import MLP
    from jaxtrain._src.program import build_program
    from jaxtrain._src.sharding import make_layout

    model = MLP((128, 512, 512, 64), rngs=nnx.Rngs(0))
    state = build_program(model, lambda m, b, k: (0.0, {}), TrainConfig(), total_steps=1000,
                          layout=make_layout("data=1")).state
    ckpt = Checkpointer(directory, keep_last=2, keep_best=0)
    call, full = [], []
    for step in range(1, repeats + 1):
        t0 = time.perf_counter()
        ckpt.save(step, state, {"history": []})
        call.append(time.perf_counter() - t0)
        ckpt.wait()
        full.append(time.perf_counter() - t0)
    ckpt.close()
    nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
    return {"save_call_s": statistics.median(call), "save_written_s": statistics.median(full), "state_bytes": nbytes}


TRIAL = ["train", "mlp-regression", "--data.samples", "20500", "--data.val-samples", "500", "--epochs", "4",
         "--checkpoint.every-steps", "200", "--verbosity", "summary"]  # the header says when training starts


def _launch(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "jaxtrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _final_params(run_dir: Path) -> list[np.ndarray]:
    import jax
    import numpy as np

    from jaxtrain.tools.runs import load

    return [np.asarray(x) for x in jax.tree.leaves(load(run_dir, "latest"))]


def _run_to_end(args: list[str], kill_after: float | None = None) -> tuple[int, float | None]:
    """Launches `jaxtrain train`; SIGKILLs it `kill_after` seconds after its header if given.
    Returns (exit code, seconds from launch to the 'resumed from' header line or None)."""
    t_launch = time.perf_counter()
    proc = _launch(args)
    to_resumed = None
    for line in proc.stdout:  # read the header; training starts after its last line
        if "resumed from" in line:
            to_resumed = time.perf_counter() - t_launch
        if "resumed from" in line or ("--resume" not in args and line.startswith("  run dir:")):
            break
    if kill_after is not None:
        time.sleep(kill_after)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    if proc.returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(f"training failed: {err.strip().splitlines()[-1:]}")
    return proc.returncode, to_resumed


def kill_trial(config: CheckpointBenchConfig, workdir: Path, console: Console) -> dict:
    """Kills `config.kills` training processes at random moments of their training, resumes each
    to the end, and compares the final parameters with an uninterrupted run's bit for bit."""
    import numpy as np

    if not config.kills:
        return {"kills": 0, "bit_exact": 0, "all_bit_exact": True, "resume_to_training_s": [],
                "uninterrupted_train_s": None}
    rng = random.Random(config.seed)
    reference = workdir / "reference"
    _run_to_end([*TRIAL, "--run-dir", str(reference)])
    train_s = json.loads((reference / "summary.json").read_text())["total_time_s"]
    expected = _final_params(reference)
    kills, exact, resume_times = 0, 0, []
    for trial in range(config.kills):
        run_dir = workdir / f"killed-{trial}"
        code, _ = _run_to_end([*TRIAL, "--run-dir", str(run_dir)], kill_after=rng.uniform(0.0, 0.95 * train_s))
        if code == 0:
            continue  # finished before the kill landed
        kills += 1
        # Killed before its first checkpoint, the resume starts the run from the beginning.
        _, seconds = _run_to_end([*TRIAL, "--run-dir", str(run_dir), "--resume", str(run_dir)])
        if seconds is not None:
            resume_times.append(seconds)
        same = all(np.array_equal(a, b) for a, b in zip(_final_params(run_dir), expected, strict=True))
        exact += same
    console.print(f"  kill trial: {kills} SIGKILLs during training, {exact} bit-exact results")
    return {"kills": kills, "bit_exact": exact, "all_bit_exact": exact == kills,
            "resume_to_training_s": resume_times, "uninterrupted_train_s": train_s}


def main(config: CheckpointBenchConfig) -> int:
    import jax

    from jaxtrain._src.report import device_description

    if config.quick:
        config = dataclasses.replace(config, repeats=1, epochs=2, samples=5_000, kills=0)  # kills: bench faults' test
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"checkpoint benchmark: mlp-regression, {config.samples:,} samples, {config.epochs} epochs, "
                  f"{config.repeats} interleaved repetitions, device {device_description(jax.devices()[0])}")
    with tempfile.TemporaryDirectory() as tmp:
        off, on = [], []
        for rep in range(config.repeats):
            off.append(_overhead_run(config, None))
            on.append(_overhead_run(config, f"{tmp}/run-{rep}"))
            console.print(f"  repetition {rep + 1}: no checkpoints {off[-1]:.2f} s, "
                          f"a checkpoint per epoch {on[-1]:.2f} s")
        overhead = statistics.median(on) / statistics.median(off) - 1
        trial = kill_trial(config, Path(tmp), console)
        cost = save_cost(Path(tmp) / "save-cost")

    table = Table(title=f"checkpoint cost, {config.epochs} epochs (medians, compile excluded)")
    for column in ("run", "time (s)", "min..max (s)"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for label, times in (("no checkpoints", off), ("a checkpoint per epoch (async)", on)):
        table.add_row(label, f"{statistics.median(times):.2f}", f"{min(times):.2f}..{max(times):.2f}")
    console.print(table)
    console.print(f"checkpoint overhead: {overhead:+.1%} of training time (target < 3%: "
                  f"{'met' if overhead < 0.03 else 'MISSED'})")
    console.print(f"one save of the {cost['state_bytes'] / 2**20:.1f} MiB train state: the call returns in "
                  f"{cost['save_call_s'] * 1e3:.1f} ms, written to the end in {cost['save_written_s'] * 1e3:.1f} ms "
                  "(medians of 5)")
    times = [t for t in trial["resume_to_training_s"] if t is not None]
    console.print(f"kill-and-resume: {trial['kills']} SIGKILLs, {trial['bit_exact']} bit-exact final results; "
                  "relaunch to resumed training " + (f"{statistics.median(times):.2f} s (median)" if times else "n/a"))
    if config.out:
        results = {"no_checkpoint_s": off, "checkpoint_s": on, "overhead": overhead, "trial": trial,
                   "save_cost": cost, "jax_version": jax.__version__}
        Path(config.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if trial["all_bit_exact"] else 1
