"""A study's trials as `jaxtrain sweep` and its schedulers (`tools/schedulers.py`) keep them: a trial's
values applied to the config, the hook that reports its epochs to the pruner, the study as one epoch's
pruner reads it, heartbeats of trials asked by hand, and a dead worker's trial asked again."""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import signal
import socket
import threading
from typing import Any, Sequence

from jaxtrain import ConfigError, DistConfig, Hook, JaxtrainError

__all__ = ["SweepStopped", "apply_values"]


def apply_values(config: Any, values: dict[str, Any]) -> Any:
    """`config` with each dotted field set to its value (a tuple field takes the value in each place).

    Raises:
      ConfigError: a field the config does not have, or a value its checks refuse.
    """
    for name, value in values.items():
        config = _replace(config, name.split("."), value, name)
    return config


def _alone(dist: DistConfig) -> DistConfig:
    """A trial trains in its worker alone: the workers of a SLURM array or a Kubernetes indexed Job share
    the study, not one JAX runtime (a job JAX would detect and join otherwise)."""
    return dist if dist.coordinator else dataclasses.replace(dist, num_processes=1)


def _replace(config: Any, path: list[str], value: Any, name: str) -> Any:
    fields = {f.name for f in dataclasses.fields(config)}
    if path[0] not in fields:
        raise ConfigError(f"--space {name}: the config has no field {path[0]!r} (it has: {', '.join(sorted(fields))})")
    current = getattr(config, path[0])
    if len(path) == 1 and dataclasses.is_dataclass(current):
        section = ", ".join(f"{name}.{f.name}" for f in dataclasses.fields(current))
        raise ConfigError(f"--space {name}: {path[0]!r} is a section of the config, not a field; name one of its "
                          f"fields ({section})")
    if len(path) > 1:
        if not dataclasses.is_dataclass(current):
            raise ConfigError(f"--space {name}: {path[0]!r} is not a section of the config")
        return dataclasses.replace(config, **{path[0]: _replace(current, path[1:], value, name)})
    if isinstance(current, tuple) and not isinstance(value, tuple):
        value = tuple(value for _ in current)
    return dataclasses.replace(config, **{path[0]: value})


class _StudyAtEpoch:
    """The study as a population's pruner sees it at one epoch's end: each query of its trials is
    read once for all the members (a read takes ~25 ms on SQLite and grows with the study), not
    once per member. Everything else is the study's own."""

    def __init__(self, study: Any):
        self._study = study
        self._epoch: int | None = None
        self._trials: dict[Any, Any] = {}  # this epoch's answers, by query

    def at(self, epoch: int) -> "_StudyAtEpoch":
        if epoch != self._epoch:
            self._epoch, self._trials = epoch, {}
        return self

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[Any]:
        key = None if states is None else tuple(states)
        if key not in self._trials:
            self._trials[key] = self._study.get_trials(deepcopy=False, states=states)
        return copy.deepcopy(self._trials[key]) if deepcopy else self._trials[key]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)


class _Report(Hook):
    """Reports the objective after each epoch and stops the run when the pruner says so. The
    members of a population share `study` (`_StudyAtEpoch`): their pruner reads the trials once an
    epoch."""

    def __init__(self, trial: Any, objective: str, study: _StudyAtEpoch | None = None):
        self.trial, self.objective, self.pruned, self.study = trial, objective, False, study

    def on_epoch_end(self, run: Any, record: dict[str, Any]) -> None:
        value = record.get(self.objective)
        if value is None or not math.isfinite(value):
            return
        self.trial.report(value, run.epoch)
        if run.epoch >= run.config.epochs:  # all its work is done: complete, whatever the pruner would say
            return
        if self._should_prune(run.epoch):
            self.pruned = True
            run.stop(f"pruned by the sweep at epoch {run.epoch}")

    def _should_prune(self, epoch: int) -> bool:
        import optuna

        if isinstance(self.trial.study.pruner, optuna.pruners.NopPruner):  # --pruner none: nothing to read
            return False
        if self.study is None:
            return self.trial.should_prune()
        study = self.trial.study  # `Trial.should_prune` with the epoch's shared view of the study
        return study.pruner.prune(self.study.at(epoch), study._storage.get_trial(self.trial._trial_id))


def _best(history: list[dict[str, Any]], objective: str, direction: str) -> float:
    values = [r[objective] for r in history if r.get(objective) is not None and math.isfinite(r[objective])]
    if not values:
        raise ConfigError(f"the runs record no {objective!r}; choose an objective among the epoch records' "
                          f"fields: {', '.join(sorted(k for k in history[-1] if k.startswith(('val_', 'train_'))))}")
    return min(values) if direction == "minimize" else max(values)


class SweepStopped(JaxtrainError):
    """A signal (SIGTERM, Ctrl-C) stopped the sweep; its running trials were marked failed and their
    values are asked again when the same command runs again (exit code 128 + signal)."""

    def __init__(self, signum: int, detail: str):
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}: {detail}; run the same command again to "
                         "finish the study")


def _owner(pid: int | None = None) -> str:
    """A process (this one by default) as a trial records who runs it, for the sweep that ends its workers."""
    return f"{socket.gethostname()} {os.getpid() if pid is None else pid}"


def _retry(study: Any, trial: Any, why: str, fail: bool) -> bool:
    """Asks the values of `trial` (frozen) again as a new trial, as Optuna does for a trial whose
    worker died, unless it drew none or is asked again already; `fail` marks it failed first (it is
    still running). Returns whether it was asked again."""
    import optuna

    states = optuna.trial.TrialState
    others = study.get_trials(deepcopy=False)
    again = bool(trial.params) and not any(t.system_attrs.get("failed_trial") == trial.number for t in others)
    if again:
        study.add_trial(optuna.trial.create_trial(
            state=states.WAITING, params=trial.params, distributions=trial.distributions,
            system_attrs={"failed_trial": trial.number, "retry_reason": why}))
    if fail:
        try:
            study._storage.set_trial_state_values(trial._trial_id, states.FAIL)
        except (RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            pass  # it ended meanwhile
    return again


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

    def add(self, trial: Any) -> None:
        """Beats `trial`'s heartbeat too from now on (a trial asked while the others run)."""
        self._ids = [*self._ids, trial._trial_id]  # a new list: the thread reads the old one whole

    def __enter__(self) -> "_Heartbeats":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
