"""A persistent compilation cache: a program compiled by one run is loaded from disk by the next.

The `jaxtrain` command turns it on (`enable_compile_cache`) in `~/.cache/jaxtrain/xla` (or
`$XDG_CACHE_HOME/jaxtrain/xla`), capped at 2 GiB (JAX evicts the least recently used programs).
A run whose programs are cached skips their compilation: char-gpt's baby compiled in 0.7 s instead
of 1.9 s, and its peak memory fell from 572 to 536 MiB, XLA's compiler no longer running (docs/
benchmarks.md). The cached program is the one XLA compiled, so results are bit for bit those of a
compile. `JAXTRAIN_COMPILE_CACHE=off` turns it off; `JAXTRAIN_COMPILE_CACHE=DIR` moves it; a cache
the user configured for JAX (`JAX_COMPILATION_CACHE_DIR`, `jax.config`) is left as it is. From
Python, `jaxtrain.enable_compile_cache()` does the same (the library changes no global setting by
itself).

Its entries are native code that XLA loads and runs, so the directory must be the user's alone: it is
made private (0700, whatever the umask), and one that another user owns, or that others may write to
(world- or group-writable, sticky or not, as /tmp is) is not used: a one-line note says why, and the run
compiles instead. A folder this process cannot write to (a read-only disk) is not used either (one
note); a disk that fills up during the run stops the cache growing without JAX's warning per program
(the programs compile as they would without it, nothing else changes).
"""

from __future__ import annotations

import os
import stat
import threading
import warnings
from pathlib import Path

import jax

from jaxtrain._src.report.notes import note
from jaxtrain._src.safe_files import probe_writable

__all__ = ["ENV", "cache_hits", "command_cache_dir", "enable_compile_cache"]

ENV = "JAXTRAIN_COMPILE_CACHE"
MAX_BYTES = 2 << 30
_OFF = ("0", "off", "false", "no")


def default_dir() -> Path:
    """`$XDG_CACHE_HOME/jaxtrain/xla`, else `~/.cache/jaxtrain/xla`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "jaxtrain" / "xla"


def command_cache_dir() -> Path | None:
    """The directory the `jaxtrain` command's runs keep compiled programs in (`enable_compile_cache`
    with no path, without turning anything on): the user's JAX cache, `JAXTRAIN_COMPILE_CACHE`, or
    `default_dir()`; None when `JAXTRAIN_COMPILE_CACHE` is off."""
    setting = os.environ.get(ENV, "").strip()
    if setting.lower() in _OFF:
        return None
    return Path(_users_cache() or setting or default_dir())


def _users_cache() -> str | None:
    """The cache the user configured for JAX (`jax.config`, `JAX_COMPILATION_CACHE_DIR`), if any."""
    return jax.config.values["jax_compilation_cache_dir"] or os.environ.get("JAX_COMPILATION_CACHE_DIR")


def enable_compile_cache(path: str | os.PathLike | None = None, max_bytes: int = MAX_BYTES) -> Path | None:
    """Turns on JAX's persistent compilation cache for every program this process compiles from
    now on (call it before the first compile); returns its directory.

    Args:
      path: the cache directory; default `JAXTRAIN_COMPILE_CACHE` when it names one, else
        `default_dir()`.
      max_bytes: the cache's size limit (least recently used programs are evicted).

    Returns:
      The directory in use: the user's own when JAX already has one; None when
      `JAXTRAIN_COMPILE_CACHE` is off, or the directory cannot be made or is not this user's alone
      (the run goes on compiling).
    """
    directory = command_cache_dir()
    if directory is None or _users_cache():  # off, or the user's own: left as it is
        return directory
    directory = Path(path) if path else directory
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)  # private under any umask (it only clears bits)
        unsafe = _unsafe(directory)
    except OSError:
        return None
    if unsafe:
        note(f"the compile cache {directory} is not used: {unsafe}, and its programs are native code this process "
             f"would run; give {ENV} a directory of your own (or {ENV}=off)")
        return None
    try:
        probe_writable(directory)
    except OSError as e:
        note(f"the compile cache {directory} is not used: it cannot be written ({e.strerror or e}); programs are "
             f"compiled afresh (give {ENV} another directory, or {ENV}=off)")
        return None
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # every program: small ones too
    jax.config.update("jax_compilation_cache_max_size", int(max_bytes))
    # A full disk: JAX warns for each program it then cannot write (several lines each); the run is unharmed
    warnings.filterwarnings("ignore", message="Error writing persistent compilation cache entry")
    return directory


def _unsafe(directory: Path) -> str | None:
    """Why another user could plant programs in `directory`, or None when only this user can write there."""
    info = directory.stat()
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return f"it belongs to user id {info.st_uid}, not to this user ({os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"others may write to it (mode {stat.S_IMODE(info.st_mode):o})"
    return None


# JAX's monitoring events: a program loaded from the persistent cache; one compiled (and written to it)
_EVENTS = {"/jax/compilation_cache/cache_hits": "loaded", "/jax/compilation_cache/cache_misses": "written"}
_counts = threading.local()  # this thread's "loaded"
_totals = {"loaded": 0, "written": 0}  # every thread's
_listening = threading.Lock()
_registered = False


def _count(event: str, **kwargs: object) -> None:
    if (kind := _EVENTS.get(event)) is not None:
        with _listening:
            _totals[kind] += 1
        if kind == "loaded":
            _counts.hits = getattr(_counts, "hits", 0) + 1


def _listen() -> None:
    global _registered
    with _listening:
        if not _registered:
            jax.monitoring.register_event_listener(_count)
            _registered = True


def cache_hits() -> int:
    """Programs this thread has loaded from the persistent cache so far (JAX's monitoring events;
    0 with no cache): compare it before and after a compile to know whether XLA compiled."""
    _listen()
    return getattr(_counts, "hits", 0)


def cache_totals() -> dict[str, int]:
    """Programs every thread of this process has loaded from the persistent cache (`loaded`) and
    compiled and written to it (`written`) since the first call of this or `cache_hits`."""
    _listen()
    with _listening:
        return dict(_totals)
