"""`@pytest.mark.devices(n)`: run a test with at least `n` JAX devices.

JAX reads `XLA_FLAGS` once, when its backend starts, so a process that started with fewer devices
cannot get more. The marked tests of a module in such a process are re-run together in one fresh
pytest process whose `XLA_FLAGS` add `--xla_force_host_platform_device_count=n` (with
`JAX_PLATFORMS=cpu`, so the `n` devices are virtual CPU devices on any machine): the first of them
to run starts the child, which runs every marked test of that module selected in this session
(one start-up of Python, JAX and the module instead of one per test), and each outer test then
passes, fails or skips as its own run in the child did; a failure shows the child's output. Inside
the child (marked by `CHILD_ENV`) the tests run normally. Registered by `tests/conftest.py`.
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

MARKER = "devices(n): needs at least n JAX devices; re-run in a subprocess with n virtual CPU devices if fewer"
CHILD_ENV = "JAXTRAIN_TEST_DEVICES_CHILD"  # set to n in the child process
TIMEOUT_S = 300  # per test run in the child
_FLAG = "--xla_force_host_platform_device_count"


def required_devices(item: pytest.Item) -> int | None:
    marker = item.get_closest_marker("devices")
    if marker is None:
        return None
    if len(marker.args) != 1 or not isinstance(marker.args[0], int) or marker.args[0] < 1:
        raise pytest.UsageError(f"{item.nodeid}: use @pytest.mark.devices(n) with one integer n >= 1")
    return marker.args[0]


def child_env(n: int) -> dict[str, str]:
    """This process's environment with `n` forced host devices and the child marker."""
    env = dict(os.environ)
    flags = re.sub(rf"{_FLAG}=\S*", "", env.get("XLA_FLAGS", "")).split()
    env["XLA_FLAGS"] = " ".join([*flags, f"{_FLAG}={n}"])
    env["JAX_PLATFORMS"] = "cpu"
    env[CHILD_ENV] = str(n)
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

    def __init__(self, items: list[pytest.Item], n: int):
        self.n, self.timed_out = n, False
        timeout = TIMEOUT_S * len(items)
        with tempfile.TemporaryDirectory(prefix="jaxtrain-devices-") as tmp:
            report = Path(tmp) / "report.xml"
            command = [sys.executable, "-m", "pytest", *(item.nodeid for item in items), "-p", "no:xdist", "-p",
                       "no:cacheprovider", "-q", "-rs", f"--junitxml={report}"]
            try:
                proc = subprocess.run(command, cwd=items[0].config.rootpath, env=child_env(n), capture_output=True,
                                      text=True, timeout=timeout)
                self.returncode, self.output = proc.returncode, proc.stdout + proc.stderr
            except subprocess.TimeoutExpired as e:
                self.timed_out, self.returncode = True, None
                self.output = f"the {n}-device child process ran past {timeout} s:\n{e.stdout or ''}"
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
            pytest.skip(f"in the {self.n}-device child process: {message}")
        pytest.fail(f"in the {self.n}-device child process (exit code {self.returncode}, {outcome}): {message}\n"
                    f"--- child output ---\n{self.output}", pytrace=False)


_runs: dict[tuple[Path, int], _ChildRun] = {}  # (module path, n) -> its child run


def run_in_child(item: pytest.Item, n: int) -> None:
    """Runs `item` (with the other selected tests of its module marked for `n` devices, the first time
    one of them gets here) in a fresh pytest process with `n` devices; reports `item`'s outcome there."""
    key = (item.path, n)
    if key not in _runs:
        group = [i for i in item.session.items if i.path == item.path and required_devices(i) == n]
        _runs[key] = _ChildRun(group if item in group else [item], n)
    _runs[key].report(item)


def pyfunc_call(item: pytest.Function) -> bool | None:
    """The `pytest_pyfunc_call` hook: True when the test was run in a child, None to run it here."""
    n = required_devices(item)
    if n is None:
        return None
    import jax

    if os.environ.get(CHILD_ENV):
        if jax.device_count() < n:
            flags = os.environ.get("XLA_FLAGS")
            pytest.fail(f"the child process has {jax.device_count()} devices despite XLA_FLAGS={flags!r}",
                        pytrace=False)
        return None
    if jax.device_count() >= n:
        return None
    run_in_child(item, n)
    return True
