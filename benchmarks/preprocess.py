"""`jaxtrain bench preprocess`: what the on-disk cache of decoded datasets saves.

For MNIST, Fashion-MNIST (decoding the four gzipped IDX files) and Tiny Shakespeare (tokenising
the text), the time of the public loader (`load_mnist`, `load_tinyshakespeare`):
(a) off: the cache turned off (`JAXTRAIN_CACHE=0`);
(b) cold: an empty cache directory, so it decodes and writes the entry;
(c) warm: it reads the entry (from the OS page cache, as a run soon after another does; a read
    from a cold disk takes longer).
Every load includes `fetch`'s SHA-256 check of the source files, also timed alone. Each repetition
uses a fresh temporary cache directory, the three kinds interleaved; medians of `--repeats`. The
cached arrays are compared with the uncached ones, element for element.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from rich.console import Console
from rich.table import Table

from jaxtrain._src.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class PreprocessBenchConfig:
    """Settings of the cached-preprocessing benchmark."""

    repeats: int = 5
    """Interleaved repetitions of each load (the median is reported)."""
    quick: bool = False
    """A cut-down run for smoke tests (one repetition)."""

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ConfigError(f"repeats={self.repeats} must be an integer >= 1")


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    """Sets environment variables for the block and restores the previous values."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _leaves(out: Any) -> list[Any]:
    """The arrays (and tokenizer) a loader returns, in order."""
    if isinstance(out, dict):
        return [out[k] for k in sorted(out)]
    if isinstance(out, (tuple, list)):
        return [leaf for item in out for leaf in _leaves(item)]
    return [out]


def _identical(a: Any, b: Any) -> bool:
    """Same arrays (values, dtypes, shapes) and equal non-array parts."""
    pairs = list(zip(_leaves(a), _leaves(b), strict=True))
    return all(x.dtype == y.dtype and np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y
               for x, y in pairs)


def measure(name: str, load: Callable[[], Any], sources: list[Path], repeats: int, root: Path) -> dict[str, Any]:
    """Median seconds of `load()` uncached, cold and warm (each repetition in a fresh cache
    directory under `root`), of hashing `sources`, and whether the outputs were identical."""
    from jaxtrain._src.data.cache import CACHE_DIR_ENV, CACHE_ENV, file_sha256

    times: dict[str, list[float]] = {"hash": [], "uncached": [], "cold": [], "warm": []}
    identical, entry_bytes = True, 0
    for r in range(repeats):
        times["hash"].append(_timed(lambda: [file_sha256(s) for s in sources])[0])
        with _env(**{CACHE_ENV: "0"}):
            seconds, reference = _timed(load)
        times["uncached"].append(seconds)
        directory = root / f"{name}-{r}"
        with _env(**{CACHE_ENV: "1", CACHE_DIR_ENV: str(directory)}):
            seconds, cold = _timed(load)
            times["cold"].append(seconds)
            seconds, warm = _timed(load)
            times["warm"].append(seconds)
        identical = identical and _identical(reference, cold) and _identical(reference, warm)
        entry_bytes = sum(p.stat().st_size for p in directory.glob("*.npz"))
    return {**{k: statistics.median(v) for k, v in times.items()}, "identical": identical, "entry_bytes": entry_bytes}


def main(config: PreprocessBenchConfig) -> int:
    from jaxtrain._src.data.datasets import DATASETS, fetch, load_mnist, load_tinyshakespeare

    if config.quick:
        config = dataclasses.replace(config, repeats=1)
    cases = [
        ("mnist (decode)", "mnist", lambda: load_mnist("mnist")),
        ("fashion_mnist (decode)", "fashion_mnist", lambda: load_mnist("fashion_mnist")),
        ("tinyshakespeare (tokenise)", "tinyshakespeare", load_tinyshakespeare),
    ]
    console = Console(highlight=False)
    table = Table(title=f"ms to load a dataset with the preprocessing cache off, cold (build + write) and "
                        f"warm (read), median of {config.repeats}")
    columns = ("dataset", "off", "cold", "warm", "saved", "off / warm", "SHA-256", "entry", "equal")
    for column in columns:
        table.add_column(column, justify="left" if column == "dataset" else "right")
    all_identical = True
    with tempfile.TemporaryDirectory(prefix="jaxtrain-bench-preprocess-") as tmp:
        for label, dataset, load in cases:
            sources = [fetch(dataset, name) for name in DATASETS[dataset]]  # downloads or checks them first
            m = measure(dataset, load, sources, config.repeats, Path(tmp))
            table.add_row(label, f"{m['uncached'] * 1e3:.0f}", f"{m['cold'] * 1e3:.0f}", f"{m['warm'] * 1e3:.0f}",
                          f"{(m['uncached'] - m['warm']) * 1e3:.0f}", f"{m['uncached'] / m['warm']:.1f}x",
                          f"{m['hash'] * 1e3:.0f}", f"{m['entry_bytes'] / 2**20:.1f} MiB",
                          "yes" if m["identical"] else "NO")
            all_identical = all_identical and m["identical"]
    console.print(table)
    console.print("saved = off - warm. Every load includes fetch's SHA-256 check of the source files (the SHA-256 "
                  "column: hashing them alone), which also gives the cache key. equal: the cached arrays equal the "
                  "uncached ones (values, dtypes, shapes).")
    if not all_identical:
        console.print("[red]error: cached arrays differ from the uncached ones (the equal column)[/red]")
    return 0 if all_identical else 1
