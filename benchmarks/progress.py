"""`jaxtrain bench progress`: is the first rate a progress line prints the rate the run keeps?

`make demo`'s run (`jaxtrain train mlp-regression`, one fused call per epoch) runs `--runs` times,
each a fresh process with its output piped (so it prints progress lines, not a bar) and a run
directory of its own. Per run: the samples/s of the first progress line that has a reading, epoch 1's
own throughput (metrics.jsonl: its samples over its training seconds), and the run's throughput
(summary.json's `samples_per_s`); the first reading against both. The target: the first reading
within 20% of the run's throughput (the median of the runs' ratios, and how many runs are within).
`--quick`: one small run, a progress line every 20 steps (a smoke test).
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.child import child_environ
from jaxtrain._src.errors import JaxtrainError

TARGET = 0.2  # the first reading within 20% of the run's throughput
READING = re.compile(r"^ +epoch \d+/\d+ step [\d,]+/[\d,]+ loss \S+ ([\d,]+) samples/s", re.M)
QUICK_ARGS = ["--data.samples", "3000", "--data.val-samples", "500", "--epochs", "2", "--log-every", "20"]


@dataclasses.dataclass(frozen=True)
class ProgressBenchConfig:
    """Settings of the progress-figures benchmark."""

    runs: int = 5
    """Fresh processes of `jaxtrain train mlp-regression` (`make demo`'s run)."""
    quick: bool = False
    """One small run (3,000 samples, 2 epochs, a line every 20 steps), for smoke tests."""
    out: str | None = None
    """Write the results as JSON to this file."""


def measure(output: str, run_dir: Path) -> dict[str, Any]:
    """What one run printed and recorded: its first progress reading (samples/s), epoch 1's throughput and
    the run's, and the first reading's ratio to each."""
    reading = READING.search(output)
    if reading is None:
        raise JaxtrainError("the run printed no progress line with a rate; is its output piped (no bar)?")
    first = float(reading.group(1).replace(",", ""))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epoch1 = next(r for r in records if r.get("kind") == "epoch" and r["epoch"] == 1)
    run = json.loads((run_dir / "summary.json").read_text())["samples_per_s"]
    epoch = epoch1["samples"] / epoch1["train_time_s"]
    return {"first": first, "epoch1": epoch, "run": run, "first_to_run": first / run, "first_to_epoch1": first / epoch}


def train_once(run_dir: Path, extra: list[str]) -> dict[str, Any]:
    """One fresh `jaxtrain train mlp-regression` process, its output piped; its figures (`measure`)."""
    command = [sys.executable, "-m", "jaxtrain", "train", "mlp-regression", "--run-dir", str(run_dir), *extra]
    proc = subprocess.run(command, capture_output=True, text=True, env=child_environ())
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise JaxtrainError(f"`jaxtrain train mlp-regression` exited with code {proc.returncode}: "
                            f"{lines[-1] if lines else 'no output'}")
    return measure(proc.stdout, run_dir)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median ratio of first reading to run throughput, how many runs are within the target, met or not."""
    ratio = statistics.median(r["first_to_run"] for r in runs)
    within = sum(abs(r["first_to_run"] - 1) <= TARGET for r in runs)
    return {"median_first_to_run": ratio, "within": within, "count": len(runs), "met": abs(ratio - 1) <= TARGET}


def main(config: ProgressBenchConfig) -> int:
    console = Console(highlight=False, width=150)
    runs = 1 if config.quick else config.runs
    extra = QUICK_ARGS if config.quick else []
    console.print(f"progress figures: {runs} fresh run(s) of `jaxtrain train mlp-regression"
                  f"{' ' + ' '.join(extra) if extra else ''}`, output piped")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(runs):
            results.append(train_once(Path(scratch) / f"run-{i}", extra))
    table = Table(title="first progress reading against the run's throughput (samples/s)")
    for column in ("run", "first reading", "epoch 1", "run's throughput", "first ÷ run", "first ÷ epoch 1"):
        table.add_column(column, justify="right")
    for i, r in enumerate(results, 1):
        table.add_row(str(i), f"{r['first']:,.0f}", f"{r['epoch1']:,.0f}", f"{r['run']:,.0f}",
                      f"{r['first_to_run']:.2f}", f"{r['first_to_epoch1']:.2f}")
    console.print(table)
    verdict = summarise(results)
    console.print(f"first reading ÷ run's throughput: median {verdict['median_first_to_run']:.2f}, "
                  f"{verdict['within']}/{verdict['count']} runs within {TARGET:.0%} "
                  f"(target: within {TARGET:.0%}: {'met' if verdict['met'] else 'MISSED'})")
    if config.out:
        Path(config.out).write_text(json.dumps({"runs": results, **verdict, "quick": config.quick}, indent=2) + "\n")
    return 0
