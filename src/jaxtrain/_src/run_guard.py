"""Who may use a run directory, and for what.

One process at a time: a run holds an exclusive lock on `RUN/.lock` (`fcntl.flock`) while it
lives; the kernel drops the lock when the process ends however it ends, so a killed run leaves no
stale lock in the way of its resume. A directory that holds a run (its config.json) refuses a new
run unless it is resumed or `overwrite` is asked for. A resume may change only the settings that
leave the trained result alone (`RESUMABLE`, plus `epochs`); the others are refused by name. The
settings a resume is checked against are those saved in the newest checkpoint (which travel with
the state it continues from), else config.json's: a deleted or edited config.json changes nothing.
A resume of a run with no complete checkpoint yet (killed in its first seconds) starts it again,
its earlier files moved aside to `RUN/previous-N/` (never deleted); a finished run with no
checkpoint to continue from (checkpoints off, `checkpoints/` unreadable) is refused. A run
directory whose files are symbolic links is refused before anything is written.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import stat
import time
from pathlib import Path
from typing import IO, Any, Callable

from jaxtrain._src.config import EARLY_STOPPING_REASON, flat_dict
from jaxtrain._src.errors import ConfigError, argument, resume_advice, setting
from jaxtrain._src.report.notes import note
from jaxtrain._src.report.run_dir import refuse_links
from jaxtrain._src.safe_files import read_json_object

LOCK = ".lock"
# What a run writes into its directory: all of it goes when a run overwrites it, nothing else does.
RUN_FILES = ("config.json", "metrics.jsonl", "summary.json", "model.json", "predict.json", "curves.png")
RUN_DIRS = ("checkpoints", "tensorboard")
NON_FINITE = "stopped: non-finite loss"  # summary.json's status of a run whose loss was not finite (training.FAILURES)
FINISHED = ("completed", "stopped early")  # summary.json's status of a run that a resume leaves as it is
# Settings a resume may change: where and how it runs, what it prints and keeps; not what it computes.
RESUMABLE = ("epochs", "quiet", "verbosity", "log_every", "eval_every", "eval_batch_size", "steps_per_call",
             "step_form", "tensorboard", "on_nan", "mesh", "dist", "run_dir", "checkpoint.enabled",
             "checkpoint.every_steps", "checkpoint.keep_last", "checkpoint.keep_best", "early_stopping",
             "data.prefetch", "data.accept_changed", "max_time", "checkpoint.every")


# `fit`'s resume="overwrite", which the command line spells as its overwrite flag
_OVERWRITE = argument("overwrite", True, python='resume="overwrite"')

class RunGuard:
    """Claims `run_dir` for one run: takes its lock and checks that the run may start there.

    Use as a context manager around the run; `resume` is then what the run really does (False
    when a resume found no checkpoint to continue from), and `clear()` removes an earlier run's
    files when the run starts from the beginning over one, or moves them aside to `previous-N/`
    when a resume found no checkpoint (after every check that could fail on the user's input has
    passed, so a refused run loses nothing).

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
        self._create, self._created = create, False
        self._lock_file: IO[str] | None = None
        self._aside = False  # clear() moves an unfinished run's files aside (a resume with nothing to resume)
        self._starting: str | None = None  # what clear() says of a run a resume starts again (none moved aside)
        self._reference: dict[str, Any] = {}  # the settings a resume is checked against (the checkpoint's)

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

    @property
    def _dir(self) -> Path:
        """`path`, for the methods that run only when there is a run directory."""
        assert self.path is not None
        return self.path

    def __exit__(self, *exc: Any) -> None:
        self._unlock()
        if self._created and [p.name for p in self._dir.iterdir()] == [LOCK]:
            shutil.rmtree(self._dir, ignore_errors=True)  # a run that failed before writing anything leaves nothing

    def _lock(self) -> None:
        if not self._dir.exists() and not self._create:
            return  # nobody can be using a directory that does not exist yet
        self._created = not self._dir.exists()
        self._lock_file = lock_directory(self._dir, "run directory", argument("run_dir"), "that run",
                                         run_dir=self.path)

    def _unlock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()  # closing the descriptor releases the flock
            self._lock_file = None

    def holds_run(self) -> bool:
        return (self._dir / "config.json").is_file()

    def _check(self) -> None:
        if self._primary:
            refuse_links(self._dir, RUN_FILES + RUN_DIRS)
        if self.resume:
            if not has_checkpoint(self._dir / "checkpoints"):
                self._start_again()
            else:
                saved = checkpoint_config(self._dir / "checkpoints")
                self._reference = saved if saved is not None else _read_json(self._dir / "config.json")
                check_resumable(self._reference, self.config, self._note)
        elif self.holds_run() and not self._overwrite:
            raise ConfigError(f"{self.path} already holds a run ({_describe(self._dir)}); continue it with "
                              f"{resume_advice(self.path)}, choose another {argument('run_dir')}, or pass "
                              f"{_OVERWRITE} to start it again", run_dir=self.path)

    def finished(self, step: int, more_epochs: bool, *, member: bool = False) -> dict[str, Any] | None:
        """The summary of the run a resume finds finished at the checkpoint `step`, else None:
        summary.json says it completed at that step and the new `epochs` asks for no more
        (`more_epochs` False), or early stopping stopped it there and is set as it was. Such a resume
        trains, compiles and rewrites nothing (one note says so). A run that another hook stopped (a
        time budget, a sweep's pruner: `RunView.stop`) is not finished: the resume continues it.

        A `member` of a population (`step` its newest checkpoint's) that stopped early for any
        reason, or on a non-finite loss, is finished too: the population went on without it, so
        it cannot rejoin; it stays as it ended."""
        try:
            summary = read_json_object(self._dir / "summary.json")
        except ConfigError:  # not the summary a run wrote: nothing says it finished
            return None
        if summary is None:
            return None
        if member and (summary.get("status") == "stopped early" or summary.get("status") == NON_FINITE):
            return summary
        if summary.get("steps") != step:
            return None
        if summary.get("status") == "completed" and not more_epochs:
            return summary  # the checkpoint's restore noted that there is nothing to train
        saved = flat_dict(self._reference)  # the checkpoint's settings: config.json may be gone
        new = flat_dict(self.config)
        same_stopping = all(saved.get(k) == v for k, v in new.items() if k.startswith("early_stopping."))
        by_early_stopping = str(summary.get("stop_reason", "")).startswith(EARLY_STOPPING_REASON)
        if summary.get("status") == "stopped early" and by_early_stopping and same_stopping:
            self._note(f"the run stopped early at step {step} ({summary['stop_reason']}); "
                       f"nothing to train (change {setting('early_stopping.patience')} to train further)")
            return summary
        return None

    def start_over(self) -> None:
        """A resume that cannot continue from its checkpoint (a population whose members share no
        step to continue from): the run starts from the beginning, its files moved aside to
        `previous-N/` by `clear()`."""
        self.resume = False
        self._aside = self._primary and self.path is not None and self.path.is_dir()

    def rejoin(self, line: str) -> None:
        """A resume with no checkpoint of a population's run that took its slot and was killed
        before its first save: it starts again as it joined, at the others' step, writing its files
        again over what it wrote then (config.json, an empty metrics.jsonl), as the uninterrupted run
        has them: nothing is moved aside; `clear()` says `line` instead."""
        self._aside, self._starting = False, line

    def _start_again(self) -> None:
        """A resume with no checkpoint to continue from: a finished run is refused; an unfinished
        one starts from the beginning with its files moved aside (a resume never deletes them)."""
        if _finished_status(self._dir):
            raise ConfigError(f"{self.path} holds a finished run ({_describe(self._dir)}) but no checkpoint to "
                              f"resume from (checkpoints were off, or checkpoints/ is unreadable); it stays as it is: "
                              f"start it again with {_OVERWRITE}, or choose another {argument('run_dir')}",
                              run_dir=self.path)
        self.resume = False
        present = self._dir.is_dir() and any((self._dir / n).exists() for n in RUN_FILES + RUN_DIRS)
        self._aside = self._primary and present
        if not self._aside:  # said by clear(), unless the run starts again as it joined its population (`rejoin`)
            what = "no run" if not self.holds_run() else "no complete checkpoint"
            self._starting = f"{self.path} has {what} to resume yet; starting the run from the beginning"

    def _move_aside(self) -> None:
        """Moves the files of an unfinished run with nothing to resume to `RUN/previous-N/`."""
        aside = next(p for p in (self._dir / f"previous-{n}" for n in range(1, 10_000))
                     if not os.path.lexists(p))  # a dangling link is in the way too
        aside.mkdir()
        for name in RUN_FILES + RUN_DIRS:
            if (self._dir / name).exists():
                os.replace(self._dir / name, aside / name)
        self._note(f"{self.path} has no complete checkpoint to resume yet; starting the run from the beginning "
                   f"(the earlier files are in {aside})")

    def clear(self) -> None:
        """Removes the files of the run this one replaces (overwrite), or moves them aside (a resume
        with nothing to resume: a resume never deletes run files)."""
        if self._aside:
            self._move_aside()
        if self._starting is not None:
            self._note(self._starting)
        if self.path is None or not (self._overwrite and self._primary):
            return
        for name in RUN_FILES:
            (self.path / name).unlink(missing_ok=True)
        for name in RUN_DIRS:
            shutil.rmtree(self.path / name, ignore_errors=True)


def lock_directory(path: Path, what: str, flag: str, holder: str, **facts: Any) -> IO[str]:
    """Claims directory `path` (created if missing) for this process: an exclusive lock on its
    `.lock` file, which says who holds it. Closing the returned file releases the lock; so does the
    end of the process, however it ends. A `.lock` that is a symbolic link is not followed.

    Args:
      what, flag: the directory in words ("run directory") and the setting that chooses it, for messages.
      holder: who the other process is, in words ("that run").
      facts: attributes of the error.

    Raises:
      ConfigError: the directory cannot be made or locked there, or a live process holds it.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        # O_NONBLOCK: a FIFO planted as .lock must not hang the open; it is refused below
        fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as e:
        why = (f"{path / LOCK} is a symbolic link" if e.errno == errno.ELOOP
               else "it is a file, not a folder" if path.is_file()
               else "a folder on its path is a file" if e.errno == errno.ENOTDIR else e.strerror)
        raise ConfigError(f"cannot use {what} {path}: {why}; choose another {flag}", **facts) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"cannot use {what} {path}: {path / LOCK} is not a file; remove it, or choose another "
                          f"{flag}", **facts)
    os.set_blocking(fd, True)
    f = os.fdopen(fd, "r+", encoding="utf-8")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        who = _holder(f.read())
        f.close()
        raise ConfigError(f"{what} {path} is in use by {who}; wait for {holder} to end (or stop it), or choose "
                          f"another {flag}", **facts) from None
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}) + "\n")
    f.flush()
    return f


def has_checkpoint(directory: Path) -> bool:
    """Whether `directory` holds a complete checkpoint (a step Orbax finished writing)."""
    return bool(checkpoint_steps(directory))


def checkpoint_steps(directory: Path) -> list[int]:
    """The steps of the complete checkpoints in `directory`, oldest first (read only: nothing is
    created or cleaned up there)."""
    if not directory.is_dir():
        return []
    from jaxtrain._src.checkpoint import Checkpointer

    ckpt = Checkpointer(directory, read_only=True)
    try:
        return ckpt.steps()
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
    old, now = flat_dict(saved), flat_dict(new)
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


def _read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path) or {}


def _finished_status(path: Path) -> str | None:
    """summary.json's status when it says the run finished (completed, stopped early), else None."""
    try:
        status = (read_json_object(path / "summary.json") or {}).get("status")
    except ConfigError:
        return None
    return status if isinstance(status, str) and status.startswith(FINISHED) else None


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
