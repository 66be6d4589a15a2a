"""Populations: P runs of one data stream trained side by side as one compiled program.

Each member is a run of its own (its model, its optimizer and settings, its run directory,
metrics, summary and checkpoints, its hooks) that shares the population's feed: the same data in
the same order, batch size and epochs. The program builder makes every member's program; the
population's train step combines them, so the K-step call is a single compiled program over all
members, in one of two formulations, each the fastest measured on its backend
(`examples/population_formulations.py`):

- `tuple`: each member's own train step, one after another inside one step; equal to the lone
  runs bit for bit; members may differ in their models' shapes (XLA:CPU);
- `stacked`: the members' states stacked on a leading axis and one step vmapped over them, so each
  layer's P small products are one batched product (GPUs).

A member that stops (pruned, early stopping, a non-finite loss) ends there: its run is ended and
written at once, and the others go on (its slot in the program computes on, unread: see `_Tuple`).

The members' runs are assembled as `fit`'s run is (`assembly.assemble`: the same order, the same
process-0 gating, memory report, K/form line and finished-run rule); what a population adds is its
`_Joint`. The loop is `fit`'s (`training.train`), over one feed, one `CompiledCalls` and one
evaluation of every member per epoch; its events reach each member's hooks through a `Run` of its
own (`_Members`), so a member's files are those a lone run writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from rich.console import Console

from jaxtrain._src.adaptive import Adapt, Refill, Slot, check_refill, is_key, put_slot, with_numbers
from jaxtrain._src.assembly import RunSpec, Specification, assemble
from jaxtrain._src.checkpoint import CheckpointError
from jaxtrain._src.checks import check_path_length
from jaxtrain._src.config import TrainConfig
from jaxtrain._src.errors import ConfigError, NonFiniteLossError
from jaxtrain._src.hooks import Run, RunHook
from jaxtrain._src.loop import FitResult
from jaxtrain._src.loop_state import LoopState
from jaxtrain._src.moments import announce
from jaxtrain._src.optim import optimizer_structure, with_values
from jaxtrain._src.program import Program, build_program
from jaxtrain._src.state import TrainState
from jaxtrain._src.step import Augment, LossFn, Preprocess
from jaxtrain._src.training import FAILURES, finish, train

__all__ = ["Member", "PopulationState", "Refill", "Slot", "fit_population", "shared_settings"]

PER_MEMBER = ("optim", "checkpoint", "early_stopping", "tensorboard", "track", "log_every", "on_nan")
"""`TrainConfig` fields members may set each their own way; the rest they share with the feed."""


@dataclasses.dataclass(frozen=True)
class Member(RunSpec):
    """One run of a population.

    Attributes:
      model: its Flax NNX model (trained in place), of any shape.
      config: its settings; only the fields in `PER_MEMBER` may differ between members.
      run_dir: its run directory (config.json, metrics.jsonl, summary.json, checkpoints/), or None.
      hooks: its own hooks (a sweep's pruning, say); they see its run only.
      optimizer: its own optax transformation; None builds `config.optim`'s.
      name: the run's name in its files (a recipe's name).
      saved_config: what its config.json records (default `config`).
      joined: (an adaptive population's resume) the epoch after which this run took its slot (0: a
        member from the start). One killed before its first save (its run directory holds no
        checkpoint) starts again as its refill started it, at the step the others continue from:
        with its initial state, or its `parent`'s there.
      parent: (with `joined`) the member (its index in this list) whose weights and optimizer
        state it took when it joined; None: fresh ones.
    """

    joined: int = 0
    parent: int | None = None


class PopulationState(NamedTuple):
    """The train state of a population: the step of the shared feed and the members' train
    states (a tuple of `TrainState`s, or one `TrainState` whose arrays have a leading member axis
    when stacked)."""

    step: jax.Array
    members: tuple[TrainState, ...] | TrainState

    @property
    def opt_state(self) -> None:
        """No optimizer state of its own (evaluation asks for an average of the weights: none)."""
        return None


def shared_settings(config: TrainConfig) -> dict[str, Any]:
    """The settings of `config` that members of one population must share (all `TrainConfig`
    fields but `PER_MEMBER`)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(TrainConfig) if f.name not in PER_MEMBER}


def _check_members(members: Sequence[Member]) -> None:
    if not members or not all(isinstance(m, Member) for m in members):
        raise ConfigError("fit_population needs a non-empty list of jaxtrain.Member(model, config, ...)")
    for i, member in enumerate(members):
        if not isinstance(member.config, TrainConfig):
            raise ConfigError(f"member {i}: config must be a jaxtrain.TrainConfig; got {type(member.config).__name__}")
    first = shared_settings(members[0].config)
    for i, member in enumerate(members):
        if not isinstance(member.model, nnx.Module):
            raise ConfigError(f"member {i}: model must be a flax.nnx.Module; got {type(member.model).__name__}")
        differ = sorted(k for k, v in shared_settings(member.config).items() if v != first[k])
        if differ:
            raise ConfigError(f"member {i} differs from member 0 in {', '.join(differ)}; members share every "
                              f"setting but {', '.join(PER_MEMBER)} (train the others as another population)")
        if member.config.max_time_s:
            raise ConfigError(f"member {i}: a deadline (max_time) is not kept in populations, whose members share "
                              "one loop; train the run alone (in a sweep: one trial at a time)")
        if member.config.ema:
            raise ConfigError(f"member {i}: an average of the weights (ema) is not kept in populations; "
                              "train that run alone")
        if member.config.optim.plateau_patience or member.config.early_stopping.restore_best:
            raise ConfigError(f"member {i}: reduce on plateau (optim.plateau_patience) and restoring the best weights "
                              "(early_stopping.restore_best) act on a lone run's state; train that run alone with fit")
        if not isinstance(member.joined, int) or member.joined < 0:
            raise ConfigError(f"member {i}: joined={member.joined!r} must be the epoch after which it took its slot "
                              "(0: from the start)")
        if member.parent is not None and not member.joined:
            raise ConfigError(f"member {i}: parent={member.parent!r} is for a member that took its slot later; give "
                              "joined (the epoch after which it took it) too, or no parent")
        if member.parent is not None and (member.parent not in range(len(members)) or member.parent == i):
            raise ConfigError(f"member {i}: parent={member.parent!r} must be another member's index, 0 to "
                              f"{len(members) - 1}")
        check_path_length(member.run_dir, f"member {i} run_dir")
    dirs = [Path(m.run_dir).resolve() for m in members if m.run_dir is not None]
    if len(set(dirs)) != len(dirs):
        raise ConfigError("two members share a run directory; give each its own")


FORMULATIONS = ("auto", "tuple", "stacked")


class _Tuple:
    """Each member's own train step, one after another in one step; the state a tuple of the
    members' states. Equal to the lone runs bit for bit; on XLA:CPU the fastest of the formulations
    measured (`examples/population_formulations.py`: 1.2-1.35x the members' lone steps, against
    0.95-1.1x for vmap).

    A stopped member's step still runs (its run has ended and its results are written: what its
    slot computes after that is never read). Skipping it instead, with a `lax.cond` per member or a
    select of its old state, made the population's step 1.35-1.4x slower on XLA:CPU (8 members of
    mlp-regression), more than the members pruned in a sweep save."""

    name = "tuple"

    def __init__(self, programs: Sequence[Program]):
        self.programs = programs

    def state(self, states: Sequence[TrainState]) -> tuple[TrainState, ...]:
        return tuple(states)

    def shardings(self, programs: Sequence[Program]) -> Any:
        return tuple(p.state_shardings for p in programs)

    def members(self, members: Any) -> tuple[TrainState, ...]:
        return members

    def kept(self, members: Any) -> Any:
        return members  # each member's state is its own: nothing to unstack

    def step(self, state: "PopulationState", batch: Any) -> tuple["PopulationState", tuple[dict, ...]]:
        out = [program.train_step(member, batch) for program, member in zip(self.programs, state.members)]
        return PopulationState(state.step + 1, tuple(new for new, _ in out)), tuple(m for _, m in out)

    def eval_step(self, state: "PopulationState", batch: Any) -> dict[str, jax.Array]:
        out = {}
        for i, (program, member) in enumerate(zip(self.programs, state.members)):
            out.update({f"{i}/{k}": v for k, v in program.eval_step(member, batch).items()})
        return out


class _Stacked:
    """The members' states stacked on a leading axis and one train step vmapped over them: each
    layer's P small matrix products become one batched product. On an H200 GPU 5.6x the lone
    steps at P = 16 (the tuple 1.1x); the members' optimizers hold all their numbers in their state,
    the betas too (`optim.with_values`), so one update function serves all. Members differ from
    their lone runs by the batched products' order of summation and the betas' rounding (within
    1e-5 in the tests; training at high rates amplifies it). Checkpoints leave the numbers out
    (the config has them), so a member's are a lone run's and resume alone."""

    name = "stacked"

    def __init__(self, programs: Sequence[Program]):
        self.programs, self.P = programs, len(programs)

        def unstack(stacked: TrainState) -> tuple[TrainState, ...]:
            return tuple(jax.tree.map(lambda x: x[i], stacked) for i in range(self.P))

        self._unstack = jax.jit(unstack)  # a copy of each member's state, when a member's hooks read it
        self._keep = jax.jit(lambda stacked: jax.tree.map(jnp.copy, stacked))

    def state(self, states: Sequence[TrainState]) -> TrainState:
        return jax.tree.map(lambda *x: jnp.stack(x), *states)

    def shardings(self, programs: Sequence[Program]) -> Any:
        replicated = programs[0].layout.replicated
        return jax.tree.map(lambda _: replicated, programs[0].state_shardings)

    def members(self, members: Any) -> tuple[TrainState, ...]:
        return self._unstack(members)

    def kept(self, members: Any) -> Any:
        """A copy of the stacked states, which the next call does not donate (one program, one tree)."""
        return self._keep(members)

    def step(self, state: "PopulationState", batch: Any) -> tuple["PopulationState", tuple[dict, ...]]:
        members, metrics = jax.vmap(self.programs[0].train_step, in_axes=(0, None))(state.members, batch)
        return (PopulationState(state.step + 1, members),
                tuple({k: jax.tree.map(lambda x: x[i], v) for k, v in metrics.items()} for i in range(self.P)))

    def eval_step(self, state: "PopulationState", batch: Any) -> dict[str, jax.Array]:
        metrics = jax.vmap(self.programs[0].eval_step, in_axes=(0, None))(state.members, batch)
        return {f"{i}/{k}": jax.tree.map(lambda x: x[i], v) for i in range(self.P) for k, v in metrics.items()}


def _stackable(members: Sequence[RunSpec]) -> str | None:
    """Why the members cannot be stacked (None when they can): the same model structure and
    shapes, optimizers from their configs that differ only in numbers, no schedule optax checks in
    Python, a mesh of one device."""
    first = members[0]
    if any(m.optimizer is not None for m in members):
        return "a member brings its own optimizer"
    if first.config.optim.schedule == "exponential":
        return "the exponential schedule"
    shape = lambda m: jax.tree.map(lambda x: (x.shape, x.dtype), nnx.state(m.model))  # noqa: E731
    structure = lambda m: (nnx.graphdef(m.model), shape(m))  # noqa: E731
    for i, m in enumerate(members[1:], 1):
        if structure(m) != structure(first):
            return f"member {i}'s model differs from member 0's"
        if optimizer_structure(m.config.optim) != optimizer_structure(first.config.optim):
            return f"member {i}'s optimizer differs from member 0's in more than its numbers"
    return None


class _MemberCalls:
    """A member's view of the population's compiled calls: the same K, compile time and
    programs; FLOPs per step its share (XLA's count of the population's program, asked once for
    all members: `shared`); closing it leaves the population's calls open."""

    def __init__(self, calls: Any, members: int, shared: dict[Any, float | None]):
        self._calls, self._members, self._shared = calls, members, shared

    def __getattr__(self, name: str) -> Any:
        return getattr(self._calls, name)

    def flops_per_step(self, *args: Any, **kwargs: Any) -> float | None:
        key = (args, tuple(sorted(kwargs.items())))
        if key not in self._shared:
            self._shared[key] = self._calls.flops_per_step(*args, **kwargs)
        flops = self._shared[key]
        return None if flops is None else flops / self._members

    def close(self) -> None: ...


class _Validation(RunHook):
    """Puts a member's evaluation results (computed for the whole population) into its epoch
    record, where a lone run's evaluation would."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def on_epoch_end(self, run: Run, record: dict[str, Any]) -> None:
        record.update(self.values)
        self.values = {}


@dataclasses.dataclass
class _Runner:
    """A member's run in the population loop: its `Run`, its model, and how it ended."""

    run: _MemberRun
    model: nnx.Module
    population: dict[str, Any]  # the summary's "population": members and formulation
    status: str | None = None  # set once the member's run has ended
    result: FitResult | None = None
    member: Any = None  # its `Member` (an adaptive population's `Slot` shows it)
    joined: int = 0  # the epoch after which it took its slot (0: from the start)

    @property
    def validation(self) -> _Validation:
        """Where its evaluation results arrive (its evaluation hook)."""
        return next(h for h in self.run.hooks if isinstance(h, _Validation))

    def close(self, summary: dict[str, Any]) -> None:
        """A member a resumed population finds ended (its summary.json): left as it is, its model
        set to its last checkpoint's weights (copied: its slot of the population's state is donated)."""
        state = self.run.state = jax.tree.map(jnp.copy, self.run.state)
        self.status = summary["status"]
        nnx.update(self.model, state.params, state.model_state)
        self.result = FitResult(self.model, state, self.run.loop.history, summary, self.run.run_dir)

    def end(self, status: str, others_train: bool = False) -> None:
        """Ends the member's run: its model updated, its summary and files written (a hook failing
        there, on a full disk say, fails this member alone: its summary says so). While
        `others_train`, its state is copied out of the population's, whose arrays the next call
        donates."""
        run = self.run
        self.status = status
        if others_train:
            run.state = jax.tree.map(jnp.copy, run.state)
        try:
            finish(run, self.model, status, population=self.population)
        except Exception:  # noqa: BLE001 - `end_run` wrote "failed: ..." into the summary
            self.status = run.summary.get("status", status)
        self.result = FitResult(self.model, run.state, run.loop.history, run.summary, run.run_dir)

    def fitted(self) -> FitResult:
        assert self.result is not None  # every member's run has ended or was closed
        return self.result


def fit_population(
    members: Sequence[Member],
    loss_fn: LossFn,
    train_data: Any,
    val_data: Any = None,
    *,
    preprocess: Preprocess | None = None,
    augment: Augment | None = None,
    verbosity: str = "summary",
    console: Console | None = None,
    formulation: str = "auto",
    resume: bool = False,
    adapt: Adapt | None = None,
) -> list[FitResult]:
    """Trains every member on the same data as one compiled program; returns a `FitResult` each.

    Each member's result (its parameters, metrics, validation losses) is what `fit` gives for its
    model, loss, data and config alone (checked to 1e-5 in the tests). Members may differ in their
    model (shapes included) and in the settings `PER_MEMBER` lists (the optimizer and its
    learning rate, weight decay, schedule, ...); they share the data, its order (the seed), batch
    size, epochs and every other setting. A member whose hooks stop it (a sweep's pruner, early
    stopping) or whose loss is not finite ends there: its summary says how (`"status"`), and the
    others train on. Their loss curves are not drawn (`jaxtrain plot RUN_DIR` draws them). A
    member's run directory is a lone run's: it resumes alone with `fit(..., resume=True)`.

    Args:
      members: the runs (`Member`s).
      loss_fn, train_data, val_data, preprocess, augment: as `fit` takes them, for every member.
      verbosity: "summary" prints a line per epoch; "silent" nothing.
      console: where to print.
      formulation: how the members share the program: "tuple" (each member's own step, one after
        another; equal to the lone runs bit for bit), "stacked" (the members' states stacked and
        one step vmapped over them: batched products; members of one model structure whose
        optimizers differ only in their numbers), or "auto": stacked off the CPU when the members
        allow it, else the tuple (what measured fastest on each backend; `summary["population"]`
        says which ran).
      resume: continue the population stopped or killed before, from the newest checkpoint step
        every member still training holds (members save at the same steps; one killed between
        their saves continues from the step before), so the result is the uninterrupted one (bit
        for bit in the tuple formulation). Members that had ended stay as they ended. Members with
        no common step (killed before their first save point was written by all) start over, their
        earlier files moved aside to `previous-N/`; but a member that took its slot
        (`Member.joined`) and was killed before its first save starts at that step as its refill
        did, in its run directory as it is (a note says so), and its summary's "population" names
        its slot, `joined_epoch` and `parent` as the refill's does. False: the run directories must
        be new.
      adapt: an adaptive population: `adapt(epoch, slots)` is called at each epoch's end but the
        last with every slot's `Slot` (its run, status, history) and returns `Refill`s: a slot's
        run ends (if it still trains) and a new `Member` (its own run directory) trains in the slot
        from the next epoch, with fresh weights (the population's initial ones) or a copy of
        another slot's weights and optimizer state, and its own optimizer numbers, without
        compiling again (the numbers are inputs of the program: `optim.with_values`, in either
        formulation). Successive halving and PBT are such callables (the sweep's schedulers). The
        result then holds every run, the members first, then the refills in
        the order they joined. A run that takes a slot saves a checkpoint at once, so a resume
        (`resume=True` with the slots' runs at the time as `members`) continues every slot from one step.

    Raises:
      ConfigError, DataError: members that cannot share a population, data that cannot work.
      TrainingStopped: SIGINT or SIGTERM arrived (members' checkpoints were saved first).
    """
    _check_members(members)
    if verbosity not in ("summary", "silent"):
        raise ConfigError(f"verbosity={verbosity!r} must be summary or silent")
    if resume not in (False, True):
        raise ConfigError(f"resume={resume!r} must be False (new runs) or True (continue the population)")
    if adapt is not None:
        _check_adaptive(members)
    joint = _Joint(formulation, members, loss_fn, preprocess, augment, numbers_in_state=adapt is not None)
    spec = Specification(members, loss_fn, train_data, val_data, preprocess, augment, resume, verbosity, console,
                         joint=joint)
    with contextlib.ExitStack() as stack:
        assembly = assemble(spec, stack)
        about = {"members": len(members), "formulation": joint.form.name}
        runners = [_Runner(_member(run), m.model, _about(about, i, m, assembly.runs), member=m, joined=m.joined)
                   for i, (run, m) in enumerate(zip(assembly.runs, members))]
        for runner, ended in zip(runners, assembly.finished):
            if ended is not None:  # it ended before the population stopped: it stays as it ended
                runner.close(ended)
        every = list(runners)  # the members, then (adaptive) the runs that took their slots
        if assembly.lead is not None:
            crew = _Members(assembly.lead, runners, joint.form, assembly.shown)
            if adapt is not None:
                assert assembly.join is not None  # a population's assembly joins new members
                crew.adaptive = _Adaptive(adapt, assembly.join, crew, every, joint.initial)
            crew.rejoined = assembly.rejoined
            train(assembly.lead, crew, assembly.signals)
    return [r.fitted() for r in every]


def _about(about: dict[str, Any], i: int, member: Member, runs: Sequence[Run]) -> dict[str, Any]:
    """The summary's "population" of member `i`: a run that took its slot (`Member.joined`, a resume)
    says which slot, when and whose weights, as its refill's run says it (`_Adaptive.refill`)."""
    if not member.joined:
        return about
    parent = None if member.parent is None else runs[member.parent].run_dir
    return {**about, "slot": i, "joined_epoch": member.joined, "parent": None if parent is None else str(parent)}


def _check_adaptive(members: Sequence[Member]) -> None:
    """Refuses what an adaptive population cannot do: a member with its own optimizer or the
    exponential schedule (the numbers must be inputs of the program)."""
    for i, m in enumerate(members):
        if m.optimizer is not None:
            raise ConfigError(f"member {i} brings its own optimizer; an adaptive population takes each member's "
                              "from config.optim (its numbers are inputs of the program): give none")
        if m.config.optim.schedule == "exponential":
            raise ConfigError(f"member {i}: the exponential schedule checks its rates in Python, so its numbers "
                              "cannot be inputs of the program; choose another schedule for an adaptive population")


class _Adaptive:
    """An adaptive population's refills (`fit_population(adapt=...)`): at an epoch's end, the
    slots `adapt` names take new runs; their states are changed on the host and put back as the
    program's arrays were placed, so nothing compiles."""

    def __init__(self, adapt: Adapt, join: Callable[..., Any], crew: "_Members", every: list[_Runner],
                 initial: list[TrainState]):
        self.adapt, self.join, self.crew, self.every = adapt, join, crew, every
        self.stacked = isinstance(crew.form, _Stacked)
        self.fresh = initial  # each slot's initial state (a resumed population's too), on the host

    def refill(self, epoch: int) -> None:
        crew = self.crew
        runners = crew.runners
        for _, runner in crew.live():  # the epoch's saves are on the disk before anything is decided (a resume's
            _wait_saves(runner.run)    # point: the slots' runs as the last decision left them, each saved there)
        slots = [Slot(i, r.member, r.status, tuple(r.run.loop.history), r.joined) for i, r in enumerate(runners)]
        refills: list[Refill] = list(self.adapt(epoch, slots))
        if not refills:
            return
        if len({r.slot for r in refills}) != len(refills):
            raise ConfigError(f"adapt named a slot twice at epoch {epoch}; give each slot one refill")
        for refill in refills:
            holder = runners[refill.slot].member if 0 <= refill.slot < len(runners) else None
            check_refill(refill, len(runners), holder or runners[0].member, shared_settings)
        shared = crew.shared
        host = jax.device_get(shared.state.members) if any(r.parent is not None for r in refills) else None
        states: dict[int, TrainState] = {}
        for refill in refills:  # every parent as the epoch ended, before any slot changes
            if refill.parent is None:  # fresh: the initial weights and optimizer state, at the population's step
                step = cast(jax.Array, np.asarray(shared.step, np.int32))  # a host array: put_slot places it
                source = self.fresh[refill.slot]._replace(step=step)
            else:
                source = _row(host, refill.parent, self.stacked)
            states[refill.slot] = with_numbers(source, refill.member.config.optim)
        for refill in refills:
            runner = runners[refill.slot]
            if runner.status is None:
                runner.run.stop_reason = refill.reason
                runner.end("stopped early")  # its arrays leave the program's state below: nothing to copy
        members = shared.state.members
        for slot, state in states.items():
            members = put_slot(members, slot, state, self.stacked)
        shared.state = shared.state._replace(members=members)
        # the new runs' states as placed on the device, as every member's reads (a save of host arrays would
        # compile its copy program again for them)
        placed = _Unstacked(crew.form, crew.form.kept(members))
        for refill in refills:
            parent = None if refill.parent is None else runners[refill.parent].run.run_dir
            about = {**runners[0].population, "slot": refill.slot, "joined_epoch": epoch,
                     "parent": None if parent is None else str(parent)}
            state = placed[refill.slot]
            loop = LoopState(epoch=epoch, position=0, feed=shared.feed.get_state())
            run = _member(self.join(refill.member, state, loop))
            runner = _Runner(run, refill.member.model, about, member=refill.member, joined=epoch)
            run.each("on_start")
            announce("slot refilled", epoch=epoch, slot=refill.slot)
            _save_joined(run)
            runners[refill.slot] = runner
            self.every.append(runner)


def _wait_saves(run: _MemberRun) -> None:
    """Waits until the run's checkpoint saves are written."""
    from jaxtrain._src.hooks import CheckpointHook

    for hook in run.hooks:
        if isinstance(hook, CheckpointHook):
            hook.ckpt.wait()


def _save_joined(run: _MemberRun, ended: bool = True) -> None:
    """A run that took a slot saves its state at once, at the step the others saved at as the epoch
    ended: a resume then finds every slot's run at one step (as the end of the epoch it joined at).
    `ended` False: its loop is already at the next epoch's start (one restarted as it joined, on
    resume), which a save records as it is. Waits until the save is written."""
    from jaxtrain._src.hooks import CheckpointHook

    hook = next((h for h in run.hooks if isinstance(h, CheckpointHook)), None)
    if hook is None:
        return
    run.loop.position = run.feed.steps_per_epoch if ended else 0  # saved as the epoch's end: resumed at the next
    try:
        run.call(hook, "_save", None, "epoch")
    finally:
        run.loop.position = 0
    hook.ckpt.wait()


def _row(states: Any, i: int, stacked: bool) -> TrainState:
    """Member `i`'s state of the population's host `states` (a tuple, or stacked). The step key, a
    JAX array still (a typed key), is left whole: slots keep their own (`adaptive.put_slot`), and
    indexing it would compile a program."""
    return jax.tree.map(lambda x: x if is_key(x) else x[i], states) if stacked else states[i]


def _member(run: Run[TrainState]) -> _MemberRun:
    assert isinstance(run, _MemberRun)  # the assembly made it of `_Joint.member_run`
    return run


def _formulation(asked: str, members: Sequence[RunSpec], devices: int) -> type:
    """The formulation of the population: `asked`, or with "auto" the one that measured fastest on
    this backend (stacked off the CPU when the members allow it, else the tuple)."""
    if asked not in FORMULATIONS:
        raise ConfigError(f"formulation={asked!r} must be one of {', '.join(FORMULATIONS)}")
    why = _stackable(members) or ("a mesh of several devices" if devices > 1 else None)
    if asked == "stacked" and why is not None:
        raise ConfigError(f"the members cannot be stacked: {why}; use formulation='tuple'")
    if asked == "auto":
        return _Stacked if why is None and jax.default_backend() != "cpu" else _Tuple
    return _Stacked if asked == "stacked" else _Tuple


class _MemberMetrics(dict):
    """A member's metrics of one call: its device arrays, as a lone run's hooks get them, that
    know their population's shared transfer (`_Transfers`), which the metrics hook uses."""

    def __init__(self, metrics: dict[str, jax.Array], transfers: "_Transfers", call: int, member: int):
        super().__init__(metrics)
        self._transfers, self._call, self._member = transfers, call, member

    def host(self) -> dict[str, np.ndarray]:
        return self._transfers.host(self._call, self._member)


def _as_dict(names: tuple[str, ...], values: tuple[Any, ...]) -> Any:
    """A plain dict (`Any`: JAX's unflatten is typed to give back the registered class)."""
    return dict(zip(names, values))


jax.tree_util.register_pytree_node(  # a dict to JAX's tree functions, as a lone run's metrics are
    _MemberMetrics, lambda m: (tuple(m[k] for k in sorted(m)), tuple(sorted(m))), _as_dict)


class _Transfers:
    """Every member's metrics come to the host in one transfer per log interval: the first member
    to fetch a call brings that call and every earlier one not yet fetched, for all members, in
    one `jax.device_get` (the calls after it may still be running: they are not waited for)."""

    def __init__(self, live: Callable[[], set[int]]):
        self._live = live  # the members still training: only they will take their metrics
        self._calls: dict[int, tuple[dict[str, jax.Array], ...]] = {}  # on the device, not yet fetched
        self._host: dict[tuple[int, int], dict[str, np.ndarray]] = {}  # (call, member): not yet taken
        self._count = 0

    def add(self, metrics: tuple[dict[str, jax.Array], ...]) -> list[_MemberMetrics]:
        """The members' views of a call's metrics (a tuple of one dict per member)."""
        call, self._count = self._count, self._count + 1
        self._calls[call] = metrics
        return [_MemberMetrics(m, self, call, i) for i, m in enumerate(metrics)]

    def host(self, call: int, member: int) -> dict[str, np.ndarray]:
        if (call, member) not in self._host:
            due, live = [c for c in self._calls if c <= call], self._live()
            for c, members in zip(due, jax.device_get([self._calls.pop(c) for c in due])):
                self._host.update({(c, i): m for i, m in enumerate(members) if i in live or i == member})
        return self._host.pop((call, member))


class _Members:
    """The crew of a population (`training.Crew`): every call's and epoch's results handed to each
    member still training, in its own `Run`; a member that stops ends there, the others go on.
    The shared run (the population's) hears the events first: its evaluation computes every
    member's validation metrics at once."""

    adaptive: _Adaptive | None = None  # an adaptive population's refills
    rejoined: tuple[int, ...] = ()  # (a resume) members that start again as they took their slots

    def __init__(self, shared: Run[PopulationState], runners: list[_Runner], form: Any, console: Console):
        self.shared, self.runners, self.form, self.console = shared, runners, form, console
        self.transfers = _Transfers(lambda: {i for i, _ in self.live()})

    @property
    def resume_hint(self) -> str:
        return ("members' checkpoints saved; resume the population (fit_population(..., resume=True)), or a "
                "member alone with its run directory")

    def live(self) -> list[tuple[int, _Runner]]:
        return [(i, r) for i, r in enumerate(self.runners) if r.status is None]

    @property
    def training(self) -> bool:
        return bool(self.live())

    def _each(self, hear: Callable[[int, Run[TrainState]], Any]) -> None:
        """`hear(member, run)` for every member still training; a member whose hooks raise a
        non-finite loss or a failed save ends there, the others go on."""
        for i, runner in self.live():
            try:
                hear(i, runner.run)
            except NonFiniteLossError:  # this member diverged: the others go on
                runner.end(FAILURES[NonFiniteLossError], others_train=True)
            except CheckpointError as e:  # its folder's disk is full, say: it ends, the others go on
                runner.end(f"failed: {e}", others_train=True)

    def each(self, event: str) -> None:
        self.shared.each(event)
        for _, r in self.live():
            r.run.loop.epoch = self.shared.loop.epoch
        self._each(lambda i, run: run.each(event))
        if event == "on_start":  # a run restarted as it took its slot saves there, as it did then (`_Adaptive`)
            self._each(lambda i, run: _save_joined(_member(run), ended=False) if i in self.rejoined else None)

    def after_call(self, k: int, metrics: Any) -> None:
        shared = self.shared
        states = _Unstacked(self.form, self.form.kept(shared.state.members))
        for i, r in self.live():
            r.run.hold(states, i)
            r.run.advance(k, shared.stop_signal)
        shared.after_call(k, metrics)  # the population's evaluation (built after the first call)
        members = self.transfers.add(metrics)
        self._each(lambda i, run: run.after_call(k, members[i]))

    def epoch_end(self, record: dict[str, Any]) -> bool:
        self.shared.end_epoch(record)  # every member's validation metrics, "val_<member>/<name>"
        member_record = {k: v for k, v in record.items() if not k.startswith("val_")}
        for i, r in self.live():
            prefix = f"val_{i}/"
            r.validation.values = {"val_" + k[len(prefix):]: v for k, v in record.items() if k.startswith(prefix)}
        self._each(lambda i, run: run.end_epoch(dict(member_record)))
        for _, r in self.live():
            if r.run.stop_reason is not None:
                r.end("stopped early", others_train=True)
        _print_epoch(self.console, record["epoch"], self.shared.config.epochs, self.runners)
        if self.adaptive is not None and record["epoch"] < self.shared.config.epochs:
            self.adaptive.refill(record["epoch"])
        return self.training

    def end(self, status: str) -> None:
        for _, r in self.live():
            r.end(status)
        self.shared.calls.close()


class _Unstacked:
    """The members' states after one call, unstacked when a member's hooks first read one: most
    calls none does (a save, a run's end and the first calls' probes do), and unstacking every call
    cost the host 14 ms a call at P = 16 (P train states rebuilt). `members` is the formulation's
    `kept` copy, not the arrays the next call donates: a run that fails in the next call still
    ends its members from it."""

    def __init__(self, form: Any, members: Any):
        self._form, self._members = form, members
        self._states: Sequence[TrainState] | None = None

    def __getitem__(self, i: int) -> TrainState:
        if self._states is None:
            self._states = self._form.members(self._members)
        return self._states[i]


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Member `i`'s state in `_Unstacked` states, not yet read."""

    states: _Unstacked
    i: int


class _MemberRun(Run[TrainState]):
    """A member's `Run`: its state is its slot of the population's last call (`hold`), unstacked
    when a hook first reads it."""

    _held: TrainState
    _slot: _Slot | None = None

    @property
    def state(self) -> TrainState:
        if self._slot is not None:
            self._held, self._slot = self._slot.states[self._slot.i], None
        return self._held

    @state.setter
    def state(self, value: TrainState) -> None:
        self._held, self._slot = value, None

    def hold(self, states: _Unstacked, i: int) -> None:
        """Its state is now member `i`'s of the call's `states`, read when needed."""
        self._slot = _Slot(states, i)


def _print_epoch(console: Console, epoch: int, epochs: int, runners: list[_Runner]) -> None:
    losses = [(r.run.loop.history[-1].get("val_loss"), i) for i, r in enumerate(runners)
              if r.run.loop.history and r.run.loop.history[-1]["epoch"] == epoch]
    losses = [(v, i) for v, i in losses if v is not None and np.isfinite(v)]
    training = sum(r.status is None for r in runners)
    line = f"epoch {epoch}/{epochs}: {training} of {len(runners)} members training"
    if losses:
        best, worst = min(losses), max(losses)
        line += f"; val_loss {best[0]:.6g} (member {best[1]}) to {worst[0]:.6g} (member {worst[1]})"
    console.print(line)


class _Joint:
    """How a population's members share one program (`assembly.Joint`): the formulation, chosen
    once the first program has made the layout, combines the members' programs and states."""

    def __init__(self, asked: str, members: Sequence[Member], loss_fn: LossFn, preprocess: Preprocess | None,
                 augment: Augment | None, numbers_in_state: bool = False):
        self.asked, self.members, self.loss_fn = asked, members, loss_fn
        self.numbers_in_state = numbers_in_state  # adaptive: every member's numbers in its state, tuple too
        self.initial: list[TrainState] = []
        self.preprocess, self.augment = preprocess, augment
        _formulation(asked, members, 1)  # a wrong formulation is refused before any directory is claimed
        self.form: Any = None

    member_run = _MemberRun

    def programs(self, first: Program, runs: Sequence[RunSpec]) -> list[Program]:
        form = _formulation(self.asked, runs, first.layout.num_devices)
        total = first.total_steps

        in_state = form is _Stacked or self.numbers_in_state

        def program(m: RunSpec) -> Program:  # stacked: every number in the state, betas too (one vmapped update)
            tx = with_values(m.config.optim, total) if in_state else m.optimizer
            return build_program(m.model, self.loss_fn, m.config, optimizer=tx, preprocess=self.preprocess,
                                 augment=self.augment, total_steps=total, layout=first.layout)

        programs = [program(runs[0]) if in_state else first] + [program(m) for m in runs[1:]]
        # each member's initial state, before a resume restores over it or the first call donates it:
        # what a slot refilled with fresh weights starts from (`_Adaptive`)
        self.initial = [jax.device_get(p.state) for p in programs] if self.numbers_in_state else []
        self.form = form(programs)
        return programs

    def program(self, first: Program, programs: list[Program], states: list[TrainState], step: int) -> Program:
        form = self.form
        state = PopulationState(first.layout.put(np.int32(step), first.state_shardings.step), form.state(states))
        shardings = PopulationState(first.state_shardings.step, form.shardings(programs))
        # the population's program carries a PopulationState where `Program` declares a TrainState
        return dataclasses.replace(first, train_step=form.step, eval_step=form.eval_step,
                                   state=state, state_shardings=shardings)  # type: ignore[arg-type]

    def member_states(self, state: PopulationState) -> Sequence[TrainState]:
        return self.form.members(state.members)

    def member_calls(self, calls: Any) -> Any:
        return _MemberCalls(calls, len(self.members), {})

    def member_evaluation(self) -> RunHook:
        return _Validation()
