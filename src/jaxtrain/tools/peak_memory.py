"""This process's peak resident memory, as the commands report it (`jaxtrain data inspect`, and each
benchmark's child process in benchmarks/child.py).

Standard library only, and `import jaxtrain` loads no JAX: the benchmarks' PyTorch child imports it
without loading JAX into the process whose memory it measures."""

from __future__ import annotations

import resource
import sys


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far, in bytes: Linux's VmHWM.

    Not `getrusage`'s ru_maxrss: Linux carries it across `exec`, so a child started by a large
    process reports at least its parent's resident size at the fork (a torch child of `bench
    frameworks` read 568 MiB, the parent's size, in every run). Elsewhere ru_maxrss is all there is."""
    try:  # `jaxtrain._src.memory.process_memory` reads the same for the library's own memory report
        with open("/proc/self/status", "rb") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(b"VmHWM:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
