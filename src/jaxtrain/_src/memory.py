"""Memory: what a compiled call needs (XLA's compiled memory analysis: no profiler, no run), the
process's resident memory (`process_memory`), giving the heap that compilation freed back to the
operating system (`release_free_heap`), dropping the programs compiled so far
(`release_compiled_programs`), capping the free memory the C heap keeps (`limit_free_heap`), and
keeping what a process imported out of the cycle collector's walks (`imports_outside_gc`)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import os
import threading
from typing import Any, Callable, Iterator

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


class TrimmingHeap:
    """While any `with trimming_heap:` block runs, a thread hands the C heap's free pages back to
    the operating system every `interval_s` (`release_free_heap`).

    XLA's compiler works on several threads (LLVM's workers, XLA's own), and glibc gives each a heap
    of its own; what they free while compiling stays resident, scattered among what is still in use,
    until `release_free_heap` runs after the compile, too late for the peak. Trimmed as it goes,
    char-gpt's training program compiled with 129-174 MiB (median 150) over the memory before it
    instead of 181-239 (median 187), 7 compiles each (docs/benchmarks.md). Only compiles are
    wrapped: a trim while training would make each step fault in its freed temporaries again.
    Blocks may overlap (a background compile beside the main thread's): one thread serves them all.
    """

    def __init__(self, interval_s: float = 0.05):
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._users = 0
        self._stop = threading.Event()

    def __enter__(self) -> "TrimmingHeap":
        if _malloc_trim() is not None:
            with self._lock:
                self._users += 1
                if self._users == 1:
                    self._stop = threading.Event()  # the new thread's own: one still stopping keeps its set
                    threading.Thread(target=self._run, args=(self._stop,), name="jaxtrain-trim-heap",
                                     daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if _malloc_trim() is not None:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._stop.set()

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            release_free_heap()


trimming_heap = TrimmingHeap()
"""The process's one `TrimmingHeap`: `with trimming_heap: lowered.compile()`."""


def release_compiled_programs() -> None:
    """Drops every program this process has compiled, with JAX's tracing caches (`jax.clear_caches`),
    and gives the memory they held back (`release_free_heap`).

    A model built eagerly compiles each op of its initialisers as a program of its own (each random
    normal, scale, zero bias) and JAX keeps every one: char-gpt's GPT left about 30, some 50 MiB
    resident, through the whole run (a tiny program costs 1.5-3 MiB of compiled code and metadata).
    The `jaxtrain` command calls this between building a process's first run's workload and `fit`
    (`runs.train`: a sweep's later trials keep what their builds compile). A program needed
    again is compiled again, or loaded from the persistent compilation cache. `fit` itself does not
    call it: the caller's own programs would go too.
    """
    import jax

    jax.clear_caches()
    gc.collect()  # the executables go with their last Python reference
    release_free_heap()


@contextlib.contextmanager
def imports_outside_gc() -> Iterator[None]:
    """Runs the block (a process's imports) with Python's cycle collector off, then moves every
    object alive at its end out of the collector's reach (`gc.freeze`), for the rest of the process.

    JAX, Flax, Optax and jaxtrain leave about 230,000 objects that live as long as the process, and
    the collector walked them all again in each full collection, during the imports and after them:
    0.35 s of a 2-epoch `jaxtrain train mlp-regression` of 2.9 CPU seconds; 0.07 s this way
    (docs/benchmarks.md). Objects made later are collected as before. The imports' own garbage in
    reference cycles (about 1,100 objects) stays with the frozen ones: a full collection to free it
    would cost 0.1 s. For a process's own entry point (the `jaxtrain` command calls it); `fit` and
    `import jaxtrain` change no global setting.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


HEAP_ENV = "JAXTRAIN_HEAP"
TRIM_BYTES = 16 << 20
MMAP_BYTES = 32 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_GLIBC_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX")
_heap_limit: int | None = None  # what limit_free_heap set in this process


def limit_free_heap(trim_bytes: int = TRIM_BYTES, mmap_bytes: int = MMAP_BYTES) -> bool:
    """Caps the free memory glibc's heap keeps resident; returns whether it did.

    XLA runs its work on threads, and glibc gives each thread a heap of its own (an arena). By
    default glibc moves its limits up as the process frees large blocks: an arena may then keep up
    to 64 MiB free at its top, and `malloc_trim` trims only the main thread's. char-gpt's runs held
    about 160 MiB so (`mallinfo2`'s free bytes, resident, not given back by `malloc_trim`). This
    fixes the limits for the whole process: an arena gives back its free top past `trim_bytes`, and
    blocks of `mmap_bytes` or more are mapped on their own (returned when freed), where glibc's
    moving limit ends anyway. char-gpt's peak went from 536 to 472 MiB at 1.006x the step time;
    a limit of 8 MiB made mnist-cnn's step 1.095x slower (its convolutions' scratch, freed and
    faulted in again every step), 16 MiB did not (docs/benchmarks.md).

    The `jaxtrain` command calls it; `fit` alone changes no global setting. Nothing is done when
    `JAXTRAIN_HEAP=off`, when the environment sets glibc's own limits (`MALLOC_TRIM_THRESHOLD_`,
    `MALLOC_MMAP_THRESHOLD_`, `MALLOC_TOP_PAD_`, `MALLOC_ARENA_MAX`, or `GLIBC_TUNABLES` for
    malloc), or where the C library is not glibc.
    """
    if _heap_off():
        return False
    if _glibc_set_by_user():
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    # Setting either one stops glibc moving both.
    if not (mallopt(_M_MMAP_THRESHOLD, int(mmap_bytes)) and mallopt(_M_TRIM_THRESHOLD, int(trim_bytes))):
        return False
    global _heap_limit
    _heap_limit = int(trim_bytes)
    return True


def heap_setting() -> str | None:
    """How this process's C heap keeps free memory, for the run's memory section: the limit
    `limit_free_heap` set, a hint where glibc keeps its moving limits, None elsewhere."""
    if _heap_limit is not None:
        return f"a thread's free memory kept to {format_bytes(_heap_limit)} (limit_free_heap)"
    if _mallopt() is None or _glibc_set_by_user():
        return None
    if _heap_off():
        return f"glibc's moving limits ({HEAP_ENV}=off)"
    return "glibc's moving limits; jaxtrain.limit_free_heap() gives a thread's free memory back"


def _heap_off() -> bool:
    return os.environ.get(HEAP_ENV, "").strip().lower() in ("0", "off", "false", "no")


def _glibc_set_by_user() -> bool:
    """Whether the environment sets glibc's heap limits itself (then they are left as they are)."""
    return any(os.environ.get(name) for name in _GLIBC_SETTINGS) or "malloc" in os.environ.get("GLIBC_TUNABLES", "")


@functools.cache
def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's `mallopt`, or None where the C library is not glibc (macOS and musl lack
    `malloc_trim`, and their `mallopt` takes other parameters, if any)."""
    if _malloc_trim() is None:
        return None
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


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
