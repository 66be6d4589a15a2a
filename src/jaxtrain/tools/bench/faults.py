"""`jaxtrain bench faults`: SIGKILL at each moment of a run × resume; do resumed runs equal an uninterrupted one?

One uninterrupted run of `jaxtrain train mlp-regression` (small data, a step checkpoint every few
calls, a fixed K so that every run makes the same calls) is the reference. Then, for each moment
and trial, the same command runs in a child process that SIGKILLs itself at that moment; the run
is resumed with `--resume RUN_DIR` until a resume exits 0 (a resume that fails twice with the same
error is not tried again), and the resumed run is compared with the reference:

- the newest checkpoint's whole train state (parameters, optimizer state, step, RNG key), bit for bit;
- metrics.jsonl: each training row and epoch row once, the reference's rows and no others, and the
  epoch rows' `val_loss` equal to the reference's.

The moments (the child listens to the library's documented seam, `jaxtrain._src.moments`, and
kills itself there; no function is patched):

  start-up           the feed or the train state built, before any compilation
  compilation        a call lowered, before XLA compiles it (before training starts)
  before-checkpoint  at a call boundary of the first epoch, before any checkpoint was saved
  mid-epoch          at a call boundary after a step checkpoint was written completely
  async-save         right after `Checkpointer.save` returned, while Orbax writes in the background
  evaluation         at an epoch end, before or after the validation pass (before the epoch's save)
  bit-flip           as mid-epoch (a later half occurrence: older checkpoints exist), then one bit of the
                     newest checkpoint's largest data file is flipped: the resume must notice (the
                     arrays' checksums), fall back to the previous checkpoint and still equal the reference

Which occurrence of its moment a trial kills at (which compile, call boundary, save, evaluation)
is drawn with a seeded RNG from the occurrences the reference run counted, distinct per trial
where there are enough. A kill point that a trial never reaches is an error of that trial.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
from rich.console import Console
from rich.table import Table

from jaxtrain.tools.bench.child import CHILD_FLAG

Moment = Literal["start-up", "compilation", "before-checkpoint", "mid-epoch", "async-save", "evaluation",
                 "bit-flip"]
MOMENTS: tuple[Moment, ...] = ("start-up", "compilation", "before-checkpoint", "mid-epoch", "async-save",
                               "evaluation", "bit-flip")
KILLED_AT = {"bit-flip": "mid-epoch"}  # cases that kill at another moment's occurrences, then damage the run
QUICK_MOMENTS: tuple[Moment, ...] = ("mid-epoch", "async-save")
KILL_MARK = "faults: SIGKILL at"  # the child's last stdout line before it kills itself


@dataclasses.dataclass(frozen=True)
class FaultsBenchConfig:
    """Settings of the faults benchmark."""

    trials: int = 3
    """Killed runs per moment."""
    moments: tuple[Moment, ...] = MOMENTS
    """The moments to kill at (default all seven)."""
    samples: int = 6_000
    """Dataset size (train + validation) of every run."""
    val_samples: int = 1_000
    """Validation samples."""
    epochs: int = 3
    """Epochs per run."""
    every_steps: int = 50
    """A step checkpoint every this many steps (--checkpoint.every-steps)."""
    steps_per_call: int = 10
    """K, fixed so that the reference and every resumed run make the same calls (the automatic K is
    timed, so it can differ between runs)."""
    log_every: int = 20
    """Steps per training row of metrics.jsonl (rows are checked for duplicates)."""
    max_resumes: int = 3
    """Resume attempts per trial before it counts as not resumed."""
    timeout_s: float = 300.0
    """Seconds one training process may take before it is stopped and the trial fails."""
    seed: int = 0
    """Seed of the kill points."""
    quick: bool = False
    """A cut-down run for smoke tests: 1 trial, tiny data, the mid-epoch and async-save moments
    (unless --moments is given)."""
    out: str | None = None
    """Write the results as JSON to this file."""


@dataclasses.dataclass
class Trial:
    """One killed and resumed run."""

    moment: str
    trial: int
    nth: int
    """The occurrence of the moment the child was told to kill at (1-based)."""
    killed_at: str | None = None
    """Where the kill landed, as the child described it; None: it did not."""
    attempts: int = 0
    """Resume launches."""
    completed: bool = False
    """A resume exited 0."""
    equal: bool = False
    """Completed, with the reference's final train state and metrics rows."""
    error: str | None = None
    """Why the trial is not equal: the failed kill or resume's error line, or the differences."""
    seconds: float = 0.0


# --- the child: a training process that kills itself at one moment --------------------------------------


class _Probes:
    """Counts the occurrences of every moment in this training process and SIGKILLs it at the
    `nth` occurrence of `moment` (None: count only)."""

    def __init__(self, moment: str | None, nth: int):
        self.moment, self.nth = moment, nth
        self.counts = {m: 0 for m in MOMENTS}
        self.training = False  # the first training call started
        self.saves, self.last_save, self.last_save_kind, self._saves_at_call = 0, 0, "", 0

    def event(self, moment: str, where: str, before_kill: Callable[[], Any] | None = None) -> None:
        self.counts[moment] += 1
        if moment == self.moment and self.counts[moment] == self.nth:
            if before_kill is not None:
                before_kill()
            print(f"{KILL_MARK} {moment} #{self.nth}: {where}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def install(self) -> None:
        """Listens to the library's moments (`jaxtrain._src.moments`, the documented seam)."""
        from jaxtrain._src import moments

        moments.listen(self._on_moment)

    def _on_moment(self, name: str, facts: dict[str, Any]) -> None:
        if name in ("feed made", "state initialised"):
            self.event("start-up", name)
        elif name == "lowered" and not self.training:
            self.event("compilation", f"compile #{self.counts['compilation'] + 1} of the start ({facts['what']}): "
                                      "lowered, before XLA compiles it")
        elif name == "call":
            self.training, self._saves_at_call = True, self.saves
            run = facts["run"]
            if self.saves == 0:  # no checkpoint hook has seen this step yet, and none saved before it
                self.event("before-checkpoint", f"step {run.step} (epoch {run.epoch}), no checkpoint yet")
        elif name == "checkpoint saved":
            self.saves += 1
            self.last_save, self.last_save_kind = facts["step"], facts["kind"]
            self.event("async-save", f"the {facts['kind']} checkpoint of step {facts['step']}: save returned, "
                                     "Orbax still writing")
        elif name == "call done":
            run = facts["run"]
            mid_epoch = run.loop.position < run.feed.steps_per_epoch
            if self.saves == self._saves_at_call and self.last_save_kind == "step" and mid_epoch:
                wait = next(h.ckpt.wait for h in run.hooks if hasattr(h, "ckpt"))
                self.event("mid-epoch", f"step {run.step} (epoch {run.epoch}, step {run.loop.position} of "
                                        f"{run.feed.steps_per_epoch}), {run.step - self.last_save} steps after the "
                                        f"step checkpoint of step {self.last_save} (written)", before_kill=wait)
        elif name == "evaluation":
            self.event("evaluation", f"epoch {facts['epoch']} end, {facts['when']} the validation pass")


# --- the parent ------------------------------------------------------------------------------------------


def train_args(config: FaultsBenchConfig) -> list[str]:
    """The `jaxtrain` command line of every run of the benchmark (each adds its own --run-dir)."""
    return ["train", "mlp-regression", "--data.samples", str(config.samples), "--data.val-samples",
            str(config.val_samples), "--epochs", str(config.epochs), "--checkpoint.every-steps",
            str(config.every_steps), "--steps-per-call", str(config.steps_per_call), "--log-every",
            str(config.log_every), "--quiet"]


def _launch(command: list[str], timeout_s: float) -> tuple[int | None, str, str]:
    """(exit code or None after a timeout, stdout, stderr) of `python COMMAND`."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        return None, out, f"timed out after {timeout_s:g} s"
    return proc.returncode, proc.stdout, proc.stderr


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def run_probed(args: list[str], moment: str | None, nth: int, timeout_s: float) -> tuple[int | None, str, dict]:
    """Runs `jaxtrain ARGS` in a child that kills itself at the `nth` occurrence of `moment`.

    Returns:
      (exit code, where it was killed or its error line, the child's result: {"exit_code", "counts"}
      when it was not killed).
    """
    payload = {"moment": moment, "nth": nth, "args": args}
    code, out, err = _launch(["-m", "jaxtrain.tools.bench.faults_child", CHILD_FLAG, json.dumps(payload)], timeout_s)
    marks = [line for line in out.splitlines() if line.startswith(KILL_MARK)]
    if marks:
        return code, marks[-1][len(KILL_MARK):].strip(), {}
    try:
        result = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        result = {}
    return code, _last_line(err), result if isinstance(result, dict) else {}


@dataclasses.dataclass(frozen=True)
class Final:
    """What a finished run is compared by."""

    step: int
    state: dict[str, np.ndarray]
    """The newest checkpoint's train state, `{path: array}`."""
    rows: list[dict[str, Any]]
    """metrics.jsonl."""


def read_final(run_dir: Path) -> Final:
    """The newest checkpoint's train state and the metrics rows of a run directory.

    Raises:
      JaxtrainError: no readable checkpoint.
    """
    from jaxtrain._src.checkpoint import Checkpointer
    from jaxtrain._src.report.run_dir import read_jsonl

    ckpt = Checkpointer(run_dir / "checkpoints", read_only=True)
    try:
        flat, meta = ckpt.read()
    finally:
        ckpt.close()
    return Final(int(meta["step"]), {k: np.asarray(v) for k, v in flat.items()}, read_jsonl(run_dir / "metrics.jsonl"))


def _row_key(row: dict[str, Any]) -> tuple[str, int]:
    return str(row.get("kind")), int(row.get("step", -1))


def differences(final: Final, reference: Final) -> list[str]:
    """How a resumed run differs from the reference: train state bit for bit, metrics rows."""
    found = []
    if final.step != reference.step:
        found.append(f"newest checkpoint is step {final.step}, the reference's {reference.step}")
    if set(final.state) != set(reference.state):
        found.append("the checkpoint holds other arrays than the reference's")
    unequal = [path for path in sorted(set(final.state) & set(reference.state))
               if final.state[path].dtype != reference.state[path].dtype
               or not np.array_equal(final.state[path], reference.state[path])]
    if unequal:
        found.append(f"{len(unequal)} of {len(reference.state)} train-state arrays differ (e.g. {unequal[0]})")
    counts = collections.Counter(_row_key(r) for r in final.rows)
    duplicated = [f"{kind} step {step} x{n}" for (kind, step), n in sorted(counts.items()) if n > 1]
    if duplicated:
        found.append(f"metrics.jsonl has duplicated rows: {', '.join(duplicated[:3])}")
    wanted = {_row_key(r) for r in reference.rows}
    missing, extra = sorted(wanted - set(counts)), sorted(set(counts) - wanted)
    if missing or extra:
        found.append(f"metrics.jsonl rows missing {missing[:3]}, unexpected {extra[:3]}")
    val = {r["epoch"]: r.get("val_loss") for r in reference.rows if r.get("kind") == "epoch"}
    changed = [r["epoch"] for r in final.rows if r.get("kind") == "epoch" and r.get("val_loss") != val.get(r["epoch"])]
    if changed:
        found.append(f"epoch {changed[0]} val_loss differs from the reference's")
    return found


def run_trial(trial: Trial, args: list[str], run_dir: Path, reference: Final, config: FaultsBenchConfig) -> Trial:
    """Kills a run at `trial.moment`, resumes it until a resume exits 0, and compares it with `reference`."""
    t0 = time.perf_counter()
    moment = KILLED_AT.get(trial.moment, trial.moment)
    code, said, _ = run_probed([*args, "--run-dir", str(run_dir)], moment, trial.nth, config.timeout_s)
    if code == -signal.SIGKILL and trial.moment == "bit-flip":
        said += f"; {flip_a_bit(run_dir)}"
    if code != -signal.SIGKILL:
        reason = "the kill point was never reached (the run finished)" if code == 0 else f"exit code {code}: {said}"
        trial.error = f"not killed: {reason}"
    else:
        trial.killed_at = said
        previous = None
        while trial.attempts < config.max_resumes and not trial.completed:
            trial.attempts += 1
            code, _, err = _launch(["-m", "jaxtrain", *args, "--run-dir", str(run_dir), "--resume", str(run_dir)],
                                   config.timeout_s)
            trial.completed = code == 0
            if not trial.completed:
                line = _last_line(err)
                trial.error = f"resume attempt {trial.attempts} failed (exit code {code}): {line}"
                if line == previous:
                    break  # the same error twice: a deterministic failure
                previous = line
        if trial.completed:
            try:
                found = differences(read_final(run_dir), reference)
            except Exception as e:  # noqa: BLE001 - an unreadable result is a finding of the trial
                found = [f"cannot read the resumed run: {type(e).__name__}: {str(e).splitlines()[0]}"]
            trial.equal, trial.error = not found, "; ".join(found) or None
    trial.seconds = time.perf_counter() - t0
    return trial


def flip_a_bit(run_dir: Path) -> str:
    """Flips one bit in the middle of the newest checkpoint's largest data file (an array's stored
    values); says which."""
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    data = max((run_dir / "checkpoints" / str(steps[-1])).glob("state/**/d/*"), key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 1
    data.write_bytes(bytes(raw))
    return f"one bit flipped in checkpoint step {steps[-1]}'s largest data file"


def _kill_points(rng: random.Random, count: int, trials: int, first: int = 1) -> list[int]:
    """Occurrences to kill at, from `first` to `count`: distinct while there are enough, then repeated."""
    points: list[int] = []
    while len(points) < trials:
        points += rng.sample(range(first, count + 1), min(count - first + 1, trials - len(points)))
    return points


def summarize(trials: list[Trial], moments: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Per moment: trials, killed, resumed to completion, equal, resume attempts of each trial."""
    rows = {}
    for moment in moments:
        mine = [t for t in trials if t.moment == moment]
        rows[moment] = {"trials": len(mine), "killed": sum(t.killed_at is not None for t in mine),
                        "completed": sum(t.completed for t in mine), "equal": sum(t.equal for t in mine),
                        "attempts": [t.attempts for t in mine]}
    return rows


def print_report(trials: list[Trial], moments: tuple[str, ...], console: Console) -> None:
    """The table, each unequal trial's reason below it, and the final count."""
    table = Table(title="SIGKILL at each moment, then --resume until it exits 0")
    for column in ("moment", "trials", "killed", "resumed to completion", "equal to uninterrupted",
                   "resume attempts"):
        table.add_column(column, justify="left" if column == "moment" else "right",
                         min_width=max(map(len, moments)) if column == "moment" else None)
    for moment, row in summarize(trials, moments).items():
        table.add_row(moment, str(row["trials"]), str(row["killed"]), str(row["completed"]), str(row["equal"]),
                      " ".join(map(str, row["attempts"])))
    console.print(table)
    for t in trials:
        if not t.equal:
            where = f" (killed at {t.killed_at})" if t.killed_at else ""
            console.print(f"  {t.moment} trial {t.trial}{where}: {t.error}")
    equal = sum(t.equal for t in trials)
    console.print(f"{equal}/{len(trials)} resumed runs equal the uninterrupted run")


def main(config: FaultsBenchConfig) -> int:
    if config.quick:
        moments = QUICK_MOMENTS if config.moments == MOMENTS else config.moments
        config = dataclasses.replace(config, trials=1, samples=2_000, val_samples=400, epochs=2, every_steps=20,
                                     steps_per_call=5, log_every=10, moments=moments)
    console = Console(highlight=False, soft_wrap=True)
    args = train_args(config)
    console.print(f"faults benchmark: jaxtrain {' '.join(args)}; {config.trials} trial(s) of each of "
                  f"{len(config.moments)} moments, seed {config.seed}")
    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="jaxtrain-faults-") as tmp:
        code, error, result = run_probed([*args, "--run-dir", f"{tmp}/reference"], None, 0, config.timeout_s)
        if code != 0 or result.get("exit_code") != 0:
            console.print(f"error: the uninterrupted reference run failed (exit code {code}): {error}")
            return 1
        reference, counts = read_final(Path(tmp, "reference")), result["counts"]
        counts = {**counts, **{m: counts[k] for m, k in KILLED_AT.items()}}
        console.print(f"  reference: {reference.step} steps; occurrences of each moment: "
                      + ", ".join(f"{m} {counts[m]}" for m in config.moments))
        rng = random.Random(config.seed)
        for moment in config.moments:
            if not counts[moment]:
                trials += [Trial(moment, i + 1, 0, error="the uninterrupted run never reaches this moment")
                           for i in range(config.trials)]
                continue
            first = counts[moment] // 2 + 1 if moment == "bit-flip" else 1  # an older checkpoint to fall back to
            for i, nth in enumerate(_kill_points(rng, counts[moment], config.trials, first)):
                t = run_trial(Trial(moment, i + 1, nth), args, Path(tmp, f"{moment}-{i + 1}"), reference, config)
                trials.append(t)
                outcome = "equal" if t.equal else "NOT EQUAL"
                console.print(f"  {moment} {i + 1}/{config.trials}: killed at {t.killed_at or '-'}; "
                              f"{t.attempts} resume(s); {outcome} ({t.seconds:.1f} s)")
    print_report(trials, config.moments, console)
    if config.out:
        results = {"config": dataclasses.asdict(config), "command": ["jaxtrain", *args],
                   "reference": {"step": reference.step, "counts": counts},
                   "moments": summarize(trials, config.moments), "trials": [dataclasses.asdict(t) for t in trials],
                   "equal": sum(t.equal for t in trials), "total": len(trials)}
        Path(config.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if trials and all(t.equal for t in trials) else 1

