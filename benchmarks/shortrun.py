"""`jaxtrain bench shortrun`: does a short run of a small user model pay for `fit`'s fixed costs?

Whole processes, each timed from launch to exit, interleaved (hand, fit, then fit, hand, ...),
several runs each, for two workloads:

- the foreign BatchNorm classifier: examples/shortrun_fit.py, a user's script (an NNX classifier of
  their own, 784-256-BatchNorm-ReLU-Dropout-10, on synthetic MNIST-shaped data, `jaxtrain.fit` with
  its defaults: automatic K, no run directory, printed summary and profile, validation after every
  epoch) against examples/shortrun_script.py, the same data, model, optimizer (Adam 1e-3), batch
  size, epochs and per-epoch validation written by hand (nnx split/merge, optax, `jax.jit` and a
  `lax.scan` over a whole epoch);
- a small conv model of the zoo (`--conv`, default keras-convnet: Keras's MNIST convnet) for about
  `--conv-seconds` of its hand loop's steps: `fit` with its defaults and no run directory against
  the source's own loop (`benchmarks/zoo/hand.py`: a jitted step per batch), as `jaxtrain bench zoo`'s
  short runs.

The table gives, per workload, the median wall seconds of each process, min..max, and the ratio of
the medians fit / hand against the 1.1x target, met or not; beside it the median of the runs' own
ratios (each run's two processes ran one after the other). On a loaded machine take the ratios,
not the seconds: the arms are interleaved so that load changes touch both.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from benchmarks.child import child_environ
from jaxtrain._src.errors import ConfigError, JaxtrainError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"  # benchmarks/ -> the checkout
SCRIPTS = {"jaxtrain.fit": EXAMPLES / "shortrun_fit.py", "hand-written jit + lax.scan": EXAMPLES / "shortrun_script.py"}
TARGET = 1.1  # fit's whole process at most 1.1x the hand-written one's wall time
ACCURACY = re.compile(r"final val accuracy ([0-9.]+)")
QUICK_ARGS = ["--epochs", "2", "--train-samples", "2048", "--val-samples", "512"]
CLASSIFIER = "BatchNorm classifier"
QUICK_CONV_STEPS = 8


@dataclasses.dataclass(frozen=True)
class ShortRunBenchConfig:
    """Settings of the short-run benchmark."""

    repeats: int = 5
    """Fresh processes of each script, interleaved (medians are reported)."""
    quick: bool = False
    """One small run of each (2 epochs of 64 steps; the conv model for 8 steps), for smoke tests."""
    conv: str = "keras-convnet"
    """The zoo's conv model timed beside the classifier ("" leaves it out)."""
    conv_seconds: float = 5.0
    """Seconds of the conv model's hand-loop steps its short run aims at (measured once, in a child)."""
    conv_steps: int = 0
    """The conv model's steps, when set (instead of sizing them by `conv_seconds`)."""
    out: str | None = None
    """Write the results as JSON to this file."""


def run_process(command: list[str], read: Callable[[str], dict[str, Any]] | None = None,
                env: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs `command` to its end: wall seconds, peak RSS (bytes, from `wait4`) and what `read` finds in
    its output (default: the final validation accuracy it printed); a failure is one line naming it."""
    with tempfile.TemporaryFile("w+") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True,
                                env={**(env or os.environ), "PYTHONUNBUFFERED": "1"})
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    found = (read or _accuracy)(text) if proc.returncode == 0 else None
    if not found:
        lines = text.strip().splitlines()
        name = Path(command[1]).name if command[1] != "-m" else " ".join(command[2:4])
        raise JaxtrainError(f"`{name}` exited with code {proc.returncode}: {lines[-1] if lines else 'no output'}")
    rss = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)  # kilobytes on Linux
    return {"wall_s": seconds, "peak_rss_bytes": rss, **found}


def _accuracy(text: str) -> dict[str, Any] | None:
    found = ACCURACY.findall(text)
    return {"accuracy": float(found[-1])} if found else None


def _zoo_json(text: str) -> dict[str, Any] | None:
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def _zoo_command(name: str, way: str, steps: int, mode: str = "short") -> list[str]:
    return [sys.executable, "-m", "benchmarks.zoo_bench", name, way, str(steps), mode]


def conv_steps(config: ShortRunBenchConfig) -> int:
    """The conv model's short-run steps: set, quick, or about `conv_seconds` of its hand loop's steps."""
    if config.conv_steps:
        return config.conv_steps
    if config.quick:
        return QUICK_CONV_STEPS
    probe = run_process(_zoo_command(config.conv, "hand", 32, "steady"), _zoo_json, child_environ())
    return int(min(4096, max(16, round(config.conv_seconds / probe["step_s"]))))


def ratio_rows(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per workload: the medians of its arms' wall seconds, fit / hand, whether that meets the target, and
    the median of the runs' own ratios (`pairs`: each run's fit and hand processes ran one after the
    other, so a drift of the machine's speed between runs moves both)."""
    rows = []
    for workload, arms in runs.items():
        hand = statistics.median(r["wall_s"] for r in arms["hand"])
        fit = statistics.median(r["wall_s"] for r in arms["fit"])
        pairs = statistics.median(f["wall_s"] / h["wall_s"] for f, h in zip(arms["fit"], arms["hand"]))
        rows.append({"workload": workload, "hand_s": hand, "fit_s": fit, "ratio": fit / hand, "pairs": pairs,
                     "met": fit / hand <= TARGET, "runs": len(arms["fit"])})
    return rows


def print_table(console: Console, runs: dict[str, dict[str, list[dict[str, Any]]]],
                rows: list[dict[str, Any]]) -> None:
    """The ratio table: what each row measures, medians of interleaved whole processes, the target."""
    table = Table(title="short runs: whole process, launch to exit, medians of interleaved fresh runs")
    for column in ("workload", "runs", "hand (s)", "min..max", "fit (s)", "min..max", "fit ÷ hand", "target",
                   "met", "pairs' median", "peak RSS fit/hand (MiB)"):
        table.add_column(column, justify="left" if column == "workload" else "right")
    for row in rows:
        arms = runs[row["workload"]]
        spans = {way: [r["wall_s"] for r in rs] for way, rs in arms.items()}
        rss = {way: statistics.median(r["peak_rss_bytes"] for r in rs) / 2**20 for way, rs in arms.items()}
        table.add_row(row["workload"], str(row["runs"]), f"{row['hand_s']:.2f}",
                      f"{min(spans['hand']):.2f}..{max(spans['hand']):.2f}", f"{row['fit_s']:.2f}",
                      f"{min(spans['fit']):.2f}..{max(spans['fit']):.2f}", f"{row['ratio']:.3f}x",
                      f"<= {TARGET}x", "met" if row["met"] else "MISSED", f"{row['pairs']:.3f}x",
                      f"{rss['fit']:,.0f}/{rss['hand']:,.0f}")
    console.print(table)
    for row in rows:
        console.print(f"{row['workload']}: jaxtrain.fit / hand-written wall time: {row['ratio']:.3f}x "
                      f"(target <= {TARGET}x: {'met' if row['met'] else 'MISSED'}; the runs' own ratios: median "
                      f"{row['pairs']:.3f}x)")


def main(config: ShortRunBenchConfig) -> int:
    missing = [str(p) for p in SCRIPTS.values() if not p.is_file()]
    if missing:
        raise ConfigError(f"{', '.join(missing)} missing; the benchmark runs the examples of a source checkout")
    if config.conv:
        from benchmarks.zoo import ZOO

        if config.conv not in ZOO:
            raise ConfigError(f"--conv {config.conv!r} is no zoo model; choose among {', '.join(ZOO)} (or --conv '')")
    console = Console(highlight=False, width=150)
    repeats = 1 if config.quick else config.repeats
    extra = QUICK_ARGS if config.quick else []
    fit_script, hand_script = SCRIPTS.values()
    commands: dict[str, dict[str, tuple[list[str], Any, Any]]] = {CLASSIFIER: {
        "hand": ([sys.executable, str(hand_script), *extra], None, None),
        "fit": ([sys.executable, str(fit_script), *extra], None, None)}}
    described = [f"{CLASSIFIER}: python examples/{fit_script.name} against python examples/{hand_script.name}"
                 + (f" {' '.join(extra)}" if extra else "") + (" (2 epochs of 64 steps)" if config.quick else
                                                               " (5 epochs of 512 steps)")]
    if config.conv:
        steps, env = conv_steps(config), child_environ()
        workload = f"{config.conv} (zoo conv model)"
        commands[workload] = {way: (_zoo_command(config.conv, way, steps), _zoo_json, env) for way in ("hand", "fit")}
        described.append(f"{workload}: python -m benchmarks.zoo_bench {config.conv} fit|hand {steps} short "
                         f"({steps} steps, batch {ZOO[config.conv].batch_size}: fit's defaults, no run directory, "
                         "against the source's jitted step per batch)")
    console.print(f"short-run benchmark: {len(commands)} workload(s), fit and hand whole processes interleaved, "
                  f"{repeats} run(s) each")
    for line in described:
        console.print(f"  {line}")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {w: {"hand": [], "fit": []} for w in commands}
    for rep in range(repeats):
        for workload, arms in commands.items():
            for way in sorted(arms, reverse=rep % 2 == 1):  # hand fit, then fit hand: neither always first
                command, read, env = arms[way]
                runs[workload][way].append(run_process(command, read, env))
        console.print(f"  run {rep + 1}: " + "; ".join(
            f"{w}: hand {arms['hand'][-1]['wall_s']:.2f} s, fit {arms['fit'][-1]['wall_s']:.2f} s"
            for w, arms in runs.items()))
    rows = ratio_rows(runs)
    print_table(console, runs, rows)
    if config.out:
        Path(config.out).write_text(json.dumps({"runs": runs, "rows": rows, "target": TARGET, "quick": config.quick},
                                               indent=2) + "\n")
    return 0
