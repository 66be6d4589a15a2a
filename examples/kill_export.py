"""`jaxtrain export` killed at random moments of its writes: is the output folder whole or absent?

    python examples/kill_export.py [--trials 20] [--dir /tmp/kill-export]

Trains a small mlp-regression run once, then for SIGTERM and for SIGKILL, `--trials` times: starts
`jaxtrain export RUN --out OUT`, waits until its temporary folder appears beside OUT (the writes
have begun), sleeps a random 0-30 ms and sends the signal. Prints, per trial, the exit code and what
OUT is: absent, whole (every file there and the artifact's SHA-256 that of signature.json), or
damaged; and whether a temporary folder was left beside it.
"""

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

FILES = ("weights.safetensors", "model.jax_export", "README.md", "signature.json")


def state(out: Path) -> str:
    if not out.exists():
        return "absent"
    if not (out / "signature.json").is_file():
        return "damaged: no signature.json (" + ", ".join(sorted(os.listdir(out))) + ")"
    signature = json.loads((out / "signature.json").read_text())
    whole = all((out / f).is_file() for f in FILES) and \
        hashlib.sha256((out / "model.jax_export").read_bytes()).hexdigest() == signature["artifact_sha256"]
    return "whole" if whole else "damaged: checksum"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/kill-export"))
    args = parser.parse_args()
    root, jaxtrain = args.dir, [sys.executable, "-m", "jaxtrain"]
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    run = root / "run"
    subprocess.run([*jaxtrain, "train", "mlp-regression", "--data.samples", "2000", "--data.val-samples", "200",
                    "--epochs", "1", "--quiet", "--run-dir", str(run)], check=True, stdout=subprocess.DEVNULL)
    random.seed(0)
    tally = Counter()
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for i in range(args.trials):
            out = root / f"out-{signum.name}-{i}"
            temporary = lambda: [n for n in os.listdir(root)  # noqa: E731
                                 if n.startswith(f".{out.name}.") and n.endswith(".partial")]
            proc = subprocess.Popen([*jaxtrain, "export", str(run), "--out", str(out)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            deadline = time.perf_counter() + 120
            while proc.poll() is None and not temporary() and time.perf_counter() < deadline:
                time.sleep(0.002)  # until its folder is being written
            time.sleep(random.uniform(0, 0.03))
            proc.send_signal(signum)
            proc.wait(timeout=60)
            seen = state(out) + (" (temporary folder left)" if temporary() else "")
            tally[(signum.name, seen)] += 1
            print(f"{signum.name} {i:2d}: exit {proc.returncode}, {seen}", flush=True)
    for (name, seen), n in sorted(tally.items()):
        print(f"{name}: {n} x {seen}")


if __name__ == "__main__":
    main()
