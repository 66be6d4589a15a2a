"""`jaxtrain compare RUN_DIR...`: several runs side by side. A table of the config keys that differ
between them and their key results (from config.json and summary.json), and one PNG overlaying
their training and validation loss against step and against wall time (from metrics.jsonl)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jaxtrain import ConfigError
from jaxtrain.engine import format_bytes, log_scale_with_plain_labels, save_figure

# Where a run lives (it differs between any two runs) and how much it printed: not what it did.
IGNORED_KEYS = ("run_dir", "quiet", "verbosity")
COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974",
          "#64b5cd")
_MISSING = object()


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What `compare` reads from one run directory.

    Attributes:
      path: the run directory.
      label: its column heading: the directory's name (its path where two names clash).
      config: config.json flattened to dotted keys (`optim.lr`); lists stay values.
      summary: summary.json, or {} while the run has none (running, or killed).
      records: the rows of metrics.jsonl.
    """

    path: Path
    label: str
    config: dict[str, Any]
    summary: dict[str, Any]
    records: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The runs and their table rows: each row a label and one cell per run.

    Attributes:
      runs: the runs, in the order given.
      differences: (dotted config key, values per run) for each key whose values differ, sorted by key.
      results: (label, cells per run, index of the best run or None) for each result any run has.
    """

    runs: list[RunRecord]
    differences: list[tuple[str, list[Any]]]
    results: list[tuple[str, list[str], int | None]]


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"optim": {"lr": 1e-3}}` -> `{"optim.lr": 1e-3}`; lists and scalars are leaves."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e.msg} at line {e.lineno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path} holds {type(value).__name__}, not a JSON object; is it a jaxtrain run's file?")
    return value


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of metrics.jsonl; a last line cut short (a run killed while writing it) is dropped."""
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    lines = text.split("\n")
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines):  # no newline after it: the write was interrupted
                continue
            raise ConfigError(f"{path} line {number} is not valid JSON ({e.msg})") from None
        if isinstance(row, dict):
            rows.append(row)
    return rows


def load_run(run_dir: str | os.PathLike, label: str | None = None) -> RunRecord:
    """Reads a run directory's config.json, summary.json (if written yet) and metrics.jsonl.

    Raises:
      ConfigError: no such directory, no config.json in it, or a file that is not valid JSON.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise ConfigError(f"run directory {path} does not exist")
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path} is not a jaxtrain run directory (no config.json); pass directories that "
                          "`jaxtrain train` or `jaxtrain.fit(run_dir=...)` wrote")
    config = flatten(_read_json(path / "config.json"))
    summary = _read_json(path / "summary.json") if (path / "summary.json").is_file() else {}
    return RunRecord(path, label or path.name, config, summary, _read_metrics(path / "metrics.jsonl"))


def _labels(paths: Sequence[Path]) -> list[str]:
    """Directory names, or the paths as given where two names are the same."""
    names = [p.name or str(p) for p in paths]
    return [str(p) if names.count(n) > 1 else n for p, n in zip(paths, names)]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _best(values: list[Any], lowest: bool) -> int | None:
    """Index of the best finite number among `values` when at least two runs have one, else None."""
    numbers = [(v, i) for i, v in enumerate(map(_number, values)) if v is not None and math.isfinite(v)]
    if len(numbers) < 2 or len({v for v, _ in numbers}) < 2:
        return None
    return (min(numbers) if lowest else max(numbers))[1]


def _format(value: Any, digits: int = 5) -> str:
    if value is _MISSING or value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, list):
        return "[" + ", ".join(_format(v, digits) for v in value) + "]"
    return str(value)


def _seconds(value: Any) -> str:
    if _number(value) is None:
        return "-"
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min"


def _peak(summary: dict[str, Any]) -> int | None:
    memory = summary.get("compiled_memory")
    return memory.get("peak_bytes") if isinstance(memory, dict) else None


def compare_runs(run_dirs: Sequence[str | os.PathLike]) -> Comparison:
    """Reads the runs and builds the rows of the comparison table.

    Raises:
      ConfigError: no run given, or a run directory that cannot be read (see `load_run`).
    """
    if not run_dirs:
        raise ConfigError("no run directory given; usage: jaxtrain compare RUN_DIR... [--out FILE.png]")
    paths = [Path(p) for p in run_dirs]
    runs = [load_run(p, label) for p, label in zip(paths, _labels(paths))]

    keys = sorted({k for r in runs for k in r.config if k not in IGNORED_KEYS})
    differences = []
    for key in keys:
        values = [r.config.get(key, _MISSING) for r in runs]
        if any(json.dumps(v, default=str) != json.dumps(values[0], default=str) for v in values[1:]):
            differences.append((key, values))

    summaries = [r.summary for r in runs]
    results: list[tuple[str, list[str], int | None]] = []

    def row(label: str, key: str, lowest: bool | None = None, fmt: Any = _format) -> None:
        values = [s.get(key) for s in summaries]
        if all(v is None for v in values):
            return
        best = None if lowest is None else _best(values, lowest)
        results.append((label, [fmt(v) for v in values], best))

    results.append(("status", [s.get("status", "no summary.json (running or killed)") for s in summaries], None))
    row("epochs", "epochs")
    row("steps", "steps", fmt=lambda v: "-" if v is None else f"{v:,}")
    row("final train loss", "final_train_loss", lowest=True)
    best_val = [s.get("best_val_loss") for s in summaries]
    if any(v is not None for v in best_val):
        cells = [_format(v) + (f" (epoch {s['best_epoch']})" if v is not None and s.get("best_epoch") else "")
                 for v, s in zip(best_val, summaries)]
        results.append(("best val loss", cells, _best(best_val, lowest=True)))
    row("final val loss", "final_val_loss", lowest=True)
    metrics = sorted({k for s in summaries for k in s if k.startswith("final_val_") and k != "final_val_loss"})
    for key in metrics:
        name = key.removeprefix("final_")
        lowest = not any(word in name for word in ("acc", "f1", "precision", "recall", "auc"))
        row(f"final {name.replace('_', ' ')}", key, lowest=lowest)
    row("wall time", "total_time_s", fmt=_seconds)
    row("compile time", "compile_time_s", fmt=_seconds)
    row("samples/s", "samples_per_s", lowest=False, fmt=lambda v: "-" if v is None else f"{v:,.0f}")
    peaks = [_peak(s) for s in summaries]
    if any(p is not None for p in peaks):
        results.append(("compiled memory peak", ["-" if p is None else format_bytes(p) for p in peaks],
                        _best(peaks, lowest=True)))
    row("device", "device")
    return Comparison(runs, differences, results)


def print_comparison(comparison: Comparison, console: Console) -> None:
    """The table: the config keys that differ first, then the results (the best of each in green)."""
    runs = comparison.runs
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("", style="bold")
    for r in runs:
        table.add_column(escape(r.label), justify="right", overflow="fold")
    if comparison.differences:
        for key, values in comparison.differences:
            table.add_row(escape(key), *(escape(_format(v)) for v in values))
    else:
        same = "one run" if len(runs) == 1 else "identical configs"
        table.add_row(f"[dim]config: {same}[/dim]", *("" for _ in runs))
    table.add_section()
    for label, cells, best in comparison.results:
        table.add_row(escape(label), *(f"[bold green]{escape(c)}[/bold green]" if i == best else escape(c)
                                       for i, c in enumerate(cells)))
    console.print(table)
    n = len(comparison.differences)
    console.print(f"[dim]{len(runs)} run{'s' if len(runs) != 1 else ''}; {n} config "
                  f"{'key differs' if n == 1 else 'keys differ'} "
                  f"({', '.join(IGNORED_KEYS)} not compared); best of each result in green[/dim]", soft_wrap=True)


def plot_comparison(comparison: Comparison, out: str | os.PathLike) -> Path:
    """Overlays every run's training loss (solid) and validation loss (dashed) against optimizer
    step and against wall time, two panels, in a PNG at `out`; returns its path.

    Raises:
      ConfigError: no run has any loss recorded yet, or the PNG cannot be written there.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not any(r.get("kind") in ("train", "epoch") for run in comparison.runs for r in run.records):
        raise ConfigError("none of the runs has recorded a loss yet (their metrics.jsonl hold no training rows)")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for ax, x_key, label in ((axes[0], "step", "optimizer step"), (axes[1], "elapsed_s", "wall time (s)")):
        for i, run in enumerate(comparison.runs):
            color = COLORS[i % len(COLORS)]
            train = [r for r in run.records if r.get("kind") == "train" and r.get("loss") is not None]
            if not train:  # no per-interval rows (a short run): the epoch means
                train = [{**r, "loss": r["train_loss"]} for r in run.records
                         if r.get("kind") == "epoch" and r.get("train_loss") is not None]
            train = [r for r in train if r.get(x_key) is not None]
            if train:
                ax.plot([r[x_key] for r in train], [r["loss"] for r in train], "-", color=color, lw=1.2,
                        label=f"{run.label} train")
            val = [r for r in run.records if r.get("kind") == "epoch" and r.get("val_loss") is not None
                   and r.get(x_key) is not None]
            if val:
                ax.plot([r[x_key] for r in val], [r["val_loss"] for r in val], "o--", color=color, ms=4,
                        label=f"{run.label} validation")
        ax.set_xlabel(label)
        ax.set_ylabel("loss")
        log_scale_with_plain_labels(ax)  # 0.06, as the runs' own curves.png, not 6×10⁻²
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[1].set_title("wall time includes compilation", fontsize=9)
    fig.suptitle(f"{len(comparison.runs)} runs: training (solid) and validation (dashed) loss")
    fig.tight_layout()
    return save_figure(fig, Path(out), make_parent=True)
