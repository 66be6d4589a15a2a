"""`jaxtrain doctor`: is this machine set up to train fast? A checklist that runs in seconds.

Each check is a function returning a `Check` record (name, status, value, detail, raw numbers);
`run_checks` runs them all and turns an unexpected exception into a `fail` line, so one broken
part never hides the rest. Nothing here prints: `jaxtrain.tools.report.doctor_report` does.

What jaxtrain itself sets in JAX (found by grepping src/jaxtrain for `jax.config.update` and
XLA_FLAGS): `jax_cpu_collectives_implementation="gloo"` when `distributed.initialize` joins a
job of several processes, and `--xla_force_host_platform_device_count` in the child processes of
`jaxtrain bench scale`. It sets no compilation cache and no default matmul precision, so the
config check reports the values that change speed or numerics (x64, matmul precision, the
compilation cache, XLA_FLAGS and the GPU allocator variables) and warns where one departs from
what jaxtrain's defaults assume. Reading those environment variables is this module's purpose:
it reports them and never acts on them.

Timings are medians of a few repeats, after a warm-up call; a busy machine gives slower numbers.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import time
from importlib import metadata
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain import engine
from jaxtrain.engine import format_bytes, matmul_rate

Status = Literal["ok", "warn", "fail", "skip"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail", "skip")
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")
JIT_TOLERANCE = 1e-4  # |jit - NumPy float64| on tanh outputs in [-1, 1] (float32 at HIGHEST precision: ~1e-6)
BF16_TOLERANCE = 2e-2  # bf16 has an 8-bit mantissa: 2^-8 relative per product, averaged over the sum
ATTENTION_TOLERANCE = 3e-2  # bf16 inputs and output (relative step 2^-8) on outputs of size ~1
ATTENTION_SHAPE = (2, 512, 8, 64)  # (B, T, nh, hs): a head size and length cuDNN's flash attention takes
SLOW_DISPATCH_US = 1000.0  # a trivial jitted call slower than this means a slow or busy host
INSTALL = {"gpu": 'pip install -U "jax[cuda12]" (or "jax[cuda13]") and check that `nvidia-smi` lists the GPU',
           "tpu": 'pip install -U "jax[tpu]" on a TPU VM',
           "cpu": 'hide the accelerator with JAX_PLATFORMS=cpu'}


@dataclasses.dataclass(frozen=True)
class Check:
    """One line of the checklist.

    Attributes:
      name: what was checked, e.g. `matmul f32`.
      status: ok, warn (works but slower or riskier than it could be), fail (jaxtrain will not work
        as asked), skip (does not apply to this device).
      value: the finding in a few words, e.g. `52.3 GFLOP/s`.
      detail: why it matters or how to fix it; one line.
      data: the raw numbers behind `value`, for `--json`.
    """

    name: str
    status: Status
    value: str
    detail: str = ""
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Problem sizes of the timed checks."""

    transfer_mib: int
    matmul_n: int
    dispatch_calls: int
    repeats: int


def sizes(quick: bool, accelerator: bool) -> Sizes:
    """The sizes for a full or `quick` run; an accelerator gets a matmul large enough to fill it."""
    if quick:
        return Sizes(transfer_mib=4, matmul_n=256, dispatch_calls=100, repeats=3)
    return Sizes(transfer_mib=64, matmul_n=4096 if accelerator else 1024, dispatch_calls=500, repeats=5)


def _median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of `fn()` over `repeats` calls (after one untimed warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _describe(device: jax.Device) -> str:
    """`cpu (2 cores)`, `gpu: NVIDIA H100 80GB HBM3`."""
    if device.platform == "cpu":
        return f"cpu ({os.cpu_count()} cores)"
    return f"{device.platform}: {device.device_kind}"


def check_versions() -> Check:
    """The versions of JAX, jaxlib and the libraries jaxtrain builds on (from package metadata)."""
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["python"] = platform.python_version()
    value = ", ".join(f"{k.removesuffix('-checkpoint')} {v}" for k, v in found.items() if v)
    missing = [k for k in PACKAGES if found[k] is None]
    if missing:
        return Check("versions", "fail", value, f"not installed: {', '.join(missing)}; pip install jaxtrain's "
                     "dependencies (pip install -e .)", found)
    if found["jax"] != found["jaxlib"]:
        return Check("versions", "warn", value, f"jax {found['jax']} with jaxlib {found['jaxlib']}: install matching "
                     'versions (pip install -U jax jaxlib, or "jax[cuda12]" on a GPU)', found)
    return Check("versions", "ok", value, "", found)


def _nvidia_gpu_present() -> bool:
    """Whether the NVIDIA driver is loaded on this host (whatever JAX uses)."""
    return os.path.exists("/proc/driver/nvidia/version")


def check_backend(expect_device: str | None = None, expect_devices: int | None = None) -> Check:
    """JAX's default backend and its devices, against what the user expects."""
    devices = jax.devices()
    backend = jax.default_backend()
    kinds = sorted({_describe(d) for d in devices})
    value = f"{backend}: {len(devices)} x {', '.join(kinds)}"
    if jax.process_count() > 1:
        value += f" ({jax.local_device_count()} local, {jax.process_count()} processes)"
    data = {"backend": backend, "device_count": len(devices), "local_device_count": jax.local_device_count(),
            "process_count": jax.process_count(), "kinds": kinds}
    if expect_device is not None and backend != expect_device:
        return Check("backend", "fail", value, f"expected a {expect_device} device, found {', '.join(kinds)}; "
                     f"{INSTALL.get(expect_device, '')}", data)
    if expect_devices is not None and len(devices) != expect_devices:
        how = ("on a CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N makes N virtual devices"
               if backend == "cpu" else "check CUDA_VISIBLE_DEVICES and that every process of the job started")
        return Check("backend", "fail", value, f"expected {expect_devices} devices, found {len(devices)}; {how}", data)
    if backend == "cpu" and _nvidia_gpu_present():
        return Check("backend", "warn", value, "an NVIDIA driver is loaded but JAX runs on the CPU: "
                     f"{INSTALL['gpu']}", data)
    return Check("backend", "ok", value, "", data)


def _host_ram() -> tuple[int, int]:
    """(total, available) bytes of host RAM: /proc/meminfo, else the physical pages."""
    fields: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, rest = line.split(":", 1)
                fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    page = os.sysconf("SC_PAGE_SIZE")
    total = fields.get("MemTotal") or os.sysconf("SC_PHYS_PAGES") * page
    available = fields.get("MemAvailable") or os.sysconf("SC_AVPHYS_PAGES") * page
    return total, available


def check_memory() -> Check:
    """Each device's memory where `memory_stats()` reports it; the host's RAM for a CPU device."""
    devices = jax.local_devices()
    stats = [d.memory_stats() if d.platform != "cpu" else None for d in devices]
    reported = [s for s in stats if s and s.get("bytes_limit")]
    if len(reported) == len(stats):
        limits = [int(s["bytes_limit"]) for s in reported]
        used = [int(s.get("bytes_in_use", 0)) for s in reported]
        each = "each " if len(devices) > 1 else ""
        value = f"{each}{format_bytes(min(limits))} limit, {format_bytes(max(used))} in use"
        data: dict[str, Any] = {"bytes_limit": limits, "bytes_in_use": used}
        return Check("device memory", "ok", value, "the limit is what XLA's allocator may take (see "
                     "XLA_PYTHON_CLIENT_MEM_FRACTION)", data)
    total, available = _host_ram()
    value = f"host RAM {format_bytes(total)}, {format_bytes(available)} available"
    data = {"host_total_bytes": total, "host_available_bytes": available}
    where = "a CPU device has no memory limit of its own" if devices[0].platform == "cpu" else \
        "this backend does not report device memory"
    if available < 0.1 * total:
        return Check("device memory", "warn", value, f"under 10% of RAM is free: other processes hold it ({where})",
                     data)
    return Check("device memory", "ok", value, where, data)


def _probe(x: jax.Array, w: jax.Array) -> jax.Array:
    """(N, D) x (D, M) -> (N, M): tanh(x·w) plus each row's mean, the function the jit check compiles."""
    return jnp.tanh(jnp.dot(x, w, precision="highest")) + jnp.mean(x, axis=1, keepdims=True)  # (N, M)


def _probe_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """`_probe` in NumPy float64."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    return np.tanh(x64 @ w64) + x64.mean(axis=1, keepdims=True)


def check_jit() -> Check:
    """Compiles a small function, runs it and compares its result with NumPy's (float64)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 32)).astype(np.float32)  # (N, D)
    w = (rng.normal(size=(32, 16)) / np.sqrt(32)).astype(np.float32)  # (D, M)
    start = time.perf_counter()
    compiled = jax.jit(_probe).lower(x, w).compile()
    compile_s = time.perf_counter() - start
    got = np.asarray(compiled(x, w))
    diff = float(np.max(np.abs(got.astype(np.float64) - _probe_reference(x, w))))
    data = {"compile_s": compile_s, "max_abs_diff": diff, "tolerance": JIT_TOLERANCE}
    value = f"compiled in {compile_s * 1e3:.0f} ms; max |diff| vs NumPy {diff:.1e}"
    if not np.isfinite(diff) or diff > JIT_TOLERANCE:
        return Check("jit", "fail", value, f"a jitted tanh(x @ w) differs from NumPy by {diff:.3g} (tolerance "
                     f"{JIT_TOLERANCE:g}): the JAX install computes wrong results; reinstall jax and jaxlib", data)
    return Check("jit", "ok", value, f"tolerance {JIT_TOLERANCE:g}", data)


def check_transfer(mib: int = 64, repeats: int = 5) -> Check:
    """Host→device (`jax.device_put`) and device→host (`np.asarray`) bandwidth of `mib` MiB of float32."""
    device = jax.devices()[0]
    host = np.random.default_rng(0).random(mib * 2**20 // 4, dtype=np.float32)
    h2d = _median_time(lambda: jax.device_put(host, device).block_until_ready(), repeats)
    # np.asarray caches the host copy on the array: each timed read needs an array not read before.
    arrays = [jax.device_put(host, device) for _ in range(repeats + 1)]
    jax.block_until_ready(arrays)
    times, shared = [], False
    for i, a in enumerate(arrays):
        start = time.perf_counter()
        read = np.asarray(a)
        if i:  # the first read is the warm-up
            times.append(time.perf_counter() - start)
        shared = device.platform == "cpu" and read.ctypes.data == a.unsafe_buffer_pointer()
    del arrays
    d2h = statistics.median(times)
    gbs = {"h2d_gb_s": host.nbytes / h2d / 1e9, "d2h_gb_s": host.nbytes / d2h / 1e9}
    back = "no copy (the buffer is shared)" if shared else f"{gbs['d2h_gb_s']:.1f} GB/s"
    value = f"host→device {gbs['h2d_gb_s']:.1f} GB/s, device→host {back} ({mib} MiB)"
    data = {**gbs, "d2h_zero_copy": shared, "bytes": host.nbytes, "repeats": repeats}
    if device.platform == "cpu":
        return Check("transfer", "ok", value, "a CPU device lives in host memory: a copy at most", data)
    if min(gbs.values()) < 1.0:
        return Check("transfer", "warn", value, "under 1 GB/s: a slow or shared link; keep the data on the device "
                     "(--data.placement device) so each batch does not cross it", data)
    return Check("transfer", "ok", value, "jaxtrain keeps data that fit on the device, so batches do not cross "
                 "this link", data)


def check_dispatch(calls: int = 500, repeats: int = 5) -> Check:
    """The host cost of one call of a trivial jitted function: median µs per call, `calls` in a row."""
    add_one = jax.jit(lambda x: x + 1)
    x = jnp.zeros((), jnp.float32)

    def chain() -> None:
        y = x
        for _ in range(calls):
            y = add_one(y)  # each call waits only for its input: the host's dispatch cost, pipelined
        y.block_until_ready()

    def synced() -> None:
        for _ in range(max(calls // 10, 10)):
            add_one(x).block_until_ready()

    per_call_us = _median_time(chain, repeats) / calls * 1e6
    synced_us = _median_time(synced, repeats) / max(calls // 10, 10) * 1e6
    value = f"{per_call_us:.0f} µs per call ({synced_us:.0f} µs waiting for each result)"
    data = {"per_call_us": per_call_us, "synced_per_call_us": synced_us, "calls": calls, "repeats": repeats}
    detail = "paid once per compiled call of K steps (lax.scan)"
    if per_call_us > SLOW_DISPATCH_US:
        return Check("dispatch", "warn", value, f"over {SLOW_DISPATCH_US:.0f} µs: the host is slow or busy; {detail}",
                     data)
    return Check("dispatch", "ok", value, detail, data)


def check_matmul(n: int = 1024, repeats: int = 5) -> Check:
    """float32 n x n matmul rate at JAX's default precision (GFLOP/s, median)."""
    rate, _, _, _ = matmul_rate(n, jnp.float32, repeats)
    precision = jax.config.values["jax_default_matmul_precision"] or "default"
    value = f"{rate / 1e9:,.1f} GFLOP/s ({n}x{n}, float32)"
    detail = f"matmul precision {precision}"
    if jax.default_backend() == "gpu" and precision == "default":
        detail += " (XLA may use TF32 on NVIDIA GPUs)"
    return Check("matmul f32", "ok", value, detail, {"gflop_s": rate / 1e9, "n": n, "repeats": repeats})


def check_bf16_matmul(n: int = 4096, repeats: int = 5) -> Check:
    """On a GPU: a bf16 matmul runs, agrees with float32 on the same (bf16-rounded) inputs, and its rate."""
    backend = jax.default_backend()
    if backend != "gpu":
        return Check("matmul bf16", "skip", f"n/a on {backend}", "checked on GPUs, where --precision bf16 runs on "
                     "tensor cores")
    rate, product, a, b = matmul_rate(n, jnp.bfloat16, repeats)
    rows = min(n, 256)  # a float64 reference of the first rows: the whole product would take NumPy seconds
    reference = a[:rows].astype(np.float64) @ b.astype(np.float64)  # (rows, N)
    got = np.asarray(product[:rows].astype(jnp.float32), np.float64)
    error = float(np.max(np.abs(got - reference)) / np.max(np.abs(reference)))
    value = f"{rate / 1e12:,.1f} TFLOP/s ({n}x{n}); relative error {error:.1e}"
    data = {"tflop_s": rate / 1e12, "relative_error": error, "tolerance": BF16_TOLERANCE, "n": n}
    if not error <= BF16_TOLERANCE:
        return Check("matmul bf16", "fail", value, f"bf16 product off by {error:.3g} relative (tolerance "
                     f"{BF16_TOLERANCE:g}): do not train with --precision bf16 on this install", data)
    return Check("matmul bf16", "ok", value, f"tolerance {BF16_TOLERANCE:g} against float64", data)


def check_cudnn_attention() -> Check:
    """On a GPU: cuDNN's fused attention in bf16 runs and agrees with float32 attention."""
    from jaxtrain.engine import attention_path, cudnn_attention, heads_major_attention

    backend = jax.default_backend()
    if backend != "gpu":
        return Check("cudnn attention", "skip", f"n/a on {backend}", "causal attention takes the "
                     f"{attention_path(jnp.bfloat16)} path here")
    B, T, nh, hs = ATTENTION_SHAPE
    q, k, v = (jax.random.normal(key, (B, T, nh, hs), jnp.float32) for key in jax.random.split(jax.random.key(0), 3))
    try:
        got = jax.jit(cudnn_attention)(*(a.astype(jnp.bfloat16) for a in (q, k, v)))  # (B, T, nh, hs) bf16
        got = np.asarray(got.astype(jnp.float32))
    except (NotImplementedError, RuntimeError, ValueError) as e:  # cuDNN missing, too old, or shapes refused
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160].rstrip(".")
        return Check("cudnn attention", "warn", "unavailable", f"{reason}; causal attention falls back to XLA's "
                     "(slower, memory quadratic in T): install cuDNN >= 9 (pip install -U \"jax[cuda12]\")")
    rounded = [a.astype(jnp.bfloat16).astype(jnp.float32) for a in (q, k, v)]
    reference = np.asarray(jax.jit(heads_major_attention)(*rounded))
    error = float(np.max(np.abs(got - reference)))
    value = f"runs; max |diff| vs float32 {error:.1e} (B={B}, T={T}, nh={nh}, hs={hs})"
    data = {"max_abs_diff": error, "tolerance": ATTENTION_TOLERANCE}
    if not error <= ATTENTION_TOLERANCE:
        return Check("cudnn attention", "fail", value, f"cuDNN attention differs by {error:.3g} (tolerance "
                     f"{ATTENTION_TOLERANCE:g}); update jax and cuDNN", data)
    return Check("cudnn attention", "ok", value, f"bf16 causal attention uses it; tolerance {ATTENTION_TOLERANCE:g}",
                 data)


def check_config() -> Check:
    """The JAX settings and XLA_FLAGS that change speed or numerics, against jaxtrain's assumptions."""
    config = jax.config.values  # by name: the options are attributes that jax.config makes at runtime
    values = {
        "jax_enable_x64": bool(config["jax_enable_x64"]),
        "jax_default_matmul_precision": config["jax_default_matmul_precision"],
        "jax_compilation_cache_dir": config["jax_compilation_cache_dir"],
        "jax_platforms": config["jax_platforms"],
        "XLA_FLAGS": os.environ.get("XLA_FLAGS"),
    }
    if jax.process_count() > 1:
        values["jax_cpu_collectives_implementation"] = config["jax_cpu_collectives_implementation"]
    for name in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR"):
        if name in os.environ:
            values[name] = os.environ[name]
    cache = values["jax_compilation_cache_dir"]
    value = (f"x64 {'on' if values['jax_enable_x64'] else 'off'}, matmul precision "
             f"{values['jax_default_matmul_precision'] or 'default'}, JAX's compilation cache {cache or 'unset'}, "
             f"XLA_FLAGS {values['XLA_FLAGS'] or '(unset)'}")
    warnings = []
    if values["jax_enable_x64"]:
        warnings.append("x64 is on: Python floats and new arrays become float64 (twice the memory, far slower on "
                        "GPUs); unset JAX_ENABLE_X64")
    precision = values["jax_default_matmul_precision"]
    if precision not in (None, "default", "DEFAULT"):
        warnings.append(f"jax_default_matmul_precision={precision} changes every matmul's speed and accuracy; "
                        "jaxtrain assumes the default (set precision with --precision)")
    if "XLA_PYTHON_CLIENT_ALLOCATOR" in values and values["XLA_PYTHON_CLIENT_ALLOCATOR"] == "platform":
        warnings.append("XLA_PYTHON_CLIENT_ALLOCATOR=platform frees memory eagerly and is slow; unset it")
    if warnings:
        return Check("jax config", "warn", value, "; ".join(warnings), values)
    detail = "jaxtrain sets none of these (only a multi-process job: gloo CPU collectives)"
    if not cache:
        from jaxtrain.engine import COMPILE_CACHE_ENV as ENV
        from jaxtrain.engine import command_cache_dir

        kept = command_cache_dir()
        detail += (f"; the jaxtrain command keeps compiled programs in {kept} ({ENV}=off: none), your own "
                   "scripts only after jaxtrain.enable_compile_cache()" if kept is not None else
                   f"; {ENV}=off: the jaxtrain command compiles every program afresh")
    return Check("jax config", "ok", value, detail, values)


def run_checks(expect_device: str | None = None, expect_devices: int | None = None, quick: bool = False
               ) -> list[Check]:
    """Runs every check in order; an exception inside one becomes its `fail` line.

    Args:
      expect_device: "cpu", "gpu" or "tpu": the backend check fails on another ("any" or None: not checked).
      expect_devices: the backend check fails unless JAX sees this many devices (0 or None: not checked).
      quick: smaller sizes and fewer repeats (rough figures, about a second).

    Returns:
      One `Check` per check, each with a status.
    """
    expect_device = None if expect_device == "any" else expect_device
    expect_devices = expect_devices or None
    s = sizes(quick, accelerator=jax.default_backend() != "cpu")
    steps: list[tuple[str, Callable[[], Check]]] = [
        ("versions", check_versions),
        ("backend", lambda: check_backend(expect_device, expect_devices)),
        ("device memory", check_memory),
        ("jit", check_jit),
        ("transfer", lambda: check_transfer(s.transfer_mib, s.repeats)),
        ("dispatch", lambda: check_dispatch(s.dispatch_calls, s.repeats)),
        ("matmul f32", lambda: check_matmul(s.matmul_n, s.repeats)),
        ("matmul bf16", lambda: check_bf16_matmul(s.matmul_n, s.repeats)),
        ("cudnn attention", check_cudnn_attention),
        ("jax config", check_config),
    ]
    results = []
    for name, check in steps:
        start = time.perf_counter()
        try:
            result = check()
        except Exception as e:  # noqa: BLE001 - a broken install raises anything; the checklist must go on
            reason = (str(e).strip().splitlines() or [""])[0][:200]
            result = Check(name, "fail", "error", f"{type(e).__name__}: {reason}")
        results.append(dataclasses.replace(result, data={**result.data, "seconds": time.perf_counter() - start}))
    return results


def failed(checks: list[Check]) -> bool:
    """Whether any check failed (the command's exit code is then 1)."""
    return any(c.status == "fail" for c in checks)


def record_matmul_rate(checks: list[Check], quick: bool) -> None:
    """Caches the float32 matmul rate of a full checklist (`jaxtrain.engine.record_matmul_rate`), where the
    end-of-run profile of every later run reads it; a quick run's rougher figure is not kept."""
    found = {c.name: c for c in checks}.get("matmul f32")
    device = jax.local_devices()[0]
    if quick or found is None or found.status != "ok" or found.data.get("n") != engine.standard_matmul_size(device):
        return
    engine.record_matmul_rate(device, found.data["gflop_s"] * 1e9, found.data["n"])
