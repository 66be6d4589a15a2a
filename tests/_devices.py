"""Tests re-run in a fresh process whose XLA_FLAGS differ from this one's.

`@pytest.mark.devices(n)`: run a test with at least `n` JAX devices. JAX reads `XLA_FLAGS` once, when
its backend starts, so a process that started with fewer devices cannot get more: the test re-runs
in a child whose `XLA_FLAGS` add `--xla_force_host_platform_device_count=n` (with
`JAX_PLATFORMS=cpu`, so the `n` devices are virtual CPU devices on any machine).

`@pytest.mark.xla_defaults`: run a test with XLA's own code generation, without the suite's
`SUITE_XLA_FLAGS` (see `suite_xla_flags`): the numerics, bit-for-bit and resume checks, whose claims
are about the program users run (tests/README.md names them).

The first marked test of a module to run starts the child, which runs every test of that module
with the same marks selected in this session (one start-up of Python, JAX and the module instead of
one per test), and each outer test then passes, fails or skips as its own run in the child did; a
failure shows the child's output. A test that re-runs in a child has its fixtures set up there only.
Inside the child (marked by `CHILD_ENV`) the tests run normally.
Registered by `tests/conftest.py`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

MARKERS = ("devices(n): needs at least n JAX devices; re-run in a subprocess with n virtual CPU devices if fewer",
           "xla_defaults: a numerics or bit-for-bit check of the code XLA's defaults generate; re-run in a subprocess "
           "without the suite's XLA_FLAGS")
CHILD_ENV = "JAXTRAIN_TEST_DEVICES_CHILD"  # set to n (0: no devices asked) in the child process
TIMEOUT_S = 300  # per test run in the child
_FLAG = "--xla_force_host_platform_device_count"

# Most of the suite's time is compiling small programs that then run a few steps. XLA:CPU's older
# fusion emitters (jaxlib 0.10.2 compiles the suite's programs in about 0.7x the time with them, and
# runs them as fast) and LLVM's optimisation off (XLA's HLO passes stay; the suite's CPU seconds
# about 0.75x again) make the suite compile less, and so does one LLVM module per program instead of
# XLA's parallel code generation (the two workers keep both cores busy already; about 0.92x);
# docs/benchmarks.md, "The test suite's time".
# jaxtrain's code is the same either way; numerics checks keep their tolerances.
SUITE_XLA_FLAGS = ("--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=0 "
                   "--xla_cpu_parallel_codegen_split_count=1")
DEFAULTS_ENV = "JAXTRAIN_TEST_XLA_DEFAULTS"  # set (to anything but "") to run the whole suite with XLA's defaults


def suite_xla_flags() -> None:
    """Adds SUITE_XLA_FLAGS to this process's XLA_FLAGS (read at JAX's backend start; every process the
    tests start inherits them), unless DEFAULTS_ENV is set or they are there already."""
    flags = os.environ.get("XLA_FLAGS", "")
    if not os.environ.get(DEFAULTS_ENV) and SUITE_XLA_FLAGS not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {SUITE_XLA_FLAGS}".strip()


Wants = tuple[int | None, bool]  # (devices, XLA's defaults) a marked test asks for


def required_devices(item: pytest.Item) -> int | None:
    marker = item.get_closest_marker("devices")
    if marker is None:
        return None
    if len(marker.args) != 1 or not isinstance(marker.args[0], int) or marker.args[0] < 1:
        raise pytest.UsageError(f"{item.nodeid}: use @pytest.mark.devices(n) with one integer n >= 1")
    return marker.args[0]


def child_env(n: int | None, defaults: bool = False) -> dict[str, str]:
    """This process's environment with `n` forced host devices (None: as here), XLA's default code
    generation if `defaults`, and the child marker."""
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    if n is not None:
        flags = " ".join([*re.sub(rf"{_FLAG}=\S*", "", flags).split(), f"{_FLAG}={n}"])
        env["JAX_PLATFORMS"] = "cpu"
    if defaults:
        flags = " ".join(flags.replace(SUITE_XLA_FLAGS, "").split())
        env[DEFAULTS_ENV] = "1"
    env["XLA_FLAGS"] = flags
    env[CHILD_ENV] = str(n or 0)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    return env


def junit_name(nodeid: str) -> tuple[str, str]:
    """(classname, name) of a test in a JUnit report, as pytest's junitxml writes them."""
    path, *names = nodeid.split("::")
    return ".".join([path.removesuffix(".py").replace("/", "."), *names[:-1]]), names[-1]


def _outcome(case: ET.Element | None) -> tuple[str, str]:
    """('passed' | 'skipped' | 'failed' | 'missing', message) of one test case of a JUnit report."""
    if case is None:
        return "missing", "the child did not report this test"
    for tag in ("failure", "error"):
        element = case.find(tag)
        if element is not None:
            return "failed", element.get("message", "")
    skipped = case.find("skipped")
    if skipped is not None:
        return "skipped", skipped.get("message", "")
    return "passed", ""


class _ChildRun:
    """One child pytest process that ran a group of marked tests: its exit code, output and the
    outcome of each test."""

    def __init__(self, items: list[pytest.Item], wants: Wants):
        n, defaults = wants
        self.what = " ".join(filter(None, [f"{n}-device" if n else "", "XLA-defaults" if defaults else ""]))
        self.timed_out = False
        timeout = TIMEOUT_S * len(items)
        with tempfile.TemporaryDirectory(prefix="jaxtrain-devices-") as tmp:
            report = Path(tmp) / "report.xml"
            command = [sys.executable, "-m", "pytest", *(item.nodeid for item in items), "-p", "no:xdist", "-p",
                       "no:cacheprovider", "-q", "-rs", f"--junitxml={report}"]
            try:
                proc = subprocess.run(command, cwd=items[0].config.rootpath, env=child_env(n, defaults),
                                      capture_output=True, text=True, timeout=timeout)
                self.returncode, self.output = proc.returncode, proc.stdout + proc.stderr
            except subprocess.TimeoutExpired as e:
                self.timed_out, self.returncode = True, None
                self.output = f"the {self.what} child process ran past {timeout} s:\n{e.stdout or ''}"
            cases = list(ET.parse(report).getroot().iter("testcase")) if report.exists() else []
        self.cases = {(c.get("classname"), c.get("name")): c for c in cases}

    def report(self, item: pytest.Item) -> None:
        """Returns if `item` passed in the child, else skips or fails it with the child's reason and output."""
        if self.timed_out:
            pytest.fail(self.output, pytrace=False)
        outcome, message = _outcome(self.cases.get(junit_name(item.nodeid)))
        if outcome == "passed":
            return
        if outcome == "skipped":
            pytest.skip(f"in the {self.what} child process: {message}")
        pytest.fail(f"in the {self.what} child process (exit code {self.returncode}, {outcome}): {message}\n"
                    f"--- child output ---\n{self.output}", pytrace=False)


_runs: dict[tuple[Path, Wants], _ChildRun] = {}  # (module path, what its tests want) -> its child run


def run_in_child(item: pytest.Item, wants: Wants) -> None:
    """Runs `item` (with the other selected tests of its module that want the same, the first time one
    of them gets here) in a fresh pytest process as `wants` says; reports `item`'s outcome there."""
    key = (item.path, wants)
    if key not in _runs:
        group = [i for i in item.session.items if i.path == item.path and _wants(i) == wants]
        _runs[key] = _ChildRun(group if item in group else [item], wants)
    _runs[key].report(item)


def _wants(item: pytest.Item) -> Wants:
    return required_devices(item), item.get_closest_marker("xla_defaults") is not None


def child_wants(item: pytest.Item) -> Wants | None:
    """What `item` asks for when it re-runs in a child of this process; None when it runs here."""
    n, defaults = wants = _wants(item)
    if (n is None and not defaults) or os.environ.get(CHILD_ENV):
        return None
    import jax

    fewer_devices = n is not None and jax.device_count() < n
    if fewer_devices or (defaults and SUITE_XLA_FLAGS in os.environ.get("XLA_FLAGS", "")):
        return wants
    return None


def runtest_setup(item: pytest.Item) -> None:
    """The `pytest_runtest_setup` hook (before pytest's own): a test that re-runs in a child sets its
    fixtures up there, so here none is (a fixture already in `funcargs` is not set up again). Without
    this, a module fixture that trains runs (tests/library/test_forms.py, tests/e2e/test_bench_faults.py)
    trained them here too, for nothing."""
    if isinstance(item, pytest.Function) and child_wants(item) is not None:
        item.funcargs.update((name, None) for name in item.fixturenames if name not in item.funcargs)


def pyfunc_call(item: pytest.Function) -> bool | None:
    """The `pytest_pyfunc_call` hook: True when the test was run in a child, None to run it here."""
    n = required_devices(item)
    if os.environ.get(CHILD_ENV) and n is not None:
        import jax

        if jax.device_count() < n:
            flags = os.environ.get("XLA_FLAGS")
            pytest.fail(f"the child process has {jax.device_count()} devices despite XLA_FLAGS={flags!r}",
                        pytrace=False)
    wants = child_wants(item)
    if wants is None:
        return None
    run_in_child(item, wants)
    return True
