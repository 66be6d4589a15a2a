"""`fit()`: the plain training loop, and the only place that decides when to log, evaluate
and write files. The compiled functions it calls are built in `step.py`."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from rich.console import Console

from jaxtrain import data as data_lib
from jaxtrain.checkpoint import Checkpointer, CheckpointError
from jaxtrain.config import TrainConfig, to_dict
from jaxtrain.data.sources import ArraySource
from jaxtrain.data.stream import DevicePrefetcher, StreamLoader
from jaxtrain.errors import ConfigError, DataError, JaxtrainError, NonFiniteLossError
from jaxtrain.optim import build_schedule, build_train_optimizer
from jaxtrain.report import EpochProgress, RunDir, epoch_block, final_block
from jaxtrain.report.plots import plot_run
from jaxtrain.state import TrainState, eval_graphdef, init_state
from jaxtrain.step import (
    Augment,
    LossFn,
    Preprocess,
    epoch_permutation,
    make_eval_step,
    make_evaluate,
    make_multi_step,
    make_scan_steps,
    make_train_step,
)

OVERHEAD_TARGET = 0.02  # per-call overhead as a fraction of a call's compute (auto steps_per_call)
PROBE_LENGTHS = (16, 128)  # the two call lengths timed to separate per-call from per-step cost
PROBE_REPEATS = 3  # timed calls of each length (the minimum is used)


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What `fit` returns.

    Attributes:
      model: the trained model (the same object that was passed in, updated in place).
      state: the final `TrainState`.
      history: one dict per epoch: `train_loss`, `val_loss`, `val_<metric>`, times, samples.
      summary: the run summary (the contents of summary.json).
      run_dir: where the run's files are, or None.
    """

    model: nnx.Module
    state: TrainState
    history: list[dict[str, Any]]
    summary: dict[str, Any]
    run_dir: Path | None

    @property
    def best_val_loss(self) -> float | None:
        return self.summary["best_val_loss"]

    @property
    def final_train_loss(self) -> float:
        return self.summary["final_train_loss"]


def device_description(device: jax.Device) -> str:
    """A short human-readable name of the device, e.g. `cpu (2 cores)` or `gpu: NVIDIA H100`."""
    if device.platform == "cpu":
        return f"cpu ({os.cpu_count()} cores)"
    return f"{device.platform}: {device.device_kind}"


def _compile(fn: Callable, *args: Any, donate: bool = True) -> tuple[Callable, float]:
    """Ahead-of-time compiles `fn` for `args`; returns the executable and the seconds it took."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn, donate_argnums=(0,) if donate else ()).lower(*args).compile()
    return compiled, time.perf_counter() - t0


class _EpochMeans:
    """Running float64 sums of per-step metrics over an epoch; non-finite values are left out
    (they only occur with on_nan=skip) and counted. Saved in checkpoints to resume mid-epoch."""

    def __init__(self, sums: dict[str, float] | None = None, counts: dict[str, int] | None = None, skipped: int = 0):
        self.sums, self.counts, self.skipped = dict(sums or {}), dict(counts or {}), skipped

    def add(self, records: list[dict[str, np.ndarray]]) -> dict[str, float]:
        """Adds the records of some calls; returns their own means."""
        means = {}
        for name in records[0]:
            values = np.concatenate([r[name] for r in records]).astype(np.float64)
            finite = values[np.isfinite(values)]
            self.sums[name] = self.sums.get(name, 0.0) + float(finite.sum())
            self.counts[name] = self.counts.get(name, 0) + finite.size
            means[name] = float(finite.mean()) if finite.size else float("nan")
            if name == "loss":
                self.skipped += values.size - finite.size
        return means

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.counts[k] if self.counts[k] else float("nan") for k in self.sums}

    def to_json(self) -> dict[str, Any]:
        return {"sums": self.sums, "counts": self.counts, "skipped": self.skipped}


def _first_non_finite(records: list[dict[str, np.ndarray]], first_step: int) -> tuple[int, float] | None:
    """(1-based step, value) of the first NaN/Inf loss in `records`, which start after `first_step`."""
    losses = np.concatenate([r["loss"] for r in records])
    bad = np.flatnonzero(~np.isfinite(losses))
    return (first_step + int(bad[0]) + 1, float(losses[bad[0]])) if bad.size else None


class TrainingStopped(JaxtrainError):
    """Training was stopped by SIGINT or SIGTERM after saving a checkpoint (exit code 128 + signal)."""

    def __init__(self, signum: int, step: int, resume_hint: str):
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}; {resume_hint}")


class _StopSignals:
    """Turns SIGINT/SIGTERM into a flag the loop checks at call boundaries (main thread only)."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:  # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def fit(
    model: nnx.Module,
    loss_fn: LossFn,
    train_data: Any,
    val_data: Any = None,
    config: TrainConfig = TrainConfig(),
    *,
    preprocess: Preprocess | None = None,
    augment: Augment | None = None,
    name: str = "fit",
    run_dir: str | os.PathLike | None = None,
    resume: bool = False,
    quiet: bool = False,
    run_config: Any = None,
    console: Console | None = None,
) -> FitResult:
    """Trains `model` on `train_data` and evaluates on `val_data` after every epoch.

    Args:
      model: a Flax NNX module; it is trained in place and also returned in the result.
      loss_fn: `loss_fn(model, batch, key) -> (loss, metrics)`, with `metrics` a dict of scalar
        batch means (may be empty). `key` is fresh for every step.
      train_data: a pytree (dict, tuple) of arrays with one row per sample, or a row source
        (`jaxtrain.data.HDF5Source`, `ArraySource`). `config.data.placement` decides whether it is
        held on the device whole or streamed in batches (auto: streamed when over the budget).
      val_data: the same for validation (a row source is read whole onto the device), or None.
      config: training settings.
      preprocess: `batch -> batch`, traced into training and evaluation (e.g. normalisation).
      augment: `(batch, key) -> batch`, traced into training only (e.g. input noise).
      name: the run's name (the recipe), recorded in summary.json.
      run_dir: directory for config.json, metrics.jsonl, summary.json and checkpoints/; None
        writes nothing.
      resume: continue from the newest complete checkpoint in `run_dir`: model, optimizer, step,
        RNG, data position and history, so the result equals an uninterrupted run's.
      quiet: no progress bar (summary blocks are still printed).
      run_config: the configuration to save as config.json (defaults to `config`).
      console: where to print; a new rich Console by default.

    Returns:
      A `FitResult`.

    Raises:
      ConfigError, DataError, CheckpointError: settings, data or checkpoints that cannot work.
      NonFiniteLossError: a training loss became NaN or Inf (with `on_nan="stop"`).
      TrainingStopped: SIGINT or SIGTERM arrived; a checkpoint was saved first.
    """
    t_start = time.perf_counter()
    console = console or Console(highlight=False, soft_wrap=True)
    B = config.batch_size
    train_source = train_data if data_lib.is_source(train_data) else None
    n_train = len(train_source) if train_source is not None else data_lib.num_samples(train_data, "train_data")
    steps_per_epoch, dropped = epoch_steps(config, n_train)
    if data_lib.is_source(val_data):
        val_data = val_data.read(0, len(val_data))  # validation data is held on the device whole
    n_val = data_lib.num_samples(val_data, "val_data") if val_data is not None else 0
    eval_B = min(config.eval_batch_size or B, n_val) if n_val else 0
    total_steps = config.epochs * steps_per_epoch
    if resume and run_dir is None:
        raise ConfigError("resume needs the run directory of the run to continue")

    device = jax.devices()[0]
    budget = int(config.data.memory_budget_gb * 1024**3) or data_lib.default_budget_bytes(device)
    train_bytes = train_source.row_nbytes * n_train if train_source is not None else data_lib.nbytes(train_data)
    placement = data_lib.choose_placement(config.data.placement, train_bytes, budget)
    streaming = placement.where == "stream"
    if streaming and train_source is None:
        if not isinstance(train_data, dict):
            raise DataError("streaming in-memory data needs a dict of arrays; pass train_data as {name: array}")
        train_source = ArraySource(train_data)
    elif not streaming and train_source is not None:
        train_data = train_source.read(0, n_train)  # fits the budget: read it whole, once

    tx = build_train_optimizer(config, total_steps)
    schedule = build_schedule(config.optim, total_steps)
    step_key, data_key = jax.random.split(jax.random.key(config.seed))
    graphdef, state = init_state(model, tx, step_key)

    # Restore before anything is written: a failed resume must leave the run directory untouched.
    ckpt = None
    meta: dict[str, Any] = {}
    if run_dir is not None and (config.checkpoint.enabled or resume):
        c = config.checkpoint
        ckpt = Checkpointer(Path(run_dir) / "checkpoints", c.keep_last, c.keep_best, c.best_metric, c.best_mode)
        if resume:
            state, meta = ckpt.restore(state)
            data_key = jax.random.wrap_key_data(jnp.asarray(meta["data_key"], jnp.uint32))
    step = int(state.step)
    history: list[dict[str, Any]] = meta.get("history", [])
    train_time_s: float = meta.get("train_time_s", 0.0)
    skipped_steps: int = meta.get("skipped_steps", 0)
    first_epoch, resume_index = divmod(step, steps_per_epoch)
    first_epoch += 1

    train_step = make_train_step(graphdef, loss_fn, tx, preprocess, augment)
    loader, train_dev = None, None
    if streaming:
        loader = StreamLoader(train_source, B, seed=config.seed, queue_depth=max(16, 2 * config.data.prefetch),
                              window_bytes=config.data.shuffle_window_mb << 20)
        row = train_source.read(0, 1)
        batch_spec = {name: (v.shape[1:], v.dtype) for name, v in row.items()}
    else:
        train_dev = jax.device_put(jax.tree.map(jnp.asarray, train_data), device)
    val_dev = jax.device_put(jax.tree.map(jnp.asarray, val_data), device) if n_val else None

    writer = RunDir(run_dir) if run_dir is not None else None
    if writer:
        writer.write_json("config.json", {"recipe": name, **to_dict(run_config if run_config is not None else config)})

    # Compile ahead of time: compile time is measured exactly and kept out of epoch times.
    compile_s = 0.0
    if not streaming:
        permute, seconds = _compile(lambda key, e: epoch_permutation(key, e, n_train), data_key, 1, donate=False)
        compile_s += seconds
    multi_steps: dict[int, Callable] = {}

    def multi_step_for(k: int) -> Callable:
        nonlocal compile_s
        if k not in multi_steps:
            if streaming:
                batches = {n: jax.ShapeDtypeStruct((k, B, *shape), dtype) for n, (shape, dtype) in batch_spec.items()}
                multi_steps[k], seconds = _compile(make_scan_steps(train_step), state, batches)
            else:
                perm0 = jnp.arange(n_train)
                multi_steps[k], seconds = _compile(
                    make_multi_step(train_step, B, k), state, train_dev, perm0, jnp.int32(0)
                )
            compile_s += seconds
        return multi_steps[k]

    chooser = StepsPerCall(config.steps_per_call or meta.get("steps_per_call", 0), steps_per_epoch)
    multi_step_for(chooser.next_length(steps_per_epoch - resume_index))
    evaluate = None
    if n_val:
        eval_step = make_eval_step(eval_graphdef(model), loss_fn, preprocess)
        evaluate, seconds = _compile(make_evaluate(eval_step, n_val, eval_B), state, val_dev, donate=False)
        compile_s += seconds

    console.print(
        f"[bold]jaxtrain[/bold] {name} on {device_description(device)}\n"
        f"  data: {n_train:,} train / {n_val:,} val samples"
        + (f"; training data streamed ({placement.reason}; shuffle window "
           f"{loader.window_nbytes / 1024**2:,.0f} MiB, {config.data.prefetch} batches prefetched)\n"
           if streaming else f" on the device ({placement.reason})\n")
        + f"  batch {B}: {steps_per_epoch:,} steps/epoch"
        + (f" ({dropped} samples/epoch dropped: partial batch)" if dropped else "")
        + (f" ({steps_per_epoch * B:,} samples per epoch drawn without replacement)" if config.steps_per_epoch else "")
        + (f"\n  run dir: {writer.path}" if writer else "")
        + (f"\n  resumed from the checkpoint at step {step:,} (epoch {first_epoch}, step {resume_index:,} of it)"
           if resume else "")
        + (f"\n  note: the interrupted run's data were placed as {meta['placement']}, now {placement.where}: "
           "the data order from here on differs from an uninterrupted run's"
           if resume and meta.get("placement", "device") != placement.where else "")
    )

    def save(epoch: int, index: int, means: _EpochMeans, metrics: dict[str, float] | None = None) -> None:
        """Saves a checkpoint at a call boundary; every metric up to `step` was checked finite."""
        if ckpt is None:
            return
        ckpt.save(step, state, {
            "epoch": epoch, "index_in_epoch": index, "steps_per_call": chooser.k, "placement": placement.where,
            "data_key": np.asarray(jax.random.key_data(data_key)).tolist(), "history": history,
            "epoch_means": means.to_json(), "train_time_s": train_time_s, "skipped_steps": skipped_steps,
        }, metrics)

    def last_good() -> str:
        latest = ckpt.latest_step() if ckpt else None
        return f"the last good checkpoint is step {latest}" if latest is not None else "no checkpoint was saved"

    progress = EpochProgress(console, B, enabled=not quiet)
    feeder: DevicePrefetcher | None = None
    status = "interrupted"
    try:
        with _StopSignals() as signals:
            for epoch in range(first_epoch, config.epochs + 1):
                t_epoch = time.perf_counter()
                compile_before = compile_s
                start = resume_index if epoch == first_epoch else 0
                if streaming:
                    perm = None
                    feeder = DevicePrefetcher(loader.iter_epoch(epoch, start), depth=config.data.prefetch)
                else:
                    perm = permute(data_key, epoch)
                input_wait_s = 0.0
                saved = meta.get("epoch_means", {}) if epoch == first_epoch and start else {}
                means = _EpochMeans(saved.get("sums"), saved.get("counts"), saved.get("skipped", 0))
                progress.start_epoch(epoch, config.epochs, steps_per_epoch, completed=start)
                pending: list[tuple[int, dict[str, jax.Array]]] = []  # (steps, metrics) not yet fetched
                pending_from = step  # the global step before the first pending call
                last_save = step

                def collect(calls: list[tuple[int, dict[str, jax.Array]]], log: bool) -> float:
                    """Fetches finished calls' metrics (the only host syncs), checks them, logs them."""
                    nonlocal pending_from, skipped_steps
                    fetched = jax.device_get([metrics for _, metrics in calls])
                    bad = _first_non_finite(fetched, pending_from)
                    if bad and config.on_nan == "stop":
                        raise NonFiniteLossError(*bad, detail=last_good())
                    skipped_before = means.skipped
                    interval = means.add(fetched)
                    skipped_steps += means.skipped - skipped_before
                    pending_from += sum(k for k, _ in calls)
                    if writer and log:
                        writer.log({"kind": "train", "epoch": epoch, "step": pending_from, **interval,
                                    "lr": float(schedule(pending_from - 1)),
                                    "elapsed_s": time.perf_counter() - t_start})
                    return interval["loss"]

                while start < steps_per_epoch:
                    k = chooser.next_length(steps_per_epoch - start)
                    fn = multi_step_for(k)
                    if streaming:
                        if pending:  # from here the device is idle: waiting for batches is input-bound time
                            jax.block_until_ready(pending[-1][1])
                        t_wait = time.perf_counter()
                        batches = feeder.next_batches(k)
                        input_wait_s += time.perf_counter() - t_wait
                        t_call = time.perf_counter()
                        state, metrics = fn(state, batches)
                    else:
                        t_call = time.perf_counter()
                        state, metrics = fn(state, train_dev, perm, jnp.int32(start))
                    if chooser.measuring:  # the first calls of the run are timed one by one
                        jax.block_until_ready(metrics)
                        if message := chooser.record(k, time.perf_counter() - t_call):
                            console.print(f"  {message}")
                    if pending:  # wait for the previous call: one call stays queued, progress stays honest
                        jax.block_until_ready(pending[-1][1])
                    pending.append((k, metrics))
                    start += k
                    step += k
                    loss_now = None
                    finished = pending[:-1]  # all but the call just queued have finished
                    if sum(n for n, _ in finished) >= config.log_every:
                        loss_now = collect(finished, log=True)
                        pending = pending[-1:]
                    progress.advance(k, loss_now)
                    every = config.checkpoint.every_steps
                    stop = signals.signum is not None
                    if start < steps_per_epoch and (stop or (every and step - last_save >= every)):
                        collect(pending, log=False)
                        pending = []
                        save(epoch, start, means)
                        last_save = step
                        if stop:
                            raise TrainingStopped(signals.signum, step, _resume_hint(ckpt, name))
                if pending:
                    collect(pending, log=False)
                if streaming:
                    feeder.close()
                train_s = time.perf_counter() - t_epoch - (compile_s - compile_before)
                train_time_s += train_s
                progress.end_epoch()

                train_means = means.means()
                record: dict[str, Any] = {"epoch": epoch, "step": step, "train_loss": train_means.pop("loss")}
                record.update({f"train_{k}": v for k, v in train_means.items()})
                t_eval = time.perf_counter()
                if evaluate is not None and (epoch % config.eval_every == 0 or epoch == config.epochs):
                    record.update({f"val_{k}": float(v) for k, v in jax.device_get(evaluate(state, val_dev)).items()})
                eval_s = time.perf_counter() - t_eval
                record.update(
                    samples=steps_per_epoch * B, samples_dropped=dropped, train_time_s=train_s,
                    eval_time_s=eval_s, epoch_time_s=train_s + eval_s,
                )
                if streaming:
                    record.update(input_wait_s=input_wait_s, input_wait_fraction=input_wait_s / max(train_s, 1e-9))
                if means.skipped:
                    record["skipped_steps"] = means.skipped
                history.append(record)
                best_metric = config.checkpoint.best_metric
                save(epoch + 1, 0, _EpochMeans(), {best_metric: record.get(best_metric)})
                if writer:
                    writer.log({"kind": "epoch", **record, "elapsed_s": time.perf_counter() - t_start})
                console.print(epoch_block(epoch, config.epochs, record, time.perf_counter() - t_start))
                if signals.signum is not None and epoch < config.epochs:
                    raise TrainingStopped(signals.signum, step, _resume_hint(ckpt, name))
        if ckpt:
            ckpt.wait()
        status = "completed"
    except NonFiniteLossError:
        status = "stopped: non-finite loss"
        raise
    except TrainingStopped:
        status = "stopped by signal"
        raise
    except CheckpointError:
        status = "failed: checkpoint not written"
        raise
    finally:
        if feeder is not None:
            feeder.close()
        progress.end_epoch()
        nnx.update(model, state.params, state.model_state)
        total_s = time.perf_counter() - t_start
        summary = _summary(name, history, step, chooser.k, train_time_s, compile_s, total_s, device, status)
        summary["skipped_steps"] = skipped_steps
        if ckpt:
            try:
                ckpt.wait()
            except CheckpointError:
                pass  # reported by the save that failed, or by the wait above
            summary["latest_checkpoint_step"] = ckpt.latest_step()
            ckpt.close()
        if writer:
            writer.finish(summary)
    if writer:
        console.print(f"  loss curves: {plot_run(writer.path)}")
    console.print(final_block(summary))
    return FitResult(model, state, history, summary, writer.path if writer else None)


def epoch_steps(config: TrainConfig, n_train: int) -> tuple[int, int]:
    """(steps per epoch, samples of the last partial batch that a full pass drops) for `n_train` samples.

    Raises:
      ConfigError: the batch, or steps_per_epoch batches, need more samples than there are.
    """
    B = config.batch_size
    if B > n_train:
        raise ConfigError(
            f"batch_size={B} is larger than the training set ({n_train} samples); use --batch-size {n_train} or less"
        )
    if config.steps_per_epoch:
        if config.steps_per_epoch * B > n_train:
            raise ConfigError(
                f"steps_per_epoch={config.steps_per_epoch} batches of {B} need {config.steps_per_epoch * B:,} "
                f"samples but the training set has {n_train:,}; use --steps-per-epoch {n_train // B} or less"
            )
        return config.steps_per_epoch, 0  # a sample of the set, not a pass: nothing is "dropped"
    return divmod(n_train, B)


def _resume_hint(ckpt: Checkpointer | None, name: str) -> str:
    if ckpt is None:
        return "no run directory, so no checkpoint was saved"
    return f"checkpoint saved; resume with: jaxtrain train {name} --resume {ckpt.directory.parent}"


class StepsPerCall:
    """Chooses K, the optimizer steps fused into one compiled call.

    A K set by the user is used as is. Otherwise the first calls of the run (real training
    steps) are timed at two lengths, K_a and K_b: `t(K) = overhead + K * step` gives both
    costs, and K becomes the smallest length whose overhead is under `OVERHEAD_TARGET` of its
    compute, never below K_a and never above an epoch. Epochs too short to measure use K_a.
    """

    def __init__(self, fixed: int, steps_per_epoch: int):
        k_a, k_b = (min(k, steps_per_epoch) for k in PROBE_LENGTHS)
        self.k = min(fixed, steps_per_epoch) if fixed else k_a
        can_measure = not fixed and PROBE_REPEATS * (k_a + k_b) <= steps_per_epoch
        self._plan = [k_a] * PROBE_REPEATS + [k_b] * PROBE_REPEATS if can_measure else []
        self._times: dict[int, list[float]] = {}
        self._steps_per_epoch = steps_per_epoch

    @property
    def measuring(self) -> bool:
        return bool(self._plan)

    def next_length(self, remaining: int) -> int:
        """Steps for the next call, given the steps left in the epoch."""
        if self._plan and self._plan[0] > remaining:  # too close to the epoch's end to measure
            self._plan = []
        return self._plan[0] if self._plan else min(self.k, remaining)

    def record(self, k: int, seconds: float) -> str | None:
        """Takes the time of a measured call; after the last one, picks K and describes why."""
        self._times.setdefault(k, []).append(seconds)
        self._plan.pop(0)
        if self._plan:
            return None
        (k_a, t_a), (k_b, t_b) = sorted((k, min(ts)) for k, ts in self._times.items())
        step_s = max((t_b - t_a) / (k_b - k_a), 1e-9)
        overhead_s = max(t_a - k_a * step_s, 0.0)
        needed = math.ceil(round(overhead_s / (OVERHEAD_TARGET * step_s), 6))
        self.k = k_a if needed <= k_a else k_b if needed <= k_b else min(needed, self._steps_per_epoch)
        share = overhead_s / (overhead_s + self.k * step_s)
        return (
            f"K={self.k} steps per compiled call (measured: {step_s * 1e3:.3f} ms per step, "
            f"{overhead_s * 1e3:.3f} ms per call = {share:.1%} overhead at K={self.k})"
        )


def _summary(
    name: str,
    history: list[dict[str, Any]],
    steps: int,
    steps_per_call: int,
    train_time_s: float,
    compile_s: float,
    total_s: float,
    device: jax.Device,
    status: str,
) -> dict[str, Any]:
    """The contents of summary.json: a stable contract for scripts."""
    last = history[-1] if history else {}
    val_losses = [(r["val_loss"], r["epoch"]) for r in history if "val_loss" in r]
    best = min(val_losses) if val_losses else (None, None)
    samples = sum(r["samples"] for r in history)
    summary = {
        "recipe": name,
        "status": status,
        "epochs": len(history),
        "steps": steps,
        "steps_per_call": steps_per_call,
        "final_train_loss": last.get("train_loss"),
        "final_val_loss": val_losses[-1][0] if val_losses else None,
        "best_val_loss": best[0],
        "best_epoch": best[1],
        "total_time_s": total_s,
        "compile_time_s": compile_s,
        "train_time_s": train_time_s,
        "mean_epoch_time_s": statistics.mean(r["epoch_time_s"] for r in history) if history else 0.0,
        "samples_per_s": samples / train_time_s if train_time_s else 0.0,
        "steps_per_s": steps / train_time_s if train_time_s else 0.0,
        "samples_per_epoch": last.get("samples"),
        "samples_dropped_per_epoch": last.get("samples_dropped"),
        "device": device_description(device),
        "jax_version": jax.__version__,
    }
    for key, value in last.items():
        if key.startswith("val_") and key != "val_loss":
            summary[f"final_{key}"] = value
    return summary
