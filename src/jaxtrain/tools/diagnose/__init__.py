"""Finding what is slow: `jaxtrain doctor` (the machine's setup), `jaxtrain scan` (static analysis of
training code) and `jaxtrain profile` (where a run's time goes, with a verdict)."""

from jaxtrain.tools.diagnose.doctor import Check, failed, run_checks
from jaxtrain.tools.diagnose.profile import profile_recipe
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
