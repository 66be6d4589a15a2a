"""Adaptive populations for `jaxtrain sweep --population P --scheduler halving|pbt`.

The population's P slots train as one compiled program (`jaxtrain.fit_population` with `adapt`);
at an epoch's end a slot takes a new trial by changing arrays only, so nothing compiles again
(the optimizer's numbers are inputs of the program). Every run a slot holds is an Optuna trial of
its own with its own run directory.

- `halving` (asynchronous successive halving inside the population): at rungs of 1, 2, 4, ...
  epochs trained, a trial goes on only if its objective is in the better half of all the study's
  trials that reached that rung; one that is not is pruned, as is one the sweep's pruner stops
  (median by default) or whose loss diverged, and its slot takes the sampler's next trial with
  fresh weights (the population's initial ones) and optimizer state. The new trial trains the
  epochs left and reports its epochs counted from its start, so rungs and pruner compare trials at
  equal epochs trained. Once the sweep's trials are all asked, nothing more is pruned (a slot
  left empty would compute on unread).
- `pbt` (Population Based Training): every `pbt_every` epochs the worst quarter of the slots (by
  the objective of the epoch) copy the weights and optimizer state of one of the best quarter and
  perturb its numbers: each searched field multiplied by 0.8 or 1.2 (kept in its range; an integer
  rounded, a choice moved to a neighbour), or drawn anew from its range with probability
  `RESAMPLE`. Each copy is a new trial whose `user_attrs` name its parent trial (`pbt_parent`),
  the epoch (`pbt_epoch`) and the slot; the trial it replaced ends complete with its best value
  (`pbt_replaced_by`). The choices come from a generator seeded by the sweep's seed, the
  population's first trial and the epoch, and the ranking from the recorded objectives, so the
  same study and seed repeat them. No pruning: PBT decides.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from rich.console import Console

from jaxtrain import ConfigError, JaxtrainError, TrainingStopped
from jaxtrain.engine import argument

SCHEDULERS = ("none", "halving", "pbt")
PERTURB = (0.8, 1.2)
"""The factors PBT multiplies a copied trial's numbers by, one drawn per field."""
RESAMPLE = 0.25
"""The probability that PBT draws a field anew from its range instead of perturbing it."""


def pbt_every(epochs: int, every: int) -> int:
    """The epochs between PBT's exploit steps: `every`, or (0) a quarter of the epochs, at least 1."""
    return every or max(1, epochs // 4)


def check_scheduler(scheduler: str, population: int, pruner: Any, every: int, config: Any,
                    spaces: Sequence[Any]) -> None:
    """Refuses a scheduler that cannot run: unknown, without a population, halving without a
    pruner, a negative `every`, or a space over more than the optimizer's numbers (a slot's
    program takes another trial's numbers, not another model or optimizer).

    Raises:
      ConfigError: saying which and what to pass.
    """
    from jaxtrain.engine import optimizer_structure
    from jaxtrain.tools import runs
    from jaxtrain.tools.trials import apply_values

    if scheduler not in SCHEDULERS:
        raise ConfigError(f"{argument('scheduler', scheduler)}: choose {', '.join(SCHEDULERS)}")
    if every < 0:
        raise ConfigError(f"{argument('pbt_every', every)} must be >= 1 (epochs between PBT's steps)")
    if scheduler == "none":
        return
    if population < 2:
        raise ConfigError(f"{argument('scheduler', scheduler)} adapts a population: pass "
                          f"{argument('population', 16)} or another P >= 2")
    key, structure = runs.population_key(config), optimizer_structure(config.optim)
    for space in spaces:
        for value in space.ends():
            changed = apply_values(config, {space.name: value})
            if runs.population_key(changed) != key or optimizer_structure(changed.optim) != structure:
                raise ConfigError(f"--space {space}: at {value!r} it changes more than the optimizer's numbers (the "
                                  "model, or the optimizer's parts: a weight decay of 0 drops the decay), and "
                                  f"{argument('scheduler', scheduler)} changes only the numbers a slot's compiled "
                                  "program takes: keep the range off such values, or search without --scheduler")


def _report_class() -> type:
    from jaxtrain.tools.trials import _Report

    class SlotReport(_Report):
        """The sweep's report, counting a refilled trial's epochs from its start (the pruner compares
        trials at equal epochs trained), and (PBT) never pruning."""

        def __init__(self, trial: Any, objective: str, study: Any, offset: int = 0, prune: bool = True):
            super().__init__(trial, objective, study)
            self.offset, self.prune = offset, prune

        def on_epoch_end(self, run: Any, record: dict[str, Any]) -> None:
            value = record.get(self.objective)
            if value is None or not math.isfinite(value):
                return
            with warnings.catch_warnings():  # a resumed population reports again the epochs after its checkpoint
                warnings.filterwarnings("ignore", message="The reported value is ignored because")
                self.trial.report(value, run.epoch - self.offset)
            if run.epoch >= run.config.epochs or not self.prune:
                return
            if self._should_prune(run.epoch):
                self.pruned = True
                run.stop(f"pruned by the sweep at epoch {run.epoch}")

    return SlotReport


@dataclasses.dataclass
class _Entry:
    """A trial run in a slot: in the order `fit_population` returns results (members, then refills)."""

    trial: Any
    values: dict[str, Any]
    config: Any
    run_dir: Any
    name: str
    report: Any
    told: bool = False
    joined: int = 0  # (a resume) the epoch after which it took its slot
    parent: int | None = None  # (a resume of a PBT copy) its parent's entry, if still a slot's run


class _Scheduler:
    """The `adapt` of a sweep's population (`runs.train_population`)."""

    def __init__(self, job: Any, study: Any, entries: list[_Entry], budget: int, shared: Any, console: Console,
                 label: str, beats: Any, first: int, asked: int, slot_ids: list[int]):
        self.job, self.study, self.entries, self.budget = job, study, entries, budget
        self.shared, self.console, self.label, self.beats = shared, console, label, beats
        self.holders = list(range(len(entries)))  # slot -> index of its entry
        self.asked = asked  # trials asked from the budget (PBT's copies are not)
        self.first = first  # the population's first trial: its name in the study and PBT's seed
        self.slot_ids = slot_ids  # a slot's place in the population as recorded (a resumed one may have fewer)
        self.every = pbt_every(job.config.epochs, job.pbt_every)
        self.Report = _report_class()

    def __call__(self, epoch: int, slots: Sequence[Any], member_of: Callable[..., Any]) -> list[Any]:
        self._tell_ended(slots)
        return self._halving(epoch, slots, member_of) if self.job.scheduler == "halving" else self._pbt(
            epoch, slots, member_of)

    def _tell_ended(self, slots: Sequence[Any]) -> None:
        """Trials whose run ended (pruned, diverged) are told now: the sampler's next ask learns from
        them, and a resume finds only the slots' runs still training."""
        import optuna

        for slot in slots:
            entry = self.entries[self.holders[slot.index]]
            if slot.status is None or entry.told:
                continue
            entry.told = True
            if entry.report.pruned:
                self.study.tell(entry.trial, state=optuna.trial.TrialState.PRUNED)
                self.job.say(self.console, f"{entry.name}: pruned at epoch {len(slot.history) + slot.joined}")
            else:
                self.console.print(f"{entry.name}: {slot.status}")
                self.study.tell(entry.trial, state=optuna.trial.TrialState.FAIL)

    def _below_rung(self, slots: Sequence[Any]) -> set[int]:
        """The live slots whose trial has just reached a rung (1, 2, 4, ... epochs trained) with its
        objective outside the better half of every trial of the study at that rung."""
        objective, sign = self.job.objective, (1 if self.job.direction == "minimize" else -1)
        due = [s for s in slots if s.status is None and s.history and _is_rung(len(s.history))
               and math.isfinite(s.history[-1].get(objective, math.nan))]
        if not due:
            return set()
        trials = self.study.get_trials(deepcopy=False)  # read now: every member has reported this epoch
        out = set()
        for slot in due:
            rung = len(slot.history)
            reached = sorted(sign * t.intermediate_values[rung] for t in trials if rung in t.intermediate_values
                             and math.isfinite(t.intermediate_values[rung]))
            if len(reached) >= 2 and sign * slot.history[-1][objective] > reached[len(reached) // 2 - 1]:
                out.add(slot.index)
        return out

    def _halving(self, epoch: int, slots: Sequence[Any], member_of: Callable[..., Any]) -> list[Any]:
        import optuna

        from jaxtrain import Refill

        refills = []
        losers = self._below_rung(slots)
        for slot in slots:
            if (slot.status is None and slot.index not in losers) or self.asked >= self.budget:
                continue
            # the next trial first: a trial behind at its rung is pruned only when another takes its slot
            with warnings.catch_warnings():  # its heartbeat is beaten by the population's (`beats.add`)
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with")
                trial = self.study.ask()
            self.asked += 1
            prepared = self.job.prepare(trial, self.label)
            if prepared is None:  # the study's trials are all taken (other workers): no more refills, and
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)  # the slot's trial trains on
                self.budget = self.asked
                continue
            reason = "its slot took the sampler's next trial"  # the run has ended already: not shown
            if slot.status is None:  # behind at its rung: pruned, told so at once
                entry = self.entries[self.holders[slot.index]]
                entry.report.pruned, entry.told = True, True
                self.study.tell(entry.trial, state=optuna.trial.TrialState.PRUNED)
                reason = f"pruned by successive halving at rung {len(slot.history)}"
                self.job.say(self.console, f"{entry.name}: {reason}; its slot {slot.index} takes the next trial")
            member = self._member(trial, prepared, epoch, member_of, prune=True, slot=slot.index, joined=epoch)
            refills.append(Refill(slot.index, member, reason=reason))
            self.holders[slot.index] = len(self.entries) - 1
        return refills

    def _pbt(self, epoch: int, slots: Sequence[Any], member_of: Callable[..., Any]) -> list[Any]:
        from jaxtrain import Refill

        if epoch % self.every:
            return []
        objective, sign = self.job.objective, (1 if self.job.direction == "minimize" else -1)
        live = [s for s in slots if s.status is None and s.history
                and math.isfinite(s.history[-1].get(objective, math.nan))]
        quarter = len(live) // 4 or (1 if len(live) >= 2 else 0)
        if not quarter:
            return []
        ranked = sorted(live, key=lambda s: (sign * s.history[-1][objective], s.index))
        best, worst = ranked[:quarter], ranked[-quarter:]
        rng = np.random.default_rng([self.job.seed, self.first, epoch])
        refills = []
        for slot in worst:
            parent = best[int(rng.integers(len(best)))]
            parent_entry = self.entries[self.holders[parent.index]]
            values = {s.name: _perturb(s, parent_entry.values[s.name], rng) for s in self.job.spaces}
            trial = self._child(values, parent_entry.trial.number, epoch)
            prepared = self.job.prepare(trial, self.label, extra=True)
            assert prepared is not None  # a child is never surplus
            replaced = self.entries[self.holders[slot.index]]
            replaced.trial.set_user_attr("pbt_replaced_by", trial.number)
            replaced.told = True  # its run ends here: complete, with its best value so far
            self.study.tell(replaced.trial, _best_of(slot.history, objective, self.job.direction))
            self.job.say(self.console, f"{replaced.name}: replaced at epoch {epoch} by trial {trial.number}, a copy "
                         f"of trial {parent_entry.trial.number} with " + ", ".join(
                             f"{k}={_short(v)}" for k, v in values.items()))
            member = self._member(trial, prepared, 0, member_of, prune=False, slot=slot.index, joined=epoch)
            refills.append(Refill(slot.index, member, parent=parent.index, reason=f"PBT: replaced by trial "
                                  f"{trial.number}"))
            self.holders[slot.index] = len(self.entries) - 1
        return refills

    def _child(self, values: dict[str, Any], parent: int, epoch: int) -> Any:
        """A new running trial of the study with `values`, recording its parent."""
        import optuna

        distributions = {s.name: s.distribution() for s in self.job.spaces}
        frozen = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, params=values,
                                           distributions=distributions,
                                           user_attrs={"pbt_parent": parent, "pbt_epoch": epoch})
        trial_id = self.study._storage.create_new_trial(self.study._study_id, template_trial=frozen)
        return optuna.Trial(self.study, trial_id)

    def _member(self, trial: Any, prepared: Any, offset: int, member_of: Callable[..., Any], prune: bool, slot: int,
                joined: int) -> Any:
        values, config, run_dir, name = prepared
        record(trial, self.first, self.slot_ids[slot], joined, offset)
        report = self.Report(trial, self.job.objective, self.shared, offset=offset, prune=prune)
        self.entries.append(_Entry(trial, values, config, run_dir, name, report))
        self.beats.add(trial)
        return member_of(config, run_dir, [report])


def record(trial: Any, population: int, slot: int, joined: int, offset: int, budget: int | None = None) -> None:
    """What a resume needs of a trial of an adaptive population: the population (its first
    trial's number), the slot, the epoch it joined after, the offset of its reported epochs, and
    (on the first trial) the trials the population may ask."""
    attrs = {"population": population, "slot": slot, "joined_epoch": joined, "report_offset": offset}
    for key, value in {**attrs, **({} if budget is None else {"population_budget": budget})}.items():
        trial.set_user_attr(key, value)


def _best_of(history: Sequence[dict[str, Any]], objective: str, direction: str) -> float:
    from jaxtrain.tools.trials import _best

    return _best(list(history), objective, direction)


def _is_rung(epochs: int) -> bool:
    """Successive halving's rungs: 1, 2, 4, 8, ... epochs trained."""
    return epochs & (epochs - 1) == 0


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _perturb(space: Any, value: Any, rng: np.random.Generator) -> Any:
    """PBT's explore step for one field: drawn anew from its range with probability `RESAMPLE`,
    else multiplied by 0.8 or 1.2 and kept in its range (a choice moves to a neighbour)."""
    resample = rng.random() < RESAMPLE
    if space.kind == "choice":
        choices = list(space.choices)
        if resample:
            return choices[int(rng.integers(len(choices)))]
        i = choices.index(value) + (1 if rng.random() < 0.5 else -1)
        return choices[min(max(i, 0), len(choices) - 1)]
    low, high = space.low, space.high
    if resample:
        if space.kind == "loguniform":
            new = math.exp(rng.uniform(math.log(low), math.log(high)))
        else:
            new = rng.uniform(low, high)
    else:
        new = value * PERTURB[int(rng.integers(2))]
    new = min(max(new, low), high)
    return int(round(new)) if space.kind == "int" else float(new)


def run_adaptive(job: Any, study: Any, n: int, budget: int, console: Console, label: str) -> int:
    """Asks `n` trials and trains them as one adaptive population (`job.scheduler`); halving asks
    more as slots free, up to `budget` trials in all. Tells every trial its result; returns the
    trials asked from the budget (PBT's copies are extra: they record the search's steps)."""
    import optuna

    from jaxtrain.tools.trials import _StudyAtEpoch

    with warnings.catch_warnings():  # the trials' heartbeats are beaten below, as optimize beats its own
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        trials = [study.ask() for _ in range(n)]
    others = study.get_trials(deepcopy=False)
    shared = _StudyAtEpoch(study)
    Report = _report_class()
    entries: list[_Entry] = []
    for trial in trials:
        prepared = job.prepare(trial, label, others)
        if prepared is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        values, config, run_dir, name = prepared
        report = Report(trial, job.objective, shared, prune=job.scheduler == "halving")
        entries.append(_Entry(trial, values, config, run_dir, name, report))
    if not entries:
        return n
    first = entries[0].trial.number  # the population's name in the study
    for slot, entry in enumerate(entries):
        record(entry.trial, first, slot, 0, 0, budget if slot == 0 else None)
    return _train(job, study, entries, budget, shared, console, label, first, n, list(range(len(entries))),
                  resume=False)


def resume_interrupted(job: Any, study: Any, console: Console, label: str) -> int:
    """Continues an adaptive population of this study whose process was killed (its running trials
    were run on this host by a process that no longer exists), from the newest epoch every slot's
    run saved, with the decisions it would have made: the slots' runs are the study's running trials
    of the population, each resumed from its run directory; PBT's choices come from the seed, the
    population and the epoch. A run whose summary was written before the kill is told its result; a
    refill killed before its first save starts again where the refill started it (fresh weights,
    or its parent's, at the others' step: `Member.joined`); any other run killed before its first
    save is failed and asked again. Returns the trials asked from the budget after the resume (0:
    nothing to resume)."""
    import optuna

    from jaxtrain.engine import checkpoint_steps
    from jaxtrain.tools.trials import _retry, _StudyAtEpoch

    states = optuna.trial.TrialState
    running = [t for t in study.get_trials(deepcopy=False, states=(states.RUNNING,))
               if "population" in t.user_attrs and _orphaned(t.user_attrs.get("worker", ""))]
    if not running:
        return 0
    first = min(t.user_attrs["population"] for t in running)
    ours = sorted((t for t in running if t.user_attrs["population"] == first), key=lambda t: t.user_attrs["slot"])
    holders, unsaved = [], []
    for t in ours:
        run_dir = Path(t.user_attrs["run_dir"])
        if (run_dir / "summary.json").is_file():  # it ended before the kill, untold
            _tell_from_files(study, t, run_dir, job)
        elif not checkpoint_steps(run_dir / "checkpoints"):
            unsaved.append(t)
        else:
            holders.append(t)
    saved = {t.number for t in holders}
    for t in unsaved:
        parent = t.user_attrs.get("pbt_parent")
        if holders and t.user_attrs["joined_epoch"] and (parent is None or parent in saved):
            holders.append(t)  # a refill: it starts again as its refill started it (fresh, or its parent's weights)
        else:  # killed before the population's first save
            _retry(study, t, "its population was killed before it saved", fail=True)
    if not holders:
        return 0
    holders.sort(key=lambda t: t.user_attrs["slot"])
    numbers = [t.number for t in holders]
    _drop_after_common_step([Path(t.user_attrs["run_dir"]) for t in holders])
    job.say(console, f"{label}resuming the adaptive population of trial {first} ({job.scheduler}): trials "
            + ", ".join(str(t.number) for t in holders))
    trials = study.get_trials(deepcopy=False)
    budget = trials[first].user_attrs["population_budget"]
    asked = sum(t.user_attrs.get("population") == first and "pbt_parent" not in t.user_attrs for t in trials)
    shared = _StudyAtEpoch(study)
    Report = _report_class()
    entries = []
    for frozen in holders:
        trial = optuna.Trial(study, frozen._trial_id)
        trial.set_user_attr("worker", _owner())
        values = dict(frozen.params)
        report = Report(trial, job.objective, shared, offset=frozen.user_attrs["report_offset"],
                        prune=job.scheduler == "halving")
        entries.append(_Entry(trial, values, trial_config(job, values), Path(frozen.user_attrs["run_dir"]),
                              f"{label}trial {frozen.number}", report, joined=frozen.user_attrs["joined_epoch"],
                              parent=_index(numbers, frozen.user_attrs.get("pbt_parent"))))
    slot_ids = [t.user_attrs["slot"] for t in holders]
    return _train(job, study, entries, budget, shared, console, label, first, asked, slot_ids, resume=True) - (
        asked - len(entries))


def _index(numbers: list[int], parent: int | None) -> int | None:
    """The entry of a PBT copy's `parent` trial among the resumed slots' trials `numbers` (None: not a
    copy, or its parent's slot has a later run): a copy that never saved starts from its weights, and
    every copy's summary names its run directory (`Member.parent`)."""
    return numbers.index(parent) if parent in numbers else None


def _drop_after_common_step(run_dirs: Sequence[Path]) -> None:
    """Removes the checkpoints a killed population's runs wrote after the newest step all of them
    hold (the population continues from that step and writes them again, the same bits): a save
    into a step that exists is refused."""
    import shutil

    from jaxtrain.engine import checkpoint_steps

    held = [set(checkpoint_steps(d / "checkpoints")) for d in run_dirs]
    common = max(set.intersection(*(h for h in held if h)), default=None)  # but a refill that never saved
    if common is None:
        return
    for run_dir, steps in zip(run_dirs, held):
        for step in sorted(s for s in steps if s > common):
            shutil.rmtree(run_dir / "checkpoints" / str(step))


def _orphaned(worker: str) -> bool:
    """Whether `worker` ("host pid", `sweep._owner`) was a process of this host that has ended."""
    host, _, pid = worker.rpartition(" ")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


def _owner() -> str:
    from jaxtrain.tools.trials import _owner as owner

    return owner()


def trial_config(job: Any, values: dict[str, Any]) -> Any:
    """The config a trial with `values` trains with (`_Job.prepare`'s)."""
    from jaxtrain.tools.trials import _alone, apply_values

    return dataclasses.replace(apply_values(job.config, values), quiet=True, run_dir="", dist=_alone(job.config.dist))


def _tell_from_files(study: Any, trial: Any, run_dir: Path, job: Any) -> None:
    """Tells `trial` the result its run directory holds (a run that ended before its process was killed)."""
    import json

    import optuna

    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    history = [r for r in rows if r.get("kind") == "epoch"]
    if summary.get("status") in ("completed", "stopped early") and history:
        if str(summary.get("stop_reason", "")).startswith("pruned"):
            study.tell(trial.number, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial.number, _best_of(history, job.objective, job.direction))
    else:
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)


def _train(job: Any, study: Any, entries: list[_Entry], budget: int, shared: Any, console: Console, label: str,
           first: int, asked: int, slot_ids: list[int], resume: bool) -> int:
    """Trains the population of `entries` (adapted by `job.scheduler`) and tells each trial its
    result; returns the trials asked from the budget."""
    import optuna

    from jaxtrain.tools import runs
    from jaxtrain.tools.trials import SweepStopped, _best, _Heartbeats, _retry

    with _Heartbeats(study, [e.trial for e in entries], job.heartbeat) as beats:
        scheduler = _Scheduler(job, study, entries, budget, shared, console, label, beats, first, asked, slot_ids)
        t0 = time.perf_counter()
        try:
            results = runs.train_population(job.recipe, [e.config for e in entries], [e.run_dir for e in entries],
                                            hooks=[[e.report] for e in entries], adapt=scheduler, resume=resume,
                                            joined=[e.joined for e in entries], parents=[e.parent for e in entries])
        except TrainingStopped as e:  # SIGTERM or Ctrl-C: the trials still running are asked again
            for entry in entries:
                if not entry.told:
                    _retry(study, study._storage.get_trial(entry.trial._trial_id), "the sweep was stopped",
                           fail=False)
                    study.tell(entry.trial, state=optuna.trial.TrialState.FAIL)
            raise SweepStopped(e.exit_code - 128, f"{label}an adaptive population was stopped; its trials are "
                               "asked again") from None
        except JaxtrainError as e:
            for entry in entries:
                if not entry.told:
                    console.print(f"{entry.name}: failed ({e})")
                    study.tell(entry.trial, state=optuna.trial.TrialState.FAIL)
            return scheduler.asked
        seconds = time.perf_counter() - t0
        for entry, result in zip(entries, results):
            if entry.told:
                continue
            status = result.summary["status"]
            shown = ", ".join(f"{k}={_short(v)}" for k, v in entry.values.items())
            if status not in ("completed", "stopped early") or not result.history:
                console.print(f"{entry.name}: {status}; {shown}")
                study.tell(entry.trial, state=optuna.trial.TrialState.FAIL)
                continue
            value = _best(result.history, job.objective, job.direction)
            pruned = entry.report.pruned
            job.say(console, f"{entry.name}: {job.objective} {value:.6g}{' (pruned)' if pruned else ''}, one of an "
                    f"adaptive population ({job.scheduler}) that ran {seconds:.1f} s; {shown}")
            if pruned:
                study.tell(entry.trial, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(entry.trial, value)
    return scheduler.asked
