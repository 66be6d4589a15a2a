"""What `jaxtrain data generate` and `jaxtrain data inspect` print: a progress bar, a summary line, tables."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from jaxtrain.engine import GenerateResult


@contextlib.contextmanager
def row_progress(label: str, total: int, console: Console, quiet: bool = False) -> Iterator[Callable[[int], None]]:
    """A progress bar of `total` rows while the block runs; yields the callback that sets the rows done."""
    progress = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("rows ETA"),
                        TimeRemainingColumn(), console=console, disable=quiet)
    with progress:
        task = progress.add_task("generate", total=total)
        yield lambda rows: progress.update(task, completed=rows)


def print_generated(result: GenerateResult, console: Console) -> None:
    """The line after `generate_dataset`: file, rows, time, rate and size on disk."""
    console.print(f"wrote {result.path}: {result.samples:,} rows in {result.seconds:.1f} s "
                  f"({result.rows_per_s:,.0f} rows/s), {result.bytes / 1024**2:,.1f} MiB on disk", markup=False,
                  soft_wrap=True)


def _mib(n: int) -> str:
    return f"{n / 1024**2:,.1f} MiB"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _attr(value: Any) -> str:
    if isinstance(value, list) and len(value) > 4:
        head = ", ".join(_num(v) if isinstance(v, float) else str(v) for v in value[:3])
        return f"[{head}, ...] ({len(value)} values)"
    return str(value)


def print_inspection(report: dict[str, Any], console: Console, max_columns: int = 8) -> None:
    """Prints an `inspect_file` report, plus "peak_rss_bytes" (the process's peak RSS), as rich tables."""
    console.print(f"{report['file']}: {_mib(report['size_bytes'])} on disk", style="bold", markup=False, soft_wrap=True)
    table = Table(title="datasets", title_justify="left")
    for column in ("name", "shape", "dtype", "chunks", "compression", "on disk", "uncompressed"):
        table.add_column(column, justify="right" if column in ("on disk", "uncompressed") else "left")
    for d in report["datasets"]:
        compression = d["compression"] or "none"
        if d["compression_opts"] is not None:
            compression += f" ({d['compression_opts']})"
        table.add_row(d["name"], str(tuple(d["shape"])), d["dtype"], str(tuple(d["chunks"])) if d["chunks"] else
                      "contiguous", compression, _mib(d["storage_bytes"]), _mib(d["nbytes"]))
    console.print(table)
    if report["attrs"]:
        attrs = Table(title="attributes", title_justify="left")
        attrs.add_column("name")
        attrs.add_column("value", overflow="fold")
        for key, value in report["attrs"].items():
            attrs.add_row(key, _attr(value))
        console.print(attrs)
    for d in report["datasets"]:
        _print_dataset(d, console, max_columns)
    console.print(f"sampled up to {max((d['sampled_rows'] for d in report['datasets']), default=0):,} rows per "
                  f"dataset in {report['seconds']:.2f} s; peak memory: {_mib(report['sample_peak_bytes'])} of "
                  f"arrays read (tracemalloc), {_mib(report['peak_rss_bytes'])} process RSS", soft_wrap=True)


def _print_dataset(d: dict[str, Any], console: Console, max_columns: int) -> None:
    if d["note"]:
        console.print(f"{d['name']}: {d['note']}", markup=False, soft_wrap=True)
        return
    title = (f"{d['name']}: {d['sampled_rows']:,} of {d['shape'][0]:,} rows sampled "
             f"({d['sample_ranges']} contiguous range{'s' if d['sample_ranges'] != 1 else ''})")
    table = Table(title=title, title_justify="left")
    for column in ("column", "mean", "std", "min", "max", "NaN", "Inf"):
        table.add_column(column, justify="left" if column == "column" else "right")

    def add(label: str, s: dict[str, Any], **style) -> None:
        table.add_row(label, *(_num(s[k]) for k in ("mean", "std", "min", "max")), f"{s['nan']:,}", f"{s['inf']:,}",
                      **style)

    columns = d["columns"]
    tokens = d["histogram"] is not None and len(columns) > 1  # e.g. (N, L) symbols: a histogram says more
    if not tokens and len(columns) > 1:
        for i, s in enumerate(columns[:max_columns]):
            add(str(i), s)
        if len(columns) > max_columns:
            table.add_row(f"... {len(columns) - max_columns} more (--json)", *[""] * 6)
    add(f"all {len(columns)}" if len(columns) > 1 else "all", d["overall"], style="bold")
    console.print(table)
    if d["histogram"] is not None:
        counts = {int(k): v for k, v in d["histogram"].items()}
        total = sum(counts.values())
        shown = ", ".join(f"{k}: {100 * v / total:.1f}%" for k, v in list(counts.items())[:32])
        more = f", ... ({len(counts) - 32} more)" if len(counts) > 32 else ""
        console.print(f"  values {min(counts)}..{max(counts)}, {len(counts)} distinct: {shown}{more}", soft_wrap=True)
