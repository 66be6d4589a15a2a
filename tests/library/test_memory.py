"""The process's memory: arrays a CPU device uses in place, the heap handed back after compiling, the
free heap a thread keeps, and the memory section of every run (`summary["memory"]`, the final block)."""

import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import mse, regression_data, silent, small_mlp

from jaxtrain import TrainConfig
from jaxtrain._src import memory
from jaxtrain._src.data.arrays import ALIGNMENT, aligned_empty, bytes_used_in_place, is_aligned
from jaxtrain._src.loop import RunOptions, run
from jaxtrain._src.memory import process_memory, release_free_heap
from jaxtrain._src.report.memory_report import IN_PLACE_HINT, PHASES, memory_lines

on_linux = pytest.mark.skipif(process_memory() is None, reason="no /proc/self/status")
on_cpu = pytest.mark.skipif(jax.default_backend() != "cpu", reason="in-place use is a CPU device's")


def misaligned(x: np.ndarray) -> np.ndarray:
    """A copy of `x` whose data start 16 bytes past an `ALIGNMENT` boundary (NumPy's own alignment)."""
    buffer = aligned_empty((x.nbytes + ALIGNMENT,), np.uint8)
    out = buffer[16 : 16 + x.nbytes].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


def test_aligned_empty_gives_aligned_arrays_of_the_asked_shape():
    for shape, dtype in [((3, 5), np.float32), ((0,), np.int32), ((1000, 65), np.uint8), ((), np.float64)]:
        x = aligned_empty(shape, dtype)
        assert x.shape == shape and x.dtype == dtype and x.flags.c_contiguous and x.flags.writeable
        assert is_aligned(x) and (x.size == 0 or x.ctypes.data % ALIGNMENT == 0)
    assert not is_aligned(misaligned(np.ones((4, 4), np.float32)))
    assert not is_aligned(aligned_empty((4, 4), np.float32).T)  # not C-contiguous


@on_cpu
def test_a_cpu_device_uses_aligned_arrays_in_place_and_copies_others():
    data = {"x": aligned_empty((256, 8), np.float32), "y": misaligned(np.ones((256, 3), np.float32))}
    data["x"][...] = 1.5
    placed = jax.device_put(data)
    assert bytes_used_in_place(data, placed) == data["x"].nbytes
    np.testing.assert_array_equal(np.asarray(placed["x"]), data["x"])
    np.testing.assert_array_equal(np.asarray(placed["y"]), data["y"])


def test_trimming_heap_trims_while_a_compile_runs_and_stops_after(monkeypatch):
    import threading
    import time

    if memory._malloc_trim() is None:
        pytest.skip("no malloc_trim in this C library")
    trims = []
    monkeypatch.setattr(memory, "release_free_heap", lambda: trims.append(threading.current_thread().name))
    trimming = memory.TrimmingHeap(interval_s=0.01)
    with trimming:
        with trimming:  # a background compile beside the main thread's: the same thread serves both
            time.sleep(0.1)
        time.sleep(0.05)
    assert len(trims) >= 5 and set(trims) == {"jaxtrain-trim-heap"}
    time.sleep(0.05)  # the thread has stopped: no trim after the blocks
    done = len(trims)
    time.sleep(0.1)
    assert len(trims) == done
    assert not any(t.name == "jaxtrain-trim-heap" and t.is_alive() for t in threading.enumerate())


def test_release_compiled_programs_drops_what_was_compiled():
    f = jax.jit(lambda x: x * 2.0 + 1.0)
    np.testing.assert_allclose(f(np.ones(3, np.float32)), 3.0)
    assert f._cache_size() == 1
    memory.release_compiled_programs()
    assert f._cache_size() == 0  # the program and its executable are gone; a call compiles it again
    np.testing.assert_allclose(f(np.ones(3, np.float32)), 3.0)


@on_linux
def test_process_memory_reads_the_resident_set_and_its_peak():
    before = process_memory()
    block = np.ones(64 << 20, np.uint8)  # 64 MiB, touched
    after = process_memory()
    assert 0 < before["rss"] <= before["peak"] and after["rss"] <= after["peak"]
    assert after["peak"] >= before["rss"] + 32 * 2**20  # most of the block is resident
    del block
    release_free_heap()  # safe to call any time; no effect where the C library has no malloc_trim
    # the high-water mark does not fall (Linux's per-thread RSS counters are batched: a few pages' slack)
    assert process_memory()["peak"] >= after["peak"] - 2**20


@on_linux
@on_cpu
@pytest.mark.parametrize("aligned", [True, False])
def test_every_run_reports_what_raised_its_peak_memory(aligned):
    data = regression_data(512)
    data = {k: _aligned_copy(v) if aligned else misaligned(v) for k, v in data.items()}
    console = silent()
    result = run(small_mlp(), mse, data, regression_data(64, seed=1), TrainConfig(epochs=2, batch_size=32),
                 session=RunOptions(console=console))
    m = result.summary["memory"]
    assert set(m["raised_bytes"]) == set(PHASES) and all(v >= 0 for v in m["raised_bytes"].values())
    assert m["peak_rss_bytes"] == m["start_peak_bytes"] + sum(m["raised_bytes"].values())
    assert m["peak_rss_bytes"] <= process_memory()["peak"]
    assert m["data_device_bytes"] == sum(v.nbytes for v in data.values())
    assert m["data_in_place_bytes"] == (m["data_device_bytes"] if aligned else 0)
    assert m["state_bytes"] > 0
    assert any(name.startswith("train call") for name in m["program_temp_bytes"])
    assert "evaluate_sums" in m["program_temp_bytes"]
    lines = memory_lines(m)
    assert lines[0].startswith("MEMORY: peak resident") and any(line.startswith("  temporaries: ") for line in lines)
    assert [line.split()[0] for line in lines[1:5]] == ["before", "setup", "training", "evaluation"]
    assert (f"  C heap: {m['heap']}" in lines) == bool(m["heap"])
    assert (("(the host arrays, used in place)" in lines[2]) == aligned
            and (f"  * a copy of the host arrays: {IN_PLACE_HINT}" in lines) != aligned)
    assert "MEMORY: peak resident" in console.file.getvalue()  # in the final block


def _aligned_copy(x: np.ndarray) -> np.ndarray:
    out = aligned_empty(x.shape, x.dtype)
    out[...] = x
    return out


_HEAP_PROBE = r"""
import ctypes, importlib.util, os, sys, threading
spec = importlib.util.spec_from_file_location("memory", sys.argv[1])
memory = importlib.util.module_from_spec(spec); spec.loader.exec_module(memory)
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
limited = memory.limit_free_heap() if sys.argv[2] == "limit" else False
p = libc.malloc(30 << 20); libc.memset(p, 1, 30 << 20); libc.free(p)  # glibc's limits move up (unless set)
statm, page = os.open("/proc/self/statm", os.O_RDONLY), os.sysconf("SC_PAGE_SIZE")
resident = lambda: int(os.pread(statm, 64, 0).split()[1]) * page  # no C heap block left above the test's
given_back = []
def work():  # on a thread of its own, as XLA's: its own arena
    blocks = [libc.malloc(1 << 20) for _ in range(40)]
    for b in blocks:
        libc.memset(b, 1, 1 << 20)
    held = resident()
    for b in reversed(blocks):
        libc.free(b)
    given_back.append(held - resident())
thread = threading.Thread(target=work); thread.start(); thread.join()
said = memory.heap_setting() or ""
print(int(limited), given_back[0] >> 20, "kept" if "kept to 16.0 MiB" in said else "off" if "=off" in said else
      "hint" if "limit_free_heap()" in said else "nothing")
"""


@on_linux
@pytest.mark.skipif(memory._mallopt() is None, reason="not glibc")
def test_limit_free_heap_gives_a_threads_freed_memory_back():
    """40 MiB freed on a thread: with glibc's moving limits its arena keeps it all; limited, all but
    the 16 MiB it may keep go back. A fresh process each: the limits are the process's."""

    def probe(mode: str, env: dict[str, str] | None = None) -> tuple[int, int, str]:
        out = subprocess.run([sys.executable, "-c", _HEAP_PROBE, memory.__file__, mode], check=True,
                             capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **(env or {})})
        limited, mib, said = out.stdout.split()
        return int(limited), int(mib), said

    # the third field: what the run's memory section says
    limited, mib, said = probe("default")
    assert limited == 0 and mib <= 4 and said == "hint"
    limited, mib, said = probe("limit")
    assert limited == 1 and mib >= 40 - memory.TRIM_BYTES // 2**20 - 1 and said == "kept"
    assert probe("limit", {memory.HEAP_ENV: "off"})[::2] == (0, "off")  # the user's way out
    assert probe("limit", {"MALLOC_ARENA_MAX": "2"})[::2] == (0, "nothing")  # glibc's own settings are left as they are
