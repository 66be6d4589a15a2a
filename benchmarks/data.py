"""`jaxtrain bench data`: streaming from HDF5 against device-resident data, memory, generation.

1. Generation: `data generate mlp-regression` of a small (`--small-rows`) and a large (`--rows`)
   file: rows/s. Inspection time and peak memory of `data inspect` on the large file.
2. Throughput: `mlp-regression` training for `--steps` steps (batch 32), each run a fresh
   process, interleaved `--repeats` times: (a) device-resident, the small file's rows read into
   memory and placed on the device; (b) streamed from the large file; (c) streamed from the small
   file. Samples/s excludes compilation (fit's train_time_s); the streamed runs also report the
   share of time the step waited for input.
3. Peak RSS (VmHWM) of each training process: flat across file sizes means host memory does
   not grow with the dataset.
4. Readers (when `grain` is installed): rows/s of StreamLoader against Grain pipelines.
Parts `adapters` and `shards` (others' datasets and loaders; .npy shards): `data_adapters.py`.
Part `stream` (peak RSS of whole `jaxtrain train` runs streaming 0.2M and 2M rows from HDF5 and
from .npy shards): `data_stream.py`.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks import data_adapters, data_stream
from benchmarks.child import child_main, peak_rss_mib, run_child
from jaxtrain._src.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DataBenchConfig:
    """Settings of the data benchmark."""

    rows: int = 10_000_000
    """Rows of the large file (768 bytes each: 10^7 rows = 7.7 GB on disk)."""
    small_rows: int = 1_000_000
    """Rows of the small file; its rows are also the device-resident run's data."""
    steps: int = 8000
    """Training steps per run (batch 32)."""
    repeats: int = 3
    """Interleaved repetitions of each training run."""
    dir: str = "bench-results/data"
    """Where the files and results.json go."""
    keep: bool = False
    """Keep the generated files (deleted at the end by default); the stream part reuses the files it
    kept."""
    parts: tuple[str, ...] = ("hdf5", "adapters", "agreement", "shards", "stream")
    """Which parts to run: hdf5 (streaming from HDF5, above), adapters (others' datasets and loaders
    against arrays, and against the data read alone), agreement (the validation loss each gives),
    shards (.npy shards of 1x and 10x the budget: peak RSS), stream (peak RSS of `jaxtrain train`
    streaming one epoch of each of stream_rows, from HDF5 and from .npy shards)."""
    adapter_rows: int = 50_000
    """Rows of the adapters part (mlp-regression's: 768 bytes each)."""
    adapter_steps: int = 1000
    """Steps per epoch (2 epochs) of the adapters part."""
    adapter_kinds: tuple[str, ...] = data_adapters.MAPS + data_adapters.ITERABLES
    """The forms of the data the adapters part measures (each against arrays and alone)."""
    agreement_rows: int = 20_000
    """Training rows of the agreement part (and a tenth more to validate)."""
    shard_rows: int = 40_000
    """Rows of the 1x-budget shards (10x that for the large run; 768 bytes each)."""
    shard_budget_gb: float = 0.03
    """The device budget of the shards part (the 1x shards hold about this much)."""
    stream_rows: tuple[int, ...] = (200_000, 2_000_000)
    """File sizes of the stream part, in rows (768 bytes each); the largest against the smallest."""
    quick: bool = False
    """A cut-down run for smoke tests."""


def _child(spec: dict) -> dict:
    """One training run (in a fresh process): samples/s, input wait and peak RSS."""
    from jaxtrain._src.config import CheckpointConfig
    from jaxtrain.engine import RunOptions, run
    from jaxtrain.tools.recipes import get_recipe
    from jaxtrain.tools.recipes.mlp_regression import RegressionDataConfig

    recipe = get_recipe("mlp-regression")
    data = RegressionDataConfig(path=spec["path"], val_samples=0, placement=spec["placement"])
    config = dataclasses.replace(recipe.config, epochs=1, steps_per_epoch=spec["steps"], data=data, quiet=True,
                                 checkpoint=CheckpointConfig(enabled=False))
    w = recipe.build(config)
    result = run(w.model, w.loss_fn, w.train, None, config, preprocess=w.preprocess,
                 session=RunOptions(console=Console(quiet=True)))
    record = result.history[-1]
    return {"samples_per_s": result.summary["samples_per_s"], "train_time_s": result.summary["train_time_s"],
            "input_wait_fraction": record.get("input_wait_fraction"),
            "peak_rss_mib": peak_rss_mib()}


def _run_child(spec: dict) -> dict:
    result = run_child("benchmarks.data", spec)
    if "error" in result:
        raise RuntimeError(f"benchmark child failed: {result['error']}")
    return result


def _generate(path: Path, rows: int) -> float:
    from jaxtrain._src.data.generate import generate_dataset

    t0 = time.perf_counter()
    generate_dataset("mlp-regression", path, rows, force=True)
    return rows / (time.perf_counter() - t0)


def main(config: DataBenchConfig) -> int:
    from jaxtrain._src.report import device_description

    if config.quick:
        config = dataclasses.replace(config, rows=40_000, small_rows=4_000, steps=100, repeats=1, adapter_rows=2_000,
                                     adapter_steps=20, shard_rows=2_000, shard_budget_gb=0.001,
                                     agreement_rows=640, stream_rows=(6_000, 12_000))
    unknown = set(config.parts) - {"hdf5", "adapters", "agreement", "shards", "stream"}
    if unknown:
        raise ConfigError(f"unknown part {sorted(unknown)[0]!r}; choose among hdf5, adapters, agreement, shards, "
                          "stream")
    if "stream" in config.parts and (len(config.stream_rows) < 2 or min(config.stream_rows) <= 5_000):
        raise ConfigError(f"--stream-rows {' '.join(map(str, config.stream_rows))}: give two sizes or more, each "
                          "above the 5,000 rows mlp-regression holds out for validation")
    out = Path(config.dir)
    out.mkdir(parents=True, exist_ok=True)
    console = Console(highlight=False, width=max(120, Console().width))
    results: dict = {"config": dataclasses.asdict(config), "device": device_description(_device())}
    try:
        if "hdf5" in config.parts:
            _hdf5(config, out, console, results)
        if "adapters" in config.parts:
            results["adapters"] = data_adapters.adapters(config.adapter_rows, config.adapter_steps, config.repeats,
                                                         out, console, config.adapter_kinds)
        if "agreement" in config.parts:
            results["agreement"] = data_adapters.agreement(config.agreement_rows, 2, console, 3 if config.quick else
                                                           data_adapters.SEEDS)
        if "shards" in config.parts:
            results["shards"] = data_adapters.shards(config.shard_rows, config.shard_budget_gb, config.repeats, out,
                                                     console)
        if "stream" in config.parts:
            results["stream"] = data_stream.stream(config.stream_rows, config.repeats, out, console, config.keep)
    finally:
        if not config.keep:
            for folder in ("adapter-shards", "shards-1x", "shards-10x"):
                shutil.rmtree(out / folder, ignore_errors=True)
    if "hdf5" in config.parts:
        _report(results, config, console)
    data_adapters.report(results, console)
    if "stream" in results:
        data_stream.report(results, console)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    console.print(f"results: {out / 'results.json'}")
    return 0


def _hdf5(config: DataBenchConfig, out: Path, console: Console, results: dict) -> None:
    from jaxtrain._src.data.inspect import inspect_file

    small, large = out / f"mlp-{config.small_rows}.h5", out / f"mlp-{config.rows}.h5"
    try:
        console.print(f"generating {config.small_rows:,} and {config.rows:,} rows ...")
        results["generate_rows_per_s"] = {"small": _generate(small, config.small_rows),
                                          "large": _generate(large, config.rows)}
        report = inspect_file(large)
        results["inspect"] = {"seconds": report["seconds"], "rows_sampled": report["datasets"][0]["sampled_rows"],
                              "sample_peak_mib": report["sample_peak_bytes"] / 2**20}
        runs = {"device (small file in memory)": {"path": str(small), "placement": "device"},
                "stream (large file)": {"path": str(large), "placement": "stream"},
                "stream (small file)": {"path": str(small), "placement": "stream"}}
        measured: dict[str, list[dict]] = {name: [] for name in runs}
        for repeat in range(config.repeats):
            for name, spec in runs.items():
                measured[name].append(_run_child({**spec, "steps": config.steps}))
                console.print(f"  run {repeat + 1}/{config.repeats} {name}: "
                              f"{measured[name][-1]['samples_per_s']:,.0f} samples/s")
        results["runs"] = measured
        results["readers"] = _readers(large, config)
    finally:
        if not config.keep:
            for path in (small, large):
                path.unlink(missing_ok=True)


def _device():
    import jax

    return jax.devices()[0]


def _readers(path: Path, config: DataBenchConfig) -> dict | None:
    try:
        import grain  # noqa: F401
    except ImportError:
        return None
    from benchmarks.data_readers import reader_throughput

    return reader_throughput(path, {"x": "features", "y": "targets"}, 32, max(100, config.steps // 4))


def _report(results: dict, config: DataBenchConfig, console: Console) -> None:
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("samples_per_s", "peak_rss_mib")}
           for name, rs in results["runs"].items()}
    device = med["device (small file in memory)"]["samples_per_s"]
    table = Table(title=f"mlp-regression, batch 32, {config.steps:,} steps, medians of {config.repeats} "
                        f"({results['device']})")
    for col in ("run", "samples/s", "vs device", "input wait", "peak RSS MiB"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for name, rs in results["runs"].items():
        wait = [r["input_wait_fraction"] for r in rs if r["input_wait_fraction"] is not None]
        table.add_row(name, f"{med[name]['samples_per_s']:,.0f}", f"{med[name]['samples_per_s'] / device:.2f}x",
                      f"{statistics.median(wait):.1%}" if wait else "-", f"{med[name]['peak_rss_mib']:,.0f}")
    console.print(table)
    gen = results["generate_rows_per_s"]
    console.print(f"generation: {gen['small']:,.0f} rows/s ({config.small_rows:,} rows), "
                  f"{gen['large']:,.0f} rows/s ({config.rows:,} rows)")
    ins = results["inspect"]
    console.print(f"inspect of the {config.rows:,}-row file: {ins['seconds']:.2f} s, "
                  f"{ins['rows_sampled']:,} rows sampled, {ins['sample_peak_mib']:.1f} MiB of arrays at peak")
    small, large = med["stream (small file)"]["peak_rss_mib"], med["stream (large file)"]["peak_rss_mib"]
    results["summary"] = {"stream_vs_device": med["stream (large file)"]["samples_per_s"] / device,
                          "rss_large_vs_small": large / small, "rss_large_mib": large}
    console.print(f"streaming (large file) / device-resident throughput: {results['summary']['stream_vs_device']:.2f}x"
                  f" (target >= 0.9x); peak RSS large/small file: {large / small:.3f} (target within 10%, < 1 GiB)")
    if results.get("readers"):
        readers = ", ".join(f"{k} {v:,.0f}" for k, v in results["readers"].items())
        console.print(f"readers (rows/s, batch 32): {readers}")


if __name__ == "__main__":
    child_main(_child)
