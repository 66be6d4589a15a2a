"""Fresh-process benchmark runs, and what a process can say about itself.

A benchmark runs each variant in a fresh process (no compile cache or memory high-water mark
shared): the parent calls `run_child(target, payload)`, which runs `python -m target --child JSON`
(or `python target.py --child JSON`); the child ends with `child_main(fn)`, which prints
`fn(payload)` as one JSON line. A child that raises prints {"error": ...} instead and exits 1.

`benchmarks/` is not installed: a child started by module name finds it through PYTHONPATH, which
`child_environ` puts the checkout on (from any working directory).

The standard library and `jaxtrain.tools.peak_memory` only (which loads no JAX): `torch_models.py`,
run as a script so that its process never loads JAX, imports this file as a sibling module.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from jaxtrain.tools.peak_memory import peak_rss_bytes

CHILD_FLAG = "--child"
CHECKOUT = Path(__file__).resolve().parents[1]  # the folder that holds benchmarks/


def child_environ(env: dict[str, str | None] | None = None) -> dict[str, str]:
    """This process's environment for a child, `env` over it (None removes a variable), with the checkout
    first on PYTHONPATH so that `python -m benchmarks.NAME` finds this package; a PYTHONPATH that `env`
    gives is kept as given (a `bench frameworks --baseline-src` child runs another checkout's code)."""
    environ = {**os.environ, **(env or {})}
    if "PYTHONPATH" not in (env or {}):
        environ["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), *filter(None, [environ.get("PYTHONPATH")])])
    return {k: v for k, v in environ.items() if v is not None}


def run_child(target: str | Path, payload: Any, timeout: float | None = None,
              env: dict[str, str | None] | None = None) -> dict[str, Any]:
    """Runs `child_main` of `target` in a fresh Python process and returns its result.

    Args:
      target: a module name (run with `python -m`) or the path of a script (a `.py` file).
      payload: the JSON-able argument of the child's function.
      timeout: seconds before the child is killed (None: no limit).
      env: environment variables to set in the child, over this process's; None removes one.

    Returns:
      The child's JSON object; {"error": one line} when it failed: its own error, else the last
      line of its stderr, else its exit code.
    """
    script = str(target).endswith(".py")
    # A script runs with -P: its directory is not put first on sys.path, where this package's
    # benchmarks/profile.py would shadow the standard library's `profile` (which torch imports).
    command = [sys.executable, "-P" if script else "-m", str(target), CHILD_FLAG, json.dumps(payload)]
    environ = child_environ({"PYTHONUNBUFFERED": "1", **(env or {})})
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=environ, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        result = None
    if proc.returncode == 0 and isinstance(result, dict):
        return result
    if isinstance(result, dict) and "error" in result:
        return {"error": str(result["error"])}
    stderr = proc.stderr.strip().splitlines()
    return {"error": stderr[-1] if stderr else f"exit code {proc.returncode}, no output"}


def child_main(fn: Callable[[Any], dict[str, Any]]) -> None:
    """The child's side of `run_child`: prints `fn(payload)` as one JSON line on stdout.

    An exception is printed to stderr and reported as {"error": "Type: first line"}, exit code 1,
    so that the parent records it and goes on.
    """
    if len(sys.argv) != 3 or sys.argv[1] != CHILD_FLAG:
        sys.exit(f"usage: {Path(sys.argv[0]).name} {CHILD_FLAG} JSON (a child process of `jaxtrain bench`)")
    try:
        result = fn(json.loads(sys.argv[2]))
    except Exception as e:
        traceback.print_exc()
        first_line = (str(e).strip().splitlines() or [""])[0]
        print(json.dumps({"error": f"{type(e).__name__}: {first_line}"[:500]}))
        sys.exit(1)
    print(json.dumps(result))


def peak_rss_mib() -> float:
    """This process's peak resident set size so far, in MiB."""
    return peak_rss_bytes() / 2**20


def torch_available() -> bool:
    """Whether PyTorch can be imported (without importing it)."""
    return importlib.util.find_spec("torch") is not None
