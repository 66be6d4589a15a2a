"""Loss curves of a run, drawn from its metrics.jsonl: training and validation loss against
step and against wall time, plus accuracy-like metrics where the run has them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jaxtrain._src.errors import ConfigError, argument
from jaxtrain._src.report.run_dir import read_jsonl
from jaxtrain._src.safe_files import atomic_write


def plot_run(run_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Draws `run_dir/metrics.jsonl` to a PNG (default `run_dir/curves.png`) and returns its path.

    Raises:
      ConfigError: when the directory has no metrics.jsonl or it holds no training records yet, or
        the PNG cannot be written there.
    """
    return save_figure(loss_figure(run_dir), Path(out) if out else Path(run_dir) / "curves.png")


def loss_figure(run_dir: str | os.PathLike) -> Any:
    """The matplotlib figure `plot_run` writes (ConfigError when there is nothing to draw)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = Path(run_dir) / "metrics.jsonl"
    if not metrics.is_file():
        raise ConfigError(f"{run_dir} has no metrics.jsonl; is it a jaxtrain run directory?")
    records = read_jsonl(metrics)
    train = [r for r in records if r.get("kind") == "train"]
    epochs = [r for r in records if r.get("kind") == "epoch"]
    if not train and not epochs:
        raise ConfigError(f"{metrics} has no training records yet")
    extra = sorted({k for r in epochs for k in r if k.startswith("val_") and k != "val_loss"
                    and not k.endswith(("_s", "loss"))})
    panels = 2 + (1 if extra else 0)
    width, height = 5.2 * panels, 4.2
    fig, axes = plt.subplots(1, panels, figsize=(width, height))
    # Margins fixed in inches (room for the tick labels, axis labels and the title), not measured by
    # `tight_layout`, which draws every text once more to measure it: half of a plot's time.
    left, right, gap = 1.0, 0.2, 1.1
    axes_width = (width - left - right - gap * (panels - 1)) / panels
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=0.55 / height, top=1 - 0.75 / height,
                        wspace=gap / axes_width)
    for ax, x_key, label in ((axes[0], "step", "optimizer step"), (axes[1], "elapsed_s", "wall time (s)")):
        if train:
            ax.plot([r[x_key] for r in train], [r["loss"] for r in train], color="#4c72b0", alpha=0.5, lw=1,
                    label="train (per log interval)")
        ax.plot([r[x_key] for r in epochs], [r["train_loss"] for r in epochs], "o-", color="#4c72b0",
                label="train (epoch mean)")
        val = [r for r in epochs if r.get("val_loss") is not None]
        if val:
            ax.plot([r[x_key] for r in val], [r["val_loss"] for r in val], "s-", color="#dd8452", label="validation")
            best = min(val, key=lambda r: r["val_loss"])
            ax.plot([best[x_key]], [best["val_loss"]], "*", ms=14, color="#c44e52", label="best validation")
        ax.set_xlabel(label)
        ax.set_ylabel("loss")
        log_scale_with_plain_labels(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if extra:
        ax = axes[2]
        for name in extra:
            points = [r for r in epochs if r.get(name) is not None]
            ax.plot([r["step"] for r in points], [r[name] for r in points], "o-", label=name)
        ax.set_xlabel("optimizer step")
        ax.set_title("validation metrics")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{Path(run_dir).name}: training and validation loss")
    return fig


def log_scale_with_plain_labels(ax: Any) -> None:
    """Puts `ax`'s y axis on a log scale whose tick labels are plain numbers (0.06, 0.1, 2e-05),
    labelled where matplotlib's default would label them. The default writes TeX-like text (6×10⁻²)
    that its math-text parser reads label by label; a run's one plot paid for building that parser
    too (a first plot in a process: 0.26 s with it, 0.22 s without; docs/benchmarks.md). `jaxtrain
    compare` draws its loss axes alike."""
    from matplotlib.ticker import LogFormatter

    class PlainLog(LogFormatter):
        def __call__(self, x: float, pos: int | None = None) -> str:
            return f"{x:.3g}" if super().__call__(x, pos) else ""

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(PlainLog())
    ax.yaxis.set_minor_formatter(PlainLog(labelOnlyBase=False))


def save_figure(fig: Any, path: Path, make_parent: bool = False) -> Path:
    """Writes `fig` to `path` (creating its directory when `make_parent`) and closes it; ConfigError
    (one line) when it cannot."""
    import matplotlib.pyplot as plt

    try:
        if make_parent:
            path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path, advice=f"write the plot elsewhere with {argument('out', placeholder='FILE.png')}") as f:
            fig.savefig(f, dpi=110, format=path.suffix.lstrip(".").lower() or "png")
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror or e}; write the plot elsewhere with "
                          f"{argument('out', placeholder='FILE.png')}", path=path) from None
    finally:
        plt.close(fig)
    return path
