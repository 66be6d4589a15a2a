"""`jaxtrain bench data` parts `adapters` and `shards`: others' datasets and loaders in `fit`.

adapters: mlp-regression's rows (128 features, 64 targets, float32; the recipe's MLP, batch 32)
given to `fit` in each form a user may bring them, each run in a fresh process, interleaved,
medians: arrays (held on the device: the reference), map-style datasets streamed by jaxtrain (a
PyTorch `Dataset` that takes slices and one read a sample at a time, a Hugging Face `Dataset`, a
Grain `MapDataset`, .npy shards), and iterables of batches (PyTorch `DataLoader`s, Grain's
`DataLoader` and `.batch()`, a batched Hugging Face `IterableDataset`, a generator, and a
`DataLoader` whose samples cost a NumPy transform each). Each is also read alone, without
training, in its own process (a loader iterated; a map-style dataset through jaxtrain's reader):
a run is compute-bound when its data alone come faster than the arrays' training, else
input-bound, and its target is 0.9x the slower of the two.
agreement: the same MLP trained from the same rows in each form for 2 epochs, validated on held-out
rows: the validation losses side by side.
shards: .npy shards of 1x and 10x a small device budget, streamed for one epoch with a 4 MiB
shuffle window: peak RSS of each process (flat: host memory does not grow with the data).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.child import child_main, peak_rss_mib, run_child

BATCH = 32
CORES = os.cpu_count() or 1
SEEDS = 6  # the arrays' runs over seeds 0..5 give the noise a loader's own order is judged against
MAPS = ("torch-dataset", "torch-dataset-samples", "hf-dataset", "grain-mapdataset", "npy-shards")
ITERABLES = ("torch-dataloader", "torch-dataloader-transform", "grain-dataloader", "grain-batched", "hf-iterable",
             "generator")


def _rows(n: int) -> tuple[np.ndarray, np.ndarray]:
    from jaxtrain._src.data.synthetic import make_rows

    rows = make_rows("mlp-regression", 0, 0, n)
    return rows["features"], rows["targets"]


class _Rows:
    """A plain map-style dataset over two arrays."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"x": self.x[i], "y": self.y[i]}

    def __repr__(self) -> str:
        return f"_Rows({len(self)})"


def make_data(kind: str, x: np.ndarray, y: np.ndarray, shards: str | None = None) -> Any:
    """The rows in the form `kind` (see the module docstring); each gives dict batches {"x", "y"}."""
    if kind == "arrays":
        return {"x": x, "y": y}
    if kind == "npy-shards":
        from jaxtrain._src.data.adapters import NpySource

        return NpySource(shards, {"x": "features", "y": "targets"})
    if kind in ("hf-dataset", "hf-iterable"):
        import datasets

        ds = datasets.Dataset.from_dict({"x": x, "y": y})
        return ds if kind == "hf-dataset" else ds.to_iterable_dataset().with_format("numpy").batch(BATCH,
                                                                                                   drop_last_batch=True)
    if kind.startswith("grain"):
        import grain

        if kind == "grain-mapdataset":
            return grain.MapDataset.source(_Rows(x, y))
        if kind == "grain-batched":
            return grain.MapDataset.source(_Rows(x, y)).shuffle(seed=0).batch(BATCH, drop_remainder=True)
        sampler = grain.samplers.IndexSampler(len(x), shuffle=True, seed=0, num_epochs=None)
        return grain.DataLoader(data_source=_Rows(x, y), sampler=sampler, worker_count=0,
                                operations=[grain.transforms.Batch(BATCH, drop_remainder=True)])
    if kind.startswith("torch"):
        import torch

        class TorchRows(torch.utils.data.Dataset):
            def __init__(self):
                self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)

            def __len__(self):
                return len(self.x)

            def __getitem__(self, i):
                return {"x": self.x[i], "y": self.y[i]}

        class Samples(TorchRows):  # one sample at a time (a dataset that decodes a record per index)
            def __getitem__(self, i):
                return super().__getitem__(int(i))

        class Transformed(TorchRows):  # each sample costs a NumPy transform: an input-bound loader
            def __getitem__(self, i):
                sample = super().__getitem__(i)
                x = sample["x"].numpy()
                for _ in range(20):
                    x = np.tanh(x) * 1.0001
                return {"x": torch.from_numpy(x), "y": sample["y"]}

        if kind == "torch-dataset":
            return TorchRows()
        if kind == "torch-dataset-samples":
            return Samples()
        dataset = Transformed() if kind == "torch-dataloader-transform" else TorchRows()
        return torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True,
                                           generator=torch.Generator())
    if kind == "generator":
        epoch = [0]

        def batches():
            epoch[0] += 1
            order = np.random.default_rng(epoch[0]).permutation(len(x))
            for i in range(0, len(order) - BATCH + 1, BATCH):
                index = np.sort(order[i : i + BATCH])
                yield {"x": x[index], "y": y[index]}

        return batches
    raise ValueError(f"unknown kind {kind!r}")


def _alone(data: Any, batches: int) -> tuple[float, float]:
    """(samples/s, CPU seconds per sample) of the data alone, the first batch not timed: a loader
    iterated (epochs as fit takes them), a map-style dataset read in batches by jaxtrain's reader
    (the one training uses)."""
    from jaxtrain._src.data.adapters import MapSource, adapt
    from jaxtrain._src.data.stream import StreamLoader

    source = adapt(data)
    if isinstance(source, MapSource) or hasattr(source, "chunk_rows"):
        loader = StreamLoader(source, BATCH, seed=0)
        epochs = lambda: loader.iter_epoch(1)  # noqa: E731
    else:
        epochs = lambda: iter(data() if callable(data) and not hasattr(data, "__iter__") else data)  # noqa: E731
    done, t0, cpu0 = 0, None, 0.0
    while done < batches:
        for batch in epochs():
            if t0 is None:
                t0, cpu0 = time.perf_counter(), time.process_time()
                continue
            np.asarray(batch["x"])
            done += 1
            if done == batches:
                break
    return done * BATCH / (time.perf_counter() - t0), (time.process_time() - cpu0) / (done * BATCH)


def _child(spec: dict) -> dict:
    """One run in a fresh process: train (or iterate alone) and report samples/s and peak RSS."""
    import jax.numpy as jnp
    from flax import nnx

    from jaxtrain import CheckpointConfig, DataConfig, LambdaHook, TrainConfig, fit
    from jaxtrain._src.models import MLP

    steps = spec["steps"]
    x, y = _rows(spec["rows"]) if spec["kind"] != "npy-shards" else (None, None)
    data = make_data(spec["kind"], x, y, spec.get("shards"))
    if spec.get("alone"):
        rate, cpu = _alone(data, 2 * steps)
        return {"samples_per_s": rate, "cpu_s_per_sample": cpu, "peak_rss_mib": peak_rss_mib()}
    model = MLP((128, 512, 512, 64), rngs=nnx.Rngs(0))

    def loss(model, batch, key):
        return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}

    placement = "stream" if spec["kind"] in MAPS else "auto"
    config = TrainConfig(epochs=2, batch_size=BATCH, steps_per_epoch=steps if steps else 0, tensorboard=False,
                         checkpoint=CheckpointConfig(enabled=False), log_every=10_000,
                         data=DataConfig(placement=placement, memory_budget_gb=spec.get("budget_gb", 0.0),
                                         shuffle_window_mb=spec.get("window_mb", 32)))
    if spec.get("epochs"):  # the shards part: one epoch, one compiled program whatever the rows
        config = dataclasses.replace(config, epochs=spec["epochs"], steps_per_call=50)
    cpu = [0.0]  # CPU seconds of the process (every thread) while epochs train

    def start(run):
        cpu[0] -= time.process_time()

    def end(run, record):
        cpu[0] += time.process_time()

    result = fit(model, loss, data, None, config, verbosity="silent",
                 hooks=[LambdaHook(on_epoch_start=start, on_epoch_end=end)])
    samples = sum(r["samples"] for r in result.history)
    return {"samples_per_s": result.summary["samples_per_s"], "peak_rss_mib": peak_rss_mib(),
            "cpu_s_per_sample": cpu[0] / samples, "input_wait_fraction": result.history[-1].get("input_wait_fraction")}


def _run(spec: dict) -> dict:
    result = run_child("benchmarks.data_adapters", spec)
    if "error" in result:
        raise RuntimeError(f"{spec['kind']}: benchmark child failed: {result['error']}")
    return result


def _interleaved(specs: dict[str, dict], repeats: int, console: Console) -> dict[str, list[dict]]:
    measured: dict[str, list[dict]] = {name: [] for name in specs}
    for repeat in range(repeats):
        for name, spec in specs.items():
            measured[name].append(_run(spec))
            console.print(f"  run {repeat + 1}/{repeats} {name}: {measured[name][-1]['samples_per_s']:,.0f} samples/s, "
                          f"peak RSS {measured[name][-1]['peak_rss_mib']:,.0f} MiB")
    return measured


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def adapters(rows: int, steps: int, repeats: int, out: Path, console: Console,
             kinds: tuple[str, ...] = (*MAPS, *ITERABLES)) -> dict:
    """The adapters part (see the module docstring), for `kinds`."""
    unknown = set(kinds) - {*MAPS, *ITERABLES}
    if unknown:
        raise ValueError(f"unknown kind {sorted(unknown)[0]!r}; choose among {', '.join((*MAPS, *ITERABLES))}")
    from jaxtrain._src.data.generate import generate_dataset

    shards = out / "adapter-shards"
    generate_dataset("mlp-regression", shards, rows, format="npy", shard_rows=max(1, rows // 4), force=True)
    base = {"rows": rows, "steps": steps, "shards": str(shards)}
    console.print(f"adapters (MLP 128-512-512-64, batch {BATCH}, {rows:,} rows, 2 x {steps:,} steps), "
                  "each trained and read alone:")
    specs = {"arrays": {**base, "kind": "arrays"}}
    for kind in kinds:
        specs[kind] = {**base, "kind": kind}
        specs[f"{kind} alone"] = {**base, "kind": kind, "alone": True}
    measured = _interleaved(specs, repeats, console)
    arrays = _median(measured["arrays"], "samples_per_s")
    arrays_cpu = _median(measured["arrays"], "cpu_s_per_sample")
    summary = {}
    for kind in kinds:
        trained, alone = _median(measured[kind], "samples_per_s"), _median(measured[f"{kind} alone"], "samples_per_s")
        # On a CPU the loader and the compiled step share the cores: at best they take, per sample,
        # the CPU time of each alone, spread over every core.
        shared = CORES / (arrays_cpu + _median(measured[f"{kind} alone"], "cpu_s_per_sample"))
        summary[kind] = {"bound": "compute" if alone >= arrays else "input", "vs_arrays": trained / arrays,
                         "vs_alone": trained / alone, "ratio": trained / min(arrays, alone),
                         "shared_cores_bound": min(arrays, alone, shared),
                         "vs_shared": trained / min(arrays, alone, shared)}
    return {"runs": measured, "summary": summary}


def agreement(rows: int, epochs: int, console: Console, seeds: int = SEEDS) -> dict:
    """The agreement part: the same MLP trained from the same rows in each form, validated on the
    same held-out rows (arrays). Map-style data in jaxtrain's order must give the arrays' validation
    loss to 1e-6; loaders in their own order within the spread of the arrays' runs over seeds."""
    import jax.numpy as jnp
    from flax import nnx

    from jaxtrain import CheckpointConfig, TrainConfig, fit
    from jaxtrain._src.models import MLP

    x, y = _rows(rows + rows // 10)
    val = {"x": x[rows:], "y": y[rows:]}
    x, y = x[:rows], y[:rows]

    def loss(model, batch, key):
        return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}

    def val_loss(data, seed: int = 0) -> float:
        config = TrainConfig(epochs=epochs, batch_size=BATCH, seed=seed, tensorboard=False,
                             checkpoint=CheckpointConfig(enabled=False))
        model = MLP((128, 512, 512, 64), rngs=nnx.Rngs(seed))
        return fit(model, loss, data, val, config, verbosity="silent").history[-1]["val_loss"]

    reference = val_loss(make_data("arrays", x, y))
    seeds = [reference] + [val_loss(make_data("arrays", x, y), seed) for seed in range(1, seeds)]
    out = {"arrays": reference, "arrays over seeds": seeds}
    console.print(f"agreement: {rows:,} rows, {epochs} epochs, validation on {len(val['x']):,} rows")
    for kind in ("torch-dataset", "hf-dataset", "grain-mapdataset", "torch-dataloader", "generator"):
        out[kind] = val_loss(make_data(kind, x, y))
        console.print(f"  {kind}: val_loss {out[kind]:.8f}")
    return out


def shards(rows: int, budget_gb: float, repeats: int, out: Path, console: Console) -> dict:
    """The shards part: one streamed epoch over shards of 1x and 10x the budget; peak RSS of each."""
    from jaxtrain._src.data.generate import generate_dataset

    specs = {}
    for times in (1, 10):
        folder = out / f"shards-{times}x"
        generate_dataset("mlp-regression", folder, times * rows, format="npy", shard_rows=max(1, rows // 2),
                         force=True)
        specs[f"{times}x budget"] = {"kind": "npy-shards", "shards": str(folder), "steps": 0, "rows": times * rows,
                                     "epochs": 1, "budget_gb": budget_gb, "window_mb": 4}
    console.print(f"shards: one streamed epoch over {rows:,} and {10 * rows:,} rows, device budget "
                  f"{budget_gb * 1024:,.0f} MiB")
    measured = _interleaved(specs, repeats, console)
    ratio = _median(measured["10x budget"], "peak_rss_mib") / _median(measured["1x budget"], "peak_rss_mib")
    return {"runs": measured, "rss_10x_vs_1x": ratio}


def report(results: dict, console: Console) -> None:
    if "adapters" in results:
        a = results["adapters"]
        table = Table(title=f"mlp-regression's MLP, batch {BATCH}: samples/s, medians ({results['device']})")
        for col in ("data given to fit", "training", "data alone", "bound", "vs arrays", "vs the slower", "target",
                    "shared-cores bound", "vs it"):
            table.add_column(col, justify="left" if col == "data given to fit" else "right")
        table.add_row("arrays (on the device)", f"{_median(a['runs']['arrays'], 'samples_per_s'):,.0f}", "-", "-",
                      "1.00x", "-", "", "-", "-")
        for kind, s in a["summary"].items():
            table.add_row(kind, f"{_median(a['runs'][kind], 'samples_per_s'):,.0f}",
                          f"{_median(a['runs'][f'{kind} alone'], 'samples_per_s'):,.0f}", s["bound"],
                          f"{s['vs_arrays']:.2f}x", f"{s['ratio']:.2f}x",
                          ">= 0.90x " + ("met" if s["ratio"] >= 0.9 else "missed"),
                          f"{s['shared_cores_bound']:,.0f}", f"{s['vs_shared']:.2f}x")
        console.print(table)
        console.print(f"shared-cores bound: {CORES} cores / (CPU seconds per sample of training on arrays + of the "
                      "data alone), the most a loader and the step sharing this CPU's cores can reach")
    if "agreement" in results:
        a = results["agreement"]
        ref, seeds = a["arrays"], a["arrays over seeds"]
        mean, std = statistics.mean(seeds), statistics.stdev(seeds)
        table = Table(title=f"validation loss after training on the same rows (arrays over seeds 0-{len(seeds) - 1}: "
                            f"{mean:.6f} +- {std:.6f})")
        for col in ("data given to fit", "order", "val_loss", "vs arrays", "expected"):
            table.add_column(col, justify="left" if col in ("data given to fit", "order") else "right")
        for kind, value in a.items():
            if kind.startswith("arrays over"):
                continue
            ours = kind in ("arrays", *MAPS)
            diff = abs(value - ref) / ref
            ok = diff <= 1e-6 if ours else abs(value - mean) <= 3 * std
            table.add_row(kind, "jaxtrain's" if ours else "the loader's", f"{value:.8f}", f"{diff:.2e}",
                          ("equal to 1e-6 " if ours else "within 3 std of the seeds' ") + ("met" if ok else "missed"))
        console.print(table)
    if "shards" in results:
        s = results["shards"]
        rss = {k: _median(v, "peak_rss_mib") for k, v in s["runs"].items()}
        console.print(f"npy shards streamed, peak RSS: 1x budget {rss['1x budget']:,.0f} MiB, 10x budget "
                      f"{rss['10x budget']:,.0f} MiB: {s['rss_10x_vs_1x']:.3f}x (target <= 1.10x: "
                      f"{'met' if s['rss_10x_vs_1x'] <= 1.1 else 'missed'})")


if __name__ == "__main__":
    child_main(_child)
