"""Helpers shared by test modules in different folders (a test module is never imported by another):
run-directory rows, bit equality, the command-line run of the checkpoint tests, small tmpfs mounts."""

import json
import subprocess
from pathlib import Path

import numpy as np

TIMINGS = ("elapsed_s", "train_time_s", "eval_time_s", "epoch_time_s", "input_wait_s", "input_wait_fraction")

TRAIN = ["train", "mlp-regression", "--data.samples", "4500", "--data.val-samples", "500", "--epochs", "4",
         "--steps-per-call", "5", "--checkpoint.every-steps", "10", "--quiet"]


def log_rows(run_dir) -> list[dict]:
    """metrics.jsonl without its timings: what must equal between a resumed and an uninterrupted run."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in rows]


def assert_bit_equal(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def unmount(path: Path) -> None:
    while subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
        pass  # a bind mount stacked on the tmpfs comes off first


def draws_of_workers(job, workers: int = 4, rounds: int = 4) -> list[float]:
    """`optim.lr` drawn by `workers` handles on the sweep job's study, opened alike, each asking in
    every round while the others' trials are running (as W worker processes do), then all telling
    a value that favours lr near 3e-3 (so TPE, past its 10 random startup trials, has a model)."""
    import math

    handles = [job.open() for _ in range(workers)]
    drawn = []
    for _ in range(rounds):
        asked = [(study, study.ask()) for study in handles]
        for _, trial in asked:
            drawn.append(job.prepare(trial, "")[0]["optim.lr"])
        for study, trial in asked:
            study.tell(trial, (math.log10(trial.params["optim.lr"]) + 2.5) ** 2)
    return drawn
