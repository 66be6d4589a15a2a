"""Compiling a run's programs: ahead of time, with the run's shardings, timed, some in the background.

`Compiler` is the run's compile service: every program a run compiles (the training calls,
evaluation, checkpoint checksums, self-play) goes through `compile`, which places inputs and outputs
by the run's `Layout`, donates the state where asked, records each program in `compiles` (what,
seconds, temporaries, whether the persistent cache served it) and adds its seconds to `compile_s`,
so that compile time stays out of epoch times. Programs not needed at once are traced and lowered on
the calling thread, then compile in one background thread while the main thread compiles or trains
(`Compiling`); the lowering and the time the main thread waits for them count. A thread that needs a
program the background thread has not started compiles it itself.

`TrainPrograms` is the cache of the training programs: the scan call of k steps (`masked_call`:
steps past `valid` skipped, so one program serves shorter calls) and the dispatched programs of U
steps, each compiled once. Which program a call runs is `calls.CompiledCalls`' choice.
"""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain._src.compile_cache import cache_hits
from jaxtrain._src.form_memory import fingerprint as fingerprint_of
from jaxtrain._src.memory import compiled_memory, release_free_heap, trimming_heap
from jaxtrain._src.moments import announce
from jaxtrain._src.sharding import Layout
from jaxtrain._src.slow_ops import loop_slow_ops
from jaxtrain._src.state import TrainState
from jaxtrain._src.step import Metrics, fuse_steps

__all__ = ["CallSource", "Compiler", "Compiling", "TrainPrograms", "masked_call", "shapes_of", "shardings_of"]


def shapes_of(tree: Any) -> Any:
    """Abstract shapes (with shardings) of a pytree of arrays, for ahead-of-time compilation."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


def shardings_of(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The sharding of every array (or abstract array) in `args`; None (the compiler's choice)
    for host values such as NumPy scalars."""
    return jax.tree.map(lambda x: getattr(x, "sharding", None), args)


def masked_call(source: "CallSource", train_step: Callable, k: int) -> Callable:
    """`call(state, *args, first, valid)`: steps `first ..` of the feed's call, k of them, of which
    the first `valid` train and the rest are skipped (`lax.cond` on the state's step: the state
    passes through, metrics are zeros). An epoch's shorter last call then runs the program of K
    instead of compiling its own, and the form measurement times a few of a call's steps. The cond
    costs nothing measurable: timed side by side with the plain scan on mlp-regression's model, a
    step took 0.98-0.99x the time."""

    def call(state: TrainState, *args: Any) -> tuple[TrainState, Metrics]:
        *inputs, first, valid = args
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

        return fuse_steps(source.make_step(step), k)(state, *inputs, first)

    return call


class CallSource(Protocol):
    """What `CompiledCalls` needs from a feed: step i of a call, and the call's arguments' shapes."""

    def make_step(self, train_step: Callable) -> Callable[..., tuple[TrainState, Metrics]]: ...

    def abstract_args(self, k: int) -> tuple[Any, ...]: ...


class _Work:
    """Background work: `fn`'s outcome into `future`, run once by whichever thread claims it first (the
    compile thread in its turn, or a thread that needs it before that)."""

    def __init__(self, fn: Callable[[], Any]):
        self._fn: list[Callable[[], Any]] = [fn]  # emptied when it runs: what it holds (a lowered program) is freed
        self.future: Future = Future()
        self._claimed = threading.Lock()

    def run(self) -> None:
        """Runs the work here unless another thread has claimed it."""
        if not self._claimed.acquire(blocking=False):
            return
        try:
            self.future.set_result(self._fn.pop()())
        except BaseException as e:  # noqa: BLE001 - raised to whoever asks for the outcome
            self.future.set_exception(e)

    def cancel(self, why: str) -> None:
        """Fails the work with `why` unless a thread has claimed it."""
        if self._claimed.acquire(blocking=False):
            self._fn.clear()
            self.future.set_exception(RuntimeError(why))


class Compiling:
    """A program compiling in the background: callable like the compiled program, whose first use
    waits for it, or compiles it on that thread if the compile thread had not started it (the wait or
    the compile, not the background compile, is added to its compiler's `compile_s`); compile errors
    are raised there."""

    def __init__(self, work: _Work, compiler: Compiler):
        self._work, self._compiler = work, compiler

    def result(self) -> Callable:
        if not self._work.future.done():
            t0 = time.perf_counter()
            self._work.run()
            self._work.future.result()
            self._compiler.compile_s += time.perf_counter() - t0
        return self._work.future.result()

    def done(self) -> bool:
        """Whether the compile is over (nothing to wait for)."""
        return self._work.future.done()

    def __call__(self, *args: Any) -> Any:
        return self.result()(*args)

    def __getattr__(self, name: str) -> Any:  # cost_analysis, memory_analysis, ...
        return getattr(self.result(), name)


class Compiler:
    """A run's compile service (see the module docstring).

    Attributes:
      layout: the run's mesh and shardings (outputs are replicated unless a compile says otherwise).
      compile_s: seconds the main thread spent compiling, or waiting for a background compile.
      compiles: every program compiled: what, seconds, temp_bytes, cached (a training program's
        entry adds k, why and calls).
      entries: a training program's key -> its entry in `compiles`.
      fingerprints: a training program's key -> the hash of its lowered text, for those compiled
        with `fingerprint` (`form_memory`: a kept form decision is the program's).
    """

    def __init__(self, layout: Layout):
        self.layout = layout
        self.compile_s = 0.0
        self.compiles: list[dict[str, Any]] = []
        self.entries: dict[Any, dict[str, Any]] = {}
        self.fingerprints: dict[Any, str] = {}
        self._background: ThreadPoolExecutor | None = None  # one thread: the main thread uses the other core
        self._lock = threading.Lock()
        self._pending: list[Compiling] = []
        self._queued: list[_Work] = []  # background work submitted (`close` cancels what has not started)

    def compile(self, fn: Callable, *args: Any, donate: bool = False, in_shardings: Any = None,
                out_shardings: Any = None, background: bool = False, key: Any = None, fingerprint: bool = False,
                **record: Any) -> Callable:
        """Compiles `fn` for `args` ahead of time (donating the first argument if asked); inputs
        are placed as `args` are unless `in_shardings` says, outputs replicated unless
        `out_shardings` says. The seconds it takes are added to `compile_s`; `record` joins its
        entry in `compiles`. A training program passes its `key`: its entry then counts the run's
        calls that ran it (`calls`). With `background`, it compiles in a background thread and a
        `Compiling` is returned at once (only a wait for it counts in `compile_s`). With
        `fingerprint`, the hash of the lowered program's text is kept in `fingerprints[key]`."""
        in_shardings = in_shardings if in_shardings is not None else shardings_of(args)
        out_shardings = out_shardings if out_shardings is not None else self.layout.replicated
        entry = {"what": getattr(fn, "__name__", "program"), "seconds": 0.0, **record}
        if key is not None:
            entry["calls"] = 0
            self.entries[key] = entry

        def lower() -> Any:
            jitted = jax.jit(fn, donate_argnums=(0,) if donate else (), in_shardings=in_shardings,
                             out_shardings=out_shardings)
            lowered = jitted.lower(*args)
            announce("lowered", what=entry["what"])
            if fingerprint:
                self.fingerprints[key] = fingerprint_of(lowered.as_text())
            return lowered

        def build(lowered: Any, lowering_s: float) -> Callable:
            t0, hits = time.perf_counter(), cache_hits()
            with trimming_heap:  # what the compiler's threads free, back to the system as they go
                compiled = lowered.compile()
            release_free_heap()  # and what they freed at the end
            entry["seconds"] = lowering_s + time.perf_counter() - t0
            entry["temp_bytes"] = (compiled_memory(compiled) or {}).get("temp_bytes")
            entry["cached"] = cache_hits() > hits  # loaded from the persistent cache, not compiled
            with self._lock:
                self.compiles.append(entry)
            return compiled

        # Traced and lowered on this thread even for a background compile, which then only compiles (XLA
        # leaves the GIL to the other threads): two threads tracing at once take turns at the GIL, and a
        # step's loss traced beside evaluation's took 0.25 s instead of 0.04 s alone, on the critical path.
        t0 = time.perf_counter()
        try:
            lowered = lower()
        except Exception as e:  # a background program's error is raised where it is first used
            if not background:
                raise
            lowered = e
        lowering_s = time.perf_counter() - t0
        self.compile_s += lowering_s
        if background:
            work = _Work(functools.partial(_raise, lowered) if isinstance(lowered, Exception)
                         else functools.partial(build, lowered, lowering_s))
            self._submit(work)
            self._pending.append(Compiling(work, self))
            return self._pending[-1]
        t0 = time.perf_counter()
        compiled = build(lowered, lowering_s)
        self.compile_s += time.perf_counter() - t0
        return compiled

    def beside(self, fn: Callable[[], Any]) -> None:
        """Runs `fn` in the background: host work that the run needs later and that would otherwise hold
        up the main thread (a probe of XLA's cost analysis, compiled meanwhile)."""
        self._submit(_Work(fn))

    def _submit(self, work: _Work) -> None:
        """Queues `work` for the background thread (a compile's error is raised where the program is
        first used)."""
        if self._background is None:
            self._background = ThreadPoolExecutor(1, thread_name_prefix="jaxtrain-compile")
        self._queued.append(work)
        self._background.submit(work.run)

    def finish(self) -> None:
        """Waits for every background compile (the wait counts in `compile_s`)."""
        for pending in self._pending:
            pending.result()
        self._pending = []

    def close(self) -> None:
        """Lets the background work that has started finish and ends its thread; work not started is
        not (a program never needed is not compiled: its use would raise)."""
        queued, self._queued = self._queued, []
        for work in queued:
            work.cancel("the run's compiler was closed before this program was needed")
        if self._background is not None:
            self._background.shutdown(wait=True)


def _raise(error: Exception) -> Any:
    raise error


class TrainPrograms:
    """The training programs of a run's calls over `source`, each compiled once with `compiler`
    (the state donated, kept where `state_shardings` put it; metrics replicated).

    - `scan(k)`: the call of k steps fused in a `lax.scan`, `call(state, *args, first, valid)`
      (`masked_call`);
    - `steps(unrolled, k)`: `unrolled` steps over the arguments of a call of k steps, fully
      unrolled, `program(leaves, *args, first)` on the state's list of leaves (metrics of shape
      (unrolled,)), dispatched one after another. The state travels as a flat list between a
      call's dispatches: flattening its pytree (NNX states are Python-level nodes) would cost more
      than the dispatch.

    Each takes `why` (called only when the program is compiled) for its entry in `compiles`, and
    compiles in the background when asked; `memory` is the first program's, once fetched.
    """

    def __init__(self, compiler: Compiler, source: CallSource, train_step: Callable, state: TrainState,
                 state_shardings: Any):
        self.compiler, self.source, self.train_step, layout = compiler, source, train_step, compiler.layout
        self.treedef = jax.tree.structure(state)
        self.state_shardings = state_shardings
        self.state_shapes = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
                                         state_shardings)
        self._index = jax.ShapeDtypeStruct((), jnp.int32, sharding=layout.replicated)
        self.calls: dict[int, Callable] = {}  # k -> the scan call of k steps
        self.dispatched: dict[tuple[int, Any], Callable] = {}  # (unrolled steps, call arguments) -> program
        self._keys: dict[tuple[int, int], tuple[int, Any]] = {}  # (unrolled, k) -> `dispatch_key`
        self.memory: dict[str, int] | None = None  # of the first program fetched (`memory.compiled_memory`)
        self.fingerprint = False  # whether scan calls keep their lowered text's hash (`Compiler.fingerprints`)

    def scan(self, k: int, why: Callable[[], str], background: bool = False) -> Callable:
        """The scan call of k steps (compiled now, or in the background, if it is new)."""
        if k not in self.calls:
            fn, args = masked_call(self.source, self.train_step, k), self.source.abstract_args(k)
            layout, index = self.compiler.layout, self._index
            self.calls[k] = self.compiler.compile(
                fn, self.state_shapes, *args, index, index, donate=True, background=background,
                in_shardings=(self.state_shardings, *shardings_of(args), *[layout.replicated] * 2),
                out_shardings=(self.state_shardings, layout.replicated), what="train call", k=k, why=why(),
                key=("call", k), fingerprint=self.fingerprint)
        return self._fetched(self.calls, k, background)

    def steps(self, unrolled: int, k: int, why: Callable[[], str], background: bool = False) -> Callable:
        """The dispatched program of `unrolled` steps over the arguments of a call of k steps
        (compiled now, or in the background, if it is new)."""
        key = self.dispatch_key(unrolled, k)
        if key not in self.dispatched:
            args, layout = self.source.abstract_args(k), self.compiler.layout
            steps, treedef = fuse_steps(self.source.make_step(self.train_step), unrolled, unroll=True), self.treedef

            def fn(leaves: list[jax.Array], *args: Any) -> tuple[list[jax.Array], Metrics]:
                state, metrics = steps(jax.tree.unflatten(treedef, leaves), *args)
                return jax.tree.leaves(state), metrics

            leaves = jax.tree.leaves(self.state_shardings)
            self.dispatched[key] = self.compiler.compile(
                fn, jax.tree.leaves(self.state_shapes), *args, self._index, donate=True, background=background,
                in_shardings=(leaves, *shardings_of(args), layout.replicated),
                out_shardings=(leaves, layout.replicated),
                what="train step" if unrolled == 1 else "train steps, unrolled", k=unrolled, why=why(),
                key=("dispatch", key))
        return self._fetched(self.dispatched, key, background)

    def _fetched(self, programs: dict[Any, Callable], key: Any, background: bool) -> Callable:
        """The program at `key`, waited for unless `background`; the first one fetched gives `memory`."""
        program = programs[key]
        if background:
            return program
        if isinstance(program, Compiling):
            program = programs[key] = program.result()
        if self.memory is None:
            self.memory = compiled_memory(program)
        return program

    def ready(self, k: int) -> bool:
        """Whether the scan call of k steps is compiled (not absent, nor still compiling)."""
        program = self.calls.get(k)
        return program is not None and not (isinstance(program, Compiling) and not program.done())

    def same_args(self, k: int, n: int) -> bool:
        """Whether calls of k and of n steps take arguments of the same shapes (data on the device)."""
        shapes = lambda k: [(x.shape, x.dtype) for x in jax.tree.leaves(self.source.abstract_args(k))]  # noqa: E731
        return shapes(k) == shapes(n)

    def dispatch_key(self, unrolled: int, k: int) -> tuple[int, Any]:
        """The key of the dispatched program of `unrolled` steps over a call of k steps' arguments
        (a feed's arguments for k steps keep their shapes through the run: worked out once, not at
        every dispatch of a step)."""
        if (unrolled, k) not in self._keys:
            shapes = tuple((x.shape, x.dtype) for x in jax.tree.leaves(self.source.abstract_args(k)))
            self._keys[unrolled, k] = (unrolled, shapes)
        return self._keys[unrolled, k]

    def slow_ops(self, k: int) -> str | None:
        """The ops of the step known to be slow in a loop body (`slow_ops.loop_slow_ops`)."""
        step_at, args = self.source.make_step(self.train_step), self.source.abstract_args(k)
        return loop_slow_ops(step_at, self.state_shapes, *args, np.int32(0))
