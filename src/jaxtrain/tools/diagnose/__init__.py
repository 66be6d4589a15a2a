"""Finding what is slow: `jaxtrain doctor` (the machine's setup), `jaxtrain scan` (static analysis of
training code) and `jaxtrain profile` (where a run's time goes, with a verdict).

The scan reads source and needs no JAX; the doctor's and the profile's names import JAX, so they
are imported on first use (PEP 562 `__getattr__`): `jaxtrain scan` and the commands' `--help`
answer without loading it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from jaxtrain.tools.diagnose.scan import (
    RULES,
    SEVERITIES,
    Finding,
    Rule,
    ScanResult,
    python_files,
    scan_paths,
    scan_source,
)

if TYPE_CHECKING:
    from jaxtrain.tools.diagnose.doctor import Check, failed, run_checks
    from jaxtrain.tools.diagnose.profile import profile_recipe

# name -> its module, imported on first use
_LAZY = {"Check": "doctor", "failed": "doctor", "run_checks": "doctor", "profile_recipe": "profile"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


__all__ = [
    "Check",
    "Finding",
    "RULES",
    "Rule",
    "SEVERITIES",
    "ScanResult",
    "failed",
    "profile_recipe",
    "python_files",
    "run_checks",
    "scan_paths",
    "scan_source",
]
