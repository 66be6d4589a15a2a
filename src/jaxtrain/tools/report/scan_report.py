"""What `jaxtrain scan` prints: findings like a linter's, a summary table by severity, or JSON."""

from __future__ import annotations

import json
import textwrap
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from jaxtrain.tools.diagnose.scan import RULES, SEVERITIES, ScanResult

STYLES = {"high": "bold red", "medium": "yellow", "low": "cyan"}


def _wrapped(label: str, text: str, width: int) -> str:
    return textwrap.fill(text, width=width, initial_indent=f"    {label:<5} ", subsequent_indent=" " * 10)


def print_findings(result: ScanResult, console: Console) -> None:
    """One line per finding (`path:line:col: rule [severity, confidence] message`), the rule's why, fix
    and gain under its first finding, then the summary table."""
    width = max(60, min(console.width, 110))
    explained: set[str] = set()
    for f in result.findings:
        rule = RULES[f.rule]
        line = Text(f"{f.path}:{f.line}:{f.col}: ", style="bold")
        line.append(f.rule, style="bold")
        line.append(" [")
        line.append(f.severity, style=STYLES[f.severity])
        line.append(f", confidence {f.confidence}] {f.message}")
        console.print(line, soft_wrap=True)
        if f.rule in explained:
            continue
        explained.add(f.rule)
        for label, text in (("why:", rule.why), ("fix:", rule.fix), ("gain:", rule.gain)):
            console.print(_wrapped(label, text, width), markup=False, highlight=False, soft_wrap=True)
    if result.findings:
        console.print()
    print_summary(result, console)


def print_summary(result: ScanResult, console: Console) -> None:
    """A table of findings per rule, worst severity first, and a closing count."""
    n_files = len(result.files)
    files = f"{n_files} file{'s' if n_files != 1 else ''}"
    if not result.findings:
        console.print(f"no findings in {files}", highlight=False)
        return
    table = Table(show_edge=False, pad_edge=False)
    for column in ("severity", "rule", "findings", "files", "expected gain"):
        table.add_column(column, justify="right" if column in ("findings", "files") else "left")
    for severity in SEVERITIES:
        found = [f for f in result.findings if f.severity == severity]
        for rule_id in dict.fromkeys(f.rule for f in found):  # in order of first appearance
            mine = [f for f in found if f.rule == rule_id]
            rule = RULES[rule_id]
            table.add_row(Text(severity, style=STYLES[severity]), rule_id, str(len(mine)),
                          str(len({f.path for f in mine})), rule.gain)
    console.print(table)
    counts = result.counts()
    total = len(result.findings)
    console.print(f"{total} finding{'s' if total != 1 else ''} in {files}: "
                  + ", ".join(f"{counts[s]} {s}" for s in SEVERITIES), highlight=False)


def scan_json(result: ScanResult) -> dict[str, Any]:
    """The result as a JSON-ready dict: files, counts per severity, and every finding with its rule's
    why, fix and gain."""
    return {
        "files": list(result.files),
        "summary": {**result.counts(), "findings": len(result.findings), "files": len(result.files)},
        "findings": [f.to_dict() for f in result.findings],
    }


def print_json(result: ScanResult) -> None:
    print(json.dumps(scan_json(result), indent=2))


def print_rules(console: Console) -> None:
    """The rule table (for `jaxtrain scan --help`): id, default severity, what it is, gain, confidence."""
    table = Table(show_edge=False, pad_edge=False, title="rules", title_justify="left", show_lines=False)
    table.add_column("rule", no_wrap=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("what / expected gain / confidence")
    for rule in RULES.values():
        table.add_row(rule.id, Text(rule.severity, style=STYLES[rule.severity]),
                      f"{rule.message}\ngain: {rule.gain}; confidence {rule.confidence}")
    console.print(table)
