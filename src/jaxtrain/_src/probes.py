"""What the profile asks of compiled programs: XLA's FLOP count, its counting rule, a call's fixed cost.

`flops_of` reads XLA's cost analysis of a compiled program; `loop_body_counted_once` finds out once
per process whether that analysis counts a `lax.scan` body once or per iteration, so that a call's
count can be scaled to its steps. `CallOverhead` times a trivial call over a state's buffers: the
fixed cost of a call, for the profile of a run whose K was not measured on its own calls.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["PROBE_REPEATS", "CallOverhead", "flops_of", "loop_body_counted_once"]


def flops_of(program: Any) -> float | None:
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


_COUNTING = threading.Lock()


def loop_body_counted_once() -> bool:
    """Whether XLA's cost analysis counts a `lax.scan` body once rather than once per iteration
    (measured once per process on a small matmul chain)."""
    with _COUNTING:  # the profile's thread (`CallOverhead.prepare`) and the main thread ask at once: one compile
        return _counted_once()


@functools.cache
def _counted_once() -> bool:
    return _measure_loop_body_count()


def _measure_loop_body_count() -> bool:
    n, length = 64, 7

    def chain(x: jax.Array) -> jax.Array:
        return jax.lax.scan(lambda c, _: (c @ x, None), x, None, length=length)[0]  # (N, N)

    cost = jax.jit(chain).lower(jax.ShapeDtypeStruct((n, n), jnp.float32)).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float((cost or {}).get("flops", 0.0))
    return flops < 0.5 * length * 2 * n**3
