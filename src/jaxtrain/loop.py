"""`fit()`: the plain training loop, and the only place that decides when to log, evaluate
and write files. The compiled functions it calls are built in `step.py`."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from rich.console import Console

from jaxtrain import data as data_lib
from jaxtrain.config import TrainConfig, to_dict
from jaxtrain.errors import ConfigError, NonFiniteLossError
from jaxtrain.optim import build_optimizer, build_schedule
from jaxtrain.report import EpochProgress, RunDir, epoch_block, final_block
from jaxtrain.state import TrainState, eval_graphdef, init_state
from jaxtrain.step import (
    Augment,
    LossFn,
    Preprocess,
    epoch_permutation,
    make_eval_step,
    make_evaluate,
    make_multi_step,
    make_train_step,
)

OVERHEAD_TARGET = 0.02  # per-call overhead as a fraction of a call's compute (auto steps_per_call)
PROBE_STEPS = 16  # steps per call while measuring the step time


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


def _mean_of(records: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """Means over steps of per-call metric arrays (each of shape (K,))."""
    return {name: float(np.mean(np.concatenate([r[name] for r in records]))) for name in records[0]}


def _check_finite(records: list[dict[str, np.ndarray]], first_step: int) -> None:
    """Raises NonFiniteLossError naming the first step whose loss was NaN or Inf."""
    losses = np.concatenate([r["loss"] for r in records])
    bad = np.flatnonzero(~np.isfinite(losses))
    if bad.size:
        raise NonFiniteLossError(first_step + int(bad[0]) + 1, float(losses[bad[0]]))


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
    quiet: bool = False,
    run_config: Any = None,
    console: Console | None = None,
) -> FitResult:
    """Trains `model` on `train_data` and evaluates on `val_data` after every epoch.

    Args:
      model: a Flax NNX module; it is trained in place and also returned in the result.
      loss_fn: `loss_fn(model, batch, key) -> (loss, metrics)`, with `metrics` a dict of scalar
        batch means (may be empty). `key` is fresh for every step.
      train_data: a pytree (dict, tuple) of arrays with one row per sample.
      val_data: the same structure for validation, or None.
      config: training settings.
      preprocess: `batch -> batch`, traced into training and evaluation (e.g. normalisation).
      augment: `(batch, key) -> batch`, traced into training only (e.g. input noise).
      name: the run's name (the recipe), recorded in summary.json.
      run_dir: directory for config.json, metrics.jsonl and summary.json; None writes nothing.
      quiet: no progress bar (summary blocks are still printed).
      run_config: the configuration to save as config.json (defaults to `config`).
      console: where to print; a new rich Console by default.

    Returns:
      A `FitResult`.

    Raises:
      ConfigError, DataError: for settings or data that cannot work (before any training).
      NonFiniteLossError: when a training loss becomes NaN or Inf.
    """
    t_start = time.perf_counter()
    console = console or Console(highlight=False, soft_wrap=True)
    B = config.batch_size
    n_train = data_lib.num_samples(train_data, "train_data")
    if B > n_train:
        raise ConfigError(f"batch_size={B} is larger than the training set ({n_train} samples); use --batch-size {n_train} or less")
    n_val = data_lib.num_samples(val_data, "val_data") if val_data is not None else 0
    eval_B = min(config.eval_batch_size or B, n_val) if n_val else 0
    steps_per_epoch, dropped = divmod(n_train, B)
    total_steps = config.epochs * steps_per_epoch

    device = jax.devices()[0]
    budget = int(config.data.memory_budget_gb * 1024**3) or data_lib.default_budget_bytes(device)
    data_bytes = data_lib.nbytes(train_data) + (data_lib.nbytes(val_data) if n_val else 0)
    placement = data_lib.choose_placement(config.data.placement, data_bytes, budget)

    tx = build_optimizer(config.optim, total_steps)
    schedule = build_schedule(config.optim, total_steps)
    step_key, data_key = jax.random.split(jax.random.key(config.seed))
    graphdef, state = init_state(model, tx, step_key)
    train_step = make_train_step(graphdef, loss_fn, tx, preprocess, augment)
    train_dev = jax.device_put(jax.tree.map(jnp.asarray, train_data), device)
    val_dev = jax.device_put(jax.tree.map(jnp.asarray, val_data), device) if n_val else None

    writer = RunDir(run_dir) if run_dir is not None else None
    if writer:
        writer.write_json("config.json", {"recipe": name, **to_dict(run_config if run_config is not None else config)})

    # Compile ahead of time: compile time is measured exactly and kept out of epoch times.
    compile_s = 0.0
    permute, seconds = _compile(lambda key, epoch: epoch_permutation(key, epoch, n_train), data_key, 1, donate=False)
    compile_s += seconds
    multi_steps: dict[int, Callable] = {}

    def multi_step_for(k: int) -> Callable:
        nonlocal compile_s
        if k not in multi_steps:
            perm0 = jnp.arange(n_train)
            multi_steps[k], seconds = _compile(make_multi_step(train_step, B, k), state, train_dev, perm0, jnp.int32(0))
            compile_s += seconds
        return multi_steps[k]

    K = min(config.steps_per_call or PROBE_STEPS, steps_per_epoch)
    multi_step_for(K)
    evaluate = None
    if n_val:
        eval_step = make_eval_step(eval_graphdef(model), loss_fn, preprocess)
        evaluate, seconds = _compile(make_evaluate(eval_step, n_val, eval_B), state, val_dev, donate=False)
        compile_s += seconds
    tune = config.steps_per_call == 0 and K < steps_per_epoch
    overhead_s = _call_overhead(state, train_dev, n_train) if tune else 0.0

    console.print(
        f"[bold]jaxtrain[/bold] {name} on {device_description(device)}\n"
        f"  data: {n_train:,} train / {n_val:,} val samples on the device ({placement.reason})\n"
        f"  batch {B}: {steps_per_epoch:,} steps/epoch"
        + (f" ({dropped} samples/epoch dropped: partial batch)" if dropped else "")
        + (f"\n  run dir: {writer.path}" if writer else "")
    )

    progress = EpochProgress(console, B, enabled=not quiet)
    history: list[dict[str, Any]] = []
    train_time_s = 0.0
    step = 0
    status = "completed"
    try:
        for epoch in range(1, config.epochs + 1):
            t_epoch = time.perf_counter()
            compile_before = compile_s
            perm = permute(data_key, epoch)
            progress.start_epoch(epoch, config.epochs, steps_per_epoch)
            epoch_records: list[dict[str, np.ndarray]] = []
            pending: list[dict[str, jax.Array]] = []  # metrics not yet fetched from the device
            pending_from = step
            in_flight = None
            probe_times: list[float] = []
            start = 0
            while start < steps_per_epoch:
                k = min(K, steps_per_epoch - start)
                fn = multi_step_for(k)
                t_call = time.perf_counter()
                state, metrics = fn(state, train_dev, perm, jnp.int32(start))
                if tune:  # time a few calls synchronously, then pick K once
                    jax.block_until_ready(metrics)
                    probe_times.append(time.perf_counter() - t_call)
                    if len(probe_times) == 3 or start + k >= steps_per_epoch:
                        K, message = _choose_steps_per_call(min(probe_times), K, overhead_s, steps_per_epoch)
                        console.print(f"  {message}")
                        tune = False
                if in_flight is not None:  # keep one call queued, so progress stays honest
                    jax.block_until_ready(in_flight)
                in_flight = metrics["loss"]
                pending.append(metrics)
                start += k
                step += k
                loss_now = None
                if step - pending_from >= config.log_every or start == steps_per_epoch:
                    fetched = jax.device_get(pending)
                    _check_finite(fetched, pending_from)
                    means = _mean_of(fetched)
                    loss_now = means["loss"]
                    epoch_records += fetched
                    if writer and step - pending_from >= config.log_every:
                        writer.log({"kind": "train", "epoch": epoch, "step": step, **means,
                                    "lr": float(schedule(step - 1)), "elapsed_s": time.perf_counter() - t_start})
                    pending, pending_from = [], step
                progress.advance(k, loss_now)
            train_s = time.perf_counter() - t_epoch - (compile_s - compile_before)
            train_time_s += train_s
            progress.end_epoch()

            train_means = _mean_of(epoch_records)
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
            history.append(record)
            if writer:
                writer.log({"kind": "epoch", **record, "elapsed_s": time.perf_counter() - t_start})
            console.print(epoch_block(epoch, config.epochs, record, time.perf_counter() - t_start))
    except NonFiniteLossError:
        status = "stopped: non-finite loss"
        raise
    finally:
        progress.end_epoch()
        nnx.update(model, state.params, state.model_state)
        summary = _summary(name, history, step, K, train_time_s, compile_s, time.perf_counter() - t_start, device, status)
        if writer:
            writer.write_json("summary.json", summary)
            writer.close()
    console.print(final_block(summary))
    return FitResult(model, state, history, summary, writer.path if writer else None)


def _call_overhead(state: TrainState, data: Any, n: int, repeats: int = 50) -> float:
    """Seconds one compiled call costs beyond its compute: a call with the real arguments
    (state donated) that does nothing; median of `repeats`."""
    null, _ = _compile(lambda s, d, p, i: s, state, data, jnp.arange(n), jnp.int32(0))
    args = jax.tree.map(lambda x: x.copy(), state), data, jnp.arange(n), jnp.int32(0)
    times = []
    s = args[0]
    for _ in range(repeats):
        t0 = time.perf_counter()
        s = null(s, *args[1:])
        jax.block_until_ready(s)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _choose_steps_per_call(call_s: float, k: int, overhead_s: float, steps_per_epoch: int) -> tuple[int, str]:
    """The smallest K whose per-call overhead stays under `OVERHEAD_TARGET` of its compute,
    never below the probe's K (already compiled), never above an epoch."""
    step_s = max(call_s - overhead_s, 1e-9) / k
    needed = math.ceil(overhead_s / (OVERHEAD_TARGET * step_s))
    chosen = min(max(needed, k), steps_per_epoch)
    share = overhead_s / (overhead_s + chosen * step_s)
    return chosen, (
        f"K={chosen} steps per compiled call (step {step_s * 1e3:.3f} ms; "
        f"call overhead {overhead_s * 1e3:.3f} ms = {share:.1%})"
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
