"""Where a `bench frameworks` run's C heap goes, and what glibc's heap limits do to its peak and step.

    # one run, sampled every 50 ms: the peak, glibc's heap in use and free (mallinfo2), the heap in
    # the main thread's (brk) and in per-thread arenas (/proc/self/smaps), malloc_trim's effect
    python examples/free_heap.py sample char-gpt [--heap off]

    # fresh processes, settings interleaved, medians: ms/step and peak RSS of each
    python examples/free_heap.py compare mnist-cnn --rounds 4 --settings off,8,16,32

A setting is `off` (glibc's moving limits: JAXTRAIN_HEAP=off), `on` (the `jaxtrain` command's
limit_free_heap) or a trim limit in MiB (glibc's MALLOC_TRIM_THRESHOLD_, with
MALLOC_MMAP_THRESHOLD_=32 MiB). Set JAXTRAIN_DATA_DIR for the datasets. docs/benchmarks.md has the
figures ("The free heap XLA's threads keep").
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: benchmarks/ is not installed


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def _heap_mib() -> dict[str, int]:
    """glibc's heap: bytes from the system (non-mapped), in use and free; blocks mapped on their own."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _MallInfo2
    m = libc.mallinfo2()
    return {"heap": m.arena >> 20, "in_use": m.uordblks >> 20, "free": m.fordblks >> 20, "mapped": m.hblkhd >> 20}


def _anonymous_mib() -> dict[str, int]:
    """Resident anonymous memory: in all, in the main thread's heap (brk), in other mappings of
    at most 64 MiB (glibc's per-thread arenas among them)."""
    out = {"anonymous": 0, "brk_heap": 0, "maps_le_64MiB": 0}
    size, name = 0, ""
    for line in open("/proc/self/smaps"):
        parts = line.split()
        if "-" in parts[0] and ":" not in parts[0]:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            size, name = hi - lo, parts[5] if len(parts) > 5 else ""
        elif parts[0] == "Anonymous:":
            kib = int(parts[1])
            out["anonymous"] += kib
            if name == "[heap]":
                out["brk_heap"] += kib
            elif not name and 1 << 20 <= size <= 64 << 20:
                out["maps_le_64MiB"] += kib
    return {k: v >> 10 for k, v in out.items()}


_CONFIG = "FREE_HEAP_CONFIG"


def _rss_mib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) >> 10 for line in f if line.startswith("VmRSS:"))


def _config(workload: str, steps: int) -> dict:
    from benchmarks import frameworks

    with tempfile.TemporaryDirectory() as d:
        prepared = frameworks.prepare(workload, frameworks.FrameworksConfig(workloads=workload, steps=steps), Path(d))
        return prepared.recipe_config


def _env(setting: str) -> dict[str, str]:
    if setting == "off":
        return {"JAXTRAIN_HEAP": "off"}
    if setting == "on":
        return {}
    return {"MALLOC_TRIM_THRESHOLD_": str(int(setting) << 20), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}


def sample(workload: str, config: dict) -> None:
    """Trains once in this process (as a `bench frameworks` child) and prints the heap at the peak."""
    from benchmarks import frameworks

    samples, trims, done = [], [], threading.Event()
    libc = ctypes.CDLL(None)

    def watch() -> None:
        t0 = time.perf_counter()
        while not done.wait(0.05):
            samples.append({"t": round(time.perf_counter() - t0, 1), "rss": _rss_mib(), **_heap_mib()})
            if len(samples) % 100 == 0:  # every 5 s: what malloc_trim gives back
                before = _rss_mib()
                libc.malloc_trim(0)
                trims.append(before - _rss_mib())

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    result = frameworks.jaxtrain_child(workload, config)
    done.set()
    thread.join()
    peak = max(samples, key=lambda s: s["rss"])
    print(f"{workload}: {result['steps']} steps, {1000 * result['train_s'] / result['steps']:.2f} ms/step, "
          f"peak RSS {result['peak_rss_mib']:.0f} MiB (VmHWM)")
    print("at the sampled peak (MiB):", json.dumps(peak))
    print("now (MiB):", json.dumps(_anonymous_mib()))
    print("malloc_trim(0) every 5 s gave back (MiB):", trims)


def compare(workload: str, steps: int, settings: list[str], rounds: int) -> None:
    """Each setting in a fresh process per round, interleaved; medians."""
    from benchmarks.child import run_child

    config, runs = _config(workload, steps), {s: [] for s in settings}
    for r in range(rounds):
        for setting in settings:
            out = run_child("benchmarks.frameworks", {"workload": workload, "config": config},
                            env=_env(setting))
            if "error" in out:
                sys.exit(f"{setting}: {out['error']}")
            ms = 1000 * out["train_s"] / out["steps"]
            runs[setting].append((ms, out["peak_rss_mib"]))
            print(f"round {r + 1} {setting:>4}: {ms:.2f} ms/step, peak {out['peak_rss_mib']:.0f} MiB", flush=True)
    first = statistics.median(ms for ms, _ in runs[settings[0]])
    for setting, values in runs.items():
        ms, mib = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        print(f"{setting:>4}: median {ms:.2f} ms/step ({ms / first:.3f}x {settings[0]}), peak {mib:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("sample", "compare"))
    parser.add_argument("workload", choices=("char-gpt", "mnist-cnn"))
    parser.add_argument("--steps", type=int, default=0, help="training steps (0: the benchmark's default)")
    parser.add_argument("--heap", default="on", help="sample: the heap setting of this process (off, on, MiB)")
    parser.add_argument("--settings", default="off,on", help="compare: comma-separated settings")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.what == "sample":
        if _CONFIG not in os.environ:  # a fresh process, as a benchmark child: glibc reads its settings
            config = json.dumps(_config(args.workload, args.steps))  # at start, and this built the workload
            os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **_env(args.heap), _CONFIG: config})
        sample(args.workload, json.loads(os.environ[_CONFIG]))
    else:
        compare(args.workload, args.steps, args.settings.split(","), args.rounds)


if __name__ == "__main__":
    main()
