"""Who may use a run directory, and for what.

One process at a time: a run holds an exclusive lock on `RUN/.lock` (`fcntl.flock`) while it
lives; the kernel drops the lock when the process ends however it ends, so a killed run leaves no
stale lock in the way of its resume. A directory that holds a run (its config.json) refuses a new
run unless it is resumed or `overwrite` is asked for. A resume may change only the settings that
leave the trained result alone (`RESUMABLE`, plus `epochs`); the others are refused by name. The
settings a resume is checked against are those saved in the newest checkpoint (which travel with
the state it continues from), else config.json's: a deleted or edited config.json changes nothing.
A resume of a run with no complete checkpoint yet (killed in its first seconds) starts it again.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Callable

from jaxtrain._src.errors import ConfigError, argument, resume_advice
from jaxtrain._src.report.notes import note

LOCK = ".lock"
# What a run writes into its directory: all of it goes when a run overwrites it, nothing else does.
RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "model.json", "curves.png", ".config.json.tmp",
             ".summary.json.tmp", ".metrics.jsonl.tmp")
RUN_DIRS = ("checkpoints", "tensorboard")
# Settings a resume may change: where and how it runs, what it prints and keeps; not what it computes.
RESUMABLE = ("epochs", "quiet", "verbosity", "log_every", "eval_every", "eval_batch_size", "steps_per_call",
             "tensorboard", "on_nan", "mesh", "dist", "run_dir", "checkpoint.enabled", "checkpoint.every_steps",
             "checkpoint.keep_last", "checkpoint.keep_best", "early_stopping", "data.prefetch",
             "data.accept_changed")


# `fit`'s resume="overwrite", which the command line spells as its overwrite flag
_OVERWRITE = argument("overwrite", True, python='resume="overwrite"')

class RunGuard:
    """Claims `run_dir` for one run: takes its lock and checks that the run may start there.

    Use as a context manager around the run; `resume` is then what the run really does (False
    when a resume found no checkpoint to continue from), and `clear()` removes an earlier run's
    files when the run starts from the beginning over one (after every check that could fail on
    the user's input has passed, so a refused run loses nothing).

    Args:
      run_dir: the run directory (created if missing); None claims nothing.
      config: the run's settings as saved in config.json (`{"recipe": name, **to_dict(config)}`).
      resume: continue the run in `run_dir`.
      overwrite: start again over a run that `run_dir` holds.
      primary: this process writes run files (process 0 of a job); the others only check.
      create: create a missing `run_dir` (and remove it again if the run leaves nothing in it);
        False only checks an existing one.
      note: where notes go (a line each).

    Raises:
      ConfigError: another live process holds the directory; it holds a run and neither resume nor
        overwrite was asked for; a resume changes a setting that would change the result.
    """

    def __init__(self, run_dir: str | os.PathLike | None, config: dict[str, Any], *, resume: bool = False,
                 overwrite: bool = False, primary: bool = True, create: bool = True,
                 note: Callable[[str], None] = note):
        if resume and overwrite:
            raise ConfigError(f"resume and overwrite exclude each other: {argument('resume', True)} continues the "
                              f"run, {_OVERWRITE} starts it again", run_dir=run_dir)
        self.path = Path(run_dir) if run_dir is not None else None
        self.config, self.resume = config, resume
        self._overwrite, self._primary, self._note = overwrite, primary, note
        self._create, self._created, self._lock_file = create, False, None

    def __enter__(self) -> "RunGuard":
        if self.path is None:  # no run directory: nothing to claim
            return self
        if self._primary:
            self._lock()
        try:
            self._check()
        except BaseException:
            self._unlock()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._unlock()
        if self._created and [p.name for p in self.path.iterdir()] == [LOCK]:
            shutil.rmtree(self.path, ignore_errors=True)  # a run that failed before writing anything leaves nothing

    def _lock(self) -> None:
        if not self.path.exists() and not self._create:
            return  # nobody can be using a directory that does not exist yet
        try:
            self._created = not self.path.exists()
            self.path.mkdir(parents=True, exist_ok=True)
            f = open(self.path / LOCK, "a+", encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot use run directory {self.path}: {e.strerror}; choose another "
                              f"{argument('run_dir')}", run_dir=self.path) from None
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = _holder(f.read())
            f.close()
            raise ConfigError(f"run directory {self.path} is in use by {holder}; wait for that run to end (or stop "
                              f"it), or choose another {argument('run_dir')}", run_dir=self.path) from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}) + "\n")
        f.flush()
        self._lock_file = f

    def _unlock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()  # closing the descriptor releases the flock
            self._lock_file = None

    def holds_run(self) -> bool:
        return (self.path / "config.json").is_file()

    def _check(self) -> None:
        if self.resume:
            if not has_checkpoint(self.path / "checkpoints"):
                what = "no run" if not self.holds_run() else "no complete checkpoint"
                self._note(f"{self.path} has {what} to resume yet; starting the run from the beginning")
                self.resume, self._overwrite = False, True
            else:
                saved = checkpoint_config(self.path / "checkpoints")
                check_resumable(saved if saved is not None else _read_json(self.path / "config.json"), self.config,
                                self._note)
        elif self.holds_run() and not self._overwrite:
            raise ConfigError(f"{self.path} already holds a run ({_describe(self.path)}); continue it with "
                              f"{resume_advice(self.path)}, choose another {argument('run_dir')}, or pass "
                              f"{_OVERWRITE} to start it again", run_dir=self.path)

    def clear(self) -> None:
        """Removes the files of the run this one replaces (overwrite, or a resume with nothing to resume)."""
        if self.path is None or not (self._overwrite and self._primary):
            return
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        for name in RUN_DIRS:
            shutil.rmtree(self.path / name, ignore_errors=True)


def has_checkpoint(directory: Path) -> bool:
    """Whether `directory` holds a complete checkpoint (a step Orbax finished writing)."""
    if not directory.is_dir():
        return False
    from jaxtrain._src.checkpoint import Checkpointer

    ckpt = Checkpointer(directory, read_only=True)
    try:
        return bool(ckpt.steps())
    finally:
        ckpt.close()


def checkpoint_config(directory: Path) -> dict[str, Any] | None:
    """The run's settings as saved in its newest checkpoint whose metadata reads (None: no step
    holds them, e.g. checkpoints written before they were saved there)."""
    from jaxtrain._src.checkpoint import Checkpointer, CheckpointError

    ckpt = Checkpointer(directory, read_only=True)
    try:
        for step in reversed(ckpt.steps()):
            try:
                config = ckpt.read_meta(step).get("config")
            except CheckpointError:
                continue  # the restore notes the unreadable step
            if isinstance(config, dict):
                return config
        return None
    finally:
        ckpt.close()


def check_resumable(saved: dict[str, Any], new: dict[str, Any], note: Callable[[str], None] = note) -> None:
    """Refuses a resume whose settings `new` differ from the run's `saved` ones where that would
    change what is computed; `epochs` may change (with a note when the schedule stretches).

    Raises:
      ConfigError: naming every refused setting with its old and new value.
    """
    old, now = _flatten(saved), _flatten(new)
    changed = [k for k in sorted(old.keys() & now.keys()) if old[k] != now[k]]
    refused = [k for k in changed if not any(k == p or k.startswith(p + ".") for p in RESUMABLE)]
    if refused:
        detail = ", ".join(f"{k} {old[k]!r} -> {now[k]!r}" for k in refused)
        raise ConfigError(f"a resume cannot change {detail}: it would no longer continue the same run; resume with "
                          f"the run's settings (drop those options), or start a new run (another "
                          f"{argument('run_dir')}, or {_OVERWRITE})",
                          changed={k: (old[k], now[k]) for k in refused})
    if "epochs" in changed and now.get("optim.schedule", "constant") != "constant" and not now.get("optim.decay_steps"):
        note(f"epochs {old['epochs']} -> {now['epochs']}: the {now['optim.schedule']} learning-rate schedule now "
             "spans the new number of steps, so the remaining steps' learning rates change")


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in values.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e.msg} at line {e.lineno})") from None


def _holder(text: str) -> str:
    """Who holds a lock, from the lock file's JSON line."""
    try:
        info = json.loads(text)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        return f"process {info['pid']} on {info['host']} (since {since})"
    except (ValueError, KeyError, TypeError):
        return "another process"


def _describe(path: Path) -> str:
    """What a run directory holds, in a few words: its summary's status, or its checkpoints."""
    summary = _read_json(path / "summary.json")
    if summary.get("status"):
        return f"{summary['status']} at step {summary.get('steps', '?')}"
    steps = sorted(p.name for p in (path / "checkpoints").glob("[0-9]*") if p.name.isdigit())
    return f"checkpoints at steps {', '.join(steps)}" if steps else "not finished, no checkpoint"
