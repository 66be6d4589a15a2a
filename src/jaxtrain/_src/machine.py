"""The machine's float32 matmul rate: measured by the tools, cached per machine, read by the library.

`jaxtrain doctor` and `jaxtrain profile` measure the rate (`measure_matmul_rate`) and record it in
`~/.cache/jaxtrain/machine.json` (or `$XDG_CACHE_HOME/jaxtrain`), keyed by the device's
description and the JAX version. Every run's end-of-run profile only reads that file
(`cached_matmul_rate`) to put its FLOP/s against the machine's rate: `fit` never benchmarks the
machine. Without an entry the profile says the rate is unknown and how to measure it.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain._src.errors import ConfigError
from jaxtrain._src.report.blocks import device_description
from jaxtrain._src.safe_files import write_text

__all__ = ["cached_matmul_rate", "machine_file", "matmul_rate", "measure_matmul_rate", "record_matmul_rate",
           "standard_matmul_size"]


def machine_file() -> Path:
    """The cache of per-machine measurements: `~/.cache/jaxtrain/machine.json`."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "jaxtrain" / "machine.json"


def _key(device: jax.Device) -> str:
    return f"{device_description(device)}; jax {jax.__version__}"


def standard_matmul_size(device: jax.Device) -> int:
    """The matmul the cached rate is measured on: 1024^2 on a CPU, 4096^2 on an accelerator."""
    return 1024 if device.platform == "cpu" else 4096


def matmul_rate(n: int, dtype: Any, repeats: int) -> tuple[float, jax.Array, np.ndarray, np.ndarray]:
    """(FLOP/s, product, a, b) of an n x n @ n x n matmul in `dtype` on the default device (inputs
    rounded to it on the host); the median of `repeats` timed calls after a warm-up call."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(n, n)).astype(np.float32)  # (N, N)
    b = rng.normal(size=(n, n)).astype(np.float32)  # (N, N)
    da, db = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
    matmul = jax.jit(jnp.matmul)
    matmul(da, db).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(da, db).block_until_ready()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return 2 * n**3 / seconds, matmul(da, db), np.asarray(da.astype(jnp.float32)), np.asarray(db.astype(jnp.float32))


def cached_matmul_rate(device: jax.Device) -> float | None:
    """The float32 matmul rate (FLOP/s) recorded for this device and JAX version, or None."""
    try:
        entry = json.loads(machine_file().read_text()).get(_key(device), {})
        rate = float(entry["matmul_f32_flop_s"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return rate if rate > 0 else None


def record_matmul_rate(device: jax.Device, rate: float, n: int) -> None:
    """Records `rate` (FLOP/s of an n x n float32 matmul) for this device and JAX version; a cache
    that cannot be written is left as it is (the profile then says the rate is unknown)."""
    path = machine_file()
    try:
        entries = json.loads(path.read_text()) if path.is_file() else {}
        entries = entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):
        entries = {}
    entries[_key(device)] = {"matmul_f32_flop_s": rate, "n": n, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(entries, indent=2) + "\n")
    except (OSError, ConfigError):
        pass


def measure_matmul_rate(device: jax.Device, repeats: int = 5, record: bool = True) -> float | None:
    """Measures the device's float32 matmul rate at the standard size (median of `repeats`) and,
    with `record`, caches it for the profiles of later runs; None if it cannot run."""
    n = standard_matmul_size(device)
    try:
        with jax.default_device(device):
            rate = matmul_rate(n, jnp.float32, repeats)[0]
    except Exception:  # noqa: BLE001 - a measurement that fails leaves the rate unknown
        return None
    if record:
        record_matmul_rate(device, rate, n)
    return rate
