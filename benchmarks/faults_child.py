"""The child process of `jaxtrain bench faults`: `jaxtrain ARGS` with the probes listening, killed at
its moment (a module of its own: it runs the command line, which lists the benchmarks)."""

from __future__ import annotations

from typing import Any

from benchmarks.child import child_main
from benchmarks.faults import _Probes


def _probed_train(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs `jaxtrain ARGS` with the probes installed: {"exit_code", "counts"} unless killed."""
    from jaxtrain.tools import cli

    probes = _Probes(payload["moment"], payload["nth"])
    probes.install()
    code = cli.main(payload["args"])
    return {"exit_code": code, "counts": probes.counts}


if __name__ == "__main__":
    child_main(_probed_train)
