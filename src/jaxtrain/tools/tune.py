"""Tuning tools: the batch-size finder (`jaxtrain tune batch-size`) and the learning-rate range
test (`jaxtrain tune lr`, `lr_range` at the end of this file).

`batch_size` finds the largest batch whose training step fits a memory cap and measures training
throughput up to it:

1. Memory, without running anything: one training step (the same `make_train_step` as `fit`,
   state donated) is compiled for abstract batches of 1, 2, 4, ... samples (n, 2n, 4n, ... on a
   mesh of n devices, per-device memory) and XLA's compiled memory analysis gives its peak
   (`memory.compiled_memory`: parameters + optimizer state + one batch + temporaries). The search
   stops at the first power of two over the cap, at `max_batch`, or at half the training set;
   bisection between the last power of two that fits and the first that does not narrows the
   largest batch to 1/2**refine_steps of a power of two.
2. Trials, by training: `fit` trains (silent, no run directory, no validation) at each power of
   two up to the largest batch and at the largest itself, which must train with a finite loss; an
   out-of-memory error (RESOURCE_EXHAUSTED) drops that batch and every larger one. Samples/s is
   the median of 3 compiled calls of K steps, timed by a hook; compilation and the first call of
   each epoch (which waits for the epoch's permutation) are left out, so an epoch holds at least
   two calls and a batch at most half the training set. With `throughput=False` only the largest
   is trained, stepping down a power of two while it runs out of memory.

3. The check, by training what it would recommend (`RateCheck`): a few timed steps say how fast a
   batch is, not whether its scaled learning rate trains (mlp-regression's fastest, 2048 at the
   square-root rule's 8e-3, stays at a val loss 8x the config's). The config and the fastest batch
   train the same short budget (`CHECK_SAMPLES`, at most one epoch; each run in whole steps of its
   batch, the samples it trained recorded) from the same initial weights and data order, the batch
   at the scaled rate and at the config's (and halfway between where the scaled rate lost); the
   scaled rate is recommended only where no other rate tried beat it, and a batch only where its
   best rate came within `CHECK_TOLERANCE` of the config's loss; otherwise the batches between it
   and the config's are bisected for the largest that does, and when none does nothing is
   recommended.

The cap bounds the step; the datasets `fit` keeps on the device are a separate, batch-independent
cost, reported as `data_bytes` (the default cap is what is left of the device's memory after them).
The header of a real run shows the whole compiled call's memory, data included.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxtrain import ConfigError, Hook, NonFiniteLossError, TrainConfig
from jaxtrain import data as data_lib
from jaxtrain.engine import (
    Layout,
    RunOptions,
    abstract_batch,
    budget_bytes,
    build_program,
    compiled_memory,
    device_description,
    format_bytes,
    make_layout,
    run,
)
from jaxtrain.tools.recipes.base import Recipe, Workload

__all__ = ["BatchSizeResult", "BatchTrial", "LRRange", "RateCheck", "RateTrial", "analyse_lr_range", "batch_size",
           "format_lr", "lr_range", "scale_learning_rate", "step_memory"]

GiB = 1024**3
MAX_BATCH = 2**16  # the default upper end of the search
REPEATS = 3  # timed calls per batch size; samples/s is their median
CHECK_SAMPLES = 2**16  # the check's budget: training samples per run (one epoch when the training set is smaller)
CHECK_TOLERANCE = 1.1  # a recommended batch reaches at most this many times the config's loss in the check


@dataclasses.dataclass(frozen=True)
class BatchTrial:
    """One batch size: its compiled step's memory and, when it was trained, its throughput.

    Attributes:
      batch_size: samples per micro-batch (`--batch-size`); a step sees batch_size x grad_accum.
      memory: `memory.compiled_memory` of one training step at this batch.
      fits: whether `memory["peak_bytes"]` is within the cap.
      samples_per_s: median over the timed calls of samples trained per second, or None when not trained.
      steps_per_s: the same in optimizer steps.
      steps: optimizer steps timed (all timed calls together).
      final_loss: the training loss of the last epoch.
      call_memory: `compiled_memory` of the trial's compiled K-step call (the datasets `fit` keeps
        on the device included): what the header of a real run shows.
      failure: why the trial did not finish ("out of memory", "loss not finite"), or "".
    """

    batch_size: int
    memory: dict[str, int]
    fits: bool
    samples_per_s: float | None = None
    steps_per_s: float | None = None
    steps: int = 0
    final_loss: float | None = None
    call_memory: dict[str, int] | None = None
    failure: str = ""

    @property
    def trained(self) -> bool:
        return self.samples_per_s is not None


@dataclasses.dataclass(frozen=True)
class RateTrial:
    """One short run of the check: a batch and learning rate, and the loss it reached.

    Attributes:
      batch_size: samples per micro-batch.
      lr: the peak learning rate.
      rate: which rate it is: "config" (the config's batch and rate), "config's rate", "halfway"
        (the geometric mean of the config's and the scaled rate) or "scaled".
      loss: the run's best validation loss (its last epoch's training loss without validation data);
        inf where the loss was not finite.
      samples: training samples the run trained (its optimizer steps x samples per step; where it failed,
        those it was to train): whole steps, so batches differ a little around `RateCheck.samples`.
    """

    batch_size: int
    lr: float
    rate: str
    loss: float
    samples: int


@dataclasses.dataclass(frozen=True)
class RateCheck:
    """The short runs that decide what `tune batch-size` recommends: each candidate batch trains the
    same `samples` from the same initial weights and data order at the config's rate, halfway and the
    scaled rate, beside the config itself; a batch holds when its best rate reaches at most
    `CHECK_TOLERANCE` x the config's loss, and the scaled rate is recommended only where no other rate
    tried beat it.

    Attributes:
      samples: the budget of each run, at most one epoch: each trains two epochs of whole steps within
        half of it (at least one step each); what it trained is its `RateTrial.samples`.
      metric: what `loss` is: "val_loss" or "train_loss".
      trials: every run, the config's first.
      batch_size: the recommended batch, or None when no batch tried held (keep the config).
      lr: the recommended learning rate (the best one tried at `batch_size`).
      reason: one line: why this rate (and this batch, where the fastest did not hold).
      capped: one line when the samples asked were over one epoch and `samples` is the epoch, else "".
    """

    samples: int
    metric: str
    trials: tuple[RateTrial, ...]
    batch_size: int | None
    lr: float
    reason: str
    capped: str = ""

    @property
    def baseline(self) -> RateTrial:
        """The config's own run."""
        return self.trials[0]


@dataclasses.dataclass(frozen=True)
class BatchSizeResult:
    """What `batch_size` found.

    Attributes:
      name: the recipe (or workload) name.
      device: the device, in words.
      cap_bytes: the memory cap of one training step.
      cap_source: where the cap came from.
      state_bytes: parameters + optimizer state (part of every row's memory).
      data_bytes: the datasets `fit` keeps on the device (outside the cap).
      stopped_by: what ended the search: the cap, max_batch, or half the training set.
      rows: the batches compiled, ascending: powers of two up to the first over the cap, the search's
        limit when it was tried, and the largest that fits (bisection's other probes are left out).
      largest: the largest batch that fits the cap and trained.
      best: the trained batch with the highest samples/s (`largest` when only it was trained).
      base_batch: samples per step of the given config (the batch its learning rate is for).
      base_lr: the config's peak learning rate.
      optimizer: the config's optimizer (sgd, adam, adamw).
      grad_accum: micro-batches per step of the config.
      min_lr: the config's final learning rate (cosine schedules), scaled like the peak.
      step_settings: the config's settings counted in optimizer steps (`steps_per_epoch`,
        `optim.warmup_steps`, `optim.decay_steps`) that are not 0, by flag: at a larger batch each
        step sees more samples.
      throughput: whether every power of two up to `largest` was timed (else only `largest`).
      check: the short runs that chose the recommended batch and rate (`RateCheck`); None when
        `check_samples=0` skipped them.
    """

    name: str
    device: str
    cap_bytes: int
    cap_source: str
    state_bytes: int
    data_bytes: int
    stopped_by: str
    rows: tuple[BatchTrial, ...]
    largest: int
    best: int
    base_batch: int
    base_lr: float
    optimizer: str
    grad_accum: int = 1
    min_lr: float = 0.0
    step_settings: dict[str, int] = dataclasses.field(default_factory=dict)
    throughput: bool = True
    check: RateCheck | None = None

    def row(self, batch: int) -> BatchTrial:
        """The row of `batch`."""
        return next(r for r in self.rows if r.batch_size == batch)

    def learning_rate(self, batch: int) -> tuple[float, str]:
        """`(lr, rule)`: the config's learning rate scaled to `batch` (see `scale_learning_rate`)."""
        return scale_learning_rate(self.base_lr, self.base_batch, batch * self.grad_accum, self.optimizer)

    def flags(self, batch: int, lr: float | None = None) -> str:
        """The command-line flags that train at `batch` with `lr` (default the scaled learning rate)."""
        lr = self.learning_rate(batch)[0] if lr is None else lr
        flags = f"--batch-size {batch} --optim.lr {format_lr(lr)}"
        if self.min_lr:
            flags += f" --optim.min-lr {format_lr(self.min_lr * lr / self.base_lr)}"
        return flags

    @property
    def recommended(self) -> str | None:
        """The flags the finder recommends: the checked batch and rate (`check`); the best batch at the
        scaled rate when nothing was checked (`check_samples=0`); None when the check found no batch
        that trains as well as the config (keep it)."""
        if self.check is None:
            return self.flags(self.best)
        if self.check.batch_size is None:
            return None
        return self.flags(self.check.batch_size, self.check.lr)

    def same_samples_flags(self, batch: int) -> str:
        """`step_settings` divided by the growth of the batch: the flags that keep the samples a run
        (or its warmup and decay) sees, at `batch`; "" when there are none."""
        ratio = batch * self.grad_accum / self.base_batch
        return " ".join(f"{flag} {max(1, round(steps / ratio))}" for flag, steps in self.step_settings.items())


_OPTIMIZER_NAMES = {"adam": "Adam", "adamw": "AdamW"}


def scale_learning_rate(lr: float, base_batch: int, batch: int, optimizer: str) -> tuple[float, str]:
    """The learning rate for `batch` samples per step, given `lr` tuned for `base_batch`.

    SGD: the linear scaling rule, `lr * batch / base_batch` (Goyal et al. 2017, "Accurate, Large
    Minibatch SGD"). Adam and AdamW: the square-root rule, `lr * sqrt(batch / base_batch)`
    (Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms").
    Both are starting points, valid up to a critical batch size; re-check the loss.

    Returns:
      `(lr, rule)`, the rule in words.
    """
    ratio = batch / base_batch
    if optimizer == "sgd":
        return lr * ratio, "linear scaling rule for SGD (Goyal et al. 2017)"
    return lr * math.sqrt(ratio), f"square-root scaling rule for {_OPTIMIZER_NAMES.get(optimizer, optimizer)} " \
                                  "(Malladi et al. 2022)"


def format_lr(lr: float) -> str:
    """`0.002828` -> `2.8e-3`."""
    mantissa, exponent = f"{lr:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def batch_size(
    recipe_or_workload: Recipe | Workload,
    config: TrainConfig | None = None,
    max_memory_gb: float | None = None,
    *,
    max_batch: int = MAX_BATCH,
    seconds: float = 1.0,
    refine_steps: int = 4,
    throughput: bool = True,
    check_samples: int | None = None,
    name: str | None = None,
    note: Callable[[str], None] | None = None,
) -> BatchSizeResult:
    """Finds the largest batch whose training step fits `max_memory_gb` and the batch with the
    best throughput up to it (see the module docstring).

    Args:
      recipe_or_workload: a `Recipe` (its workload is built for `config` and closed afterwards) or
        a `Workload` you built.
      config: the training settings (precision, grad_accum, optimizer, mesh, ...); default the
        recipe's. Its batch size and learning rate are the base of the learning-rate scaling.
      max_memory_gb: the cap of one training step in GiB; None: the device's memory limit (on a
        CPU, which has none, the host's available RAM) less the datasets `fit` keeps on the device.
      max_batch: the largest batch considered (also never more than half the training set).
      seconds: timed training per batch size (3 calls of about seconds / 3 each).
      refine_steps: bisection steps between the last power of two that fits and the first that
        does not (each one compile); 0 keeps powers of two.
      throughput: time every power of two up to the largest batch; False trains only the largest
        (stepping down a power of two at a time while a trial runs out of memory).
      check_samples: the check's budget, training samples per short run (see `RateCheck`); None:
        `CHECK_SAMPLES`, or one epoch when the training set is smaller; 0: no check (the result
        then recommends the best batch at the scaled rate, untested).
      name: the name to report (default the recipe's, or "workload").
      note: called with a line of progress after each compile and each measurement.

    Returns:
      A `BatchSizeResult`.

    Raises:
      ConfigError: a cap that is not a positive number or is too small for the smallest batch;
        a backend that does not report compiled memory; no batch trained.
    """
    if max_memory_gb is not None and not (isinstance(max_memory_gb, (int, float)) and math.isfinite(max_memory_gb)
                                          and max_memory_gb > 0):
        raise ConfigError(f"max_memory_gb={max_memory_gb!r} must be a positive number of GiB, e.g. "
                          "--max-memory-gb 4")
    if not (isinstance(max_batch, int) and max_batch >= 1):
        raise ConfigError(f"max_batch={max_batch!r} must be an integer >= 1")
    if not seconds > 0:
        raise ConfigError(f"seconds={seconds!r} must be positive")
    if check_samples is not None and not (isinstance(check_samples, int) and check_samples >= 0):
        raise ConfigError(f"check_samples={check_samples!r} must be a whole number of samples >= 0 (0: no check), "
                          "e.g. --check-samples 65536")
    if isinstance(recipe_or_workload, Recipe):
        recipe = recipe_or_workload
        config = recipe.config if config is None else config
        workload = recipe.build(config)
        try:
            return _find(workload, config, max_memory_gb, max_batch, seconds, refine_steps, throughput,
                         check_samples, name or recipe.name, note or (lambda line: None))
        finally:
            workload.close()
    if not isinstance(recipe_or_workload, Workload):
        raise ConfigError(f"batch_size takes a jaxtrain Recipe or Workload; got {type(recipe_or_workload).__name__}")
    return _find(recipe_or_workload, config or TrainConfig(), max_memory_gb, max_batch, seconds, refine_steps,
                 throughput, check_samples, name or "workload", note or (lambda line: None))


def step_memory(workload: Workload, config: TrainConfig, batch_sizes: Sequence[int]) -> list[dict[str, int]]:
    """`memory.compiled_memory` of one training step of `workload` (built as `fit` builds it, for
    `config`) at each of `batch_sizes`, from compilation alone: nothing runs, no data is placed."""
    memory = _StepMemory(workload, config, make_layout(config.mesh))
    return [memory(b) for b in batch_sizes]


def _find(w: Workload, config: TrainConfig, max_memory_gb: float | None, max_batch: int, seconds: float,
          refine_steps: int, throughput: bool, check_samples: int | None, name: str,
          note: Callable[[str], None]) -> BatchSizeResult:
    layout = make_layout(config.mesh)
    device = jax.local_devices()[0]
    n = layout.num_devices  # every batch splits over the devices: batches are n x powers of two
    n_train = data_lib.num_rows(w.train, "train_data")
    limit = min(max_batch, n_train // 2 // config.grad_accum)  # two steps per epoch: see _Trainer
    if limit < n:
        raise ConfigError(f"no batch of at least {n} (one per device) fits max_batch={max_batch} and half the "
                          f"{n_train} training samples")
    data_bytes = _device_data_bytes(w, config, device)
    if max_memory_gb is not None:
        cap, cap_source = int(max_memory_gb * GiB), f"--max-memory-gb {max_memory_gb:g}"
    else:
        total, where = _device_memory(device)
        cap = total - data_bytes
        cap_source = where + (f" less {format_bytes(data_bytes)} of data on the device" if data_bytes else "")
    step_memory = _StepMemory(w, config, layout)

    def measure(batch: int) -> BatchTrial:
        memory = step_memory(batch)
        row = BatchTrial(batch, memory, memory["peak_bytes"] <= cap)
        if row.fits or batch > n:  # a smallest batch over the cap is the error below, said once
            note(f"batch {batch:>6}: a step needs {format_bytes(memory['peak_bytes'])}"
                 f"{'' if row.fits else ' (over the cap)'}")
        return row

    rows: dict[int, BatchTrial] = {}
    batch = n
    while True:
        rows[batch] = measure(batch)
        if not rows[batch].fits or batch * 2 > limit:
            break
        batch *= 2
    first = rows[n]
    if not first.fits:
        need = first.memory["peak_bytes"]
        raise ConfigError(f"the memory cap {format_bytes(cap)} ({cap_source}) is too small for batch {n}: a "
                          f"training step of {name} needs {format_bytes(need)} there "
                          f"({format_bytes(step_memory.state_bytes)} of it parameters and optimizer state); "
                          f"give at least --max-memory-gb {math.ceil(need / GiB * 1000) / 1000:g}")
    powers = sorted(rows)
    lo = max(b for b in powers if rows[b].fits)  # the largest batch known to fit
    hi = None if rows[powers[-1]].fits else powers[-1]  # the smallest known not to
    stopped_by = "the cap"
    if hi is None:
        in_set = n_train // 2 // config.grad_accum
        stopped_by = f"max_batch={max_batch}" if max_batch <= in_set else \
            f"half the training set ({n_train:,} samples)"
        top = limit // n * n
        if top > lo and refine_steps > 0:  # the limit itself, then bisection below it
            rows[top] = measure(top)
            lo, hi = (top, None) if rows[top].fits else (lo, top)
            stopped_by = stopped_by if hi is None else "the cap"
    probes: dict[int, BatchTrial] = {}
    for _ in range(refine_steps):
        if hi is None:
            break
        mid = (lo + hi) // 2 // n * n
        if mid <= lo:
            break
        probes[mid] = measure(mid)
        lo, hi = (mid, hi) if probes[mid].fits else (lo, mid)
    if lo not in rows:  # the largest batch that fits, found by the bisection
        rows[lo] = probes[lo]

    # The trials. With throughput: every power of two up to the largest, then the largest, ascending
    # (one that runs out of memory ends it). Without: the largest, then each power of two below it.
    fitting = [b for b in sorted(rows) if rows[b].fits and (b in powers or b == lo)]
    order = fitting if throughput else fitting[::-1]
    trainer = _Trainer(w, config, name, n_train, seconds)
    trained: list[int] = []
    for i, b in enumerate(order):
        rows[b] = trainer(rows[b])
        if rows[b].trained:
            trained.append(b)
            note(f"batch {b:>6}: trained, {rows[b].samples_per_s:,.0f} samples/s ({rows[b].steps} steps)")
            if not throughput:
                break
        else:
            note(f"batch {b:>6}: {rows[b].failure}")
            if throughput and rows[b].failure == "out of memory":
                for larger in order[i + 1:]:
                    rows[larger] = dataclasses.replace(rows[larger], failure="not tried: a smaller batch ran out "
                                                                            "of memory")
                break
    if not trained:
        raise ConfigError(f"no batch trained: {rows[order[0]].failure} at batch {order[0]}")
    largest = max(trained)
    best = max(trained, key=lambda b: rows[b].samples_per_s or 0.0)  # (every trained row has a rate)
    table = tuple(rows[b] for b in sorted(rows))
    result = BatchSizeResult(
        name=name, device=device_description(device), cap_bytes=cap, cap_source=cap_source,
        state_bytes=step_memory.state_bytes, data_bytes=data_bytes, stopped_by=stopped_by, rows=table,
        largest=largest, best=best, base_batch=config.samples_per_step, base_lr=config.optim.lr,
        optimizer=config.optim.name, grad_accum=config.grad_accum,
        min_lr=config.optim.min_lr if config.optim.schedule == "warmup-cosine" else 0.0,
        step_settings=_step_settings(config), throughput=throughput,
    )
    if check_samples == 0:
        return result
    # the batches the check may recommend: those that trained (or, without throughput, fit) from the best
    # toward the config's, the best first
    ok = [b for b in sorted(rows) if rows[b].fits and (rows[b].trained or not (throughput or rows[b].failure))]
    base = config.samples_per_step
    between = [b for b in ok if min(base, best * config.grad_accum) < b * config.grad_accum
               < max(base, best * config.grad_accum)]
    candidates = [best, *sorted(between, key=lambda b: -abs(b * config.grad_accum - base))]
    runner = _ShortRun(w, config, name, n_train, check_samples)
    return dataclasses.replace(result, check=_check(result, runner, candidates, note))


def _check(result: BatchSizeResult, runner: _ShortRun, candidates: list[int],
           note: Callable[[str], None]) -> RateCheck:
    """Trains the config and the candidate batches (the best first, then toward the config's batch)
    on the same short budget and keeps the first batch, by bisection, whose best rate holds (see `RateCheck`)."""
    baseline = runner(runner.config.batch_size, result.base_lr, "config")
    note(f"check: the config (batch {runner.config.batch_size}, lr {format_lr(result.base_lr)}) reached "
         f"{runner.metric} {baseline.loss:.4g} in {baseline.samples:,} samples")
    trials, tried = [baseline], {}

    def best_rate(b: int) -> RateTrial:
        scaled, _ = result.learning_rate(b)
        # halfway (in log) is tried only where the scaled rate lost to the config's
        rates = {"scaled": scaled, "config's rate": result.base_lr, "halfway": math.sqrt(scaled * result.base_lr)}
        if b * result.grad_accum == result.base_batch:  # the config's batch: its rate is the scaled one
            rates = {"scaled": result.base_lr}
        runs: list[RateTrial] = []
        for rate, lr in rates.items():
            if rate == "halfway" and runs[0].loss <= runs[1].loss:  # (run after the config's rate) not needed
                continue
            runs.append(runner(b, lr, rate))
            note(f"check: batch {b}, lr {format_lr(lr)} ({rate}): {runner.metric} {runs[-1].loss:.4g}")
        trials.extend(runs)
        tried[b] = runs
        return min(runs, key=lambda r: r.loss)  # ties keep the earlier: the scaled rate

    def holds(trial: RateTrial) -> bool:
        return trial.loss <= CHECK_TOLERANCE * baseline.loss

    picked: RateTrial | None = best_rate(candidates[0])
    if picked is not None and not holds(picked):  # bisection toward the config's batch: the largest that holds, if any
        lo, hi, found = 0, len(candidates), None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            trial = best_rate(candidates[mid])
            lo, hi, found = (lo, mid, trial) if holds(trial) else (mid, hi, found)
        picked = found
    metric, base = runner.metric, baseline.loss
    first = tried[candidates[0]]
    why = ""
    if picked is None or picked.batch_size != candidates[0]:
        why = (f"batch {candidates[0]:,} reached {metric} {min(r.loss for r in first):.4g} at best, over "
               f"{CHECK_TOLERANCE:g}x the config's {base:.4g}; ")
    if picked is None:
        reason = why + (f"no batch tried held ({runner.samples:,} samples asked of each run): keep the config's batch "
                        "and learning rate")
        return RateCheck(runner.samples, metric, tuple(trials), None, result.base_lr, reason, runner.capped)
    runs = tried[picked.batch_size]
    scaled = runs[0]
    if picked is scaled:
        rate = f"the scaled rate {format_lr(scaled.lr)} reached {metric} {scaled.loss:.4g}" + (
            f", no worse than {min(r.loss for r in runs[1:]):.4g} at the other rates tried" if runs[1:] else "")
    else:
        rate = (f"the scaled rate {format_lr(scaled.lr)} reached {metric} {scaled.loss:.4g} against "
                f"{picked.loss:.4g} at {format_lr(picked.lr)} ({picked.rate}), which is recommended")
    reason = (f"{why}{rate} (batch {picked.batch_size:,}; the config: {base:.4g}; {picked.samples:,} samples against "
              f"the config's {baseline.samples:,}, one run each)")
    return RateCheck(runner.samples, metric, tuple(trials), picked.batch_size, picked.lr, reason, runner.capped)


def _step_settings(config: TrainConfig) -> dict[str, int]:
    """The config's nonzero settings counted in optimizer steps, by flag."""
    settings = {"--steps-per-epoch": config.steps_per_epoch}
    if config.optim.schedule == "warmup-cosine":
        settings |= {"--optim.warmup-steps": config.optim.warmup_steps, "--optim.decay-steps": config.optim.decay_steps}
    return {flag: steps for flag, steps in settings.items() if steps}


class _StepMemory:
    """Compiles one training step, as `fit` builds it, for an abstract batch of a given size and
    returns its compiled memory; nothing is placed on the device."""

    def __init__(self, w: Workload, config: TrainConfig, layout: Layout):
        self._w, self._config = w, config
        self._program = build_program(w.model, w.loss_fn, config, preprocess=w.preprocess, augment=w.augment,
                                      total_steps=1000, layout=layout, abstract=True)
        self.state_bytes = sum(_nbytes(x) for x in jax.tree.leaves(self._program.state))
        # XLA:CPU spends most of a compile in LLVM, after buffer assignment: without its optimisation
        # the compiled memory is the same (tests/tools/test_tune.py checks it) in about half the time.
        cpu = layout.mesh.devices.flat[0].platform == "cpu"
        self._options = {"xla_backend_optimization_level": 0} if cpu else None

    def __call__(self, batch: int) -> dict[str, int]:
        spec = abstract_batch(self._w.train, batch * self._config.grad_accum, "train_data")
        try:
            memory = compiled_memory(self._program.compile_step(spec, self._options))
        except Exception as e:  # a compiler that refuses a program over the device's memory
            if not _out_of_memory(e):
                raise
            return {"argument_bytes": 0, "output_bytes": 0, "alias_bytes": 0, "temp_bytes": 0,
                    "peak_bytes": 2**62}
        if memory is None:
            raise ConfigError(f"the {jax.default_backend()} backend does not report the memory of compiled "
                              "programs, which the batch-size finder needs")
        return memory


class _CallTimer(Hook):
    """Times a run's compiled calls but the first of each epoch, which also waits for what ends the
    epoch before it (evaluation, checkpoints, a streamed feed's first blocks). The loop waits for call
    j - 1 just before it announces call j, so from one announcement to the next is call j - 1's
    time; the last call of an epoch ends at the epoch's end."""

    def __init__(self):
        self.calls: list[tuple[int, float]] = []  # (steps, seconds) of each timed call
        self._seen, self._last, self._k = 0, 0.0, 0

    def on_epoch_start(self, run: Any) -> None:
        self._seen = 0

    def after_call(self, run: Any, k: int, metrics: Any) -> None:
        self._lap()
        self._k = k

    def on_epoch_end(self, run: Any, record: dict[str, Any]) -> None:
        self._lap()

    def _lap(self) -> None:
        now = time.perf_counter()
        if self._seen >= 2:  # the call that just ended is not the epoch's first
            self.calls.append((self._k, now - self._last))
        self._seen, self._last = self._seen + 1, now


class _Trainer:
    """Trains at a batch with `fit` (silent, no run directory, no validation) and times
    `REPEATS` compiled calls of K steps with `_CallTimer`, K sized from the previous batch's speed
    to take `seconds / REPEATS`; the model's initial weights are restored around each run."""

    def __init__(self, w: Workload, config: TrainConfig, name: str, n_train: int, seconds: float):
        self._w, self._config, self._name, self._n_train = w, config, name, n_train
        self._initial = jax.tree.map(jnp.copy, nnx.state(w.model))
        self._call_s = seconds / REPEATS
        self._steps_per_s: float | None = None  # of the last batch trained: sizes the next one's calls

    def __call__(self, row: BatchTrial) -> BatchTrial:
        most = self._n_train // (row.batch_size * self._config.grad_accum) // 2  # K: two calls fit an epoch
        k = 8 if self._steps_per_s is None else round(self._call_s * self._steps_per_s)
        k = max(1, min(most, k))
        result = self._run(row, k)
        if result.steps_per_s is not None and k < most and k / result.steps_per_s < self._call_s / 4:  # too short
            result = self._run(row, max(1, min(most, round(self._call_s * result.steps_per_s))))
        if result.trained:
            self._steps_per_s = result.steps_per_s
        return result

    def _run(self, row: BatchTrial, k: int) -> BatchTrial:
        c = self._config
        samples_per_step = row.batch_size * c.grad_accum
        calls = min(1 + REPEATS, self._n_train // samples_per_step // k)  # per epoch, >= 2; the first is not timed
        config = dataclasses.replace(
            c, batch_size=row.batch_size, epochs=math.ceil(REPEATS / (calls - 1)), steps_per_epoch=calls * k,
            steps_per_call=k, on_nan="stop", tensorboard=False,
            checkpoint=dataclasses.replace(c.checkpoint, enabled=False),
            early_stopping=dataclasses.replace(c.early_stopping, patience=0))
        timer = _CallTimer()
        nnx.update(self._w.model, jax.tree.map(jnp.copy, self._initial))
        try:
            out = run(self._w.model, self._w.loss_fn, self._w.train, None, config, hooks=[timer],
                      preprocess=self._w.preprocess, augment=self._w.augment, verbosity="silent",
                          session=RunOptions(name=self._name))
        except NonFiniteLossError:
            return dataclasses.replace(row, failure="loss not finite")
        except Exception as e:
            if not _out_of_memory(e):
                raise
            return dataclasses.replace(row, failure="out of memory")
        finally:
            nnx.update(self._w.model, jax.tree.map(jnp.copy, self._initial))
        loss = out.summary["final_train_loss"]
        if loss is None or not math.isfinite(loss):
            return dataclasses.replace(row, failure="loss not finite", final_loss=loss)
        if not timer.calls:
            return dataclasses.replace(row, failure="not timed", final_loss=loss)
        samples_per_s = statistics.median(steps * samples_per_step / seconds for steps, seconds in timer.calls)
        return dataclasses.replace(row, samples_per_s=samples_per_s, steps_per_s=samples_per_s / samples_per_step,
                                   steps=sum(steps for steps, _ in timer.calls), final_loss=loss,
                                   call_memory=out.summary["compiled_memory"])


class _ShortRun:
    """One short run of the check: `fit` (silent, no run directory) from the workload's initial weights
    at a batch and learning rate, the config's other settings kept; returns its best validation loss (the
    last epoch's training loss without validation data) and the samples it trained. A config whose whole
    run fits in `samples` is run whole (its epochs, evaluation and early stopping): the check is then the
    recommended command's own run. Otherwise two epochs of whole steps within samples / 2 each (at least
    one step). `samples` is `asked` (None: `CHECK_SAMPLES`) up to one epoch; `capped` says in one line
    that an `asked` over one epoch was cut to it."""

    def __init__(self, w: Workload, config: TrainConfig, name: str, n_train: int, asked: int | None):
        self._w, self.config, self._name = w, config, name
        self.samples = min(CHECK_SAMPLES if asked is None else asked, n_train)
        self._whole = not config.steps_per_epoch and not config.max_time_s and config.epochs * n_train <= self.samples
        self.capped = "" if asked is None or asked <= n_train else \
            f"{asked:,} samples asked, capped at one epoch of the training set ({n_train:,} samples)"
        self.metric = "val_loss" if w.val is not None else "train_loss"
        self._initial = jax.tree.map(jnp.copy, nnx.state(w.model))

    def __call__(self, batch: int, lr: float, rate: str) -> RateTrial:
        c = self.config
        samples_per_step = batch * c.grad_accum
        per_epoch = max(1, self.samples // samples_per_step // 2)  # (samples <= n_train: both epochs fit)
        if per_epoch > 64:  # calls of K <= 64 steps that divide the epoch (no program for a shorter last call)
            per_epoch -= per_epoch % 16
        k = max(d for d in range(1, min(per_epoch, 64) + 1) if per_epoch % d == 0)
        optim = dataclasses.replace(c.optim, lr=lr)
        if c.optim.schedule == "warmup-cosine" and c.optim.lr:  # as `BatchSizeResult.flags` scales it
            optim = dataclasses.replace(optim, min_lr=c.optim.min_lr * lr / c.optim.lr)
        config = dataclasses.replace(
            c, batch_size=batch, optim=optim,
            step_form="scan" if c.step_form == "auto" else c.step_form,  # no timing probe: one form for every run
            on_nan="stop", tensorboard=False, track="", log_every=10**9,
            checkpoint=dataclasses.replace(c.checkpoint, enabled=False))
        if not self._whole:
            config = dataclasses.replace(config, epochs=2, steps_per_epoch=per_epoch, steps_per_call=k, eval_every=1,
                                         early_stopping=dataclasses.replace(c.early_stopping, patience=0))
        nnx.update(self._w.model, jax.tree.map(jnp.copy, self._initial))
        try:
            out = run(self._w.model, self._w.loss_fn, self._w.train, self._w.val, config,
                      preprocess=self._w.preprocess, augment=self._w.augment, verbosity="silent",
                      session=RunOptions(name=self._name))
        except NonFiniteLossError:
            return RateTrial(batch, lr, rate, math.inf, 2 * per_epoch * samples_per_step)
        except Exception as e:
            if not _out_of_memory(e):
                raise
            return RateTrial(batch, lr, rate, math.inf, 2 * per_epoch * samples_per_step)
        finally:
            nnx.update(self._w.model, jax.tree.map(jnp.copy, self._initial))
        loss = out.summary["best_val_loss" if self.metric == "val_loss" else "final_train_loss"]
        return RateTrial(batch, lr, rate, loss if loss is not None and math.isfinite(loss) else math.inf,
                         out.summary["steps"] * samples_per_step)


def _out_of_memory(e: Exception) -> bool:
    """Whether `e` is XLA's out-of-memory error (RESOURCE_EXHAUSTED)."""
    text = str(e)
    return isinstance(e, jax.errors.JaxRuntimeError) and ("RESOURCE_EXHAUSTED" in text
                                                          or "out of memory" in text.lower())


def _device_memory(device: jax.Device) -> tuple[int, str]:
    """`(bytes, where from)`: the device's memory limit; on a CPU, which has none, the host's available RAM."""
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"the device's memory limit ({format_bytes(stats['bytes_limit'])})"
    available = _available_ram()
    return available, f"the host's available RAM ({format_bytes(available)}; a CPU device has no memory limit)"


def _available_ram() -> int:
    """MemAvailable of /proc/meminfo, else the free physical pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _device_data_bytes(w: Workload, config: TrainConfig, device: jax.Device) -> int:
    """Bytes of the training and validation data that `fit` would keep on the device (within its
    data budget; replicated on every device), as `feeds.make_feed` and `place_validation` decide."""
    budget, held = budget_bytes(config, device), 0
    train = _data_bytes(w.train)
    if data_lib.choose_placement(config.data.placement, train, budget).where == "device":
        held = train
    if w.val is not None and (_data_bytes(w.val) <= budget - held or config.data.placement == "device"):
        held += _data_bytes(w.val)
    return held


def _data_bytes(data: Any) -> int:
    return data.row_nbytes * len(data) if data_lib.is_source(data) else data_lib.nbytes(data)


def _nbytes(x: Any) -> int:
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return math.prod(x.shape) * 8  # a threefry key is two uint32 words
    return math.prod(x.shape) * jnp.dtype(x.dtype).itemsize




# -- the learning-rate range test -----------------------------------------------------------------

SMOOTHING = 0.98  # the loss curve's exponential moving average (bias-corrected), as fastai and Lightning
DIVERGED = 4.0  # the test stops counting where the smoothed loss passes this many times its minimum
SUGGESTION_BELOW_MIN = 10.0  # the suggestion: the rate at the lowest loss over this
MAX_STEPS = 1000  # the test's default length: the run's own optimizer steps, up to this many


@dataclasses.dataclass(frozen=True)
class LRRange:
    """A learning-rate range test: the loss of each step while the learning rate grows exponentially.

    Attributes:
      lrs, losses: each step's learning rate and training loss (NaN where it was not finite).
      smoothed: the losses' bias-corrected moving average (`SMOOTHING`), up to `end`.
      end: the steps analysed: up to where the smoothed loss diverged (`DIVERGED` x its minimum, or
        not finite), else all.
      steepest: the learning rate where the smoothed loss falls fastest against log(lr).
      min_loss_lr: the learning rate at the smoothed loss's minimum (too high to train at: the loss
        is about to rise).
      check: the short runs of the config's rate and the suggestion (`RateCheck`: `lr` is the one
        recommended, the suggestion only where it trained at least as well); None when not checked.
    """

    lrs: list[float]
    losses: list[float]
    smoothed: list[float]
    end: int
    steepest: float
    min_loss_lr: float
    check: RateCheck | None = None

    @property
    def suggestion(self) -> float:
        """A tenth of the rate at the lowest loss (fastai's `lr_min`): the steepest point of a test
        as long as the run falls on the same rate for some curves and far from it for others (see
        docs/benchmarks.md, "Learning-rate range test")."""
        return self.min_loss_lr / SUGGESTION_BELOW_MIN


def analyse_lr_range(lrs: Sequence[float], losses: Sequence[float]) -> LRRange:
    """The suggestion of a range test's curve (see `LRRange`).

    Raises:
      ConfigError: fewer than 10 steps with a finite loss before divergence: no curve to read.
    """
    smoothed: list[float] = []
    average = 0.0
    for i, loss in enumerate(losses):
        if not math.isfinite(loss):
            break
        average = SMOOTHING * average + (1 - SMOOTHING) * loss
        value = average / (1 - SMOOTHING ** (i + 1))
        if smoothed and value > DIVERGED * min(smoothed):
            break
        smoothed.append(value)
    end = len(smoothed)
    if end < 10:
        raise ConfigError(f"the loss diverged after {end} steps of the range test (at learning rate "
                          f"{format_lr(lrs[max(0, end - 1)])}); start lower (min_lr) or take more steps")
    skip = max(1, end // 10)  # the first steps' slope is the average warming up, not the loss
    log_lr = [math.log(x) for x in lrs[:end]]
    slopes = [(smoothed[i + 1] - smoothed[i - 1]) / (log_lr[i + 1] - log_lr[i - 1]) for i in range(skip, end - 1)]
    steepest = skip + min(range(len(slopes)), key=slopes.__getitem__)
    lowest = min(range(end), key=smoothed.__getitem__)
    return LRRange(list(lrs), list(losses), smoothed, end, lrs[steepest], lrs[lowest])


class _Losses(Hook):
    """Every step's training loss, read once per compiled call (its metrics hold each step's)."""

    def __init__(self):
        self.losses: list[float] = []

    def after_call(self, run: Any, k: int, metrics: Any) -> None:
        self.losses.extend(float(x) for x in jax.device_get(metrics["loss"]).reshape(-1))


def lr_range(recipe: Recipe, config: Any, min_lr: float = 1e-7, max_lr: float = 10.0, steps: int | None = None,
             steps_per_call: int = 10, check_samples: int | None = None) -> LRRange:
    """Trains `recipe` for `steps` steps with its optimizer while the learning rate grows from
    `min_lr` to `max_lr` by the same factor each step (`optim.schedule="exponential"`); returns
    the losses and the suggestion. Updates whose loss or gradient is not finite are skipped
    (`on_nan="skip"`), so a diverging end of the range is recorded rather than stopping the run.
    `steps` defaults to the optimizer steps of the run `config` describes, up to `MAX_STEPS`: the
    rate a run trains best at depends on its length, and so does the test's curve.

    The suggestion is then checked: the config's rate and the suggestion train `check_samples`
    samples each (default `CHECK_SAMPLES`, at most one epoch; 0: no check) from the same initial
    weights, and `check.lr` is the suggestion only where it reached a loss no higher than the config's.

    Raises:
      ConfigError: a bad range, fewer steps than the training set holds, or a curve that diverged
        before it could be read.
    """
    if not 0 < min_lr < max_lr:
        raise ConfigError(f"min_lr={min_lr:g} and max_lr={max_lr:g}: need 0 < min_lr < max_lr")
    if check_samples is not None and not (isinstance(check_samples, int) and check_samples >= 0):
        raise ConfigError(f"check_samples={check_samples!r} must be a whole number of samples >= 0 (0: no check)")
    w = recipe.build(config)
    try:
        return _lr_range(w, recipe.name, config, min_lr, max_lr, steps, steps_per_call, check_samples)
    finally:
        w.close()


def _lr_range(w: Workload, name: str, config: Any, min_lr: float, max_lr: float, steps: int | None,
              steps_per_call: int, check_samples: int | None) -> LRRange:
    n_train = data_lib.num_rows(w.train, "train")
    runner = _ShortRun(w, config, name, n_train, check_samples) if check_samples != 0 else None  # initial weights
    if steps is None:
        per_epoch = config.steps_per_epoch or data_lib.num_rows(w.train, "train") // config.samples_per_step
        steps = min(MAX_STEPS, max(20, config.epochs * per_epoch))
    if steps < 20:
        raise ConfigError(f"steps={steps}: the range test needs at least 20 steps (100 is usual)")
    optim = dataclasses.replace(config.optim, schedule="exponential", lr=max_lr, min_lr=min_lr, decay_steps=steps,
                                warmup_steps=0)
    per_epoch = min(steps, data_lib.num_rows(w.train, "train") // config.samples_per_step)  # epochs of fresh orders
    if per_epoch < 1:
        raise ConfigError(f"the training set has fewer samples than one step of {config.samples_per_step}")
    range_config = dataclasses.replace(
        config, optim=optim, epochs=math.ceil(steps / per_epoch), steps_per_epoch=per_epoch,
        steps_per_call=math.gcd(per_epoch, steps_per_call),
        on_nan="skip", log_every=10**9, tensorboard=False, ema=0.0, track="",
        checkpoint=dataclasses.replace(config.checkpoint, enabled=False),
        early_stopping=dataclasses.replace(config.early_stopping, patience=0))
    losses = _Losses()
    run(w.model, w.loss_fn, w.train, None, range_config, hooks=[losses], preprocess=w.preprocess, augment=w.augment,
        verbosity="silent", session=RunOptions(name=name))
    schedule = min_lr * (max_lr / min_lr) ** (jnp.arange(steps) / (steps - 1))
    result = analyse_lr_range([float(x) for x in schedule], losses.losses[:steps])
    if runner is None:
        return result
    base = runner(config.batch_size, config.optim.lr, "config")
    tried = runner(config.batch_size, float(format_lr(result.suggestion)), "suggestion")  # the rate printed
    held = tried.loss <= base.loss
    reason = (f"the suggestion {format_lr(tried.lr)} reached {runner.metric} {tried.loss:.4g} against {base.loss:.4g} "
              f"at the config's rate {format_lr(base.lr)} ({base.samples:,} samples each, one run each)"
              + ("" if held else ": the config's rate is kept"))
    check = RateCheck(runner.samples, runner.metric, (base, tried), config.batch_size, tried.lr if held else base.lr,
                      reason, runner.capped)
    return dataclasses.replace(result, check=check)
