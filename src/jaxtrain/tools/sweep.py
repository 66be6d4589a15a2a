"""`jaxtrain sweep`: a hyperparameter search over a recipe, on Optuna.

Each trial is a normal run directory under the sweep's folder (`OUT/trial-0003`), trained by the
same code as `jaxtrain train`, so `compare`, `eval`, `predict` and `export` work on it. The study
lives in Optuna's RDB storage (SQLite in the sweep folder by default, any SQLAlchemy URL with
`storage`): running the same command again continues the study until `trials` trials are
finished (complete or pruned), never more, and trial numbers, which name the run directories,
come from the storage, so no directory holds two trials.

Workers: `workers=W` starts W processes that share the study (as do processes on other machines
pointed at one `storage`, PostgreSQL for instance). Each trial beats a heartbeat into the storage;
a trial whose worker died (SIGKILL, a lost machine) goes stale after three missed beats, is marked
failed and is asked again with the same values as a new trial. A worker starts a trial only while
fewer than `trials` are finished or running, and waits while the rest run elsewhere, so the study
ends with `trials` finished ones whichever workers die on the way. The sampler draws each trial
from a seed of its own, derived from `seed` and the trial's number (which the storage hands out
once), so workers, machines and later runs of the study never draw alike from one history, and a
one-process sweep on a new study draws the same values for the same seed.

The sweep owns its workers: they end when it ends, however it ends (the kernel's parent-death
signal), and Ctrl-C or SIGTERM reach the sweep alone, which ends its workers, marks their running
trials failed and asks their values again when the same command runs again (exit code 128 +
signal); a trial that `fit` stopped on such a signal in a one-process sweep is asked again too.
The sweep's files and trial directories are never followed through symbolic links, and with its
study in its folder (the default) the folder is locked while it runs: a second sweep into it is
refused (sweeps sharing a study in `storage` share their folder by design).

Pruning: after each epoch the trial reports its objective (`val_loss` by default) to Optuna;
when the pruner (median by default) says so, the run stops at that epoch's end and the trial is
marked pruned. A trial that reaches its last epoch is complete: the pruner is not asked there. A
trial whose loss is not finite fails (its run directory says so) and the sweep goes on; a failed
trial counts toward the trials run this time, not toward the finished ones.

Search spaces are written `NAME=KIND:ARGS` over any config field: `optim.lr=loguniform:1e-4:1e-2`,
`optim.b1=uniform:0.8:0.99`, `batch_size=int:16:128`, `model.hidden=choice:64,128,256` (a field
holding a tuple, such as the MLP's widths, takes the chosen value in each of its places).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import math
import multiprocessing
import os
import re
import shlex
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from rich.console import Console
from rich.table import Table

from jaxtrain import ConfigError, JaxtrainError, NonFiniteLossError, TrainingStopped
from jaxtrain.engine import (
    MAX_SEED,
    argument,
    flat_dict,
    format_bytes,
    lock_directory,
    refuse_links,
    require,
    setting,
    to_dict,
)
from jaxtrain.tools.recipes.base import Recipe
from jaxtrain.tools.trials import (
    SweepStopped,
    _alone,
    _best,
    _Heartbeats,
    _owner,
    _Report,
    _retry,
    _StudyAtEpoch,
    apply_values,
)

__all__ = ["Space", "SweepStopped", "apply_values", "load_study", "parse_space", "print_report", "print_result",
           "sweep", "without_flags"]

KINDS = ("loguniform", "uniform", "int", "choice")
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "hyperband", "none")
PLOTS = ("history", "parallel", "slices")
# The sweep's own files in its folder (besides trial-NNNN/): never written through a symbolic link.
SWEEP_FILES = ("study.db", "study.db-journal", "study.db-wal", "study.db-shm", *(f"sweep-{n}.png" for n in PLOTS))
# Optuna reads every earlier trial at each ask (0.05 s at 1,000 trials, 0.16 s at 5,000 on SQLite, 2 cores):
# past this many, asking grows toward the time small trials train, and hours in all.
MAX_TRIALS = 10_000
# A population's trials are all asked before any trains, and each member is one more step in its program.
MAX_POPULATION = 1_024
# A worker process before its data: Python, JAX, Optuna and jaxtrain loaded (230 MiB measured on Linux).
WORKER_BYTES = 256 * 2**20
# From this size up a population's memory is checked before anything is asked (it costs a build of the
# workload, seconds; smaller populations are left to the run).
MEASURED_POPULATION = 64


@dataclasses.dataclass(frozen=True)
class Space:
    """One dimension of the search: a config field (dotted) and what it may take."""

    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] = ()

    def __str__(self) -> str:
        """As written on the command line: `optim.lr=loguniform:0.0001:0.01`."""
        if self.kind == "choice":
            return f"{self.name}=choice:{','.join(str(c) for c in self.choices)}"
        return f"{self.name}={self.kind}:{self.low:g}:{self.high:g}"

    def _range(self) -> tuple[float, float]:
        assert self.low is not None and self.high is not None  # every kind but choice has them
        return self.low, self.high

    def ends(self) -> tuple[Any, ...]:
        """The values at the ends of the range (every choice): a field must take them all."""
        if self.kind == "choice":
            return self.choices
        low, high = self._range()
        return (int(low), int(high)) if self.kind == "int" else (low, high)

    def distribution(self) -> Any:
        """The Optuna distribution `suggest` draws from."""
        import optuna.distributions as d

        if self.kind == "choice":
            return d.CategoricalDistribution(list(self.choices))
        low, high = self._range()
        if self.kind == "int":
            return d.IntDistribution(int(low), int(high))
        return d.FloatDistribution(low, high, log=self.kind == "loguniform")

    def suggest(self, trial: Any) -> Any:
        if self.kind == "loguniform":
            return trial.suggest_float(self.name, self.low, self.high, log=True)
        if self.kind == "uniform":
            return trial.suggest_float(self.name, self.low, self.high)
        if self.kind == "int":
            low, high = self._range()
            return trial.suggest_int(self.name, int(low), int(high))
        return trial.suggest_categorical(self.name, list(self.choices))


def _number(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--space {spec}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"--space {spec}: {text!r} is not a finite number; a range needs finite ends")
    return value


def _choice(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_space(spec: str) -> Space:
    """`optim.lr=loguniform:1e-4:1e-2` as a `Space`.

    Raises:
      ConfigError: not NAME=KIND:ARGS, an unknown kind, a range that is empty or not positive for
        loguniform, no choices.
    """
    name, _, rest = spec.partition("=")
    kind, _, args = rest.partition(":")
    if not name or not rest:
        raise ConfigError(f"--space {spec}: write NAME=KIND:ARGS, e.g. optim.lr=loguniform:1e-4:1e-2")
    if kind not in KINDS:
        raise ConfigError(f"--space {spec}: unknown kind {kind!r}; choose {', '.join(KINDS)}")
    if kind == "choice":
        choices = tuple(_choice(c) for c in args.split(",") if c)
        if not choices:
            raise ConfigError(f"--space {spec}: choice needs values, e.g. choice:64,128,256")
        return Space(name, kind, choices=choices)
    bounds = args.split(":")
    if len(bounds) != 2:
        raise ConfigError(f"--space {spec}: {kind} needs LOW:HIGH, e.g. {kind}:1e-4:1e-2")
    low, high = (_number(b, spec) for b in bounds)
    if not low < high or (kind == "loguniform" and low <= 0):
        raise ConfigError(f"--space {spec}: need LOW < HIGH" + (" and LOW > 0" if kind == "loguniform" else ""))
    if kind == "int" and (low != int(low) or high != int(high)):
        raise ConfigError(f"--space {spec}: int needs whole numbers")
    return Space(name, kind, low, high)


def _sampler(name: str, seed: int) -> Any:
    import optuna

    if name not in SAMPLERS:
        raise ConfigError(f"unknown sampler {name!r}; choose {', '.join(SAMPLERS)}")
    return optuna.samplers.TPESampler(seed=seed) if name == "tpe" else optuna.samplers.RandomSampler(seed=seed)


def trial_seed(seed: int, number: int) -> int:
    """The sampler's seed for trial `number` of a sweep seeded `seed`: a stream of its own for every
    trial (numbers are handed out once by the storage), whichever worker, machine or run asks it."""
    import numpy as np

    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


def _pruner(name: str) -> Any:
    import optuna

    if name not in PRUNERS:
        raise ConfigError(f"unknown pruner {name!r}; choose {', '.join(PRUNERS)}")
    return {"median": optuna.pruners.MedianPruner(n_startup_trials=2), "hyperband": optuna.pruners.HyperbandPruner(),
            "none": optuna.pruners.NopPruner()}[name]


def sweep(recipe: Recipe, config: Any, spaces: Sequence[Space], trials: int, out: str | Path, *,
          storage: str | None = None, study: str | None = None, objective: str = "val_loss",
          direction: str = "minimize", sampler: str = "tpe", pruner: Any = "median", seed: int = 0,
          flags: Sequence[str] = (), workers: int = 1, heartbeat: int = 10, population: int = 1,
          scheduler: str = "none", pbt_every: int = 0, console: Console | None = None) -> Any:
    """Runs trials of `recipe` until the study holds `trials` finished ones; returns the Optuna study.

    Args:
      recipe, config: the recipe and its config for the fixed settings (the command's train flags).
      spaces: the search space.
      trials: finished trials (complete or pruned) the study should hold (at most `MAX_TRIALS`).
      out: the sweep folder: `study.db` (the default storage) and a run directory per trial.
      storage: an SQLAlchemy URL (`sqlite:///...`, `postgresql://...`); default SQLite in `out`.
      study: the study's name (default the recipe's).
      objective, direction: the epoch record field to optimise, "minimize" or "maximize".
      sampler: "tpe" or "random"; pruner: "median", "hyperband", "none", or an Optuna pruner.
      seed: the sampler's seed, 0 to 2**32 - 1 (each trial draws from a seed derived from it and its number).
      flags: the command's own train flags, written into each trial's command line.
      workers: processes that run trials side by side (1: this one); at most the cores this process
        may use, and as many processes of `WORKER_BYTES` as the available memory holds.
      heartbeat: seconds between a running trial's heartbeats; three missed ones fail and retry it.
      population: trials asked at once and trained side by side as one compiled program
        (`jaxtrain.fit_population`); those whose values change more than the optimizer's settings
        (a model's width, the batch size) are grouped with the trials they share the rest with. At
        most `MAX_POPULATION`; from `MEASURED_POPULATION` up, the members' states must fit the device.
      scheduler: "none" (a population is fixed for its life), "halving" (successive halving at rungs
        of 1, 2, 4, ... epochs, and the pruner: a pruned trial's slot takes the sampler's next trial,
        up to `trials`) or "pbt" (Population Based Training: every `pbt_every` epochs the worst quarter
        copy the best quarter's weights with perturbed numbers, each copy an extra trial recording its
        parent); the slots change without compiling again, and a population killed on this host
        continues when the command runs again (`tools/schedulers.py`). The space may then search the
        optimizer's numbers only.
      pbt_every: epochs between PBT's steps (0: a quarter of the epochs, at least 1).

    Raises:
      ConfigError: before anything runs: Optuna not installed (the "sweep" extra), a bad space (a
        field given twice, a section, an end of a range the config refuses, a fractional kind over a
        whole-number field, a batch the training set cannot fill at the range's end), trials,
        workers, heartbeat or population < 1 or more than the machine holds, a seed out of range,
        an unknown sampler, pruner or direction, a sweep folder in use or holding symbolic links,
        a storage that cannot be opened, a study of another direction whose fields were drawn from
        other kinds of distribution, or whose trials trained with other settings (besides those in
        `FREE`: where a trial runs, what it prints and keeps).
      SweepStopped: SIGTERM or Ctrl-C stopped it (workers), or stopped `fit` in a trial.
      JaxtrainError: workers failed before the study held `trials` finished trials.
    """
    require("optuna", "jaxtrain sweep")  # first: a missing extra is one line, and nothing is written
    for name, value in (("trials", trials), ("workers", workers), ("heartbeat", heartbeat), ("population", population)):
        if value < 1:
            raise ConfigError(f"{argument(name, value)} must be >= 1")
    if trials > MAX_TRIALS:
        raise ConfigError(f"{argument('trials', trials)}: past {MAX_TRIALS:,} trials a study spends more time asking "
                          f"Optuna than training small trials (each ask reads every earlier trial): split the search "
                          f"into studies of at most {MAX_TRIALS:,} trials")
    if not (isinstance(seed, int) and 0 <= seed <= MAX_SEED):
        raise ConfigError(f"{argument('seed', seed)}: the sampler's seed must be an integer from 0 to {MAX_SEED}")
    if direction not in ("minimize", "maximize"):
        raise ConfigError(f"direction={direction!r}: choose minimize or maximize")
    _check_spaces(config, spaces)
    _check_batches(recipe, config, spaces)
    _check_workers(workers)
    _check_population(recipe, config, min(population, trials))
    from jaxtrain.tools.schedulers import check_scheduler

    check_scheduler(scheduler, population, pruner, pbt_every, config, spaces)
    out = Path(out)
    where, flag = _where(out, storage)
    job = _Job(recipe, config, tuple(spaces), trials, str(out), storage or f"sqlite:///{out.resolve() / 'study.db'}",
               study or recipe.name, objective, direction, sampler, pruner, seed, tuple(flags), heartbeat, population,
               where, flag, scheduler, pbt_every)
    console = console or Console(highlight=False)
    with _claim(out, lock=storage is None), _storage_errors(where, flag):
        study_obj = job.open()
        _check_study(study_obj, job)
        study_obj.set_user_attr("objective", objective)  # for `sweep report`
        if "settings" not in study_obj.user_attrs:
            study_obj.set_user_attr("settings", _settings(job))
        if workers == 1:
            job.work(study_obj, console, "")
        else:
            _run_workers(job, workers, console)
    return study_obj


def _check_spaces(config: Any, spaces: Sequence[Space]) -> None:
    """Every field is given once, exists, and takes the values at both ends of its range (every
    choice), before a trial runs: a draw the config refuses would stop the sweep half way."""
    if not spaces:
        raise ConfigError("a sweep needs at least one --space NAME=KIND:ARGS")
    seen: dict[str, Space] = {}
    for space in spaces:
        if space.name in seen:
            raise ConfigError(f"--space {space.name} is given twice ({seen[space.name]} and {space}); give each "
                              "field once")
        seen[space.name] = space
        for value in space.ends():
            try:
                apply_values(config, {space.name: value})
            except ConfigError as e:
                if e.template.startswith("--space"):
                    raise
                if space.kind in ("uniform", "loguniform") and _takes_whole(config, space.name, value):
                    raise ConfigError(f"--space {space}: {space.name} takes whole numbers, and {space.kind} draws "
                                      f"fractions; write {Space(space.name, 'int', space.low, space.high)}") from None
                raise ConfigError(f"--space {space}: the config refuses {value!r} ({e.template}); keep the range "
                                  "within the values it takes") from None


def _takes_whole(config: Any, name: str, value: float) -> bool:
    """Whether the field refuses the float `value` but takes it as an int (`epochs`, a model's width)."""
    if not float(value).is_integer():
        return False
    try:
        apply_values(config, {name: int(value)})
    except ConfigError:
        return False
    return True


# Fields whose drawn values `fit` checks against the training set's size (`epoch_steps`), and the
# section whose fields decide that size: a space over any of them is checked against the data.
STEP_FIELDS = ("batch_size", "grad_accum", "steps_per_epoch")
DATA_SECTION = "data."


def _check_batches(recipe: Recipe, config: Any, spaces: Sequence[Space]) -> None:
    """Refuses, before any trial, a space that can draw a step of more rows than the training set
    holds (or `steps_per_epoch` batches more than it): `fit` would refuse the trial that draws it,
    half way through the sweep. The largest batch the space draws (every step field at its largest
    value) is checked against the training set of the workload built at the sweep's settings and,
    where the space draws the data's own settings, at each end of each of those (their data made
    or opened once each, as a trial would: a second or so for the recipes' synthetic sets). A
    build refused at such an end (too large for the memory) is refused here too."""
    from jaxtrain import data as data_lib
    from jaxtrain.engine import epoch_steps

    steps = [s for s in spaces if s.name in STEP_FIELDS]
    data = [s for s in spaces if s.name.startswith(DATA_SECTION)]
    if not steps and not data:
        return
    largest = {s.name: max(s.ends()) for s in steps}
    ends: list[tuple[Space | None, Any]] = [(None, None)] if not data else [(s, v) for s in data for v in s.ends()]
    for space, value in ends:
        at = config if space is None else apply_values(config, {space.name: value})
        w = _build_at(recipe, at, space, value)
        try:
            train = w.train
            n = len(train) if data_lib.is_source(train) else (
                None if hasattr(train, "abstract_batch") else data_lib.num_samples(train, "train_data"))
        finally:
            w.close()
        if n is None:  # data the run makes as it trains (self-play's replay buffer): no size to check
            return
        try:
            epoch_steps(apply_values(at, largest), n)
        except ConfigError as e:
            drawn = " and ".join(f"--space {s}" for s in [*steps, *([space] if space is not None else [])])
            where = "its largest batch" if space is None else f"{space.name}={value!r}"
            raise ConfigError(f"{drawn}: at {where}, {e.template}; narrow the range") from None


def _build_at(recipe: Recipe, config: Any, space: Space | None, value: Any) -> Any:
    """The workload of `config`, whose build refusing it (at an end of `space`) is the space's error."""
    try:
        return recipe.build(config)
    except JaxtrainError as e:
        if space is None:
            raise
        raise ConfigError(f"--space {space}: at {space.name}={value!r}, {e.template}") from None


def _cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _check_workers(workers: int) -> None:
    """Refuses more workers than the cores (each is a whole training process, whose XLA already
    spreads over every core: more only wait on each other) or than the available memory holds."""
    from jaxtrain.tools.tune import _available_ram

    cores = _cores()
    if workers > cores:
        raise ConfigError(f"{argument('workers', workers)}: this machine gives the sweep {cores} cores, and each "
                          f"worker is a whole training process that spreads over every core, so more would only wait "
                          f"on each other: pass {argument('workers', cores)} or fewer")
    if workers > 1:
        size, available = WORKER_BYTES, _available_ram()
        if workers * size > available:
            raise ConfigError(f"{argument('workers', workers)}: each worker is a process of at least "
                              f"{format_bytes(size)} (Python, JAX and Optuna, before its data), "
                              f"{format_bytes(workers * size)} in all, more than the {format_bytes(available)} of "
                              f"memory available: pass {argument('workers', max(1, available // size))} or fewer")


def _check_population(recipe: Recipe, config: Any, population: int) -> None:
    """Refuses a population too large to ask (`MAX_POPULATION`) or, from `MEASURED_POPULATION` up,
    whose members' train states (parameters and optimizer state, one each) exceed the device's memory,
    or a deadline (`max_time`, which a population does not keep: its trials train alone)."""
    if population > 1 and config.max_time_s:
        raise ConfigError(f"{argument('population', population)}: a population does not keep a deadline "
                          f"(max_time={config.max_time!r}); drop {argument('population')} to give every trial "
                          "the same time alone")
    if population > MAX_POPULATION:
        raise ConfigError(f"{argument('population', population)}: a population's trials are all asked before any "
                          f"trains, and each member is one more step in its compiled program: pass "
                          f"{argument('population', MAX_POPULATION)} or fewer")
    if population < MEASURED_POPULATION:
        return
    import jax

    from jaxtrain.engine import make_layout
    from jaxtrain.tools.tune import _device_memory, _StepMemory

    w = recipe.build(config)
    try:
        state = _StepMemory(w, config, make_layout(config.mesh)).state_bytes  # abstract: nothing is placed
    finally:
        w.close()
    total, where = _device_memory(jax.local_devices()[0])
    if population * state > total:
        raise ConfigError(f"{argument('population', population)}: each member keeps its own parameters and optimizer "
                          f"state ({format_bytes(state)}) on the device, {format_bytes(population * state)} in all, "
                          f"more than {where}: pass {argument('population', max(1, total // state))} or fewer")


@contextlib.contextmanager
def _claim(out: Path, lock: bool) -> Iterator[None]:
    """Refuses a sweep folder whose files or trial directories are symbolic links (the sweep would
    write wherever they point) and, with `lock`, locks it for this sweep as a run directory is
    locked. A study in the folder (SQLite, the default) is this sweep's alone: more processes are
    its workers. Sweeps that share a study in a `storage` share their folder by design (machines
    writing their trials into one shared folder), so theirs is not locked."""
    made = not out.exists()
    if lock:
        held = lock_directory(out, "sweep folder", argument("out"), "that sweep", out=out)
    else:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot use sweep folder {out}: {e.strerror}; choose another {argument('out')}",
                              out=out) from None
    failed = True
    try:
        _refuse_links(out, [p.name for p in out.iterdir() if p.name.startswith("trial-")] + list(SWEEP_FILES))
        yield
        failed = False
    finally:
        if lock:
            held.close()
        if failed and made:  # a sweep that stopped before writing anything leaves no folder holding a lone .lock
            with contextlib.suppress(OSError):
                if {p.name for p in out.iterdir()} <= {".lock"}:
                    (out / ".lock").unlink(missing_ok=True)
                    out.rmdir()


def _refuse_links(out: Path, names: Sequence[str]) -> None:
    refuse_links(out, names, "a sweep", argument("out"))


def _where(out: Path, storage: str | None) -> tuple[str, str]:
    """The study's storage in words for messages, and the flag that chooses it."""
    if storage:
        return argument("storage", _masked(storage)), argument("storage")
    return f"{out / 'study.db'} (the study in {argument('out')})", argument("out")


def _masked(url: str) -> str:
    """`url` with its password hidden (it goes into messages): `postgresql://user:***@host/db`."""
    return re.sub(r"^([^:/]+://[^:/@]*:)[^@]*@", r"\1***@", url)


def _sqlalchemy_error(e: BaseException) -> str | None:
    """"url" for SQLAlchemy's error about a URL it cannot use, "database" for its others, else None.
    Optuna's storage raises them; they are known by name, SQLAlchemy being Optuna's dependency, not ours."""
    names = {c.__name__ for c in type(e).__mro__ if c.__module__.startswith("sqlalchemy.")}
    return "url" if "ArgumentError" in names else ("database" if "SQLAlchemyError" in names else None)


@contextlib.contextmanager
def _one_creator(url: str) -> Iterator[None]:
    """While a new SQLite study database is opened, no other worker opens it: SQLite has no CREATE TABLE
    that waits for another, so two workers creating one database at the same instant met "table ...
    already exists" or a second schema version row. An exclusive `flock` on the database file (SQLite's own
    locks are `fcntl` ones, which `flock` does not touch) orders them; the second finds the tables made.
    Other storages, or a file that cannot be opened (SQLAlchemy says why), go unlocked."""
    path = url[len("sqlite:///"):].partition("?")[0] if url.startswith("sqlite:///") else ""  # no ?options
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644) if path and path != ":memory:" else None
    except OSError:
        fd = None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _created_once(open_storage: Callable[[], Any], attempts: int = 5) -> Any:
    """`open_storage()`, again when another worker was creating the same new database's tables at the same
    instant (a server's "duplicate key" / "already exists"; workers on several machines share no lock): the
    next attempt finds the tables made. Any other error, or the same one `attempts` times, is raised."""
    for attempt in range(attempts):
        try:
            return open_storage()
        except Exception as e:
            reason = _first_line(getattr(e, "orig", None) or e).lower()
            raced = _sqlalchemy_error(e) == "database" and ("duplicate key" in reason or "already exists" in reason)
            if not raced or attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _storage_errors(where: str, flag: str, opening: bool = False) -> Iterator[None]:
    """The study's storage failing as one line naming it (`where`, chosen by `flag`): a URL
    SQLAlchemy cannot open, a server that does not answer, a missing folder, a damaged or locked
    database, a schema of another Optuna; while `opening` it, a database driver not installed."""
    try:
        yield
    except Exception as e:
        error = _storage_error(e, where, flag, opening)
        if error is None:
            raise
        raise error from None


def _storage_error(e: Exception, where: str, flag: str, opening: bool) -> ConfigError | None:
    kind = _sqlalchemy_error(e)
    if kind == "url":
        return ConfigError(f"{where} is not a database URL SQLAlchemy can open ({_first_line(e)}); give "
                           "sqlite:///PATH or postgresql://USER@HOST/DB")
    if kind == "database":
        reason = _first_line(getattr(e, "orig", None) or e)
        hint = next((h for key, h in _STORAGE_HINTS if key in reason.lower()), "")
        return ConfigError(f"the study's storage {where} failed: {reason}{hint.format(flag=flag)}")
    if isinstance(e, ImportError) and opening:  # the URL's driver (psycopg for postgresql://) is not installed
        return ConfigError(f"{where} needs the database driver {e.name!r}, which is not installed: install it "
                           "(pip install psycopg[binary] for PostgreSQL)")
    if isinstance(e, RuntimeError) and "table schema" in str(e):  # Optuna: tables of another Optuna version
        return ConfigError(f"{where}: {_first_line(e)}")
    return None


_STORAGE_HINTS = (  # what to do, by what the driver said
    ("unable to open database file", "; its folder must exist and be writable, or choose another {flag}"),
    ("not a database", "; it is not a study (damaged, or another file): move it away, or choose another {flag}"),
    ("malformed", "; the file is damaged: move it away, or choose another {flag}"),
    ("database is locked", "; another process holds it locked: end that process, or choose another {flag}"),
    ("connect", "; is the database server running and reachable there?"),
)


def _first_line(e: Any) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _check_study(study: Any, job: "_Job") -> None:
    """Refuses a study this sweep cannot continue: another direction (Optuna would keep the study's
    silently), a field its trials drew from another kind of distribution (the sampler would fail),
    or settings other than those its trials trained with (`_check_settings`)."""
    import optuna

    if study.direction.name.lower() != job.direction:
        raise ConfigError(f"study {study.study_name} in {job.where} is set to {study.direction.name.lower()}, not "
                          f"{job.direction}: give its {argument('direction')}, or start another study "
                          f"({argument('study', placeholder='NAME')}, or another {argument('out')})")
    ours = {s.name: s for s in job.spaces}
    for trial in study.get_trials(deepcopy=False):
        for name, drawn in trial.distributions.items():
            if name in ours:
                try:
                    optuna.distributions.check_distribution_compatibility(drawn, ours[name].distribution())
                except ValueError:
                    raise ConfigError(f"--space {ours[name]}: study {study.study_name} in {job.where} drew {name} "
                                      f"as {_spec(name, drawn)}; keep that kind, or start another study "
                                      f"({argument('study', placeholder='NAME')}, or another {argument('out')})"
                                      ) from None
    _check_settings(study, job)


# Settings a study's trials may differ in: where and how they run, what they print and keep. The
# others are the study's own: with another value, a trial's objective would not compare with theirs.
FREE = ("run_dir", "quiet", "verbosity", "log_every", "steps_per_call", "step_form", "eval_batch_size", "tensorboard",
        "track", "mesh", "dist", "checkpoint.enabled", "checkpoint.every_steps", "checkpoint.keep_last",
        "checkpoint.keep_best", "data.prefetch")


def _settings(job: "_Job") -> dict[str, Any]:
    """What the sweep trains every trial with besides the values it draws (JSON, as the study keeps it)."""
    import json

    searched = {space.name for space in job.spaces}
    values = {k: v for k, v in flat_dict(to_dict(job.config)).items()
              if k not in searched and not any(k == p or k.startswith(p + ".") for p in FREE)}
    return json.loads(json.dumps(values, default=str))


def _check_settings(study: Any, job: "_Job") -> None:
    """Refuses to continue a study whose trials trained with other settings (a field searched in
    either sweep, or that only one of them knows, is not compared)."""
    kept, ours = study.user_attrs.get("settings"), _settings(job)
    if not isinstance(kept, dict):
        return  # a study of an earlier version, or made by hand: nothing to compare with
    changed = [k for k in sorted(kept.keys() & ours.keys()) if kept[k] != ours[k]]
    if changed:
        def listed(values: dict[str, Any]) -> str:
            return ", ".join(setting(k, values[k]) for k in changed[:3]) + (", ..." if len(changed) > 3 else "")

        another = f"({argument('study', placeholder='NAME')}, or another {argument('out')})"
        raise ConfigError(f"study {study.study_name} in {job.where} trained its trials with {listed(kept)}, not "
                          f"{listed(ours)}: their {job.objective} would not compare; give the study's settings, "
                          f"or start another study {another}")


def _spec(name: str, d: Any) -> str:
    """An Optuna distribution as a --space: `optim.lr=loguniform:0.0001:0.01`."""
    if hasattr(d, "choices"):
        return str(Space(name, "choice", choices=tuple(d.choices)))
    kind = "int" if isinstance(d.low, int) else ("loguniform" if d.log else "uniform")
    return str(Space(name, kind, d.low, d.high))


FINISHED = ("COMPLETE", "PRUNED")


class _Surplus(Exception):
    """A trial asked while the study already had its trials finished or running elsewhere."""


@dataclasses.dataclass(frozen=True)
class _Job:
    """What a worker needs to run the sweep's trials (picklable: workers are started afresh)."""

    recipe: Recipe
    config: Any
    spaces: tuple[Space, ...]
    trials: int
    out: str
    url: str
    name: str
    objective: str
    direction: str
    sampler: str
    pruner: Any
    seed: int
    flags: tuple[str, ...]
    heartbeat: int
    population: int = 1
    where: str = "the study's storage"  # the storage in words, and the flag that chooses it, for messages
    flag: str = "--storage"
    scheduler: str = "none"  # how a population adapts (`tools/schedulers.py`)
    pbt_every: int = 0

    def open(self) -> Any:
        """The study, created if new, on a storage that beats heartbeats and retries stale trials.

        Raises:
          ConfigError: the storage cannot be opened (`_storage_errors`).
        """
        import optuna

        # Optuna logs each failed trial with its traceback; the sweep says why in one line itself
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        if self.url.startswith("sqlite"):
            engine = {"connect_args": {"timeout": 60}}  # workers wait for each other's writes
        elif self.url.startswith("postgresql"):
            engine = {"connect_args": {"connect_timeout": 10}}  # a host that drops packets: not minutes
        else:
            engine = None
        with _storage_errors(self.where, self.flag, opening=True), warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats are "experimental"
            with _one_creator(self.url):
                storage = _created_once(lambda: optuna.storages.RDBStorage(
                    self.url, engine_kwargs=engine, heartbeat_interval=self.heartbeat,
                    grace_period=3 * self.heartbeat,
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=3)))
            if self.url.startswith("sqlite"):
                _immediate_transactions(storage.engine)
            # each trial reseeds the sampler (`prepare`): this seed draws nothing
            direction = optuna.study.StudyDirection[self.direction.upper()]  # "minimize" -> MINIMIZE
            return optuna.create_study(storage=storage, study_name=self.name, direction=direction,
                                       load_if_exists=True, sampler=_sampler(self.sampler, self.seed),
                                       pruner=_pruner(self.pruner) if isinstance(self.pruner, str) else self.pruner)

    @property
    def quiet(self) -> bool:
        """Whether the command asked for its result alone (--quiet, --verbosity result or silent)."""
        return getattr(self.config, "quiet", False) or getattr(self.config, "verbosity", "") in ("result", "silent")

    def say(self, console: Console, text: str) -> None:
        """A line of the sweep's progress (a trial's result, waiting for others); none under --quiet.
        A trial's failure is printed either way."""
        if not self.quiet:
            console.print(text)

    def work(self, study: Any, console: Console, label: str) -> None:
        """Runs trials until the study holds `trials` finished ones, or this worker ran that many."""
        import optuna

        budget, waiting = self.trials - self._count(study, FINISHED), False
        if self.population > 1 and self.scheduler != "none":  # a population killed on this host continues first
            from jaxtrain.tools.schedulers import resume_interrupted

            budget -= resume_interrupted(self, study, console, label)
        while budget > 0:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(study)  # a dead worker's trial: failed, asked again
            finished = self._count(study, FINISHED)
            if finished >= self.trials:
                return
            if finished + self._count(study, ("RUNNING",)) >= self.trials:  # the rest run elsewhere
                if not waiting:
                    self.say(console, f"{label}the other trials run elsewhere; waiting for them (a trial whose "
                             f"worker died is asked again {3 * self.heartbeat} s after its last heartbeat)")
                waiting = True
                time.sleep(min(self.heartbeat, 2))
                continue
            waiting = False
            size = min(self.population, budget, self.trials - finished)
            if size > 1 and self.scheduler != "none":  # one trial left: nothing to adapt, it trains alone
                from jaxtrain.tools.schedulers import run_adaptive

                budget -= run_adaptive(self, study, size, min(budget, self.trials - finished), console, label)
                continue
            if self.population > 1:
                budget -= self.run_population(study, min(self.population, budget, self.trials - finished),
                                              console, label)
                continue
            study.optimize(lambda trial: self.run(trial, console, label), n_trials=1,
                           catch=(NonFiniteLossError, _Surplus))
            budget -= 1

    @staticmethod
    def _count(study: Any, names: Sequence[str]) -> int:
        import optuna

        states = tuple(optuna.trial.TrialState[n] for n in names)
        return sum("pbt_parent" not in t.user_attrs for t in study.get_trials(deepcopy=False, states=states))

    def run(self, trial: Any, console: Console, label: str) -> float:
        """One trial: a run directory trained with the trial's values; its best objective."""
        import optuna

        from jaxtrain.tools import runs

        prepared = self.prepare(trial, label)
        if prepared is None:  # another worker took the last place between this worker's count and its ask
            raise _Surplus()
        values, trial_config, run_dir, name = prepared
        report = _Report(trial, self.objective)
        t0 = time.perf_counter()
        try:
            result = runs.train(self.recipe, trial_config, run_dir, hooks=[report], console=Console(quiet=True),
                                plots=False)
        except NonFiniteLossError as e:  # a diverging trial fails; the sweep goes on
            console.print(f"{name}: failed ({e})")
            raise
        except TrainingStopped as e:  # SIGTERM or Ctrl-C in fit: Optuna marks the trial failed; asked again
            _retry(trial.study, trial.study._storage.get_trial(trial._trial_id), "the sweep was stopped", fail=False)
            raise SweepStopped(e.exit_code - 128, f"{name} was stopped and is asked again") from None
        value = _best(result.history, self.objective, self.direction)
        self.say(console, f"{name}: {self.objective} {value:.6g}{' (pruned)' if report.pruned else ''} in "
                 f"{time.perf_counter() - t0:.1f} s; " + ", ".join(f"{k}={_short(v)}" for k, v in values.items()))
        if report.pruned:
            raise optuna.TrialPruned()
        return value

    def prepare(self, trial: Any, label: str, others: list[Any] | None = None, extra: bool = False
                ) -> tuple[dict[str, Any], Any, Path, str] | None:
        """A trial's values, config, run directory and printed name (its command saved with it);
        None for a trial asked past the end (marked surplus). `others`: the study's trials read after
        this one was asked (None: read here; a population's trials, asked together, share one read).
        `extra`: a trial beyond the study's count by design (a PBT copy), never surplus."""
        import optuna

        trial.set_user_attr("worker", _owner())  # first: the sweep that ends this worker fails its trials
        others = trial.study.get_trials(deepcopy=False) if others is None else others
        taken = {optuna.trial.TrialState[n] for n in (*FINISHED, "RUNNING")}
        counted = sum(t.state in taken and t.number < trial.number and "pbt_parent" not in t.user_attrs for t in others)
        if not extra and counted >= self.trials:  # PBT's copies are beyond the count: not counted
            trial.set_user_attr("surplus", True)
            return None
        # A stream of its own for each trial: workers asking from one history draw apart (a sampler seeded
        # once per worker drew the same values in two workers whose seeds met).
        seed = trial_seed(self.seed, trial.number)
        trial.study.sampler = _sampler(self.sampler, seed)
        trial.set_user_attr("sampler_seed", seed)
        values = {s.name: s.suggest(trial) for s in self.spaces}
        run_dir = Path(self.out) / f"trial-{trial.number:04d}"
        _refuse_links(Path(self.out), [run_dir.name])  # planted while the sweep runs
        trial_config = dataclasses.replace(apply_values(self.config, values), quiet=True, run_dir="",
                                           dist=_alone(self.config.dist))
        # the command that trains the trial again: in a run directory of its own (the default, under
        # runs/), since the trial's own already holds the trial and would refuse a second run
        command = shlex.join(["jaxtrain", "train", self.recipe.name, *without_flags(self.flags, [*values, "run_dir"]),
                              *(x for k in values for x in _flag_args(k, _value_at(trial_config, k)))])
        trial.set_user_attr("run_dir", str(run_dir))
        trial.set_user_attr("command", command)
        attrs = next(t for t in others if t.number == trial.number).system_attrs
        retry, why = attrs.get("failed_trial"), attrs.get("retry_reason", "its worker died")
        name = f"{label}trial {trial.number}" + ("" if retry is None else f" (trial {retry} again: {why})")
        return values, trial_config, run_dir, name

    def run_population(self, study: Any, n: int, console: Console, label: str) -> int:
        """Asks `n` trials at once and trains them as populations, one per group of trials that share
        everything but the optimizer's settings; tells each its result. Returns the trials asked."""
        import optuna

        from jaxtrain.tools import runs

        with warnings.catch_warnings():  # the trials' heartbeats are beaten below, as optimize beats its own
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
            trials = [study.ask() for _ in range(n)]
        with _Heartbeats(study, trials, self.heartbeat):
            groups: dict[str, list[tuple[Any, ...]]] = {}
            # One read of the study for the n trials: a trial found surplus still reads as running for
            # the ones after it, which are surplus too, so the decisions are those of a read per trial.
            others = study.get_trials(deepcopy=False)
            for trial in trials:
                prepared = self.prepare(trial, label, others)
                if prepared is None:
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    continue
                groups.setdefault(runs.population_key(prepared[1]), []).append((trial, *prepared))
            pending = list(groups.values())
            while pending:
                group = pending.pop(0)
                shared = _StudyAtEpoch(study)
                reports = [_Report(trial, self.objective, shared) for trial, *_ in group]
                t0 = time.perf_counter()
                try:
                    results = runs.train_population(self.recipe, [g[2] for g in group], [g[3] for g in group],
                                                    hooks=[[r] for r in reports])
                except TrainingStopped as e:  # SIGTERM or Ctrl-C: this group's trials and the rest, asked again
                    for trial, *_ in [*group, *(g for rest in pending for g in rest)]:
                        _retry(study, study._storage.get_trial(trial._trial_id), "the sweep was stopped", fail=False)
                        study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    raise SweepStopped(e.exit_code - 128, f"{label}{len(trials)} trials were stopped and are asked "
                                       "again") from None
                except JaxtrainError as e:
                    for trial, *_, name in group:
                        console.print(f"{name}: failed ({e})")
                        study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    continue
                seconds = time.perf_counter() - t0
                for (trial, values, _, _, name), report, result in zip(group, reports, results):
                    status = result.summary["status"]
                    shown = ", ".join(f"{k}={_short(v)}" for k, v in values.items())
                    if status not in ("completed", "stopped early"):
                        console.print(f"{name}: {status}; {shown}")
                        study.tell(trial, state=optuna.trial.TrialState.FAIL)
                        continue
                    value = _best(result.history, self.objective, self.direction)
                    self.say(console, f"{name}: {self.objective} {value:.6g}{' (pruned)' if report.pruned else ''} "
                             f"in {seconds:.1f} s, one of a population of {len(group)}; {shown}")
                    if report.pruned:
                        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    else:
                        study.tell(trial, value)
        return n


def _worker(job: _Job, index: int) -> None:
    """A worker process: it ends with the sweep, labels its lines, says a user error in one line
    with its exit code."""
    _die_with_parent()
    console = Console(highlight=False, soft_wrap=True)
    try:
        with _storage_errors(job.where, job.flag):
            job.work(job.open(), console, f"worker {index}: ")
    except JaxtrainError as e:
        print(f"error: worker {index}: {e.for_cli()}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:  # a Ctrl-C sent to it alone; its trial is failed by Optuna
        sys.exit(130)


PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends


def _die_with_parent() -> None:
    """Makes this process end when its parent (the sweep) ends, however that ends, SIGKILL
    included: the kernel's parent-death signal on Linux, a thread watching the parent elsewhere.
    Leaves the parent's process group, so that the terminal's Ctrl-C reaches the sweep alone, which
    ends its workers and marks their trials itself."""
    parent = multiprocessing.parent_process()
    expected = parent.pid if parent is not None else os.getppid()
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    else:
        def watch() -> None:
            while os.getppid() == expected:
                time.sleep(0.5)
            os._exit(1)

        threading.Thread(target=watch, name="jaxtrain-sweep-parent", daemon=True).start()
    if os.getppid() != expected:  # the parent ended before the signal was asked for
        os._exit(1)


class _Signalled(Exception):
    """SIGTERM arrived while the sweep waited for its workers."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _run_workers(job: _Job, workers: int, console: Console) -> None:
    """Starts `workers` processes on the job, waits for them and says how each that failed ended.
    SIGTERM or Ctrl-C ends them (SIGKILL: they hold nothing that a kill would damage), marks their
    running trials failed and asks their values again.

    Raises:
      SweepStopped: SIGTERM or Ctrl-C arrived.
      JaxtrainError: workers failed and the study holds fewer than `trials` finished trials.
    """
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked JAX runtime
    processes = [context.Process(target=_worker, args=(job, i), name=f"jaxtrain-sweep-worker-{i}")
                 for i in range(1, workers + 1)]

    def stop(signum: int, frame: Any) -> None:
        raise _Signalled(signum)

    main = threading.current_thread() is threading.main_thread()
    previous = (signal.signal(signal.SIGTERM, stop), signal.getsignal(signal.SIGINT)) if main else None
    _start_resource_tracker()
    try:
        for process in processes:
            process.start()
        job.say(console, f"started {workers} workers (pids {', '.join(str(p.pid) for p in processes)})")
        for process in processes:
            process.join()
    except (_Signalled, KeyboardInterrupt) as e:
        if main:  # a second signal must not cut the cleanup short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        _stop_workers(job, processes, e.signum if isinstance(e, _Signalled) else signal.SIGINT)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])
    failed = [(i, p.exitcode) for i, p in enumerate(processes, 1) if p.exitcode]  # each joined: an exit code
    for i, code in failed:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        console.print(f"worker {i} {how}")
    finished = job._count(job.open(), FINISHED)
    if failed and finished < job.trials:
        raise JaxtrainError(f"the study holds {finished} of {job.trials} finished trials: {len(failed)} of "
                            f"{workers} workers failed (above); run the same command again to continue it")


def _start_resource_tracker() -> None:
    """Starts multiprocessing's resource tracker, which the workers share, told not to warn of
    "leaked" semaphores at its end: those are the semaphores of workers the sweep ended by SIGKILL
    (tensorboardX's queues), which it removes. A tracker already running is left as it is."""
    from multiprocessing import resource_tracker

    option = "ignore:resource_tracker:UserWarning"
    sys.warnoptions.append(option)  # the tracker starts with this process's -W options
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove(option)


def _stop_workers(job: _Job, processes: Sequence[Any], signum: int) -> None:
    """Ends the workers, fails the trials they were running and asks their values again.

    Raises:
      SweepStopped: always, saying what was stopped.
    """
    import optuna

    for process in processes:
        if process.pid is not None and process.is_alive():
            process.kill()
    for process in processes:
        if process.pid is not None:
            process.join()
    owners = {_owner(p.pid) for p in processes if p.pid is not None}
    study = job.open()
    running = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
               if t.user_attrs.get("worker") in owners]
    again = sum(_retry(study, t, "the sweep was stopped", fail=True) for t in running)
    raise SweepStopped(signum, f"its {len(processes)} workers ended; {len(running)} running trials were marked "
                       f"failed, {again} of them asked again")


def _immediate_transactions(engine: Any) -> None:
    """Every transaction on the SQLite study takes the database's write lock when it begins
    (`BEGIN IMMEDIATE`). Optuna takes a waiting (re-asked) trial by reading it `FOR UPDATE` and
    marking it running; SQLite ignores `FOR UPDATE`, and Python's sqlite3 begins a transaction
    only at the first write, so two workers could both read the trial as waiting and both run it
    (seen: 2 in 17 runs of the two-worker SIGTERM test; optuna issues #4002, #4621). Connections
    opened before this keep the old behaviour, so the pool is emptied."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_implicit_transactions(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy's "begin" below starts each transaction

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()


def _flag(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)  # repr: the float itself, to the last bit


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def without_flags(flags: Sequence[str], names: Sequence[str]) -> list[str]:
    """`flags` less those that set one of the dotted `names` (each with the values after it)."""
    drop = {"--" + n.replace("_", "-") for n in names}
    out, skipping = [], False
    for arg in flags:
        if arg.startswith("--"):
            skipping = arg.split("=", 1)[0] in drop
        if not skipping:
            out.append(arg)
    return out


def _value_at(config: Any, name: str) -> Any:
    for part in name.split("."):
        config = getattr(config, part)
    return config


def _flag_args(name: str, value: Any) -> list[str]:
    """`--optim.lr 0.003`, or `--model.hidden 64 64` for a tuple."""
    flag = "--" + name.replace("_", "-")
    return [flag, *(_flag(v) for v in value)] if isinstance(value, tuple) else [flag, _flag(value)]


def print_report(study: Any, console: Console, objective: str, importances: bool = True) -> None:
    """The trials table, the best trial's command and (with `importances`) the parameters'
    importances by fANOVA. A sweep's own end leaves them to `jaxtrain sweep report`: fANOVA imports
    scikit-learn, 1.1-1.9 s on a 2-core VM, longer than the rest of a 16-member population's end."""
    import optuna

    shown = [t for t in study.trials if not t.user_attrs.get("surplus")]  # asked past the end, never run
    table = Table(title=f"study {study.study_name}: {len(shown)} trials")
    names = sorted({k for t in shown for k in t.params})
    for col in ("trial", *names, "state", objective, "seconds"):
        table.add_column(col, justify="left" if col == "state" else "right")
    for t in shown:
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete else None
        value = t.value if t.value is not None else (t.intermediate_values[max(t.intermediate_values)]
                                                     if t.intermediate_values else None)
        table.add_row(str(t.number), *(_short(t.params[n]) if n in t.params else "-" for n in names),
                      t.state.name.lower(), "-" if value is None else f"{value:.6g}",
                      "-" if seconds is None else f"{seconds:.1f}")
    console.print(table)
    complete = _print_best(study, console, objective)
    if importances and len(complete) >= 2 and len(study.trials[0].params) >= 1:
        try:
            scores = optuna.importance.get_param_importances(study)
        except (ValueError, RuntimeError) as e:  # e.g. every complete trial drew the same values
            console.print(f"parameter importances: not computed ({e})")
        except ImportError:  # Optuna's fANOVA fits scikit-learn's forests; no extra of jaxtrain installs it
            console.print("parameter importances: not computed (fANOVA needs scikit-learn: pip install scikit-learn)")
        else:
            console.print("parameter importances (fANOVA): " + ", ".join(f"{k} {v:.2f}"
                                                                         for k, v in scores.items()))


def _print_best(study: Any, console: Console, objective: str) -> list[Any]:
    """Prints the best trial and the command that reproduces it; returns the complete trials."""
    import optuna

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if complete:
        best = study.best_trial
        where = f" ({best.user_attrs['run_dir']})" if "run_dir" in best.user_attrs else ""
        parent, joined = best.user_attrs.get("pbt_parent"), best.user_attrs.get("joined_epoch") or 0
        if parent is not None or joined:  # it began mid-population: a run from scratch is another run
            began = f"from trial {parent}'s weights" if parent is not None else "with fresh weights"
            console.print(f"best: trial {best.number}{where}, {objective} {best.value:.6g}; it joined the population "
                          f"at epoch {joined} {began}, so no command trains it again from scratch: its weights are "
                          "in its run directory; its numbers as a run of their own:\n"
                          f"  {best.user_attrs.get('command', '')}", markup=False, highlight=False)
        else:
            console.print(f"best: trial {best.number}{where}, {objective} {best.value:.6g}; reproduce it with:\n"
                          f"  {best.user_attrs.get('command', '')}", markup=False, highlight=False)
    return complete


def print_result(study: Any, console: Console, objective: str, out: str | Path) -> None:
    """A sweep's result alone (--quiet): the trials by state, where they are, and the best trial's command."""
    shown = [t for t in study.trials if not t.user_attrs.get("surplus")]
    states = collections.Counter(t.state.name.lower() for t in shown)
    console.print(f"study {study.study_name}: {len(shown)} trials ({', '.join(f'{n} {s}' for s, n in states.items())})"
                  f" in {out}", markup=False, highlight=False)
    _print_best(study, console, objective)


def load_study(out: str | Path, storage: str | None = None, study: str | None = None) -> Any:
    """The study of the sweep folder `out` (or of `storage`); its only study when `study` is None.

    Raises:
      ConfigError: no study there, or several and none named; Optuna not installed.
    """
    optuna = require("optuna", "jaxtrain sweep report")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    url = storage or f"sqlite:///{Path(out).resolve() / 'study.db'}"
    if storage is None and not (Path(out) / "study.db").is_file():
        raise ConfigError(f"{out} holds no study.db; pass the folder a sweep wrote (its --out), or --storage URL")
    where, flag = _where(Path(out), storage) if storage else (str(Path(out) / "study.db"), "folder")
    with _storage_errors(where, flag, opening=True):
        names = [s.study_name for s in optuna.study.get_all_study_summaries(url)]
        if study is None and len(names) != 1:
            raise ConfigError(f"{where} holds {len(names)} studies ({', '.join(names) or 'none'}); name one with "
                              "--study")
        if study is not None and study not in names:
            raise ConfigError(f"{where} holds no study {study!r} (it has: {', '.join(names) or 'none'})")
        return optuna.load_study(study_name=study or names[0], storage=url)


def plot_report(study: Any, out: str | Path) -> list[Path]:
    """PNGs of the optimization history, parallel coordinates and slices in `out`."""
    require("optuna", "jaxtrain sweep report")
    import matplotlib

    matplotlib.use("Agg")
    import warnings

    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as vis

    _refuse_links(Path(out), [f"sweep-{name}.png" for name in PLOTS])
    paths = []
    draws: tuple[Callable[[Any], Any], ...] = (vis.plot_optimization_history, vis.plot_parallel_coordinate,
                                               vis.plot_slice)
    for name, draw in zip(PLOTS, draws):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
            draw(study)
        path = Path(out) / f"sweep-{name}.png"
        plt.gcf().set_size_inches(8, 4.5)
        plt.gcf().savefig(path, dpi=100, bbox_inches="tight")
        plt.close("all")
        paths.append(path)
    return paths
