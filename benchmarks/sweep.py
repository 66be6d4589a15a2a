"""`jaxtrain bench sweep`: trials per hour of `jaxtrain sweep`, one trial at a time against workers
and populations; and `tune lr`'s suggestion against the best rate a sweep finds.

Part `trials`: each measured run is the whole command, `jaxtrain sweep WORKLOAD ... --trials N` in a fresh
process and a fresh sweep folder (process start, data, compilation, training, evaluation,
checkpoints and the study's bookkeeping included), timed from start to exit; mode `shell` is what a
user has without a sweep: N `jaxtrain train WORKLOAD --optim.lr X --run-dir DIR` commands one after
another, as a shell loop runs them. The modes run interleaved for `--rounds` rounds; the figure is
the median of N trials / wall time, as trials per hour, and its ratio to one trial at a time. Where
the time went comes from the trials' summary.json: compiling (`compile_time_s`, loaded from the
cache or not), training (`train_s`), the hooks' seconds between the training calls
(`profile.hook_seconds`) as checkpoints, run files (metrics rows, summary, TensorBoard, plots), the
study (each epoch's report and pruning check) and other hooks (evaluation, profile, progress), and
the rest of the wall time (process start, imports, the study's opening, asks and tells, data,
models); a population's members share one compile and one training, counted once, and run their
hooks one after another, summed. The trials draw the learning rate only (the random sampler, no pruning), so
every trial of a workload does the same work whichever mode runs it.

Part `lr`: for each case (a recipe with fixed settings; the last cases were not looked at when
the suggestion's rule was chosen) a sweep of `--lr-trials` trials over the learning rate alone
(TPE, median pruning) and the range test `tune lr` on the same settings; the figure is the
factor between the suggestion and the sweep's best rate (target ≤ 3×).

Part `adaptive`: the best val loss each way of sweeping reaches and when, on one budget of trials:
`sequential` (one trial at a time), `population` (a fixed population of P), `halving` and `pbt`
(`--scheduler`, population P; halving refills the slots it prunes from a budget of 2P trials, its
slots running no longer than the fixed population's; PBT's copies are extra trials by design).
All draw from one wider range of learning rates with the random sampler and the same seed, so
their first P trials draw the same rates; each arm is a whole command, interleaved over rounds.
When a val loss was reached: its trial's start in the study plus the run's `elapsed_s` at that
epoch (a population's trials counted from the population's first), from the command's start.
The figure: the time each arm takes to reach the best val loss of the one-at-a-time sweep of the
same round, as a share of that sweep's wall time (issue 62's target: ≤ 1/3 at P = 16).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

TARGETS = {"mlp-regression": 2.0, "mnist-cnn": 1.5}  # trials per hour against one trial at a time (2-core CPU)
AIM = 3.0
LR_FACTOR = 3.0  # tune lr's suggestion within this factor of the sweep's best rate
# name -> (recipe, flags); the rule (a tenth of the lowest-loss rate, over the run's own length) was
# chosen on the first two; the others were run only after it was fixed
LR_CASES = {
    "mlp-regression": ("mlp-regression", ["--data.samples", "8000", "--data.val-samples", "1000", "--epochs", "3"]),
    "mnist-cnn": ("mnist-cnn", ["--data.limit", "12000", "--epochs", "2"]),
    "mlp-regression sgd (held out)": ("mlp-regression", ["--data.samples", "8000", "--data.val-samples", "1000",
                                                         "--epochs", "3", "--optim.name", "sgd",
                                                         "--optim.momentum", "0.9"]),
    "fashion-mnist cnn (held out)": ("mnist-cnn", ["--data.dataset", "fashion_mnist", "--data.limit", "12000",
                                                   "--epochs", "2"]),
}

WORKLOADS = {
    "mlp-regression": ["--data.samples", "8000", "--data.val-samples", "1000", "--epochs", "3"],
    "mnist-cnn": ["--data.limit", "3000", "--epochs", "2"],
}
ADAPTIVE = {  # longer than WORKLOADS' (rungs and PBT's steps need epochs), over a range wide enough to miss in
    "mlp-regression": ["--data.samples", "8000", "--data.val-samples", "1000", "--epochs", "6"],
    "mnist-cnn": ["--data.limit", "3000", "--epochs", "6"],
}
ADAPTIVE_SPACE = "optim.lr=loguniform:1e-5:3e-1"
ADAPTIVE_ARMS = ("sequential", "population", "halving", "pbt")
ADAPTIVE_TARGET = 1 / 3  # of the one-at-a-time sweep's wall time, to reach its best val loss
QUICK = {
    "mlp-regression": ["--data.samples", "600", "--data.val-samples", "100", "--model.hidden", "16", "--epochs", "1"],
    "mnist-cnn": ["--data.limit", "300", "--epochs", "1"],
}


@dataclasses.dataclass(frozen=True)
class SweepBenchConfig:
    """Settings of the sweep benchmark."""

    parts: tuple[str, ...] = ("trials", "lr")
    """trials: trials per hour by mode; lr: tune lr against a sweep; adaptive: halving and PBT against one
    trial at a time and a fixed population (best val loss against wall time)."""
    workloads: tuple[str, ...] = ("mlp-regression", "mnist-cnn")
    """Recipes swept (each with its small fixed settings above)."""
    modes: tuple[str, ...] = ("shell", "sequential", "workers", "population")
    """shell: N `jaxtrain train` commands one after another; sequential: one trial at a time
    (`--workers 1`); workers: `--workers W`; population: `--population P` for each P of `populations`."""
    workers: int = 2
    """W of the worker modes."""
    populations: tuple[int, ...] = (4, 8, 16)
    """P of the population modes."""
    trials: int = 16
    """Trials per measured sweep."""
    flags: str = ""
    """Train flags added to every sweep of part trials after the workload's own (later ones win), as one
    string, e.g. `--flags="--data.samples 50000 --epochs 5"` for longer trials."""
    rounds: int = 3
    """Interleaved rounds (every mode once per round)."""
    lr_trials: int = 16
    """Trials of each lr part sweep."""
    lr_cases: tuple[str, ...] = tuple(LR_CASES)
    """The lr part's cases."""
    adaptive_population: int = 16
    """P of part adaptive (its trials: P, and 2P for halving)."""
    arms: tuple[str, ...] = ADAPTIVE_ARMS
    """Part adaptive's arms."""
    quick: bool = False
    """A cut-down run for smoke tests (1 round, 2 trials, tiny data)."""


MODES = ("shell", "sequential", "workers", "population")


def _commands(workload: str, mode: str, config: SweepBenchConfig, out: Path) -> list[list[str]]:
    """The commands one measured run of `mode` runs, one after another."""
    flags = [*(QUICK if config.quick else WORKLOADS)[workload], *shlex.split(config.flags)]
    if mode == "shell":  # the learning rates a random sampler would draw from the same range
        draw = random.Random(0)
        rates = [math.exp(draw.uniform(math.log(1e-4), math.log(1e-2))) for _ in range(config.trials)]
        return [[sys.executable, "-m", "jaxtrain", "train", workload, *flags, "--optim.lr", f"{lr:.6g}",
                 "--run-dir", str(out / f"trial-{i:04d}"), "--quiet"] for i, lr in enumerate(rates)]
    command = [sys.executable, "-m", "jaxtrain", "sweep", workload, *flags, "--space",
               "optim.lr=loguniform:1e-4:1e-2", "--trials", str(config.trials), "--out", str(out),
               "--sampler", "random", "--pruner", "none"]
    if mode.startswith("population"):
        return [[*command, "--population", mode.split()[1]]]
    return [[*command, "--workers", str(1 if mode == "sequential" else config.workers)]]


PARTS = ("compile", "train", "checkpoints", "run files", "study", "hooks")
"""Where a measured run's time went, besides the rest."""
RUN_FILES = ("RunFilesHook", "MetricsHook", "TensorBoard", "PlotHook")  # the hooks that write a run's files


def _part(hook: str) -> str:
    """The part of `PARTS` a hook's seconds count in."""
    if hook == "CheckpointHook":
        return "checkpoints"
    if hook in RUN_FILES:
        return "run files"
    return "study" if hook == "_Report" else "hooks"  # `_Report`: the sweep's report to its study


def _split(out: Path, mode: str) -> tuple[dict[str, float], int]:
    """Seconds of each of `PARTS` in a measured run's trials, and how many of the trials' training
    programs came from the compilation cache. A population's members (P trials asked together, so
    P consecutive trial numbers: the benchmark draws one shape) share one compile and one
    training, counted once, from the member that trained longest; their hooks run one after
    another on the loop's thread, so every member's count."""
    summaries = [json.loads(p.read_text()) for p in sorted(out.glob("trial-*/summary.json"))]
    seconds = dict.fromkeys(PARTS, 0.0)
    for s in summaries:
        for hook, hook_s in s["profile"].get("hook_seconds", {}).items():
            seconds[_part(hook)] += hook_s
    if mode.startswith("population"):
        size = int(mode.split()[1])
        summaries = [max(summaries[i:i + size], key=lambda s: s["profile"]["train_s"])
                     for i in range(0, len(summaries), size)]
    seconds["compile"] = sum(s.get("compile_time_s") or 0.0 for s in summaries)
    seconds["train"] = sum(s["profile"]["train_s"] for s in summaries)
    cached = sum(any(c.get("cached") for c in s["profile"]["compiles"] if c.get("what") == "train call")
                 for s in summaries)
    return seconds, cached


def _modes(config: SweepBenchConfig) -> list[str]:
    """The measured modes, a population mode for each P: `population 4`, ..."""
    return [m for mode in config.modes
            for m in ([f"population {p}" for p in config.populations] if mode == "population" else [mode])]


def main(config: SweepBenchConfig) -> int:
    if config.quick:
        config = dataclasses.replace(config, rounds=1, trials=2, lr_trials=2, lr_cases=("mlp-regression",),
                                     populations=(2,))
    for what, given, known in (("part", config.parts, ("trials", "lr", "adaptive")),
                               ("arm", config.arms, ADAPTIVE_ARMS),
                               ("mode", config.modes, MODES),
                               ("workload", config.workloads, tuple(WORKLOADS)),
                               ("case", config.lr_cases, tuple(LR_CASES))):
        unknown = [g for g in given if g not in known]
        if unknown:
            print(f"error: unknown {what} {unknown[0]!r}; choose {', '.join(known)}", file=sys.stderr)
            return 2
    console = Console(highlight=False)
    code = _trials(config, console) if "trials" in config.parts else 0
    code = code or (_lr(config, console) if "lr" in config.parts else 0)
    return code or (_adaptive(config, console) if "adaptive" in config.parts else 0)


def _trials(config: SweepBenchConfig, console: Console) -> int:
    modes = _modes(config)
    rates: dict[tuple[str, str], list[float]] = {(w, m): [] for w in config.workloads for m in modes}
    splits: dict[tuple[str, str], list[dict[str, float]]] = {key: [] for key in rates}
    with tempfile.TemporaryDirectory(prefix="jaxtrain-bench-sweep-") as tmp:
        for round_ in range(1, config.rounds + 1):
            for workload in config.workloads:
                for mode in modes:
                    out = Path(tmp) / f"{workload}-{mode}-{round_}".replace(" ", "-")
                    t0 = time.perf_counter()
                    for command in _commands(workload, mode, config, out):
                        done = subprocess.run(command, capture_output=True, text=True)
                        if done.returncode != 0:
                            console.print(f"round {round_} {workload} {mode}: FAILED (exit {done.returncode}): "
                                          f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
                            return 1
                    wall = time.perf_counter() - t0
                    rates[workload, mode].append(3600 * config.trials / wall)
                    seconds, cached = _split(out, mode)
                    seconds["rest"] = wall - sum(seconds.values())
                    splits[workload, mode].append(seconds)
                    parts = ", ".join(f"{part} {t:.1f} s" for part, t in seconds.items() if part != "compile")
                    console.print(f"round {round_} {workload} {mode}: {config.trials} trials in {wall:.1f} s "
                                  f"({rates[workload, mode][-1]:,.0f} trials/hour): compile {seconds['compile']:.1f} s "
                                  f"({cached} training programs from the cache), {parts}")
    table = Table(title=f"sweep: {config.trials} trials per sweep, {config.rounds} interleaved rounds, medians "
                        f"({os.cpu_count()} CPU cores)")
    for column in ("workload", "mode", "trials/hour (each round)", "median", "× sequential", "× shell",
                   *(f"{part} s" for part in (*PARTS, "rest"))):
        table.add_column(column, justify="left" if column in ("workload", "mode") else "right")
    best = {}
    for workload in config.workloads:
        base = statistics.median(rates[workload, "sequential"]) if "sequential" in modes else None
        shell = statistics.median(rates[workload, "shell"]) if "shell" in modes else None
        for mode in modes:
            median = statistics.median(rates[workload, mode])
            label = f"{mode} (W={config.workers})" if mode == "workers" else mode
            parts = [f"{statistics.median(s[part] for s in splits[workload, mode]):.1f}" for part in (*PARTS, "rest")]
            table.add_row(workload, label, ", ".join(f"{r:,.0f}" for r in rates[workload, mode]), f"{median:,.0f}",
                          "-" if base is None else f"{median / base:.2f}×",
                          "-" if shell is None else f"{median / shell:.2f}×", *parts)
            if base is not None and mode not in ("sequential", "shell"):
                best[workload] = max(best.get(workload, 0.0), median / base)
    console.print(table)
    for workload, ratio in best.items():
        target = TARGETS[workload]
        verdict = "met" if ratio >= target else "missed"
        console.print(f"{workload}: best {ratio:.2f}× one trial at a time; target ≥ {target:g}× (aim {AIM:g}×): "
                      f"{verdict}")
    return 0


def _lr(config: SweepBenchConfig, console: Console) -> int:
    import optuna

    table = Table(title=f"tune lr against a sweep of {config.lr_trials} trials over the learning rate (TPE)")
    for column in ("case", "best lr", "val_loss", "tune lr", "factor", f"≤ {LR_FACTOR:.0f}×"):
        table.add_column(column, justify="left" if column == "case" else "right", no_wrap=True)
    with tempfile.TemporaryDirectory(prefix="jaxtrain-bench-lr-") as tmp:
        for case in config.lr_cases:
            name, flags = LR_CASES[case]
            flags = QUICK[name] if config.quick else flags
            out = Path(tmp) / case.replace(" ", "-")
            jaxtrain = [sys.executable, "-m", "jaxtrain"]
            sweep = subprocess.run([*jaxtrain, "sweep", name, *flags, "--space", "optim.lr=loguniform:1e-5:1",
                                    "--trials", str(config.lr_trials), "--out", str(out)],
                                   capture_output=True, text=True)
            tune = subprocess.run([*jaxtrain, "tune", "lr", name, *flags, "--out", str(out / "lr.png")],
                                  capture_output=True, text=True)
            if sweep.returncode or tune.returncode or "--optim.lr " not in tune.stdout:
                console.print(f"{case}: FAILED: {(sweep.stderr + tune.stderr).strip().splitlines()[-1:]}")
                return 1
            best = optuna.load_study(study_name=name, storage=f"sqlite:///{out / 'study.db'}").best_trial
            suggestion = float(tune.stdout.split("--optim.lr ")[-1].split()[0])
            rate = best.params["optim.lr"]
            factor = max(suggestion, rate) / min(suggestion, rate)
            table.add_row(case, f"{rate:.2e}", f"{best.value:.4g}", f"{suggestion:.2e}", f"{factor:.1f}×",
                          "met" if factor <= LR_FACTOR else "missed")
            console.print(f"{case}: sweep best {rate:.2e}, tune lr {suggestion:.2e}")
    console.print(table)
    return 0


def _adaptive_command(workload: str, arm: str, config: SweepBenchConfig, out: Path) -> list[str]:
    """The sweep command of one arm of part adaptive."""
    p = 4 if config.quick else config.adaptive_population
    flags = [*(QUICK if config.quick else ADAPTIVE)[workload], *shlex.split(config.flags)]
    if config.quick:
        flags += ["--epochs", "2"]
    command = [sys.executable, "-m", "jaxtrain", "sweep", workload, *flags, "--space", ADAPTIVE_SPACE, "--out",
               str(out), "--sampler", "random", "--pruner", "none", "--quiet"]
    if arm == "sequential":
        return [*command, "--trials", str(p)]
    if arm == "population":
        return [*command, "--trials", str(p), "--population", str(p)]
    trials = 2 * p if arm == "halving" else p
    return [*command, "--trials", str(trials), "--population", str(p), "--scheduler", arm]


def _reached(out: Path, arm: str, started: float) -> list[tuple[float, float]]:
    """(seconds from the command's start, val_loss) of every epoch of every trial of the sweep in `out`."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    trials = optuna.load_study(study_name=None, storage=f"sqlite:///{out / 'study.db'}").trials
    first = min(t.datetime_start.timestamp() for t in trials if t.datetime_start)
    points = []
    for t in trials:
        rows = out / f"trial-{t.number:04d}" / "metrics.jsonl"
        if not rows.is_file() or t.datetime_start is None:
            continue
        base = t.datetime_start.timestamp() if arm == "sequential" else first
        for line in rows.read_text().splitlines():
            row = json.loads(line)
            if row.get("kind") == "epoch" and math.isfinite(row.get("val_loss", math.nan)):
                points.append((base + row["elapsed_s"] - started, row["val_loss"]))
    return sorted(points)


def _adaptive(config: SweepBenchConfig, console: Console) -> int:
    arms = list(config.arms)
    if "sequential" not in arms:
        arms.insert(0, "sequential")  # its best is the target
    walls: dict[tuple[str, str], list[float]] = {}
    bests: dict[tuple[str, str], list[float]] = {}
    to_target: dict[tuple[str, str], list[float | None]] = {}
    with tempfile.TemporaryDirectory(prefix="jaxtrain-bench-adaptive-") as tmp:
        for round_ in range(1, config.rounds + 1):
            for workload in config.workloads:
                target = None
                for arm in arms:
                    out = Path(tmp) / f"{workload}-{arm}-{round_}"
                    started, t0 = time.time(), time.perf_counter()
                    done = subprocess.run(_adaptive_command(workload, arm, config, out), capture_output=True,
                                          text=True)
                    wall = time.perf_counter() - t0
                    if done.returncode != 0:
                        console.print(f"round {round_} {workload} {arm}: FAILED (exit {done.returncode}): "
                                      f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
                        return 1
                    points = _reached(out, arm, started)
                    best = min(v for _, v in points)
                    target = best if arm == "sequential" else target
                    reach = next((t for t, v in points if v <= target), None) if target is not None else None
                    for table, value in ((walls, wall), (bests, best), (to_target, reach)):
                        table.setdefault((workload, arm), []).append(value)  # type: ignore[arg-type]
                    console.print(f"round {round_} {workload} {arm}: {wall:.1f} s, best val_loss {best:.5g}, the "
                                  f"sequential sweep's best reached "
                                  + ("never" if reach is None else f"at {reach:.1f} s"))
    p = 4 if config.quick else config.adaptive_population
    table = Table(title=f"adaptive populations: P = {p}, {config.rounds} interleaved rounds, medians "
                        f"({os.cpu_count()} CPU cores)")
    for column in ("workload", "arm", "trials", "wall s", "best val_loss", "seq. best at s", "÷ seq. wall"):
        table.add_column(column, justify="left" if column in ("workload", "arm") else "right")
    for workload in config.workloads:
        base = statistics.median(walls[workload, "sequential"])
        for arm in arms:
            reached = [r for r in to_target[workload, arm] if r is not None]
            # an arm that missed the target in some round: its median counts those rounds as never
            reach = statistics.median(reached) if len(reached) * 2 > len(to_target[workload, arm]) else None
            trials = {"halving": f"{2 * p}", "pbt": f"{p} + copies"}.get(arm, str(p))
            table.add_row(workload, arm, trials, f"{statistics.median(walls[workload, arm]):.1f}",
                          f"{statistics.median(bests[workload, arm]):.5g}",
                          "never" if reach is None else f"{reach:.1f}",
                          "-" if reach is None else f"{reach / base:.2f}")
    console.print(table)
    for workload in config.workloads:
        base = statistics.median(walls[workload, "sequential"])
        for arm in ("halving", "pbt"):
            if (workload, arm) not in to_target:
                continue
            reached = [r for r in to_target[workload, arm] if r is not None]
            share = statistics.median(reached) / base if len(reached) * 2 > len(to_target[workload, arm]) else None
            verdict = "met" if share is not None and share <= ADAPTIVE_TARGET else "missed"
            reaches = "never reaches it" if share is None else f"reaches it in {share:.2f} of that sweep's wall time"
            console.print(f"{workload} {arm}: the one-at-a-time sweep's best val_loss: {reaches}; target ≤ 1/3: "
                          f"{verdict}")
    return 0
