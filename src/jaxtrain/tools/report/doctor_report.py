"""What `jaxtrain doctor` prints: a table of the checks, then one line per failure and a tally."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jaxtrain.tools.diagnose.doctor import STATUSES, Check

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def print_checks(checks: Sequence[Check], console: Console, seconds: float | None = None) -> None:
    """The checks as a table (name, status, value, detail); each failure again below it as
    `fail: <detail>`; then how many of each status (and how long the checks took)."""
    table = Table(show_edge=False, pad_edge=False)
    for column in ("check", "status", "value", "detail"):
        table.add_column(column, overflow="fold")
    for c in checks:
        style = _STYLE[c.status]
        table.add_row(escape(c.name), f"[{style}]{c.status}[/{style}]", escape(c.value), escape(c.detail))
    console.print(table)
    for c in checks:
        if c.status == "fail":
            console.print(f"[bold red]fail[/bold red]: {escape(c.detail)}", soft_wrap=True)
    tally = ", ".join(f"{sum(c.status == s for c in checks)} {s}" for s in STATUSES)
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    console.print(f"{tally}{took}", soft_wrap=True)


def checks_json(checks: Sequence[Check], seconds: float | None = None) -> str:
    """The checks as a JSON document: {"ok": no failure, "seconds": ..., "checks": [records]}."""
    payload: dict[str, Any] = {"ok": not any(c.status == "fail" for c in checks), "seconds": seconds,
                               "checks": [dataclasses.asdict(c) for c in checks]}
    return json.dumps(payload, indent=2, default=str)
