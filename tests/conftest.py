import io
import os
import shutil
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rich.console import Console

from jaxtrain._src.models import MLP

# Bytecode is written, also where the environment forbids it (PYTHONDONTWRITEBYTECODE=1, as on this
# project's CI machine kind): otherwise each of the suite's Python processes (130 started by the tests in
# one run) compiles jaxtrain's source again and each worker rewrites every test module's asserts again
# (docs/benchmarks.md, "The test suite's time"). Set before the tests are collected; children inherit it.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def mse(model, batch, key):
    err = model(batch["x"]) - batch["y"]
    return jnp.mean(err**2), {"mae": jnp.mean(jnp.abs(err))}


def regression_data(n: int, d_in: int = 8, d_out: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d_in)).astype(np.float32)
    w = rng.normal(size=(d_in, d_out)).astype(np.float32)
    return {"x": x, "y": np.tanh(x @ w).astype(np.float32)}


def small_mlp(seed: int = 0, d_in: int = 8, d_out: int = 3) -> MLP:
    return MLP((d_in, 16, d_out), rngs=nnx.Rngs(seed))


def silent() -> Console:
    return Console(file=io.StringIO(), width=100)


def leaves_close(a, b) -> float:
    """Largest relative difference between two pytrees of arrays."""
    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        worst = max(worst, float(np.max(np.abs(x - y)) / (np.max(np.abs(y)) + 1e-12)))
    return worst


@pytest.fixture
def data():
    return regression_data(200)


@pytest.fixture(autouse=True, scope="session")
def _preprocessing_cache(tmp_path_factory):
    """Decoded datasets (jaxtrain.data.cache) are cached in a temporary directory, not in ~/.cache."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv("JAXTRAIN_CACHE_DIR", str(tmp_path_factory.mktemp("preprocessed")))
        yield


# The suite's XLA_FLAGS (`_devices.SUITE_XLA_FLAGS`, compiling faster); `@pytest.mark.devices(n)`: a
# test needing n JAX devices, and `@pytest.mark.xla_defaults`: one checking the bits of XLA's own code
# generation, re-run in a fresh process (JAX reads XLA_FLAGS only at backend start); see tests/_devices.py.
import _devices  # noqa: E402

pytest_plugins = ("pytester",)  # tests of the suite's own conftest (tests/library/test_devices.py)


def pytest_configure(config):
    for marker in _devices.MARKERS:
        config.addinivalue_line("markers", marker)
    _devices.suite_xla_flags()  # before any test starts JAX's backend
    _compilation_cache(config)


_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def _compilation_cache(config) -> None:
    """A persistent XLA compilation cache shared by this test run's processes.

    Much of the suite's time is XLA compiling the same programs again: every `fit` call jits new
    closures, and every CLI, benchmark or `devices(n)` child starts with an empty in-memory cache.
    Keyed by the program's HLO, compile options, devices and XLA_FLAGS, a cached executable is
    what a fresh compilation would give; tracing, lowering and every test's checks (retracing
    counts included) are unchanged. The first pytest process (the xdist controller, or the only
    one) makes a directory for the run and removes it at the end; its workers and every process
    they start inherit it through the environment. (A read that races another process's write
    of the same entry gets a JAX warning and compiles instead.) Set JAX_COMPILATION_CACHE_DIR
    yourself to choose the directory, or to "" to compile everything.
    """
    # The suite's runs share this cache: a form decision one test's run kept would be reused by another's
    # (tests/library/test_same_seed.py turns it on where it checks it).
    os.environ.setdefault("JAXTRAIN_FORM_MEMORY", "off")
    if _CACHE_ENV in os.environ:
        return  # set by the user, or inherited from the test process that started this one
    path = tempfile.mkdtemp(prefix="jaxtrain-test-xla-cache-")
    config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))
    # Processes started from here read these at their JAX import; this one imported JAX already.
    os.environ[_CACHE_ENV], os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = path, "0"
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _devices.runtest_setup(item)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    return _devices.pyfunc_call(pyfuncitem)


# A pytest worker's memory above which its programs are dropped at the end of a test module.
RELEASE_ABOVE_BYTES = int(1.2 * 2**30)


@pytest.fixture(autouse=True, scope="module")
def _programs_released_after_each_module():
    """Drops what the test modules compiled (JAX's caches cleared, the heap trimmed) when a module ends
    with the worker above RELEASE_ABOVE_BYTES resident, so that a pytest worker does not carry every
    earlier module's programs. A worker's memory grew module by module to about 2.5 GB through the
    suite. Dropped after every module, its peak was 1.4 GB, and every module that used a program
    again paid for tracing, lowering and loading it from the persistent cache the suite shares:
    tests/library and tests/recipes took 168-173 s that way, against 159-164 s with nothing dropped
    (peak 2.2 GB) and 159 s with this limit (peak 1.9 GB; docs/benchmarks.md, "The test suite's time").
    No full garbage collection here: it cost 0.3-0.4 s a module (about 35 CPU s a run) and freed
    nothing more than the collector's own runs do."""
    yield
    from jaxtrain._src.memory import process_memory, release_free_heap

    memory = process_memory()
    if memory is not None and memory["rss"] < RELEASE_ABOVE_BYTES:
        return
    jax.clear_caches()
    release_free_heap()
