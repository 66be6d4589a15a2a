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

Two cases are not a kill (nor compared with the reference in the same way), each with its own test
of "handled":

  disk-full          the run directory is on a tmpfs (`mount -t tmpfs -o size=...`, needs root; skipped
                     with a note where mounting is refused) with room for 1 or 2 of the run's
                     checkpoints (drawn per trial) and half of one more, so that a later save finds
                     the disk full. Handled: the training process exits 2 with a single `error:` line
                     on stderr and no traceback, summary.json's status is "failed: ...", the newest
                     complete checkpoint still loads (`jaxtrain.tools.runs.load(run_dir, STEP)`); then the
                     tmpfs is grown (`mount -o remount,size=1g`: the space is freed) and `--resume RUN_DIR`
                     completes and equals the reference.
  changed-data       the run trains from an HDF5 file (`jaxtrain data generate mlp-regression` with
                     the same sample count, `--data.path`), is killed as at mid-epoch, the file is
                     regenerated with another `--seed` (`--force`). Handled: `--resume RUN_DIR` is
                     refused, exit 2 with a single `error:` line naming the file and no traceback;
                     then `--resume RUN_DIR --data.accept-changed` completes (every step) and
                     metrics.jsonl holds a "note" row naming the file. The data differ, so this case
                     is not compared with the reference.

For the kill moments (and bit-flip), handled means equal to the reference.

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

from benchmarks.child import CHILD_FLAG, child_environ

Moment = Literal["start-up", "compilation", "before-checkpoint", "mid-epoch", "async-save", "evaluation",
                 "bit-flip", "disk-full", "changed-data"]
MOMENTS: tuple[Moment, ...] = ("start-up", "compilation", "before-checkpoint", "mid-epoch", "async-save",
                               "evaluation", "bit-flip", "disk-full", "changed-data")
# cases that kill at another moment's occurrences, then damage the run (disk-full: its saves, none killed)
KILLED_AT = {"bit-flip": "mid-epoch", "changed-data": "mid-epoch", "disk-full": "async-save"}
NOT_COMPARED = ("changed-data",)  # cases whose resumed run is not compared with the reference (other data)
FITTING = 2  # disk-full: the tmpfs holds 1 to FITTING checkpoints (and half of one more)
QUICK_MOMENTS: tuple[Moment, ...] = ("mid-epoch", "async-save")
KILL_MARK = "faults: SIGKILL at"  # the child's last stdout line before it kills itself


@dataclasses.dataclass(frozen=True)
class FaultsBenchConfig:
    """Settings of the faults benchmark."""

    trials: int = 3
    """Killed runs per moment."""
    moments: tuple[Moment, ...] = MOMENTS
    """The moments to kill at, and the disk-full and changed-data cases (default all nine)."""
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
    ema: float = 0.0
    """--ema of every run (an average of the weights in the train state that must resume exactly too)."""
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
    handled: bool = False
    """The case's test passed: `equal` for a kill; see the module docstring for disk-full and changed-data."""
    skipped: bool = False
    """Not run here (disk-full where a tmpfs cannot be mounted); `error` says why."""
    error: str | None = None
    """Why the trial is not handled: the failed kill or resume's error line, or the differences."""
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
            str(config.log_every), "--quiet", *(["--ema", str(config.ema)] if config.ema else [])]


def _launch(command: list[str], timeout_s: float) -> tuple[int | None, str, str]:
    """(exit code or None after a timeout, stdout, stderr) of `python COMMAND`."""
    env = child_environ({"PYTHONUNBUFFERED": "1"})
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
    code, out, err = _launch(["-m", "benchmarks.faults_child", CHILD_FLAG, json.dumps(payload)], timeout_s)
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
        _resume_and_compare(trial, args, run_dir, reference, config)
    trial.handled = trial.equal
    trial.seconds = time.perf_counter() - t0
    return trial


def _resume(trial: Trial, args: list[str], run_dir: Path, config: FaultsBenchConfig, extra: tuple[str, ...] = ()
            ) -> None:
    """`--resume RUN_DIR` (and `extra`) until it exits 0: sets `trial.attempts`, `completed`, `error`."""
    previous = None
    while trial.attempts < config.max_resumes and not trial.completed:
        trial.attempts += 1
        code, _, err = _launch(["-m", "jaxtrain", *args, "--run-dir", str(run_dir), "--resume", str(run_dir),
                                *extra], config.timeout_s)
        trial.completed = code == 0
        if not trial.completed:
            line = _last_line(err)
            trial.error = f"resume attempt {trial.attempts} failed (exit code {code}): {line}"
            if line == previous:
                break  # the same error twice: a deterministic failure
            previous = line


def _resume_and_compare(trial: Trial, args: list[str], run_dir: Path, reference: Final,
                        config: FaultsBenchConfig) -> None:
    """Resumes until a resume exits 0, then compares the run with the reference: sets `trial.equal`."""
    _resume(trial, args, run_dir, config)
    if trial.completed:
        try:
            found = differences(read_final(run_dir), reference)
        except Exception as e:  # noqa: BLE001 - an unreadable result is a finding of the trial
            found = [f"cannot read the resumed run: {type(e).__name__}: {str(e).splitlines()[0]}"]
        trial.equal, trial.error = not found, "; ".join(found) or None


def one_error_line(code: int | None, stderr: str, naming: str | None = None) -> list[str]:
    """What is wrong with a failure that should be exit 2 and a single `error:` line on stderr, no
    traceback (and the line naming `naming`); [] when nothing is."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    found = []
    if code != 2:
        found.append(f"exit code {code}, not 2")
    if "Traceback" in stderr:
        found.append("a traceback on stderr")
    if len(lines) != 1 or not lines[0].startswith("error: "):
        found.append(f"{len(lines)} lines on stderr, not one `error:` line (last: {_last_line(stderr)})")
    elif naming is not None and naming not in lines[0]:
        found.append(f"the error line does not name {naming}: {lines[0]}")
    return found


def checkpoint_bytes(run_dir: Path) -> int:
    """The size of the newest checkpoint of a run directory, in bytes."""
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    return sum(f.stat().st_size for f in (run_dir / "checkpoints" / str(steps[-1])).rglob("*") if f.is_file())


def _mount(path: Path, options: str) -> str | None:
    """`mount -t tmpfs -o OPTIONS tmpfs PATH`; None, or why it failed."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True,
                              text=True)
    except OSError as e:
        return str(e)
    return None if proc.returncode == 0 else _last_line(proc.stderr or proc.stdout)


def run_disk_full(trial: Trial, args: list[str], where: Path, reference: Final, ckpt_bytes: int,
                  config: FaultsBenchConfig) -> Trial:
    """The disk-full case: a run on a tmpfs with room for `trial.nth` checkpoints and half of one
    more fails cleanly; after the tmpfs is grown, `--resume` completes and equals the reference."""
    t0 = time.perf_counter()
    size = int((trial.nth + 0.5) * ckpt_bytes) + (256 << 10)  # + the run's other files
    why = _mount(where, f"size={size}")
    if why is not None:
        trial.skipped, trial.error = True, f"skipped: cannot mount a tmpfs here (needs root): {why}"
        return trial
    run_dir = where / "run"
    try:
        code, _, err = _launch(["-m", "jaxtrain", *args, "--run-dir", str(run_dir)], config.timeout_s)
        found = one_error_line(code, err)
        if code == 0:
            found = [f"the run finished on a {size / 2**20:.1f} MiB disk: it never filled"]
        else:
            trial.killed_at = f"disk full ({size / 2**20:.1f} MiB, room for {trial.nth} checkpoint(s)): " \
                              f"{_last_line(err)}"
            try:
                status = json.loads((run_dir / "summary.json").read_text())["status"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                status = f"unreadable ({type(e).__name__})"
            if not str(status).startswith("failed: "):
                found.append(f"summary.json status is {status!r}, not 'failed: ...'")
            found += _newest_loads(run_dir)
        grown = None if found else subprocess.run(["mount", "-o", "remount,size=1g", str(where)],
                                                   capture_output=True, text=True)
        if grown is not None and grown.returncode != 0:
            found.append(f"cannot grow the tmpfs to free space: {_last_line(grown.stderr)}")
        if not found:  # space freed: the filesystem grown in place
            _resume_and_compare(trial, args, run_dir, reference, config)
            trial.handled = trial.equal
        else:
            trial.error = "; ".join(found)
    finally:
        while subprocess.run(["umount", str(where)], capture_output=True).returncode == 0:
            pass
    trial.seconds = time.perf_counter() - t0
    return trial


def _newest_loads(run_dir: Path) -> list[str]:
    """[] when the newest complete checkpoint of a run directory loads as a model, else why not."""
    from jaxtrain._src.checkpoint import Checkpointer
    from jaxtrain.tools import runs

    try:
        ckpt = Checkpointer(run_dir / "checkpoints", read_only=True)
        try:
            steps = ckpt.steps()
        finally:
            ckpt.close()
        if not steps:
            return ["no complete checkpoint was left"]
        runs.load(run_dir, str(steps[-1]))
    except Exception as e:  # noqa: BLE001 - any failure to load is the finding
        return [f"the newest complete checkpoint does not load: {type(e).__name__}: {str(e).splitlines()[0]}"]
    return []


def hdf5_args(args: list[str], path: Path) -> list[str]:
    """`args` training from the HDF5 file `path` instead of generated data."""
    i = args.index("--data.samples")
    return [*args[:i], "--data.path", str(path), *args[i + 2:]]


def _generate(path: Path, samples: int, seed: int, timeout_s: float) -> str | None:
    """`jaxtrain data generate mlp-regression PATH --samples N --seed S --force`: None, or its error."""
    code, _, err = _launch(["-m", "jaxtrain", "data", "generate", "mlp-regression", str(path), "--samples",
                            str(samples), "--seed", str(seed), "--force", "--quiet"], timeout_s)
    return None if code == 0 else f"data generate exited {code}: {_last_line(err)}"


def run_changed_data(trial: Trial, args: list[str], where: Path, steps: int, config: FaultsBenchConfig) -> Trial:
    """The changed-data case: killed mid-epoch, the HDF5 file regenerated with another seed; the
    resume must be refused with one line naming the file, and `--data.accept-changed` must then
    complete all `steps` with a note row."""
    t0 = time.perf_counter()
    where.mkdir(parents=True, exist_ok=True)
    data, run_dir = where / "data.h5", where / "run"
    args = hdf5_args(args, data)
    found: list[str] = []
    error = _generate(data, config.samples, 0, config.timeout_s)
    if error is None:
        code, said, _ = run_probed([*args, "--run-dir", str(run_dir)], "mid-epoch", trial.nth, config.timeout_s)
        if code != -signal.SIGKILL:
            error = "not killed: " + ("the kill point was never reached (the run finished)" if code == 0
                                      else f"exit code {code}: {said}")
        else:
            trial.killed_at = f"{said}; the file regenerated with --seed {trial.trial}"
            error = _generate(data, config.samples, trial.trial, config.timeout_s)
    if error is None:
        code, _, err = _launch(["-m", "jaxtrain", *args, "--run-dir", str(run_dir), "--resume", str(run_dir)],
                               config.timeout_s)
        trial.attempts += 1
        found = [f"the resume on changed data: {f}" for f in one_error_line(code, err, naming=str(data))]
        if code == 0:
            found = ["the resume on changed data was not refused (exit 0)"]
        _resume(trial, args, run_dir, config, extra=("--data.accept-changed",))
        if not trial.completed:
            found.append(f"--data.accept-changed: {trial.error}")
        else:
            found += _accepted_run(run_dir, data, steps)
        error = "; ".join(found) or None
    trial.error, trial.handled = error, error is None
    trial.seconds = time.perf_counter() - t0
    return trial


def _accepted_run(run_dir: Path, data: Path, steps: int) -> list[str]:
    """[] when a run resumed with --data.accept-changed reached `steps` and noted the change."""
    from jaxtrain._src.report.run_dir import read_jsonl

    found = []
    try:
        rows, step = read_jsonl(run_dir / "metrics.jsonl"), read_final(run_dir).step
    except Exception as e:  # noqa: BLE001 - an unreadable result is a finding of the trial
        return [f"cannot read the resumed run: {type(e).__name__}: {str(e).splitlines()[0]}"]
    if step != steps:
        found.append(f"the accepted resume ended at step {step}, not {steps}")
    if not any(r.get("kind") == "note" and str(data) in str(r.get("note")) for r in rows):
        found.append("metrics.jsonl has no note row naming the changed file")
    return found


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
    """Per moment: trials, killed (or stopped: disk-full), resumed to completion, equal (None: not
    compared), handled, skipped, resume attempts of each trial."""
    rows = {}
    for moment in moments:
        mine = [t for t in trials if t.moment == moment]
        rows[moment] = {"trials": len(mine), "killed": sum(t.killed_at is not None for t in mine),
                        "completed": sum(t.completed for t in mine),
                        "equal": None if moment in NOT_COMPARED else sum(t.equal for t in mine),
                        "handled": sum(t.handled for t in mine), "skipped": sum(t.skipped for t in mine),
                        "attempts": [t.attempts for t in mine]}
    return rows


def print_report(trials: list[Trial], moments: tuple[str, ...], console: Console) -> None:
    """The table, each unequal trial's reason below it, and the final count."""
    table = Table(title="SIGKILL at each moment, then --resume until it exits 0")
    for column in ("moment", "trials", "killed", "resumed to completion", "equal to uninterrupted", "handled",
                   "resume attempts"):
        table.add_column(column, justify="left" if column == "moment" else "right",
                         min_width=max(map(len, moments)) if column == "moment" else None)
    for moment, row in summarize(trials, moments).items():
        trials_cell = str(row["trials"]) + (f" ({row['skipped']} skipped)" if row["skipped"] else "")
        table.add_row(moment, trials_cell, str(row["killed"]), str(row["completed"]),
                      "-" if row["equal"] is None else str(row["equal"]), str(row["handled"]),
                      " ".join(map(str, row["attempts"])))
    console.print(table)
    for t in trials:
        if not t.handled:
            where = f" (killed at {t.killed_at})" if t.killed_at else ""
            console.print(f"  {t.moment} trial {t.trial}{where}: {t.error}")
    ran = [t for t in trials if not t.skipped]
    if any(t.moment in NOT_COMPARED or t.moment == "disk-full" for t in trials):
        console.print(f"{sum(t.handled for t in ran)}/{len(ran)} faults handled"
                      + (f" ({len(trials) - len(ran)} skipped)" if len(ran) < len(trials) else ""))
    compared = [t for t in ran if t.moment not in NOT_COMPARED]
    if compared or not trials:
        console.print(f"{sum(t.equal for t in compared)}/{len(compared)} resumed runs equal the uninterrupted run")


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
        ckpt_bytes = checkpoint_bytes(Path(tmp, "reference"))
        counts = {**counts, **{m: counts[k] for m, k in KILLED_AT.items()}}
        counts["disk-full"] = max(0, min(FITTING, counts["disk-full"] - 1))  # checkpoints that fit, not a later one
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
                where, trial = Path(tmp, f"{moment}-{i + 1}"), Trial(moment, i + 1, nth)
                if moment == "disk-full":
                    t = run_disk_full(trial, args, where, reference, ckpt_bytes, config)
                elif moment == "changed-data":
                    t = run_changed_data(trial, args, where, reference.step, config)
                else:
                    t = run_trial(trial, args, where, reference, config)
                trials.append(t)
                outcome = ("skipped" if t.skipped else "handled" if t.handled else "NOT HANDLED") \
                    if moment in ("disk-full", *NOT_COMPARED) else "equal" if t.equal else "NOT EQUAL"
                console.print(f"  {moment} {i + 1}/{config.trials}: killed at {t.killed_at or '-'}; "
                              f"{t.attempts} resume(s); {outcome} ({t.seconds:.1f} s)")
    print_report(trials, config.moments, console)
    if config.out:
        results = {"config": dataclasses.asdict(config), "command": ["jaxtrain", *args],
                   "reference": {"step": reference.step, "counts": counts, "arrays": sorted(reference.state)},
                   "moments": summarize(trials, config.moments), "trials": [dataclasses.asdict(t) for t in trials],
                   "equal": sum(t.equal for t in trials), "handled": sum(t.handled for t in trials),
                   "skipped": sum(t.skipped for t in trials), "total": len(trials)}
        Path(config.out).write_text(json.dumps(results, indent=2) + "\n")
    ran = [t for t in trials if not t.skipped]
    return 0 if ran and all(t.handled for t in ran) else 1

