"""Finding what is slow: `jaxtrain doctor` (the machine's setup) and `jaxtrain scan` (static analysis of
training code)."""

from jaxtrain.diagnose.doctor import Check, failed, run_checks
from jaxtrain.diagnose.scan import RULES, SEVERITIES, Finding, Rule, ScanResult, python_files, scan_paths, scan_source

__all__ = [
    "Check",
    "Finding",
    "RULES",
    "Rule",
    "SEVERITIES",
    "ScanResult",
    "failed",
    "python_files",
    "run_checks",
    "scan_paths",
    "scan_source",
]
