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
ends with `trials` finished ones whichever workers die on the way.

Pruning: after each epoch the trial reports its objective (`val_loss` by default) to Optuna;
when the pruner (median by default) says so, the run stops at that epoch's end and the trial is
marked pruned. A trial whose loss is not finite fails (its run directory says so) and the sweep
goes on; a failed trial counts toward the trials run this time, not toward the finished ones.

Search spaces are written `NAME=KIND:ARGS` over any config field: `optim.lr=loguniform:1e-4:1e-2`,
`optim.b1=uniform:0.8:0.99`, `batch_size=int:16:128`, `model.hidden=choice:64,128,256` (a field
holding a tuple, such as the MLP's widths, takes the chosen value in each of its places).
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import shlex
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

from jaxtrain import Hook
from jaxtrain._src.errors import ConfigError, JaxtrainError, NonFiniteLossError
from jaxtrain.tools.recipes.base import Recipe

__all__ = ["Space", "apply_values", "load_study", "parse_space", "print_report", "sweep", "without_flags"]

KINDS = ("loguniform", "uniform", "int", "choice")
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "hyperband", "none")


@dataclasses.dataclass(frozen=True)
class Space:
    """One dimension of the search: a config field (dotted) and what it may take."""

    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        if self.kind == "loguniform":
            return trial.suggest_float(self.name, self.low, self.high, log=True)
        if self.kind == "uniform":
            return trial.suggest_float(self.name, self.low, self.high)
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high))
        return trial.suggest_categorical(self.name, list(self.choices))


def _number(text: str, spec: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"--space {spec}: {text!r} is not a number") from None


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


def apply_values(config: Any, values: dict[str, Any]) -> Any:
    """`config` with each dotted field set to its value (a tuple field takes the value in each place).

    Raises:
      ConfigError: a field the config does not have, or a value its checks refuse.
    """
    for name, value in values.items():
        config = _replace(config, name.split("."), value, name)
    return config


def _replace(config: Any, path: list[str], value: Any, name: str) -> Any:
    fields = {f.name for f in dataclasses.fields(config)}
    if path[0] not in fields:
        raise ConfigError(f"--space {name}: the config has no field {path[0]!r} (it has: {', '.join(sorted(fields))})")
    current = getattr(config, path[0])
    if len(path) > 1:
        if not dataclasses.is_dataclass(current):
            raise ConfigError(f"--space {name}: {path[0]!r} is not a section of the config")
        return dataclasses.replace(config, **{path[0]: _replace(current, path[1:], value, name)})
    if isinstance(current, tuple) and not isinstance(value, tuple):
        value = tuple(value for _ in current)
    return dataclasses.replace(config, **{path[0]: value})


class _Report(Hook):
    """Reports the objective after each epoch and stops the run when the pruner says so."""

    def __init__(self, trial: Any, objective: str):
        self.trial, self.objective, self.pruned = trial, objective, False

    def on_epoch_end(self, run: Any, record: dict[str, Any]) -> None:
        value = record.get(self.objective)
        if value is None or not math.isfinite(value):
            return
        self.trial.report(value, run.epoch)
        if self.trial.should_prune():
            self.pruned = True
            run.stop(f"pruned by the sweep at epoch {run.epoch}")


def _best(history: list[dict[str, Any]], objective: str, direction: str) -> float:
    values = [r[objective] for r in history if r.get(objective) is not None and math.isfinite(r[objective])]
    if not values:
        raise ConfigError(f"the runs record no {objective!r}; choose an objective among the epoch records' "
                          f"fields: {', '.join(sorted(k for k in history[-1] if k.startswith(('val_', 'train_'))))}")
    return min(values) if direction == "minimize" else max(values)


def _sampler(name: str, seed: int) -> Any:
    import optuna

    if name not in SAMPLERS:
        raise ConfigError(f"unknown sampler {name!r}; choose {', '.join(SAMPLERS)}")
    return optuna.samplers.TPESampler(seed=seed) if name == "tpe" else optuna.samplers.RandomSampler(seed=seed)


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
          console: Console | None = None) -> Any:
    """Runs trials of `recipe` until the study holds `trials` finished ones; returns the Optuna study.

    Args:
      recipe, config: the recipe and its config for the fixed settings (the command's train flags).
      spaces: the search space.
      trials: finished trials (complete or pruned) the study should hold.
      out: the sweep folder: `study.db` (the default storage) and a run directory per trial.
      storage: an SQLAlchemy URL (`sqlite:///...`, `postgresql://...`); default SQLite in `out`.
      study: the study's name (default the recipe's).
      objective, direction: the epoch record field to optimise, "minimize" or "maximize".
      sampler: "tpe" or "random"; pruner: "median", "hyperband", "none", or an Optuna pruner.
      flags: the command's own train flags, written into each trial's command line.
      workers: processes that run trials side by side (1: this one).
      heartbeat: seconds between a running trial's heartbeats; three missed ones fail and retry it.
      population: trials asked at once and trained side by side as one compiled program
        (`jaxtrain.fit_population`); those whose values change more than the optimizer's settings
        (a model's width, the batch size) are grouped with the trials they share the rest with.

    Raises:
      ConfigError: a bad space, trials, workers, heartbeat or population < 1, an unknown sampler, pruner or
        direction, a field the recipe's config does not have.
      JaxtrainError: workers failed before the study held `trials` finished trials.
    """
    for name, value in (("trials", trials), ("workers", workers), ("heartbeat", heartbeat), ("population", population)):
        if value < 1:
            raise ConfigError(f"{name}={value} must be >= 1")
    if direction not in ("minimize", "maximize"):
        raise ConfigError(f"direction={direction!r}: choose minimize or maximize")
    if not spaces:
        raise ConfigError("a sweep needs at least one --space NAME=KIND:ARGS")
    for space in spaces:  # every field exists and takes a value of its kind, before a trial runs
        apply_values(config, {space.name: space.choices[0] if space.kind == "choice" else
                              (int(space.low) if space.kind == "int" else space.low)})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    job = _Job(recipe, config, tuple(spaces), trials, str(out), storage or f"sqlite:///{out.resolve() / 'study.db'}",
               study or recipe.name, objective, direction, sampler, pruner, seed, tuple(flags), heartbeat, population)
    study_obj = job.open(seed)
    study_obj.set_user_attr("objective", objective)  # for `sweep report`
    console = console or Console(highlight=False)
    if workers == 1:
        job.work(study_obj, console, "")
    else:
        _run_workers(job, workers, console)
    return study_obj


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

    def open(self, seed: int) -> Any:
        """The study, created if new, on a storage that beats heartbeats and retries stale trials."""
        import optuna

        # Optuna logs each failed trial with its traceback; the sweep says why in one line itself
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats are "experimental"
            storage = optuna.storages.RDBStorage(
                self.url, engine_kwargs={"connect_args": {"timeout": 60}} if self.url.startswith("sqlite") else None,
                heartbeat_interval=self.heartbeat, grace_period=3 * self.heartbeat,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=3))
        study = optuna.create_study(storage=storage, study_name=self.name, direction=self.direction,
                                    load_if_exists=True, sampler=_sampler(self.sampler, seed),
                                    pruner=_pruner(self.pruner) if isinstance(self.pruner, str) else self.pruner)
        # A study run again continues with a sampler seeded past its trials: the same seed would draw
        # the values of its first trials again (a new study keeps `seed`, so a sweep is reproducible).
        if asked := len(study.get_trials(deepcopy=False)):
            study.sampler = _sampler(self.sampler, seed + asked)
        return study

    def work(self, study: Any, console: Console, label: str) -> None:
        """Runs trials until the study holds `trials` finished ones, or this worker ran that many."""
        import optuna

        budget, waiting = self.trials - self._count(study, FINISHED), False
        while budget > 0:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(study)  # a dead worker's trial: failed, asked again
            finished = self._count(study, FINISHED)
            if finished >= self.trials:
                return
            if finished + self._count(study, ("RUNNING",)) >= self.trials:  # the rest run elsewhere
                if not waiting:
                    console.print(f"{label}the other trials run elsewhere; waiting for them (a trial whose worker "
                                  f"died is asked again {3 * self.heartbeat} s after its last heartbeat)")
                waiting = True
                time.sleep(min(self.heartbeat, 2))
                continue
            waiting = False
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

        return len(study.get_trials(deepcopy=False, states=tuple(optuna.trial.TrialState[n] for n in names)))

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
        value = _best(result.history, self.objective, self.direction)
        console.print(f"{name}: {self.objective} {value:.6g}{' (pruned)' if report.pruned else ''} in "
                      f"{time.perf_counter() - t0:.1f} s; " + ", ".join(f"{k}={_short(v)}" for k, v in values.items()))
        if report.pruned:
            raise optuna.TrialPruned()
        return value

    def prepare(self, trial: Any, label: str) -> tuple[dict[str, Any], Any, Path, str] | None:
        """A trial's values, config, run directory and printed name (its command saved with it);
        None for a trial asked past the end (marked surplus)."""
        import optuna

        others = trial.study.get_trials(deepcopy=False)
        taken = {optuna.trial.TrialState[n] for n in (*FINISHED, "RUNNING")}
        if sum(t.state in taken and t.number < trial.number for t in others) >= self.trials:
            trial.set_user_attr("surplus", True)
            return None
        values = {s.name: s.suggest(trial) for s in self.spaces}
        run_dir = Path(self.out) / f"trial-{trial.number:04d}"
        trial_config = dataclasses.replace(apply_values(self.config, values), quiet=True, run_dir="")
        command = shlex.join(["jaxtrain", "train", self.recipe.name, *without_flags(self.flags, list(values)),
                              *(x for k in values for x in _flag_args(k, _value_at(trial_config, k))),
                              "--run-dir", str(run_dir)])
        trial.set_user_attr("run_dir", str(run_dir))
        trial.set_user_attr("command", command)
        retry = next(t for t in others if t.number == trial.number).system_attrs.get("failed_trial")
        name = f"{label}trial {trial.number}" + ("" if retry is None else f" (trial {retry} again: its worker died)")
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
            for trial in trials:
                prepared = self.prepare(trial, label)
                if prepared is None:
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    continue
                groups.setdefault(runs.population_key(prepared[1]), []).append((trial, *prepared))
            for group in groups.values():
                reports = [_Report(trial, self.objective) for trial, *_ in group]
                t0 = time.perf_counter()
                try:
                    results = runs.train_population(self.recipe, [g[2] for g in group], [g[3] for g in group],
                                                    hooks=[[r] for r in reports])
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
                    console.print(f"{name}: {self.objective} {value:.6g}{' (pruned)' if report.pruned else ''} in "
                                  f"{seconds:.1f} s, one of a population of {len(group)}; {shown}")
                    if report.pruned:
                        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    else:
                        study.tell(trial, value)
        return n


class _Heartbeats:
    """Beats the heartbeat of trials asked by hand (`study.ask`) while they run, as `optimize` does
    for its own: a worker that dies leaves them stale, failed and asked again."""

    def __init__(self, study: Any, trials: Sequence[Any], interval: int):
        # the study's storage and the trials' ids, as Optuna's own heartbeat thread reads them
        self._storage, self._ids, self._interval = study._storage, [t._trial_id for t in trials], interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="jaxtrain-sweep-heartbeat", daemon=True)

    def _beat(self) -> None:
        while True:
            for trial_id in self._ids:
                self._storage.record_heartbeat(trial_id)
            if self._stop.wait(self._interval):
                return

    def __enter__(self) -> "_Heartbeats":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def _worker(job: _Job, index: int) -> None:
    """A worker process: its own sampler seed, its lines labelled, a user error as one line and its
    exit code, Ctrl-C (which reaches every worker) without a traceback."""
    import sys

    console = Console(highlight=False, soft_wrap=True)
    try:
        job.work(job.open(job.seed + index), console, f"worker {index}: ")
    except JaxtrainError as e:
        print(f"error: worker {index}: {e.for_cli()}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:  # its trial is failed by Optuna; the command run again continues
        sys.exit(130)


def _run_workers(job: _Job, workers: int, console: Console) -> None:
    """Starts `workers` processes on the job, waits for them and says how each that failed ended.

    Raises:
      JaxtrainError: workers failed and the study holds fewer than `trials` finished trials.
    """
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked JAX runtime
    processes = [context.Process(target=_worker, args=(job, i), name=f"jaxtrain-sweep-worker-{i}")
                 for i in range(1, workers + 1)]
    for process in processes:
        process.start()
    console.print(f"started {workers} workers (pids {', '.join(str(p.pid) for p in processes)})")
    for process in processes:
        process.join()
    failed = [(i, p.exitcode) for i, p in enumerate(processes, 1) if p.exitcode != 0]
    for i, code in failed:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        console.print(f"worker {i} {how}")
    finished = job._count(job.open(job.seed), FINISHED)
    if failed and finished < job.trials:
        raise JaxtrainError(f"the study holds {finished} of {job.trials} finished trials: {len(failed)} of "
                            f"{workers} workers failed (above); run the same command again to continue it")


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


def print_report(study: Any, console: Console, objective: str) -> None:
    """The trials table and the best trial's command."""
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
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if complete:
        best = study.best_trial
        console.print(f"best: trial {best.number}, {objective} {best.value:.6g}; reproduce it with:\n"
                      f"  {best.user_attrs.get('command', '')}")
    if len(complete) >= 2 and len(study.trials[0].params) >= 1:
        try:
            importances = optuna.importance.get_param_importances(study)
        except (ValueError, RuntimeError) as e:  # e.g. every complete trial drew the same values
            console.print(f"parameter importances: not computed ({e})")
        else:
            console.print("parameter importances (fANOVA): " + ", ".join(f"{k} {v:.2f}"
                                                                         for k, v in importances.items()))


def load_study(out: str | Path, storage: str | None = None, study: str | None = None) -> Any:
    """The study of the sweep folder `out` (or of `storage`); its only study when `study` is None.

    Raises:
      ConfigError: no study there, or several and none named.
    """
    import optuna

    url = storage or f"sqlite:///{Path(out).resolve() / 'study.db'}"
    if storage is None and not (Path(out) / "study.db").is_file():
        raise ConfigError(f"{out} holds no study.db; pass the folder a sweep wrote (its --out), or --storage URL")
    names = [s.study_name for s in optuna.study.get_all_study_summaries(url)]
    if study is None and len(names) != 1:
        raise ConfigError(f"{url} holds {len(names)} studies ({', '.join(names) or 'none'}); name one with --study")
    if study is not None and study not in names:
        raise ConfigError(f"{url} holds no study {study!r} (it has: {', '.join(names) or 'none'})")
    return optuna.load_study(study_name=study or names[0], storage=url)


def plot_report(study: Any, out: str | Path) -> list[Path]:
    """PNGs of the optimization history, parallel coordinates and slices in `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import warnings

    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as vis

    paths = []
    for name, draw in (("history", vis.plot_optimization_history), ("parallel", vis.plot_parallel_coordinate),
                       ("slices", vis.plot_slice)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
            draw(study)
        path = Path(out) / f"sweep-{name}.png"
        plt.gcf().set_size_inches(8, 4.5)
        plt.gcf().savefig(path, dpi=100, bbox_inches="tight")
        plt.close("all")
        paths.append(path)
    return paths
