"""Compiled calls: one ahead-of-time compiled program per call length K, and the choice of K.

A call runs K optimizer steps fused with `lax.scan` (see `step.py`); the feed says what the call
takes besides the train state (device data and a permutation, or stacked streamed batches).
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
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain._src.errors import ConfigError
from jaxtrain._src.memory import compiled_memory, release_free_heap
from jaxtrain._src.moments import announce
from jaxtrain._src.sharding import Layout
from jaxtrain._src.state import TrainState
from jaxtrain._src.step import Metrics


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
    """

    probe_lengths: tuple[int, int] = (16, 128)
    repeats: int = 3
    overhead_target: float = 0.02
    short_run_calls: int = 32
    slow_call_s: float = 1.0

    def __post_init__(self) -> None:
        k_a, k_b = self.probe_lengths
        if not (isinstance(k_a, int) and isinstance(k_b, int) and 1 <= k_a < k_b):
            raise ConfigError(f"AutoSteps.probe_lengths={self.probe_lengths} must be two integers 1 <= K_a < K_b")
        if self.repeats < 1 or not self.overhead_target > 0 or self.short_run_calls < 0:
            raise ConfigError("AutoSteps.repeats must be >= 1, overhead_target > 0 and short_run_calls >= 0")


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
        self.short = not fixed and total_steps is not None and total_steps < auto.short_run_calls * k_b
        self.k = min(fixed, steps_per_epoch) if fixed else k_b if self.short else k_a
        self.fitted: tuple[float, float] | None = None  # (seconds per step, per call) once measured
        can_measure = (not fixed and not self.short and k_a < k_b
                       and auto.repeats * (k_a + k_b) <= steps_per_epoch)
        self._plan = [k_a] * auto.repeats + [k_b] * auto.repeats if can_measure else []
        self._times: dict[int, list[float]] = {}
        self._steps_per_epoch = steps_per_epoch
        self._target = auto.overhead_target
        self._remaining = steps_per_epoch  # steps left in the epoch at the last `next_length`
        self._steps_left = total_steps  # steps of the run not yet timed (None: unknown)
        self._k_a, self._checked, self._slow_s = k_a, False, auto.slow_call_s

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

    @property
    def checking(self) -> bool:
        """Whether the next call of a short run's K_b is timed (once), in case its steps are slow."""
        return self.short and self._k_a < self.k and not self._checked

    def check(self, k: int, seconds: float) -> str | None:
        """Takes the time of a short run's first full call of K_b: a call slower than
        `slow_call_s` means steps so slow that K_a's overhead is negligible too, and K_a keeps
        progress and stop signals responsive (its calls run K_b's program, masked: no compile)."""
        self._checked = True
        if k < self.k or seconds <= self._slow_s:
            return None
        self.k = self._k_a
        return (f"K={self.k} steps per compiled call (a call of {k} steps took {seconds:.1f} s: steps this slow "
                f"leave a call's overhead negligible at K={self.k})")

    def record(self, k: int, seconds: float, compile_s: float = 0.0) -> str | None:
        """Takes the time of a measured call; after the last one, picks K and describes why.
        `compile_s`: what compiling one more program would cost (e.g. the last one's time)."""
        self._times.setdefault(k, []).append(seconds)
        self._plan.pop(0)
        self._steps_left = None if self._steps_left is None else self._steps_left - k
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

    def why(self, k: int) -> str:
        """Why a call of k steps runs: the cause of compiling its program."""
        if self.measuring:
            return "timing probe of the automatic K"
        if k == self.k:
            return "the run's K, " + ("set" if self.fixed else "measured" if self.fitted else
                                      "automatic (a run too short for measuring K to pay)" if self.short else
                                      "automatic (epochs too short to measure it)")
        if k == self._remaining:
            return f"last call of the epoch: the {k} steps left after calls of K={self.k}"
        return f"a call of {k} steps"


def masked_call(source: "CallSource", train_step: Callable, k: int) -> Callable:
    """`call(state, *args, valid)`: the feed's call of k steps, of which the first `valid` train
    and the rest are skipped (`lax.cond` on the state's step: the state passes through, metrics
    are zeros). An epoch's shorter last call then runs the program of K instead of compiling its
    own. The cond costs nothing measurable: timed side by side with the plain scan on
    mlp-regression's model, a step took 0.98-0.99x the time."""

    def call(state: TrainState, *args: Any) -> tuple[TrainState, Metrics]:
        *args, valid = args
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

        return source.make_call(step, k)(state, *args)

    return call


class CallSource(Protocol):
    """What `CompiledCalls` needs from a feed: the function of one call and its arguments' shapes."""

    def make_call(self, train_step: Callable, k: int) -> Callable[..., tuple[TrainState, Metrics]]: ...

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

    `calls(k, state, args)` runs one call of k steps and returns `(state, metrics)` with each
    metric stacked to shape (k,). While the K chooser is measuring, each call is timed (a host
    sync); afterwards calls are asynchronous.

    Args:
      source: the feed, which builds the function of a call and describes its arguments.
      train_step: the pure `train_step(state, batch) -> (state, metrics)`.
      state: a train state (or its shapes) to compile for.
      chooser: the K chooser.
      layout: the mesh and shardings of the run (the state is split as `layout.state_shardings`).
      log: where the K chooser's decision is reported.
      state_shardings: `layout.state_shardings(state)`, when the caller has it already.
    """

    def __init__(self, source: CallSource, train_step: Callable, state: TrainState, chooser: StepsPerCall,
                 layout: Layout, log: Callable[[str], None] = lambda message: None, state_shardings: Any = None):
        self.source, self.train_step, self.chooser, self.layout, self.log = source, train_step, chooser, layout, log
        self.state_shardings = state_shardings if state_shardings is not None else layout.state_shardings(state)
        self._state_shapes = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
                                          self.state_shardings)
        self._compiled: dict[int, Callable] = {}
        self.compile_s = 0.0
        self.memory: dict[str, int] | None = None  # of the first call compiled (`memory.compiled_memory`)
        self.compiles: list[dict[str, Any]] = []  # every program compiled: what, seconds (K calls: k, why)
        self._background: ThreadPoolExecutor | None = None  # one thread: the main thread uses the other core
        self._lock = threading.Lock()
        self._pending: list[Compiling] = []
        self.dispatch_s = 0.0  # host seconds handing calls to the device (compilation not included)
        self.wait_s = 0.0  # host seconds waiting for calls to finish: the device computing

    @property
    def k(self) -> int:
        """The K in use (the measured choice once measuring is over)."""
        return self.chooser.k

    def next_length(self, remaining: int) -> int:
        return self.chooser.next_length(remaining)

    def compile(self, fn: Callable, *args: Any, donate: bool = False, in_shardings: Any = None,
                out_shardings: Any = None, background: bool = False, **record: Any) -> Callable:
        """Compiles `fn` for `args` ahead of time (donating the first argument if asked); inputs
        are placed as `args` are unless `in_shardings` says, outputs replicated unless
        `out_shardings` says. The seconds it takes are added to `compile_s`; `record` joins its
        entry in `compiles`. With `background`, it compiles in a background thread and a
        `Compiling` is returned at once (only a wait for it counts in `compile_s`)."""
        in_shardings = in_shardings if in_shardings is not None else _shardings_of(args)
        out_shardings = out_shardings if out_shardings is not None else self.layout.replicated
        entry = {"what": getattr(fn, "__name__", "program"), "seconds": 0.0, **record}

        def build() -> Callable:
            t0 = time.perf_counter()
            jitted = jax.jit(fn, donate_argnums=(0,) if donate else (), in_shardings=in_shardings,
                             out_shardings=out_shardings)
            lowered = jitted.lower(*args)
            announce("lowered", what=entry["what"])
            compiled = lowered.compile()
            release_free_heap()  # the compiler's freed memory, back to the system
            entry["seconds"] = time.perf_counter() - t0
            entry["temp_bytes"] = (compiled_memory(compiled) or {}).get("temp_bytes")
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
        """The compiled call of k steps (compiled now if it is new): `call(state, *args, valid)`
        runs the first `valid` of its k steps (see `masked_call`); a longer program when one serves
        (`program_length`)."""
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

    def _compile_call(self, k: int, background: bool = False) -> Callable:
        fn, args = masked_call(self.source, self.train_step, k), self.source.abstract_args(k)
        valid = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.layout.replicated)
        return self.compile(fn, self._state_shapes, *args, valid, donate=True, background=background,
                            in_shardings=(self.state_shardings, *_shardings_of(args), self.layout.replicated),
                            out_shardings=(self.state_shardings, self.layout.replicated),
                            what="train call", k=k, why=self.chooser.why(k))

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
        length = self.program_length(k)
        fn = self.get(length)
        if self.chooser.measuring:  # timed calls run with nothing compiling beside them
            self.finish_compiles()
        t0 = time.perf_counter()
        state, metrics = fn(state, *args, np.int32(k))
        if length != k:  # the steps the call ran; the rest of the program's were skipped
            metrics = jax.tree.map(lambda m: m[:k], metrics)
        self.dispatch_s += time.perf_counter() - t0
        if self.chooser.checking:  # a short run's first full call: are its steps slow?
            self.wait(metrics)
            if message := self.chooser.check(k, time.perf_counter() - t0):
                self.log(message)
        if self.chooser.measuring:  # the first calls of the run are timed one by one
            self.wait(metrics)
            compile_s = max((c["seconds"] for c in self.compiles if c.get("what") == "train call"), default=0.0)
            if message := self.chooser.record(k, time.perf_counter() - t0, compile_s):
                self.log(message)
        return state, metrics

    def wait(self, outputs: Any) -> None:
        """Blocks until `outputs` of a call are computed; the seconds are added to `wait_s`."""
        t0 = time.perf_counter()
        jax.block_until_ready(outputs)
        self.wait_s += time.perf_counter() - t0

    def flops_per_step(self, k: int | None = None, grad_accum: int = 1) -> float | None:
        """XLA's FLOP count of one optimizer step, from the compiled call of k steps (see `flops`);
        with k None, from a call already compiled (the run's K when it is, else the longest), so
        that asking compiles nothing."""
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
        try:
            cost = self.get(k).cost_analysis()
        except Exception:  # noqa: BLE001 - optional backend feature
            return None
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        return float(cost["flops"]) if cost and cost.get("flops", -1) > 0 else None


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
