"""`jaxtrain bench data` part `stream`: the peak memory of a streamed run against the file's size.

For each size in `stream_rows` (default 0.2M and 2M `mlp-regression` rows: 147 MiB and 1.4 GiB)
and each format (one HDF5 file; a folder of .npy shards), a fresh process runs the command a user
runs,

    jaxtrain train mlp-regression --data.path FILE --data.placement stream --epochs 1 --quiet
    (--data.npy DIR for the shards)

one whole epoch, read ahead while the first calls compile, then validation, a checkpoint and the
curves, and reports the process's peak resident set (its `ru_maxrss`, start to exit). Runs interleave, in
`repeats` rounds; medians. Flat means the read-ahead holds what it is bounded to, not what the file
holds: target largest/smallest size <= 1.1x per format.

The compile cache is off in the children (`JAXTRAIN_COMPILE_CACHE=off`): every run compiles its
programs as a first run does, so a run does not differ from the next by what it left on disk.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

FORMATS = ("hdf5", "npy")
TARGET = 1.1  # largest/smallest file's peak RSS


def _run(fmt: str, path: Path, run_dir: Path) -> dict:
    """One `python -m jaxtrain train ...` process, the command users run: its peak RSS (the
    kernel's `ru_maxrss` of that child, from `os.wait4`), samples/s, K and input wait (the share of
    training time the loop waited for batches: the read-ahead at work)."""
    flag = "--data.path" if fmt == "hdf5" else "--data.npy"
    command = [sys.executable, "-m", "jaxtrain", "train", "mlp-regression", flag, str(path), "--data.placement",
               "stream", "--epochs", "1", "--quiet", "--run-dir", str(run_dir)]
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err,
                                env={**os.environ, "JAXTRAIN_COMPILE_CACHE": "off"})
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        if proc.returncode:
            err.seek(0)
            lines = err.read().decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"`jaxtrain train` exited with code {proc.returncode}: "
                               f"{lines[-1] if lines else 'no output'}")
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epoch = [r for r in records if r.get("kind") == "epoch"][-1]
    return {"peak_rss_mib": usage.ru_maxrss / 1024, "samples_per_s": summary["samples_per_s"],  # KiB on Linux
            "steps_per_call": summary["steps_per_call"], "input_wait_fraction": epoch["input_wait_fraction"]}


def stream(sizes: tuple[int, ...], repeats: int, out: Path, console: Console, keep: bool = False) -> dict:
    """The stream part (see the module docstring): {"runs": {name: [run, ...]}, "ratio": {format: x}}."""
    from jaxtrain._src.data.generate import generate_dataset

    files = {(fmt, rows): out / (f"stream-{rows}.h5" if fmt == "hdf5" else f"stream-{rows}-npy")
             for rows in sizes for fmt in FORMATS}
    runs = out / "stream-runs"
    try:
        for (fmt, rows), path in files.items():
            if not path.exists():  # a file kept by an earlier run (--keep) is the same rows
                console.print(f"generating {rows:,} rows ({fmt}) ...")
                generate_dataset("mlp-regression", path, rows, format=fmt, force=True)
        measured: dict[str, list[dict]] = {_name(fmt, rows): [] for fmt, rows in files}
        for repeat in range(repeats):
            for (fmt, rows), path in files.items():
                run_dir = runs / f"{fmt}-{rows}-{repeat}"
                try:
                    result = _run(fmt, path, run_dir)
                except RuntimeError as e:
                    raise RuntimeError(f"{_name(fmt, rows)}: {e}") from None
                shutil.rmtree(run_dir, ignore_errors=True)
                measured[_name(fmt, rows)].append(result)
                console.print(f"  run {repeat + 1}/{repeats} {_name(fmt, rows)}: peak RSS "
                              f"{result['peak_rss_mib']:,.0f} MiB, K={result['steps_per_call']}, "
                              f"{result['samples_per_s']:,.0f} samples/s, input wait "
                              f"{result['input_wait_fraction']:.1%}")
    finally:
        shutil.rmtree(runs, ignore_errors=True)
        if not keep:
            for path in files.values():
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
    small, large = min(sizes), max(sizes)
    ratio = {fmt: _median(measured[_name(fmt, large)]) / _median(measured[_name(fmt, small)]) for fmt in FORMATS}
    return {"sizes": list(sizes), "runs": measured, "ratio": ratio}


def report(results: dict, console: Console) -> None:
    s = results["stream"]
    small, large = min(s["sizes"]), max(s["sizes"])
    table = Table(title="streamed `jaxtrain train mlp-regression --epochs 1`: peak RSS of the process (MiB)")
    for col in ("format", *(f"{rows:,} rows" for rows in s["sizes"]), f"{large:,} / {small:,}", "target"):
        table.add_column(col, justify="left" if col == "format" else "right")
    for fmt in FORMATS:
        cells = []
        for rows in s["sizes"]:
            runs = s["runs"][_name(fmt, rows)]
            each = " / ".join(f"{r['peak_rss_mib']:,.0f}" for r in runs)
            cells.append(f"{_median(runs):,.0f} ({each})")
        ok = s["ratio"][fmt] <= TARGET
        table.add_row(fmt, *cells, f"{s['ratio'][fmt]:.3f}x", f"<= {TARGET}x " + ("met" if ok else "missed"))
    console.print(table)


def _name(fmt: str, rows: int) -> str:
    return f"{fmt} {rows:,} rows"


def _median(runs: list[dict]) -> float:
    return statistics.median(r["peak_rss_mib"] for r in runs)
