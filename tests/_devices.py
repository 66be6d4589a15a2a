"""`@pytest.mark.devices(n)`: run a test with at least `n` JAX devices.

JAX reads `XLA_FLAGS` once, when its backend starts, so a process that started with fewer devices
cannot get more. A marked test in such a process is re-run alone in a fresh pytest process whose
`XLA_FLAGS` add `--xla_force_host_platform_device_count=n` (with `JAX_PLATFORMS=cpu`, so the `n`
devices are virtual CPU devices on any machine). The outer test passes, fails or skips as the child
did, and a failure shows the child's output. Inside the child (marked by `CHILD_ENV`) the test runs
normally. Registered by `tests/conftest.py`.
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
TIMEOUT_S = 300
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


def _outcome(junit_xml: Path) -> tuple[str, str]:
    """('passed' | 'skipped' | 'failed' | 'missing', message) of the one test case in a JUnit report."""
    cases = list(ET.parse(junit_xml).getroot().iter("testcase")) if junit_xml.exists() else []
    if len(cases) != 1:
        return "missing", f"the child ran {len(cases)} tests, expected 1"
    for tag in ("failure", "error"):
        element = cases[0].find(tag)
        if element is not None:
            return "failed", element.get("message", "")
    skipped = cases[0].find("skipped")
    if skipped is not None:
        return "skipped", skipped.get("message", "")
    return "passed", ""


def run_in_child(item: pytest.Item, n: int) -> None:
    """Runs exactly `item` in a fresh pytest process with `n` devices; returns if it passed, else skips
    or fails this test with the child's reason and output."""
    with tempfile.TemporaryDirectory(prefix="jaxtrain-devices-") as tmp:
        report = Path(tmp) / "report.xml"
        command = [sys.executable, "-m", "pytest", item.nodeid, "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
                   "-rs", f"--junitxml={report}"]
        try:
            proc = subprocess.run(command, cwd=item.config.rootpath, env=child_env(n), capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"the {n}-device child process ran past {TIMEOUT_S} s:\n{e.stdout or ''}", pytrace=False)
        outcome, message = _outcome(report)
    if proc.returncode == 0 and outcome == "passed":
        return
    if proc.returncode == 0 and outcome == "skipped":
        pytest.skip(f"in the {n}-device child process: {message}")
    pytest.fail(f"in the {n}-device child process (exit code {proc.returncode}, {outcome}): {message}\n"
                f"--- child output ---\n{proc.stdout}{proc.stderr}", pytrace=False)


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
