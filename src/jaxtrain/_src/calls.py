"""Compiled calls: the programs that run K optimizer steps per call, the choice of K and of the call's form.

A call runs K optimizer steps; the feed says what the call takes besides the train state (device
data and a permutation, or stacked streamed batches) and what step i of it is (`Feed.make_step`).
The call has one of three forms (`StepForm`): the K steps fused with `lax.scan` (one program per
K, one dispatch), programs of U fully unrolled steps dispatched K/U times, or the plain step
dispatched K times; the dispatched forms queue their programs without a host sync in between.
XLA:CPU runs some ops (convolutions) many times slower inside a loop body than in straight-line
code (jax#12868), so the form is measured on the run's own first steps, not assumed.
An epoch's shorter last call runs the program of K with its extra steps skipped (`masked_call`),
so a run over device-resident data compiles one program for K (streamed batches, stacked per call,
still need one per length).
Compile time is measured exactly and kept out of epoch times; the train state is donated, so its
buffers are reused rather than doubled. Calls are compiled with explicit in/out shardings from
the run's `Layout`: the state stays where the layout puts it, metrics come back replicated.
Over device-resident data the K chooser's two timed lengths share one program (the longer, its
extra steps skipped for the shorter calls). Programs not needed at once (the other length the K
chooser times when batches are streamed, the epoch permutation, evaluation) compile in a
background thread while the main thread compiles or trains; only the time the main thread waits
for them counts as compile time.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain._src.compile_cache import cache_hits
from jaxtrain._src.config import STEP_FORMS as FORMS
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.memory import compiled_memory, release_free_heap, trimming_heap
from jaxtrain._src.moments import announce
from jaxtrain._src.sharding import Layout
from jaxtrain._src.slow_ops import loop_slow_ops
from jaxtrain._src.state import TrainState
from jaxtrain._src.step import Metrics, fuse_steps


def shapes_of(tree: Any) -> Any:
    """Abstract shapes (with shardings) of a pytree of arrays, for ahead-of-time compilation."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


def _shardings_of(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The sharding of every array (or abstract array) in `args`; None (the compiler's choice)
    for host values such as NumPy scalars."""
    return jax.tree.map(lambda x: getattr(x, "sharding", None), args)


@dataclasses.dataclass(frozen=True)
class AutoSteps:
    """How the automatic K is measured (used when `TrainConfig.steps_per_call` is 0).

    Attributes:
      probe_lengths: the two call lengths (K_a < K_b) timed at the start of the run.
      repeats: timed calls of each length; the fastest counts.
      overhead_target: the per-call overhead allowed, as a fraction of a call's compute.
      short_run_calls: a run of fewer steps than this many calls of K_b is not measured: it runs
        K_b. Measuring could only end in a longer program, whose saving over so few calls (their
        fixed cost, milliseconds each) cannot repay its compile, or in K_a, no faster; and its timed
        calls wait for every background compile (evaluation's) instead of training beside it.
        0 measures every run.
      slow_call_s: a short run's first call of K_b slower than this switches it to K_a (see
        `StepsPerCall.check`); a population, whose call trains every member, allows its members'
        share each.
      unroll: steps per program of the "unroll" form (its compile grows with them).
      form_probe_s: the time a timed segment of the form measurement aims at (its steps: this over
        the first step's time, 1 to `probe_lengths[0]`).
    """

    probe_lengths: tuple[int, int] = (16, 128)
    repeats: int = 3
    overhead_target: float = 0.02
    short_run_calls: int = 32
    slow_call_s: float = 1.0
    unroll: int = 4
    form_probe_s: float = 0.02

    def __post_init__(self) -> None:
        k_a, k_b = self.probe_lengths
        if not (isinstance(k_a, int) and isinstance(k_b, int) and 1 <= k_a < k_b):
            raise ConfigError(f"AutoSteps.probe_lengths={self.probe_lengths} must be two integers 1 <= K_a < K_b")
        if self.repeats < 1 or not self.overhead_target > 0 or self.short_run_calls < 0:
            raise ConfigError("AutoSteps.repeats must be >= 1, overhead_target > 0 and short_run_calls >= 0")
        if self.unroll < 2 or not self.form_probe_s > 0:
            raise ConfigError("AutoSteps.unroll must be >= 2 and form_probe_s > 0")


class StepsPerCall:
    """Chooses K, the optimizer steps fused into one compiled call.

    A K set by the user is used as is. Otherwise the first calls of the run (real training
    steps) are timed at two lengths, K_a and K_b: `t(K) = overhead + K * step` gives both
    costs, and K becomes the smallest length whose overhead is under `overhead_target` of its
    compute, never below K_a and never above an epoch. Epochs too short to measure use K_a; runs
    shorter than `short_run_calls` calls of K_b use K_b unmeasured (K_a if their first call of K_b
    takes over `slow_call_s`). A length beyond K_b means compiling one more program: given the
    run's `total_steps`, it is chosen only when its saving over the steps left exceeds a compile's
    time (`record`'s `compile_s`).
    """

    def __init__(self, fixed: int, steps_per_epoch: int, auto: AutoSteps = AutoSteps(),
                 total_steps: int | None = None):
        k_a, k_b = (min(k, steps_per_epoch) for k in auto.probe_lengths)
        self.fixed = bool(fixed)
        self.brief = total_steps is not None and total_steps < auto.short_run_calls * k_b  # K set or not
        self.short = not fixed and self.brief
        self.k = min(fixed, steps_per_epoch) if fixed else k_b if self.short else k_a
        self.fitted: tuple[float, float] | None = None  # (seconds per step, per call) once measured
        can_measure = (not fixed and not self.short and k_a < k_b
                       and auto.repeats * (k_a + k_b) <= steps_per_epoch)
        self._plan = [k_a] * auto.repeats + [k_b] * auto.repeats if can_measure else []
        self._times: dict[int, list[float]] = {}
        self._steps_per_epoch = steps_per_epoch
        self._target = auto.overhead_target
        self._remaining = steps_per_epoch  # steps left in the epoch at the last `next_length`
        self._steps_left = total_steps  # steps of the run not yet run (None: unknown)
        self._k_a, self._checked, self._slow_s = k_a, False, auto.slow_call_s
        self.slowed: tuple[int, float] | None = None  # (steps, seconds) of the call that switched K to K_a

    @property
    def measuring(self) -> bool:
        return bool(self._plan)

    def planned(self) -> list[int]:
        """The call lengths still to be timed, each once."""
        return sorted(set(self._plan))

    def next_length(self, remaining: int) -> int:
        """Steps for the next call, given the steps left in the epoch."""
        if self._plan and self._plan[0] > remaining:  # too close to the epoch's end to measure
            self._plan = []
        self._remaining = remaining
        return self._plan[0] if self._plan else min(self.k, remaining)

    def ran(self, k: int) -> None:
        """A call of k steps of the run was handed to the device."""
        self._steps_left = None if self._steps_left is None else self._steps_left - k

    def stop(self) -> None:
        """No K to measure (the calls are dispatched step by step): K_a, or the K set."""
        if not self.fixed and (self._plan or self.short):
            self._plan, self.short, self.k = [], False, self._k_a

    @property
    def checking(self) -> bool:
        """Whether the next call of a short run's K_b is timed (once), in case its steps are slow."""
        return self.short and self._k_a < self.k and not self._checked

    def check(self, k: int, seconds: float) -> str | None:
        """Takes the time of a short run's first full call of K_b: a call slower than
        `slow_call_s` means steps so slow that K_a's overhead is negligible too, and K_a keeps
        progress and stop signals responsive (its calls run K_b's program, masked: no compile).
        A run with no step left after that call keeps K_b: K_a would describe no call of it."""
        self._checked = True
        if k < self.k or seconds <= self._slow_s or (self._steps_left is not None and self._steps_left <= 0):
            return None
        self.k, self.slowed = self._k_a, (k, seconds)
        return (f"K={self.k} steps per compiled call (a call of {k} steps took {seconds:.1f} s: steps this slow "
                f"leave a call's overhead negligible at K={self.k})")

    def record(self, k: int, seconds: float, compile_s: float = 0.0) -> str | None:
        """Takes the time of a measured call; after the last one, picks K and describes why.
        `compile_s`: what compiling one more program would cost (e.g. the last one's time)."""
        self._times.setdefault(k, []).append(seconds)
        self._plan.pop(0)
        if self._plan:
            return None
        (k_a, t_a), (k_b, t_b) = sorted((k, min(ts)) for k, ts in self._times.items())
        step_s = max((t_b - t_a) / (k_b - k_a), 1e-9)
        overhead_s = max(t_a - k_a * step_s, 0.0)
        self.fitted = (step_s, overhead_s)
        needed = math.ceil(round(overhead_s / (self._target * step_s), 6))
        self.k = k_a if needed <= k_a else k_b if needed <= k_b else min(needed, self._steps_per_epoch)
        kept = ""
        if self.k > k_b and self._steps_left is not None:  # a new program: worth its compile?
            saving = self._steps_left * overhead_s * (1 / k_b - 1 / self.k)
            if saving < compile_s:
                kept = f"; K={self.k} would save {saving:.2f} s over the run, less than its compile ({compile_s:.2f} s)"
                self.k = k_b
        share = overhead_s / (overhead_s + self.k * step_s)
        return (
            f"K={self.k} steps per compiled call (measured: {step_s * 1e3:.3f} ms per step, "
            f"{overhead_s * 1e3:.3f} ms per call = {share:.1%} overhead at K={self.k}{kept})"
        )

    @staticmethod
    def why_probe() -> str:
        return "timing probe of the automatic K"

    def why(self, k: int) -> str:
        """Why a call of k steps runs: the cause of compiling its program."""
        if self.measuring:
            return self.why_probe()
        if k == self.k and self.slowed:
            return f"the run's K, K_a: a call of {self.slowed[0]} steps took {self.slowed[1]:.1f} s"
        if k == self.k:
            return "the run's K, " + ("set" if self.fixed else "measured" if self.fitted else
                                      "automatic (a run too short for measuring K to pay)" if self.short else
                                      "automatic (epochs too short to measure it)")
        if k == self._remaining:
            return f"last call of the epoch: the {k} steps left after calls of K={self.k}"
        return f"a call of {k} steps"

    def why_slowed(self) -> str:
        """What K_b's program was for, once its first call's time switched K to K_a (`check`)."""
        steps, seconds = self.slowed
        return (f"a short run's K_b, until its first call ({steps} steps) took {seconds:.1f} s; K={self.k} from then "
                "on")


class StepForm:
    """Chooses the form of the run's calls: "scan" (K steps fused in a rolled `lax.scan`),
    "unroll" (programs of U fully unrolled steps, dispatched K/U times) or "step" (the plain
    step, dispatched K times).

    A form set by the user is used as is. Otherwise ("auto") the steps of the run's first call are
    timed in each form before it runs, on a copy of the state that is then dropped (see
    `CompiledCalls._measure_form`): the plain step, then the scan program masked to the same steps,
    twice each, with a host sync after each segment. Each program first runs once untimed (a first
    run pays one-off costs: 39 ms against 2.4 ms for mlp-regression's step). The scan program is
    longer than the segment (K_b's, or the run's K), and its skipped steps and the call itself cost
    time too: a call of it that skips every step is timed (`call_s`) and taken off the segment's
    time, so that the loop's figure is per step, as the plain step's and the K chooser's are. A
    segment holds `form_probe_s` over the first (warm) step's time steps (1 to K_a; see `segment`),
    so a model whose loop body is slow pays that slowness for a step or two, not for a call of K;
    one timing of each decides when they are 3x apart and the scan's took over `DECISIVE_S`. When
    the plain step is faster than the loop, programs of U unrolled steps are timed too and kept
    when faster by `UNROLL_MARGIN` (they hold more temporaries).

    The forms round differently (XLA fuses a loop body and straight-line code apart), so a run's
    numbers depend on the form to about 1e-7: a dispatched form replaces the scan only when it is
    `LOOP_MARGIN` faster in its slowest timing than the scan in its fastest, far outside the
    timings' noise, so that runs of the same seed choose alike. Where a model's loop body is slow
    it is several times slower (convolutions on XLA:CPU: 10-15x); where it is not, the scan's
    per-call cost is made negligible by K. `step_form` pins the form.
    """

    LOOP_MARGIN = 2 / 3  # the plain step's per-step time must be under this fraction of the loop's
    UNROLL_MARGIN = 0.9  # the unrolled program's, under this fraction of the plain step's
    DECISIVE_S = 0.2  # a timed segment this long is not a scheduler's hiccup

    def __init__(self, fixed: str = "auto", auto: AutoSteps = AutoSteps()):
        if fixed not in FORMS:
            raise ConfigError(f"step_form={fixed!r} must be one of {', '.join(FORMS)}")
        self.fixed = fixed != "auto"
        self.form = "scan" if fixed == "auto" else fixed
        self.unroll = auto.unroll
        self.per_step: dict[str, float] = {}  # the fastest seconds per step timed in each form
        self.call_s: float | None = None  # the scan program's time for a call that skips every step
        self._slowest: dict[str, float] = {}  # and the slowest: a form replaces another only if its slowest wins
        self._plan: list[str] = [] if self.fixed else ["step", "step", "scan", "scan"]
        self._probe_s, self._max_steps = auto.form_probe_s, auto.probe_lengths[0]
        self.steps = 1  # steps of a timed segment (the first is one step: it sets the rest)
        self.why = "set" if self.fixed else "not measured yet"

    @property
    def measuring(self) -> bool:
        return bool(self._plan)

    def next_form(self) -> str:
        return self._plan[0]

    def segment(self, probe: str, k: int) -> int:
        """Steps of the next timed segment in `probe`'s form, in a call of k steps: `steps`, or U
        for the unrolled program. The loop's segment holds at least the steps whose time (at the
        plain step's rate) matches the loop's `call_s` (up to K_a), so that what is left once that
        is taken off stands above the timings' noise."""
        if probe == "unroll":
            return min(self.unroll, k)
        n = self.steps
        if probe == "scan" and self.call_s and self.per_step.get("step"):
            n = max(n, min(self._max_steps, round(self.call_s / self.per_step["step"])))
        return min(n, k)

    @property
    def dispatched(self) -> bool:
        """Whether calls are dispatched step by step (or U steps at a time) rather than scanned."""
        return self.form != "scan"

    def keep(self, why: str) -> None:
        """Not measured, for `why`: the scan stays."""
        self._plan, self.why = [], why

    def stop(self) -> None:
        """Measuring is over without a decision (a run too short for it): the current form stays."""
        if self._plan:
            self._plan, self.why = [], "measuring cut short: " + self._figures()

    def record(self, form: str, steps: int, seconds: float) -> str | None:
        """Takes the time of a segment of `steps` steps in `form`; at the end of the plan picks the
        form and returns why (None before)."""
        per_step = seconds / steps
        self.per_step[form] = min(self.per_step.get(form, math.inf), per_step)
        self._slowest[form] = max(self._slowest.get(form, 0.0), per_step)
        self._plan.pop(0)
        if form == "step" and self.steps == 1 and len(self._plan) == 3:  # the first step: sets the segments
            self.steps = max(1, min(self._max_steps, round(self._probe_s / per_step)))
        if form == "scan" and self._plan == ["scan"] and seconds > self.DECISIVE_S:  # one timing is
            ratio = per_step / self.per_step["step"]  # enough when far apart and too long to be noise
            if ratio > 3 or ratio < 1 / 3:
                self._plan = []
        if self._plan:
            return None
        timed, slowest = self.per_step, self._slowest
        if "unroll" not in timed:
            if slowest["step"] < self.LOOP_MARGIN * timed["scan"]:
                self.form, self._plan = "step", ["unroll", "unroll"]  # the plain step wins: try U unrolled
                return None
            self.form = "scan"
        else:
            self.form = "unroll" if slowest["unroll"] < self.UNROLL_MARGIN * timed["step"] else "step"
        self.why = f"measured: {self._figures()}"
        return f"{self.describe()} ({self.why})"

    @property
    def loop_slower(self) -> bool:
        """Whether the loop was timed slower per step than the plain step."""
        return not self.measuring and self.per_step.get("scan", 0.0) > self.per_step.get("step", math.inf)

    def blame(self, ops: str | None) -> str:
        """Adds the step's ops known to be slow in a loop body to `why`; the decision's message."""
        if ops:
            self.why += f"; the step holds {ops}, which XLA:CPU runs slower in a loop body"
        return f"{self.describe()} ({self.why})"

    def _figures(self) -> str:
        names = {"scan": "loop", "step": "plain step", "unroll": f"{self.unroll} unrolled"}
        call = f" + {self._call_ms():.3g} ms per call" if self.call_s is not None else ""
        ms = lambda t: f"{t * 1e3:.3g}" if t >= 1e-6 else "<0.001"  # noqa: E731 - steps lost in the call's noise
        return ", ".join(f"{names[f]} {ms(t)} ms/step" + (call if f == "scan" else "")
                         for f, t in sorted(self.per_step.items(), key=lambda item: item[1]))

    def describe(self) -> str:
        return {"scan": "steps fused in a lax.scan loop",
                "unroll": f"programs of {self.unroll} unrolled steps, dispatched without a host sync",
                "step": "the plain step, dispatched without a host sync"}[self.form]

    def summary(self) -> dict[str, Any]:
        """What summary.json records of the choice."""
        return {"form": self.form, "why": self.why, "unroll": self.unroll,
                "ms_per_step": {f: float(f"{t * 1e3:.5g}") for f, t in self.per_step.items()},  # small stays > 0
                **({"loop_ms_per_call": self._call_ms()} if self.call_s is not None else {})}

    def _call_ms(self) -> float:
        """The loop's fixed time per call in ms, as recorded: the message shows this number, not the
        unrounded one (0.68650 and 0.686504 round to different third digits)."""
        return round(self.call_s * 1e3, 4)


FORM_PROBE = "timing probe of the step's form"  # why a dispatched program compiled while the form is timed


def masked_call(source: "CallSource", train_step: Callable, k: int) -> Callable:
    """`call(state, *args, first, valid)`: steps `first ..` of the feed's call, k of them, of which
    the first `valid` train and the rest are skipped (`lax.cond` on the state's step: the state
    passes through, metrics are zeros). An epoch's shorter last call then runs the program of K
    instead of compiling its own, and the form measurement times a few of a call's steps. The cond
    costs nothing measurable: timed side by side with the plain scan on mlp-regression's model, a
    step took 0.98-0.99x the time."""

    def call(state: TrainState, *args: Any) -> tuple[TrainState, Metrics]:
        *args, first, valid = args
        limit = state.step + valid
        traced: dict[str, Any] = {}  # the metrics' shapes, from tracing the training branch

        def train(state: TrainState, batch: Any) -> tuple[TrainState, Metrics]:
            state, metrics = train_step(state, batch)
            traced["metrics"] = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), metrics)
            return state, metrics

        def skip(state: TrainState, batch: Any) -> tuple[TrainState, Metrics]:
            # `cond` traces the training branch first: its shapes save tracing the whole step again
            metrics = traced.get("metrics") or jax.eval_shape(train_step, state, batch)[1]
            return state, jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), metrics)

        def step(state: TrainState, batch: Any) -> tuple[TrainState, Metrics]:
            return jax.lax.cond(state.step < limit, train, skip, state, batch)

        return fuse_steps(source.make_step(step), k)(state, *args, first)

    return call


class CallSource(Protocol):
    """What `CompiledCalls` needs from a feed: step i of a call, and the call's arguments' shapes."""

    def make_step(self, train_step: Callable) -> Callable[..., tuple[TrainState, Metrics]]: ...

    def abstract_args(self, k: int) -> tuple[Any, ...]: ...


class Compiling:
    """A program compiling in the background: callable like the compiled program, whose first use
    waits for it (that wait, not the compile, is added to `calls.compile_s`); compile errors are
    raised there."""

    def __init__(self, future: Future, calls: "CompiledCalls"):
        self._future, self._calls = future, calls

    def result(self) -> Callable:
        if not self._future.done():
            t0 = time.perf_counter()
            self._future.result()
            self._calls.compile_s += time.perf_counter() - t0
        return self._future.result()

    def __call__(self, *args: Any) -> Any:
        return self.result()(*args)

    def __getattr__(self, name: str) -> Any:  # cost_analysis, memory_analysis, ...
        return getattr(self.result(), name)


class CompiledCalls:
    """The compiled K-step calls of a run, compiled ahead of time on first use, with donation.

    `calls(k, state, args)` runs one call of k steps in the form `form` chose and returns
    `(state, metrics)` with each metric stacked to shape (k,). While the form or K is measured,
    calls (or segments of them) are timed (a host sync); afterwards calls are asynchronous.

    Args:
      source: the feed, which builds the function of a call and describes its arguments.
      train_step: the pure `train_step(state, batch) -> (state, metrics)`.
      state: a train state (or its shapes) to compile for.
      chooser: the K chooser.
      form: the form chooser (default: the scan, as set).
      rewrites: what of the loss was rewritten for XLA:CPU (`Program.rewrites`), for the reports.
      loss_clean: the loss is known to hold no loop-slow op (`Program.loss_clean`): no step is traced
        to look for one.
      layout: the mesh and shardings of the run (the state is split as `layout.state_shardings`).
      log: where the K chooser's decision is reported.
      state_shardings: `layout.state_shardings(state)`, when the caller has it already.
    """

    def __init__(self, source: CallSource, train_step: Callable, state: TrainState, chooser: StepsPerCall,
                 layout: Layout, log: Callable[[str], None] = lambda message: None, state_shardings: Any = None,
                 form: StepForm | None = None, rewrites: str | None = None, loss_clean: bool = False):
        self.source, self.train_step, self.chooser, self.layout, self.log = source, train_step, chooser, layout, log
        self.form = form if form is not None else StepForm("scan")
        self._dispatched: dict[tuple[int, Any], Callable] = {}  # (unrolled steps, call arguments) -> program
        self._treedef = jax.tree.structure(state)
        self.rewrites, self.loss_clean = rewrites, loss_clean
        self._indices: dict[int, jax.Array] = {}
        self.state_shardings = state_shardings if state_shardings is not None else layout.state_shardings(state)
        self._state_shapes = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
                                          self.state_shardings)
        self._compiled: dict[int, Callable] = {}
        self.compile_s = 0.0
        self.memory: dict[str, int] | None = None  # of the first call compiled (`memory.compiled_memory`)
        self.compiles: list[dict[str, Any]] = []  # every program compiled: what, seconds (training: k, why, calls)
        self._entries: dict[Any, dict[str, Any]] = {}  # a training program's key -> its entry in `compiles`
        self._keys: dict[tuple[int, int], tuple[int, Any]] = {}  # (unrolled, k) -> `_dispatch_key`
        self._background: ThreadPoolExecutor | None = None  # one thread: the main thread uses the other core
        self._lock = threading.Lock()
        self._pending: list[Compiling] = []
        self.dispatch_s = 0.0  # host seconds handing calls to the device (compilation not included)
        self.longest = 0  # the most steps a call of the run ran
        self.wait_s = 0.0  # host seconds waiting for calls to finish: the device computing
        self.overhead = CallOverhead()  # the profile's probe of a call's fixed cost, shared by whoever calls these

    @property
    def k(self) -> int:
        """The K in use (the measured choice once measuring is over)."""
        return self.chooser.k

    def next_length(self, remaining: int) -> int:
        return self.chooser.next_length(remaining)

    def compile(self, fn: Callable, *args: Any, donate: bool = False, in_shardings: Any = None,
                out_shardings: Any = None, background: bool = False, key: Any = None, **record: Any) -> Callable:
        """Compiles `fn` for `args` ahead of time (donating the first argument if asked); inputs
        are placed as `args` are unless `in_shardings` says, outputs replicated unless
        `out_shardings` says. The seconds it takes are added to `compile_s`; `record` joins its
        entry in `compiles`. A training program passes its `key`: its entry then counts the run's
        calls that ran it (`calls`). With `background`, it compiles in a background thread and a
        `Compiling` is returned at once (only a wait for it counts in `compile_s`)."""
        in_shardings = in_shardings if in_shardings is not None else _shardings_of(args)
        out_shardings = out_shardings if out_shardings is not None else self.layout.replicated
        entry = {"what": getattr(fn, "__name__", "program"), "seconds": 0.0, **record}
        if key is not None:
            entry["calls"] = 0
            self._entries[key] = entry

        def build() -> Callable:
            t0, hits = time.perf_counter(), cache_hits()
            jitted = jax.jit(fn, donate_argnums=(0,) if donate else (), in_shardings=in_shardings,
                             out_shardings=out_shardings)
            lowered = jitted.lower(*args)
            announce("lowered", what=entry["what"])
            with trimming_heap:  # what the compiler's threads free, back to the system as they go
                compiled = lowered.compile()
            release_free_heap()  # and what they freed at the end
            entry["seconds"] = time.perf_counter() - t0
            entry["temp_bytes"] = (compiled_memory(compiled) or {}).get("temp_bytes")
            entry["cached"] = cache_hits() > hits  # loaded from the persistent cache, not compiled
            with self._lock:
                self.compiles.append(entry)
            return compiled

        if background:
            if self._background is None:
                self._background = ThreadPoolExecutor(1, thread_name_prefix="jaxtrain-compile")
            self._pending.append(Compiling(self._background.submit(build), self))
            return self._pending[-1]
        t0 = time.perf_counter()
        compiled = build()
        self.compile_s += time.perf_counter() - t0
        return compiled

    def finish_compiles(self) -> None:
        """Waits for every background compile (the wait counts in `compile_s`)."""
        for pending in self._pending:
            pending.result()
        self._pending = []

    def close(self) -> None:
        """Lets background compiles finish and ends their thread."""
        if self._background is not None:
            self._background.shutdown(wait=True)

    def get(self, k: int) -> Callable:
        """The compiled scan call of k steps (compiled now if it is new): `call(state, *args, first,
        valid)` runs `valid` of its k steps from step `first` of the call's arguments (see
        `masked_call`); a longer program when one serves (`program_length`). With a dispatched
        form it compiles that form's program instead (and returns it)."""
        if self.form.dispatched and not self.form.measuring:
            program = self._program(self.form.unroll if self.form.form == "unroll" else 1, k)
            if self.form.form == "unroll" and k % self.form.unroll:  # the remainder's steps: beside it
                self._program(1, k, background=True)
            return program
        if self.form.measuring and not self._dispatched and self.chooser.brief and self._slow_ops(k) is None:
            self.form.keep("a run too short to repay compiling another form, and no op of its step known to be "
                           "slow in a loop body")
        if self.form.measuring and not self._dispatched:  # the plain step, timed first: beside the scan
            self._program(1, k, background=True)
        k = self.program_length(k)
        if k not in self._compiled:
            self._compiled[k] = self._compile_call(k)
            for other in {self.program_length(n) for n in self.chooser.planned()}:  # the K chooser's other
                if other not in self._compiled:  # timed length, when it needs a program: in the background
                    self._compiled[other] = self._compile_call(other, background=True)
        if isinstance(self._compiled[k], Compiling):
            self._compiled[k] = self._compiled[k].result()
        if self.memory is None:
            self.memory = compiled_memory(self._compiled[k])
        return self._compiled[k]

    def _program(self, unrolled: int, k: int, background: bool = False) -> Callable:
        """The dispatched program of `unrolled` steps over the arguments of a call of k steps:
        `program(leaves, *args, first)` runs steps `first .. first+unrolled-1` on the train state
        given as its list of leaves (metrics of shape (unrolled,)); compiled now (or in the
        background) if it is new. The state travels as a flat list between a call's dispatches:
        flattening its pytree (NNX states are Python-level nodes) would cost more than the dispatch."""
        key = self._dispatch_key(unrolled, k)
        if key not in self._dispatched:
            args = self.source.abstract_args(k)
            steps, treedef = fuse_steps(self.source.make_step(self.train_step), unrolled, unroll=True), self._treedef

            def fn(leaves: list[jax.Array], *args: Any) -> tuple[list[jax.Array], Metrics]:
                state, metrics = steps(jax.tree.unflatten(treedef, leaves), *args)
                return jax.tree.leaves(state), metrics

            first = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.layout.replicated)
            self._dispatched[key] = self.compile(
                fn, jax.tree.leaves(self._state_shapes), *args, first, donate=True, background=background,
                in_shardings=(jax.tree.leaves(self.state_shardings), *_shardings_of(args), self.layout.replicated),
                out_shardings=(jax.tree.leaves(self.state_shardings), self.layout.replicated),
                what="train step" if unrolled == 1 else "train steps, unrolled", k=unrolled,
                why=FORM_PROBE if self.form.measuring else f"the run's form ({self.form.why})",
                key=("dispatch", key))
        program = self._dispatched[key]
        if isinstance(program, Compiling) and not background:
            program = self._dispatched[key] = program.result()
        if self.memory is None and not background:
            self.memory = compiled_memory(program)
        return program

    def _slow_ops(self, k: int) -> str | None:
        """The ops of the step known to be slow in a loop body (`slow_ops.loop_slow_ops`)."""
        if self.loss_clean:  # the program's trace of the loss found none (or rewrote them): a step's trace saved
            return None
        step_at, args = self.source.make_step(self.train_step), self.source.abstract_args(k)
        return loop_slow_ops(step_at, self._state_shapes, *args, np.int32(0))

    def _index(self, i: int) -> jax.Array:
        """Step i of a call as an argument on the devices (made once: a host scalar is sent each call)."""
        if i not in self._indices:
            self._indices[i] = jax.device_put(np.int32(i), self.layout.replicated)
        return self._indices[i]

    def _compile_call(self, k: int, background: bool = False) -> Callable:
        fn, args = masked_call(self.source, self.train_step, k), self.source.abstract_args(k)
        index = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.layout.replicated)
        return self.compile(fn, self._state_shapes, *args, index, index, donate=True, background=background,
                            in_shardings=(self.state_shardings, *_shardings_of(args), *[self.layout.replicated] * 2),
                            out_shardings=(self.state_shardings, self.layout.replicated),
                            what="train call", k=k, why=self.chooser.why(k), key=("call", k))

    def _dispatch_key(self, unrolled: int, k: int) -> tuple[int, Any]:
        """The key of the dispatched program of `unrolled` steps over a call of k steps' arguments
        (a feed's arguments for k steps keep their shapes through the run: worked out once, not at
        every dispatch of a step)."""
        if (unrolled, k) not in self._keys:
            shapes = tuple((x.shape, x.dtype) for x in jax.tree.leaves(self.source.abstract_args(k)))
            self._keys[unrolled, k] = (unrolled, shapes)
        return self._keys[unrolled, k]

    def _count(self, key: Any) -> None:
        """One more call of the run ran the training program `key` (a program compiled to time the
        form, whose timed segments trained a copy of the state, says that the run's calls ran it)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry["calls"] += 1
        if entry["why"] == FORM_PROBE:
            entry["why"] += f", then the run's form ({self.form.why})"

    def program_length(self, k: int) -> int:
        """The program a call of k steps runs, when the feed's arguments do not depend on the
        call's length (data held on the device), so that one program serves the run:

        - while the K chooser measures, the longest timed length's (K_b): the timed calls of K_a run
          it with their extra steps skipped, so measuring K compiles one program, not two;
        - then K's for a shorter call (an epoch's last, or the rest of the first epoch after the
          timed calls);
        - a K shorter than the programs compiled (the chooser picked K_a) runs the shortest longer
          one, masked, while its own compiles in the background (in a short run, for good)."""
        if self.chooser.measuring:
            probe = max(self.chooser.planned(), default=k)
            return probe if k < probe and self._same_args(k, probe) else k
        K = self.chooser.k
        length = K if k < K and self._same_args(k, K) else k
        if not self._ready(length):
            longer = [n for n in self._compiled if n > length and self._ready(n) and self._same_args(length, n)]
            if longer:
                if length not in self._compiled and not self.chooser.short:  # a short run: not worth a compile
                    self._compiled[length] = self._compile_call(length, background=True)
                return min(longer)
        return length

    def _ready(self, k: int) -> bool:
        """Whether the program of k steps is compiled (not absent, nor still compiling)."""
        program = self._compiled.get(k)
        return program is not None and not (isinstance(program, Compiling) and not program._future.done())

    def _same_args(self, k: int, K: int) -> bool:
        shapes = lambda n: [(x.shape, x.dtype) for x in jax.tree.leaves(self.source.abstract_args(n))]  # noqa: E731
        return shapes(k) == shapes(K)

    def __call__(self, k: int, state: TrainState, args: tuple[Any, ...]) -> tuple[TrainState, Metrics]:
        if self.form.measuring:
            self._measure_form(k, state, args)
        self.chooser.ran(k)
        self.longest = max(self.longest, k)
        if self.form.dispatched:  # its time counts as computing: XLA:CPU runs a program on the
            t0 = time.perf_counter()  # thread that dispatches it, once the one before is done
            state, metrics = self._dispatch(self.form.form, k, state, args, 0, k)
            self.wait_s += time.perf_counter() - t0
            unrolled = self.form.unroll if self.form.form == "unroll" else 1
            self._count(("dispatch", self._dispatch_key(unrolled, k)))
            if unrolled > 1 and k % unrolled:  # the remainder's steps ran the plain step
                self._count(("dispatch", self._dispatch_key(1, k)))
            return state, metrics
        length = self.program_length(k)
        fn = self.get(length)
        self._count(("call", length))
        if self.chooser.measuring:  # timed calls run with nothing compiling beside them
            self.finish_compiles()
        t0 = time.perf_counter()
        state, metrics = fn(state, *args, np.int32(0), np.int32(k))
        if length != k:  # the steps the call ran; the rest of the program's were skipped
            metrics = jax.tree.map(lambda m: m[:k], metrics)
        self.dispatch_s += time.perf_counter() - t0
        if self.chooser.checking:  # a short run's first full call: are its steps slow?
            self.wait(metrics)
            if message := self.chooser.check(k, time.perf_counter() - t0):
                self.log(message)
                if ("call", length) in self._entries:  # its program was compiled as the run's K: no longer
                    self._entries[("call", length)]["why"] = self.chooser.why_slowed()
        if self.chooser.measuring:  # the first calls of the run are timed one by one
            self.wait(metrics)
            compile_s = max((c["seconds"] for c in self.compiles if c.get("what") == "train call"), default=0.0)
            if message := self.chooser.record(k, time.perf_counter() - t0, compile_s):
                self.log(message)
                probe = self._entries.get(("call", self.k))
                if probe is not None and probe["why"] == self.chooser.why_probe():  # a timed length became K
                    probe["why"] += f", then {self.chooser.why(self.k)}"
        return state, metrics

    def _dispatch(self, form: str, n: int, state: TrainState, args: tuple[Any, ...], first: int,
                  k: int) -> tuple[TrainState, Metrics]:
        """Steps `first .. first+n-1` of a call of k steps in `form`, queued without a host sync;
        metrics stacked to shape (n,)."""
        if form == "scan":
            state, metrics = self.get(self.program_length(k))(state, *args, np.int32(first), np.int32(n))
            return state, jax.tree.map(lambda m: m[:n], metrics)
        parts, end, leaves = [], first + n, self._treedef.flatten_up_to(state)
        unrolled = self.form.unroll if form == "unroll" else 1
        while first < end:
            u = unrolled if end - first >= unrolled else 1
            leaves, metrics = self._program(u, k)(leaves, *args, self._index(first))
            parts.append(metrics)
            first += u
        metrics = parts[0] if len(parts) == 1 else jax.tree.map(lambda *m: jnp.concatenate(m), *parts)
        return jax.tree.unflatten(self._treedef, leaves), metrics

    def _measure_form(self, k: int, state: TrainState, args: tuple[Any, ...]) -> None:
        """Chooses the form before the run's first call of k steps: timed segments of that call in
        each form (see `StepForm`) run on a copy of the state, which is then dropped, so training
        starts from the same state in the chosen form: results never depend on the timings that
        chose it, and a resumed run (which keeps the form) continues bit for bit."""
        form = self.form
        self.get(k)  # the scan program, and the plain step beside it
        if not form.measuring:  # a short run without loop-slow ops (see `get`)
            return
        scratch = jax.tree.map(lambda x: x.copy(), state)  # the timed programs donate it
        self.wait((scratch, args))  # the timings are the programs' own, not the inputs' arrival
        warm: set[str] = set()

        def run(probe: str, n: int) -> float:  # seconds of a segment of n steps in `probe`'s form
            nonlocal scratch
            t0 = time.perf_counter()
            scratch, metrics = self._dispatch(probe, n, scratch, args, 0, k)
            self.wait((scratch, metrics))
            return time.perf_counter() - t0

        while form.measuring:
            probe = form.next_form()
            unrolled = form.unroll if probe == "unroll" else 1
            n = form.segment(probe, k)
            if n < unrolled:  # calls too short to hold the unrolled program's steps: not compiled
                form.stop()
                break
            if probe != "scan":
                self._program(unrolled, k)
            self.finish_compiles()  # timed segments run with nothing compiling beside them
            if probe not in warm:  # a program's first run pays one-off costs: untimed
                warm.add(probe)
                run(probe, unrolled)  # the scan: one step, then skipped ones (both branches run)
            if probe == "scan" and form.call_s is None:  # the call and its skipped steps, without a step
                form.call_s = min(run("scan", 0) for _ in range(2))
                n = form.segment(probe, k)
            seconds = run(probe, n)
            if probe == "scan":
                seconds = max(seconds - form.call_s, 1e-9)  # steps too cheap to tell from noise: ~0
            if message := form.record(probe, n, seconds):
                if form.loop_slower:  # say which of the step's ops a loop body makes slow
                    message = form.blame(self._slow_ops(k))
                self.log(message)
        del scratch
        if form.dispatched:  # K need not be measured: a dispatched call's cost is its steps'
            self.chooser.stop()

    @property
    def measuring(self) -> bool:
        """Whether calls are still timed (the form or K being measured)."""
        return self.form.measuring or self.chooser.measuring

    def wait(self, outputs: Any) -> None:
        """Blocks until `outputs` of a call are computed; the seconds are added to `wait_s`."""
        t0 = time.perf_counter()
        jax.block_until_ready(outputs)
        self.wait_s += time.perf_counter() - t0

    def flops_per_step(self, k: int | None = None, grad_accum: int = 1) -> float | None:
        """XLA's FLOP count of one optimizer step, from the compiled call of k steps (see `flops`);
        with k None, from a call already compiled (the run's K when it is, else the longest), so
        that asking compiles nothing. With a dispatched form, from its program (k is not used)."""
        accum = grad_accum if loop_body_counted_once() else 1  # the micro-batches' scan
        if self.form.dispatched and not self.form.measuring and self._dispatched:
            unrolled = self.form.unroll if self.form.form == "unroll" else 1
            ready = [p for (u, _), p in self._dispatched.items() if u == unrolled and not isinstance(p, Compiling)]
            flops = _flops(ready[0]) if ready else None
            return None if flops is None else flops * accum / unrolled
        if k is None:
            ready = [n for n in self._compiled if self._ready(n)]
            if not ready:
                return None
            k = self.k if self.k in ready else max(ready)
        flops = self.flops(k)
        if flops is None:
            return None
        return flops * grad_accum if loop_body_counted_once() else flops / k

    def flops(self, k: int) -> float | None:
        """XLA's FLOP count of the compiled call of k steps (`cost_analysis`; a loop's body counts
        once), or None when the backend does not report it."""
        return _flops(self.get(k))


def _flops(program: Any) -> float | None:
    """XLA's FLOP count of a compiled program, or None when the backend does not report it."""
    try:
        cost = program.cost_analysis()
    except Exception:  # noqa: BLE001 - optional backend feature
        return None
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"]) if cost and cost.get("flops", -1) > 0 else None


PROBE_REPEATS = 15  # timed trivial calls of `CallOverhead`; the median counts


class CallOverhead:
    """What a call costs whatever it computes: (seconds to hand over, seconds round trip) of a trivial
    jitted call that takes every buffer of a state, medians of `PROBE_REPEATS` calls; for the profile
    of a run whose K was not measured on its own calls.

    `prepare` compiles it on a thread beside the training, with XLA's counting rule
    (`loop_body_counted_once`); `measure` times it once. `CompiledCalls` hold one, so the members of
    a population, whose calls are one, share one probe and one measurement instead of one each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._probe: Any = None
        self._measured: tuple[float, float] | None = None

    def prepare(self, state: Any | None) -> None:
        """Starts the thread, once: XLA's counting rule, and the probe for `state`'s shapes (None: no probe)."""
        with self._lock:
            if self._thread is not None:
                return
            shapes = None if state is None else jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
            self._thread = threading.Thread(target=self._compile, args=(shapes,), name="jaxtrain-profile-prepare",
                                            daemon=True)
            self._thread.start()

    def _compile(self, shapes: Any) -> None:
        loop_body_counted_once()
        if shapes is not None:
            try:
                self._probe = _overhead_probe().lower(shapes).compile()
            except Exception:  # noqa: BLE001 - `measure` compiles it instead
                self._probe = None

    def join(self) -> None:
        """Waits for what `prepare` started, if anything."""
        if self._thread is not None:
            self._thread.join()

    def measure(self, state: Any) -> tuple[float, float]:
        """The figures, timed on `state`'s buffers the first time they are asked for."""
        self.join()
        with self._lock:
            if self._measured is None:
                self._measured = _time_probe(state, self._probe)
            return self._measured


def _overhead_probe() -> Any:
    """A trivial jitted function that takes every buffer of its argument."""
    return jax.jit(lambda s: jnp.zeros((), jnp.float32), keep_unused=True)


def _time_probe(state: Any, compiled: Any = None) -> tuple[float, float]:
    """(seconds to hand over, seconds round trip) of the probe on `state`: medians of PROBE_REPEATS
    calls. `compiled`: the probe compiled ahead for `state`'s shapes, if any."""
    probe = compiled if compiled is not None else _overhead_probe()
    try:
        jax.block_until_ready(probe(state))
    except (TypeError, ValueError):  # an ahead-of-time program that does not take these buffers
        probe = _overhead_probe()
        jax.block_until_ready(probe(state))
    handed, round_trip = [], []
    for _ in range(PROBE_REPEATS):
        t0 = time.perf_counter()
        out = probe(state)
        t1 = time.perf_counter()
        jax.block_until_ready(out)
        handed.append(t1 - t0)
        round_trip.append(time.perf_counter() - t0)
    return statistics.median(handed), statistics.median(round_trip)


@functools.cache
def loop_body_counted_once() -> bool:
    """Whether XLA's cost analysis counts a `lax.scan` body once rather than once per iteration
    (measured once per process on a small matmul chain)."""
    n, length = 64, 7

    def chain(x: jax.Array) -> jax.Array:
        return jax.lax.scan(lambda c, _: (c @ x, None), x, None, length=length)[0]  # (N, N)

    cost = jax.jit(chain).lower(jax.ShapeDtypeStruct((n, n), jnp.float32)).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float((cost or {}).get("flops", 0.0))
    return flops < 0.5 * length * 2 * n**3
