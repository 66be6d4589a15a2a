"""Memory: what a compiled call needs (XLA's compiled memory analysis: no profiler, no run), the
process's resident memory (`process_memory`), and giving the heap that compilation freed back to
the operating system (`release_free_heap`)."""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Callable

FIELDS = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "peak_bytes")


def compiled_memory(compiled: Any) -> dict[str, int] | None:
    """`{argument_bytes, output_bytes, alias_bytes, temp_bytes, peak_bytes}` of a compiled call
    (`jax.jit(f).lower(...).compile()`), or None when the backend does not say.

    Arguments are the inputs (train state, data), outputs what it returns; `alias_bytes` are outputs
    written into donated inputs, so counted once; temporaries are the intermediates (activations
    kept for the backward pass among them). `peak_bytes` = arguments + outputs - aliased +
    temporaries: the device memory the call holds at once.
    """
    try:
        stats = compiled.memory_analysis()
    except Exception:  # some backends do not implement it
        return None
    if stats is None:
        return None
    arg, out = int(stats.argument_size_in_bytes), int(stats.output_size_in_bytes)
    alias, temp = int(stats.alias_size_in_bytes), int(stats.temp_size_in_bytes)
    return {"argument_bytes": arg, "output_bytes": out, "alias_bytes": alias, "temp_bytes": temp,
            "peak_bytes": arg + out - alias + temp}


def process_memory() -> dict[str, int] | None:
    """`{"rss": bytes, "peak": bytes}`: this process's resident memory now and its high-water mark
    (Linux's VmRSS and VmHWM, what `getrusage` reports as the peak), or None where /proc has neither."""
    try:
        with open("/proc/self/status", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f if line.startswith((b"VmRSS:", b"VmHWM:")))
        return {"rss": int(fields[b"VmRSS"].split()[0]) * 1024, "peak": int(fields[b"VmHWM"].split()[0]) * 1024}
    except (OSError, KeyError, ValueError):
        return None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (macOS, musl)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_heap() -> None:
    """Hands the C heap's free pages back to the operating system (glibc's `malloc_trim(0)`).

    XLA's compiler frees 100-200 MiB of small allocations after each program it compiles; glibc
    keeps them in the heap, so they stay in the process's resident memory and add to every peak
    after it. Called after the model's initialiser, before the program is built and after each
    compile, background ones included: a mnist-cnn run's peak RSS went from about 690 to 590 MiB;
    a few milliseconds per call (docs/benchmarks.md has what it costs in step time). Does nothing
    where the C library has no `malloc_trim`.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def format_bytes(n: float) -> str:
    """`1536` -> `1.5 KiB`."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def describe(memory: dict[str, int] | None) -> str:
    """One line: `12.3 MiB peak = 10.1 MiB arguments + 0.1 MiB outputs (- aliased) + 2.1 MiB temporaries`."""
    if memory is None:
        return "not reported by this backend"
    size = {name: format_bytes(value) for name, value in memory.items()}
    aliased = f" - {size['alias_bytes']} donated" if memory["alias_bytes"] else ""
    return (f"{size['peak_bytes']} peak = {size['argument_bytes']} arguments + {size['output_bytes']} outputs"
            f"{aliased} + {size['temp_bytes']} temporaries")
