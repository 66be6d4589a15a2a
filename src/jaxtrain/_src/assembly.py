"""One assembly of a run, for `fit` and for `fit_population`: a specification in, the runs and
their shared parts out; `training.train` then runs them.

The order is the same for one run and for P, and each step is written once here:

1. the run directories are claimed (`RunGuard`: locked, checked; only process 0 writes);
2. the programs are built (one, or every member's over one layout: `Joint`) and validation placed;
3. a resume is planned before anything moves: the checkpoint step every run continues from, and
   the runs that had finished (`RunGuard.finished`, the one finished-run rule);
4. earlier files are cleared or moved aside (`RunGuard.clear`), and only then the checkpoint hooks
   made: a hook made before would write into a folder that was moved away;
5. the states are restored (the first run restores the shared feed);
6. the calls are made (K and form, their line printed where the run prints), the evaluation, the
   `Run`s (built here and nowhere else) and their hooks, the memory report among them.

What differs for a population (its programs combined into one, its members' runs fed from the
population's) is the `Joint` that `population.py` passes in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Protocol, Sequence

import jax
import numpy as np
import optax
from flax import nnx
from rich.console import Console

from jaxtrain._src.checks import check_fit_inputs
from jaxtrain._src.choosers import AutoSteps
from jaxtrain._src.config import TrainConfig, to_dict
from jaxtrain._src.errors import setting
from jaxtrain._src.feeds import Feed, adapt_inputs, place_validation
from jaxtrain._src.hooks import CheckpointHook, EvalHook, Hook, MemoryHook, ProgressHook, Run, RunHook
from jaxtrain._src.hooks.deadline import more_to_train
from jaxtrain._src.loop_state import LoopState
from jaxtrain._src.program import Program, build_program
from jaxtrain._src.report.notes import note
from jaxtrain._src.run_guard import RunGuard, checkpoint_steps
from jaxtrain._src.state import TrainState
from jaxtrain._src.step import Augment, LossFn, Preprocess
from jaxtrain._src.training import StopSignals, run_hooks, step_form_of, summarise_model

__all__ = ["Assembly", "Joint", "RunSpec", "Specification", "assemble", "printing"]


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run to assemble.

    Attributes:
      model: its Flax NNX model (trained in place).
      config: its settings.
      run_dir: its run directory, or None (nothing written).
      hooks: the user's hooks of this run.
      optimizer: its own optax transformation; None builds `config.optim`'s.
      name: the run's name in its files (a recipe's name).
      saved_config: what its config.json records (default `config`).
    """

    model: nnx.Module
    config: TrainConfig
    run_dir: str | os.PathLike | None = None
    hooks: Sequence[Hook] = ()
    optimizer: optax.GradientTransformation | None = None
    name: str = "fit"
    saved_config: Any = None


class Joint(Protocol):
    """How the runs of a population share one program (`population.py`); a lone run has none."""

    @property
    def member_run(self) -> type[Run[TrainState]]:
        """The class of a member's `Run` (its state a slot of the population's)."""

    def programs(self, first: Program, runs: Sequence[RunSpec]) -> list[Program]:
        """Every run's program, `first` (the first run's, which made the layout and feed) among them."""

    def program(self, first: Program, programs: list[Program], states: list[TrainState], step: int) -> Program:
        """The population's program over the runs' `states` at `step` (its calls and evaluation),
        on `first`'s layout and feed."""

    def member_states(self, state: Any) -> Sequence[TrainState]:
        """Each member's train state in the population's `state`."""

    def member_calls(self, calls: Any) -> Any:
        """A member's view of the population's calls."""

    def member_evaluation(self) -> RunHook:
        """The hook that puts a member's share of the population's evaluation into its record."""


@dataclasses.dataclass(frozen=True)
class Specification:
    """What to assemble.

    Attributes:
      runs: the runs (one for `fit`; a population's members).
      loss_fn, train_data, val_data, preprocess, augment: as `fit` takes them, for every run.
      resume: False, True or "overwrite" (`fit`'s `resume`).
      verbosity: `fit`'s verbosity ("progress", "summary", "result", "silent").
      console: where to print (None: a new rich Console).
      auto_steps: how the automatic K is measured (scaled by the number of runs for a population).
      plots: draw the loss curves when a lone run ends.
      joint: how the runs share one program (a population), or None (one lone run).
      started: `time.perf_counter()` when the tool's command began: a deadline counts from it (None: now).
    """

    runs: Sequence[RunSpec]
    loss_fn: LossFn
    train_data: Any
    val_data: Any = None
    preprocess: Preprocess | None = None
    augment: Augment | None = None
    resume: bool | str = False
    verbosity: str = "progress"
    console: Console | None = None
    auto_steps: AutoSteps = AutoSteps()
    plots: bool = True
    joint: Joint | None = None
    started: float | None = None


@dataclasses.dataclass
class Assembly:
    """The runs, assembled.

    Attributes:
      lead: the run the loop keeps (a lone run itself; a population's own run, whose state is the
        population's and whose hooks evaluate every member at once); None when every run had
        finished (nothing to train: nothing was compiled).
      runs: each run's `Run` (a lone run's is `lead`).
      finished: each run's summary when a resume found it finished, else None.
      shown: where the run's lines are printed (nowhere when silent, or off process 0).
      signals: the stop signals (SIGINT, SIGTERM) the loop polls.
      join: for a population, `join(spec, state, loop)` claims a new member's run directory and
        makes its `Run` (hooks included) on the population's program, for a slot that takes a new
        run while the others train (`adaptive.Refill`); None for a lone run.
      rejoined: (a population's resume) the runs that start again as they took their slots
      (`Member.joined`, no checkpoint yet).
    """

    lead: Run[Any] | None
    runs: list[Run[TrainState]]
    finished: list[dict[str, Any] | None]
    shown: Console
    signals: StopSignals
    join: Callable[[RunSpec, TrainState, LoopState], Run[TrainState]] | None = None
    rejoined: tuple[int, ...] = ()


def printing(console: Console | None, verbosity: str, primary: bool) -> tuple[Console, Console, bool]:
    """`(run's console, progress's console, bar)`: where the run's hooks print (nowhere when silent
    or result-only, or in processes other than the first), where the progress hook prints its
    blocks or result, and whether it shows progress."""
    if verbosity == "silent" or not primary:
        return Console(quiet=True), Console(quiet=True), False
    shown = console or Console(highlight=False, soft_wrap=True)
    if verbosity == "result":  # the loss curves' path, the K chooser's decisions, ...: not printed
        return Console(quiet=True), shown, False
    return shown, shown, verbosity == "progress"


def assemble(spec: Specification, stack: contextlib.ExitStack) -> Assembly:
    """Assembles `spec`'s runs (its arguments checked by the caller); the stop signals are caught,
    the run directories claimed and a population's checkpoint writer open until `stack` closes.

    Raises:
      ConfigError, DataError, CheckpointError: data, settings or run directories that cannot work.
    """
    t_start, memory = time.perf_counter(), MemoryHook()  # the memory the caller brought
    spec = _adapted(spec)
    signals = stack.enter_context(StopSignals())  # stop signals count from here
    runs, joint = spec.runs, spec.joint
    config = runs[0].config  # the settings the runs share (a population's members differ in theirs alone)
    primary = jax.process_index() == 0  # of several processes, only the first prints and writes run files
    saved = [{"recipe": r.name, **to_dict(r.saved_config or r.config)} for r in runs]
    # Each directory is claimed (locked, checked) before anything else.
    resume, overwrite = spec.resume is True, spec.resume == "overwrite"
    guards = [stack.enter_context(RunGuard(r.run_dir, s, resume=resume, overwrite=overwrite, primary=primary))
              for r, s in zip(runs, saved)]
    console, shown, bar = printing(spec.console, spec.verbosity, primary)
    first = build_program(runs[0].model, spec.loss_fn, config, train_data=spec.train_data,
                          optimizer=runs[0].optimizer, preprocess=spec.preprocess, augment=spec.augment)
    if runs[0].optimizer is not None and not first.logs_lr:
        note("the learning rate of your optimizer= is not in its state, so lr is not logged; wrap it as "
             "jaxtrain.log_learning_rate(optimizer, schedule) (a constant rate c: schedule=c), or build it with "
             "optax.inject_hyperparams")
    if first.rewrite_declined and primary:
        note(f"the loss was not rewritten for XLA:CPU ({setting('rewrite')}): {first.rewrite_declined}; it trains "
             f"as written, any convolution or max pool in it at XLA:CPU's slower speed "
             f"({setting('rewrite', 'off')} skips the attempt)")
    programs = joint.programs(first, runs) if joint else [first]
    feed = first.feed
    assert feed is not None  # built with training data
    val, val_streamed = place_validation(spec.val_data, config, feed) if spec.val_data is not None else (None, False)

    # Restore before anything is written: a failed resume must leave the run directories untouched.
    # a population's runs that took their slots (`Member.joined`) and were killed before their first save: their
    # parent's index (None: fresh weights)
    joined = {i: getattr(r, "parent", None) for i, (r, g) in enumerate(zip(runs, guards))
              if resume and getattr(r, "joined", 0) > 0 and not g.resume}
    step, finished = _plan(guards, first.total_steps, joint is not None, joined)
    for i, parent in joined.items() if step is not None else ():
        start = "fresh weights" if parent is None else f"the checkpoint of {guards[parent].path}"
        guards[i].rejoin(f"{guards[i].path} took its slot after epoch {getattr(runs[i], 'joined')} and has no "
                         f"checkpoint yet; it starts again there, at step {step}, from {start}")
    for guard in guards:
        guard.clear()  # the files of a run this one replaces, or of one that starts over (moved aside)
    # a population's saves are written by one thread beside the loop, one after another
    writer = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="jaxtrain-checkpoints")) if joint else None
    checkpoints = [CheckpointHook(g.path / "checkpoints", r.config.checkpoint, r.name, s, writer)
                   if g.path is not None and (r.config.checkpoint.enabled or g.resume) else None
                   for r, g, s in zip(runs, guards, saved)]
    states, loops = _restore(guards, checkpoints, programs, feed, step, finished, joint is None, joined)
    kind = joint.member_run if joint else Run
    live = [i for i, f in enumerate(finished) if f is None]
    if not live:  # nothing to train: nothing compiled
        feed.close()
        ended = [_run(kind, r.name, r.config, console, g.path, first, feed, None, s, loop, t_start=t_start)
                 for r, g, s, loop in zip(runs, guards, states, loops)]
        return Assembly(None, ended, finished, shown, signals)

    lead_loop, lead_step = loops[live[0]], int(states[live[0]].step)  # the feed's position, K and form are theirs
    program = joint.program(first, programs, states, lead_step) if joint else first
    progress = ProgressHook(shown, bar=bar, result_only=spec.verbosity == "result")
    auto = dataclasses.replace(spec.auto_steps, slow_call_s=spec.auto_steps.slow_call_s * len(runs))  # P runs' call
    calls = program.calls(config.steps_per_call or lead_loop.steps_per_call, auto, log=progress.message,
                          form=step_form_of(config, lead_loop))
    evaluation = None if val is None else EvalHook(program.eval_step, val, val_streamed,
                                                   config.eval_batch_size or config.batch_size, config.eval_every)
    num_val = evaluation.num_samples if evaluation else 0
    if joint is None:
        run = _run(Run, runs[0].name, config, console, guards[0].path, first, feed, calls, states[0], loops[0],
                   num_val=num_val, resumed_step=lead_step if guards[0].resume else None, t_start=t_start,
                   started=spec.started)
        run.model_summary = summarise_model(runs[0].model, spec.loss_fn, spec.train_data, spec.preprocess,
                                            config.batch_size)
        run.hooks = [memory, *run_hooks(config, runs[0].hooks, evaluation, checkpoints[0], progress,
                                        guards[0].path if primary else None, saved[0], loops[0], spec.plots)]
        return Assembly(run, [run], finished, shown, signals)

    quiet = Console(quiet=True)  # a member's hooks print nothing: the population prints its lines
    loop = LoopState(epoch=lead_loop.epoch, position=lead_loop.position, feed=feed.get_state())
    lead = _run(Run, "population", config, quiet, None, program, feed, calls, program.state, loop, num_val=num_val,
                t_start=t_start)
    lead.hooks = [memory, *([evaluation] if evaluation else [])]  # every member evaluated at once
    member_calls, member_states = joint.member_calls(calls), joint.member_states(program.state)
    members: list[Run[TrainState]] = []
    summaries: dict[Any, dict[str, Any]] = {}

    def equip(member: Run[TrainState], r: RunSpec, checkpoint: CheckpointHook | None, path: Any,
              saved_config: dict[str, Any], loop: LoopState) -> None:
        """A member's model summary and hooks."""
        structure = (nnx.graphdef(r.model), tuple((x.shape, x.dtype) for x in jax.tree.leaves(nnx.state(r.model))))
        if structure not in summaries:  # members of one structure (a sweep over numbers) share theirs
            summaries[structure] = summarise_model(r.model, spec.loss_fn, spec.train_data, spec.preprocess,
                                                   config.batch_size)
        member.model_summary = summaries[structure]
        member.hooks = [_MemoryOf(memory), *run_hooks(r.config, r.hooks, joint.member_evaluation(), checkpoint,
                                                      Hook(), path if primary else None, saved_config, loop,
                                                      plots=False)]

    for i, (r, guard) in enumerate(zip(runs, guards)):
        state = member_states[i] if finished[i] is None else states[i]
        member = _run(kind, r.name, r.config, quiet, guard.path, program, feed, member_calls, state, loops[i],
                      num_val=num_val, resumed_step=lead_step if guard.resume else None, t_start=t_start)
        members.append(member)
        if finished[i] is None:
            equip(member, r, checkpoints[i], guard.path, saved[i], loops[i])

    def join(r: RunSpec, state: TrainState, loop: LoopState) -> Run[TrainState]:
        """A run that takes a slot mid-population: its directory claimed (new), its hooks made."""
        saved_config = {"recipe": r.name, **to_dict(r.saved_config or r.config)}
        guard = stack.enter_context(RunGuard(r.run_dir, saved_config, resume=False, overwrite=False,
                                             primary=primary))
        guard.clear()
        checkpoint = (CheckpointHook(guard.path / "checkpoints", r.config.checkpoint, r.name, saved_config, writer)
                      if guard.path is not None and r.config.checkpoint.enabled else None)
        member = _run(kind, r.name, r.config, quiet, guard.path, program, feed, member_calls, state, loop,
                      num_val=num_val, t_start=t_start)
        equip(member, r, checkpoint, guard.path, saved_config, loop)
        return member

    return Assembly(lead, members, finished, shown, signals, join, tuple(joined) if step is not None else ())


def _restore(guards: list[RunGuard], checkpoints: list[CheckpointHook | None], programs: list[Program], feed: Feed,
             step: int | None, finished: list[dict[str, Any] | None], lone: bool,
             joined: dict[int, int | None]) -> tuple[list[TrainState], list[LoopState]]:
    """Each run's train state and loop state: fresh, or (resuming) checkpoint `step`'s (None: the
    newest), the first run setting the shared feed to it; a run that had ended gets its newest
    checkpoint's. A lone run that a resume finds finished is marked so in `finished`
    (`RunGuard.finished`: a finished run stays finished). A population's `joined` run (one that took
    its slot and was killed before its first save) is what its slot's refill gave it at `step`
    (`population._Adaptive`): its fresh state, or its parent's checkpoint at `step` with its own
    numbers (a checkpoint holds none), with the others' position and no history."""
    config = programs[0].config
    states, loops = [p.state for p in programs], [LoopState(feed=feed.get_state()) for _ in programs]
    resuming = [i for i, g in enumerate(guards) if g.resume and finished[i] is None]
    for n, i in enumerate(resuming):
        epochs = None if config.max_time_s else config.epochs  # a deadline's run is not limited by epochs
        states[i], loops[i] = _hook(checkpoints, i).restore(programs[i].state, programs[i].state_shardings,
                                                            epochs, feed if n == 0 else None,
                                                            config.data.accept_changed, step=step)
        programs[i].state = states[i]  # its calls count the steps left from here
        if lone:
            finished[i] = guards[i].finished(int(states[i].step), more_to_train(config, loops[i]))
    for i, ended in enumerate(finished):
        if ended is not None and not lone:  # it stays as it ended, its model set to its newest checkpoint
            states[i], loops[i] = _hook(checkpoints, i).restore(programs[i].state, programs[i].state_shardings)
    for i, parent in joined.items() if step is not None else ():
        if parent is None:
            fresh = states[i].step  # placed as the program takes it (a copy: two members never share a buffer)
            states[i] = states[i]._replace(step=jax.device_put(np.asarray(step, fresh.dtype), fresh.sharding))
        else:
            states[i], _ = _hook(checkpoints, parent).restore(programs[i].state, programs[i].state_shardings,
                                                              step=step)
        loops[i] = dataclasses.replace(loops[resuming[0]], train_time_s=0.0, history=[], hooks={})
        programs[i].state = states[i]
    return states, loops


def _adapted(spec: Specification) -> Specification:
    """`spec` with others' datasets and loaders adapted (`feeds.adapt_inputs`: a loader's batch
    size becomes every run's) and the data checked against the first run's model and loss."""
    config = spec.runs[0].config
    train_data, val_data, adapted = adapt_inputs(spec.train_data, spec.val_data, config)
    changed = {f.name: getattr(adapted, f.name) for f in dataclasses.fields(TrainConfig)
               if getattr(adapted, f.name) != getattr(config, f.name)}
    runs = [dataclasses.replace(r, config=dataclasses.replace(r.config, **changed)) for r in spec.runs]
    check_fit_inputs(runs[0].model, spec.loss_fn, train_data, val_data, adapted.batch_size,  # eval_shape
                     spec.preprocess, spec.augment, adapted.data.allow_nan)
    return dataclasses.replace(spec, runs=runs, train_data=train_data, val_data=val_data)


def _run(kind: type[Run], name: str, config: TrainConfig, console: Console, run_dir: Any, program: Program,
         feed: Feed, calls: Any, state: Any, loop: LoopState, **more: Any) -> Run[Any]:
    """A `Run` (or a member's `kind` of one): the one place runs are made."""
    return kind(name=name, config=config, console=console, run_dir=run_dir, device=jax.local_devices()[0],
                layout=program.layout, feed=feed, calls=calls, state=state, step=int(state.step), loop=loop, hooks=[],
                rewrite_declined=program.rewrite_declined, **more)


def _plan(guards: list[RunGuard], total_steps: int, population: bool,
          joined: dict[int, int | None]) -> tuple[int | None, list[dict[str, Any] | None]]:
    """Where a resume continues, decided before any folder moves: the checkpoint step every run
    still training continues from (None: each its newest) and the summaries of a population's
    members that had ended (`RunGuard.finished`). A population's members continue from the newest
    step all of them hold but the `joined` runs (none saved: they start at that step); when they
    share none (killed before every member's first save), all start over."""
    finished: list[dict[str, Any] | None] = [None] * len(guards)
    if not population or not any(g.resume for g in guards):
        return None, finished
    held = [checkpoint_steps(g.path / "checkpoints") if g.resume and g.path is not None else [] for g in guards]
    for i, (guard, steps) in enumerate(zip(guards, held)):
        if guard.resume and steps:
            finished[i] = guard.finished(steps[-1], steps[-1] < total_steps, member=True)
    live = [set(held[i]) for i in range(len(guards)) if finished[i] is None and i not in joined]
    common = max(set.intersection(*live), default=None) if live else None
    if live and common is None:  # some member never saved where the others did: all start over
        note("the members share no checkpoint step to continue from; the population starts over")
        for guard in guards:
            guard.start_over()
        return None, [None] * len(guards)
    return common, finished


def _hook(checkpoints: list[CheckpointHook | None], i: int) -> CheckpointHook:
    hook = checkpoints[i]
    assert hook is not None  # a resuming run has its checkpoint hook
    return hook


class _MemoryOf(RunHook):
    """A population member's memory section: the population's (its `MemoryHook` hears the
    population's own run: the process's memory is the population's, not a member's)."""

    def __init__(self, memory: MemoryHook):
        self.memory = memory

    def on_end(self, run: Run, summary: dict[str, Any]) -> None:
        self.memory.on_end(run, summary)

