"""`jaxtrain bench shortrun`: does a short run of a small user model pay for `fit`'s fixed costs?

Two whole processes, each timed from launch to exit, interleaved (A B, B A, ...), several runs each:

- A: examples/shortrun_fit.py, a user's script: an NNX classifier of their own (784-256-BatchNorm-
  ReLU-Dropout-10) on synthetic MNIST-shaped data, `jaxtrain.fit` with its defaults (automatic K,
  no run directory, printed summary and profile), validation after every epoch;
- B: examples/shortrun_script.py, the same data, model, optimizer (Adam 1e-3), batch size, epochs
  and per-epoch validation written by hand: nnx split/merge, optax, `jax.jit` and a `lax.scan`
  over a whole epoch.

Both print their final validation accuracy; the table gives median wall seconds, min..max, the
peak resident memory of each process and the ratio fit / hand-written against the target.
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
from typing import Any

from rich.console import Console
from rich.table import Table

from jaxtrain._src.errors import ConfigError, JaxtrainError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"  # benchmarks/ -> the checkout
SCRIPTS = {"jaxtrain.fit": EXAMPLES / "shortrun_fit.py", "hand-written jit + lax.scan": EXAMPLES / "shortrun_script.py"}
TARGET = 1.1  # fit's whole process at most 1.1x the hand-written one's wall time
ACCURACY = re.compile(r"final val accuracy ([0-9.]+)")
QUICK_ARGS = ["--epochs", "2", "--train-samples", "2048", "--val-samples", "512"]


@dataclasses.dataclass(frozen=True)
class ShortRunBenchConfig:
    """Settings of the short-run benchmark."""

    repeats: int = 5
    """Fresh processes of each script, interleaved (medians are reported)."""
    quick: bool = False
    """One small run of each (2 epochs of 64 steps), for smoke tests."""
    out: str | None = None
    """Write the results as JSON to this file."""


def run_process(command: list[str]) -> dict[str, Any]:
    """Runs `command` to its end: wall seconds, peak RSS (bytes, from `wait4`) and the final
    validation accuracy it printed; a failure is one line naming the script."""
    with tempfile.TemporaryFile("w+") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    found = ACCURACY.findall(text)
    if proc.returncode != 0 or not found:
        lines = text.strip().splitlines()
        raise JaxtrainError(f"`{Path(command[1]).name}` exited with code {proc.returncode}: "
                            f"{lines[-1] if lines else 'no output'}")
    rss = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)  # kilobytes on Linux
    return {"wall_s": seconds, "peak_rss_bytes": rss, "accuracy": float(found[-1])}


def main(config: ShortRunBenchConfig) -> int:
    missing = [str(p) for p in SCRIPTS.values() if not p.is_file()]
    if missing:
        raise ConfigError(f"{', '.join(missing)} missing; the benchmark runs the examples of a source checkout")
    console = Console(highlight=False)
    repeats = 1 if config.quick else config.repeats
    extra = QUICK_ARGS if config.quick else []
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SCRIPTS}
    console.print(f"short-run benchmark: {len(SCRIPTS)} whole processes interleaved, {repeats} run(s) each"
                  + (" (quick: 2 epochs of 64 steps)" if config.quick else " (5 epochs of 512 steps)"))
    for rep in range(repeats):
        for name in sorted(SCRIPTS, reverse=rep % 2 == 1):  # A B, then B A: neither always goes first
            runs[name].append(run_process([sys.executable, str(SCRIPTS[name]), *extra]))
        console.print("  run {}: {}".format(rep + 1, ", ".join(f"{name} {r[-1]['wall_s']:.2f} s" for name, r in
                                                               runs.items())))
    medians = {name: statistics.median(r["wall_s"] for r in rs) for name, rs in runs.items()}
    table = Table(title=f"whole process, launch to exit ({repeats} interleaved fresh runs each, medians)")
    for column in ("process", "wall (s)", "min..max (s)", "peak RSS (MiB)", "val accuracy"):
        table.add_column(column, justify="left" if column == "process" else "right")
    for name, rs in runs.items():
        walls = [r["wall_s"] for r in rs]
        table.add_row(name, f"{medians[name]:.2f}", f"{min(walls):.2f}..{max(walls):.2f}",
                      f"{statistics.median(r['peak_rss_bytes'] for r in rs) / 2**20:,.0f}",
                      f"{statistics.median(r['accuracy'] for r in rs):.4f}")
    console.print(table)
    fit_name, hand_name = SCRIPTS
    ratio = medians[fit_name] / medians[hand_name]
    met = "met" if ratio <= TARGET else "MISSED"
    console.print(f"  python examples/{SCRIPTS[fit_name].name} against python examples/{SCRIPTS[hand_name].name}"
                  + (f" {' '.join(extra)}" if extra else ""))
    console.print(f"jaxtrain.fit / hand-written wall time: {ratio:.3f}x (target <= {TARGET}x: {met})")
    if config.out:
        Path(config.out).write_text(json.dumps({"runs": runs, "median_wall_s": medians, "ratio": ratio,
                                                "target": TARGET, "quick": config.quick}, indent=2) + "\n")
    return 0
