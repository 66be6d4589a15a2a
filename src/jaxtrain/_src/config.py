"""Frozen, validated configuration dataclasses.

Field docstrings become the command-line help (through tyro). Configs reach builders and the
loop; jitted functions never see them.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import typing
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from jaxtrain._src.deadline import parse_duration
from jaxtrain._src.errors import ConfigError, setting

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Optimizer = Literal["sgd", "adam", "adamw"]
Schedule = Literal["constant", "warmup-cosine", "exponential"]
Placement = Literal["auto", "device", "stream"]
LastBatch = Literal["drop", "pad"]
OnNaN = Literal["stop", "skip"]
TRACKERS = ("mlflow", "wandb", "csv")  # the names TrainConfig.track takes (hooks/trackers.py)
STEP_FORMS = ("auto", "scan", "unroll", "step")  # TrainConfig.step_form (choosers.StepForm)
REWRITES = ("auto", "on", "off")  # TrainConfig.rewrite (rewrite.rewrite_loss)
Precision = Literal["fp32", "bf16", "fp16"]
BestMode = Literal["min", "max"]


Config = TypeVar("Config", bound="DataclassInstance")  # a config dataclass

MAX_SEED = 2**32 - 1  # jax.random.key keeps the low 32 bits: 2**32 would be seed 0 again


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _plain_numbers(config: Any) -> None:
    """Numbers as Python's own: a NumPy integer or float in an `int` or `float` field becomes an int or a
    float (they come from arrays and sweeps; the JSON of config.json takes no NumPy scalars), and a bool
    in a number field is refused (True is an int to Python: batch_size=True would train as batch 1)."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.type not in ("int", "float"):
            continue
        kind = "an integer" if field.type == "int" else "a number"
        _check(not isinstance(value, bool), f"{field.name}={value!r} must be {kind}, not True or False")
        if isinstance(value, numbers.Integral) and not isinstance(value, int):
            object.__setattr__(config, field.name, int(value))
        elif field.type == "float" and isinstance(value, numbers.Real) and not isinstance(value, (int, float)):
            object.__setattr__(config, field.name, float(value))


def _check_choice(field: str, value: str, choices: object) -> None:  # choices: a Literal alias
    allowed = get_args(choices)
    _check(value in allowed, f"{field}={value!r} is not allowed; choose one of {', '.join(allowed)}")


def _check_positive(field: str, value: float) -> None:
    _check(
        isinstance(value, (int, float)) and math.isfinite(value) and value > 0,
        f"{field}={value!r} must be a positive number",
    )


def _check_non_negative(field: str, value: float) -> None:
    _check(
        isinstance(value, (int, float)) and math.isfinite(value) and value >= 0,
        f"{field}={value!r} must be zero or a positive number",
    )


AXES = ("data", "fsdp")
"""The mesh's axes: data parallelism, and fully sharded data parallelism (parameters split too)."""


def parse_mesh(text: str) -> dict[str, int] | None:
    """`"data=2,fsdp=2"` → `{"data": 2, "fsdp": 2}`; `"auto"` → None.

    Raises:
      ConfigError: an unknown axis name, a repeated axis, or a size that is not an integer >= 1.
    """
    text = text.strip()
    if text == "auto":
        return None
    sizes: dict[str, int] = {}
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\w+)\s*=\s*(\d+)\s*", part)
        if not match:
            raise ConfigError(f"{setting('mesh', text)}: write axis=size pairs separated by commas, e.g. data=4 or "
                              "data=2,fsdp=2 (or auto)", mesh=text)
        name, size = match.group(1), int(match.group(2))
        if name not in AXES:
            raise ConfigError(f"{setting('mesh', text)}: unknown axis {name!r}; the axes are {' and '.join(AXES)}",
                              mesh=text)
        if name in sizes or size < 1:
            raise ConfigError(f"{setting('mesh', text)}: give each axis once, with a size >= 1", mesh=text)
        sizes[name] = size
    return sizes


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimizer, learning-rate schedule and gradient clipping."""

    name: Optimizer = "adam"
    """Update rule: sgd (with optional momentum), adam, or adamw (decoupled weight decay)."""
    lr: float = 1e-3
    """Peak learning rate."""
    schedule: Schedule = "constant"
    """Learning-rate schedule: constant; linear warmup then cosine decay; or exponential, from min_lr
    up to lr over decay_steps by the same factor each step (the learning-rate range test)."""
    warmup_steps: int = 0
    """Steps of linear warmup from 0 to lr (warmup-cosine only)."""
    decay_steps: int = 0
    """Steps from the start to the end of the cosine decay; 0 means the whole run."""
    min_lr: float = 0.0
    """Learning rate at the end of the cosine decay."""
    momentum: float = 0.0
    """SGD momentum; 0 is plain SGD."""
    b1: float = 0.9
    """Adam first-moment decay."""
    b2: float = 0.999
    """Adam second-moment decay."""
    eps: float = 1e-8
    """Adam denominator epsilon."""
    weight_decay: float = 0.0
    """Weight decay: decoupled for adamw, an L2 term added to the gradient for sgd and adam."""
    clip_norm: float = 0.0
    """Clip gradients to this global L2 norm before the update; 0 disables clipping."""
    plateau_patience: int = 0
    """Reduce on plateau (Keras's ReduceLROnPlateau): after this many evaluated epochs without
    improvement of `plateau_metric`, the learning rate (the whole schedule) is multiplied by
    `plateau_factor`; 0 disables it. The rate is a number in the optimizer state: nothing recompiles."""
    plateau_factor: float = 0.1
    """Reduce on plateau: the factor in (0, 1) the learning rate is multiplied by at each reduction."""
    plateau_metric: str = "val_loss"
    """Reduce on plateau: the epoch metric to watch: val_loss, train_loss or val_<metric>."""
    plateau_mode: BestMode = "min"
    """Reduce on plateau: whether lower (min) or higher (max) `plateau_metric` is better."""
    plateau_min_delta: float = 0.0
    """Reduce on plateau: the smallest change that counts as an improvement."""
    plateau_cooldown: int = 0
    """Reduce on plateau: epochs after a reduction before epochs without improvement count again."""
    plateau_min_lr: float = 0.0
    """Reduce on plateau: the learning rate is not reduced below this."""

    def __post_init__(self) -> None:
        _plain_numbers(self)
        _check_choice("optim.name", self.name, Optimizer)
        _check_choice("optim.schedule", self.schedule, Schedule)
        _check_positive("optim.lr", self.lr)
        for field in ("warmup_steps", "decay_steps"):
            value = getattr(self, field)
            _check(isinstance(value, int) and value >= 0, f"optim.{field}={value!r} must be an integer >= 0")
        _check_non_negative("optim.min_lr", self.min_lr)
        _check(self.min_lr <= self.lr, f"optim.min_lr={self.min_lr} must not exceed optim.lr={self.lr}")
        _check(self.schedule != "exponential" or self.min_lr > 0,
               "optim.schedule=exponential rises from optim.min_lr, which must be > 0 (e.g. 1e-7)")
        _check(0 <= self.momentum < 1, f"optim.momentum={self.momentum} must be in [0, 1)")
        _check(0 <= self.b1 < 1, f"optim.b1={self.b1} must be in [0, 1)")
        _check(0 <= self.b2 < 1, f"optim.b2={self.b2} must be in [0, 1)")
        _check_positive("optim.eps", self.eps)
        _check_non_negative("optim.weight_decay", self.weight_decay)
        _check_non_negative("optim.clip_norm", self.clip_norm)
        _check_choice("optim.plateau_mode", self.plateau_mode, BestMode)
        for field in ("plateau_patience", "plateau_cooldown"):
            value = getattr(self, field)
            _check(isinstance(value, int) and value >= 0, f"optim.{field}={value!r} must be an integer >= 0")
        _check(isinstance(self.plateau_factor, (int, float)) and 0 < self.plateau_factor < 1,
               f"optim.plateau_factor={self.plateau_factor!r} must be in (0, 1), e.g. 0.1 or 0.5")
        _check_non_negative("optim.plateau_min_delta", self.plateau_min_delta)
        _check_non_negative("optim.plateau_min_lr", self.plateau_min_lr)
        _check(self.schedule != "exponential" or not self.plateau_patience,
               "optim.plateau_patience does not take optim.schedule=exponential (the learning-rate range test); "
               "use constant or warmup-cosine")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the training data lives while training."""

    placement: Placement = "auto"
    """auto: keep the dataset on the device when it fits the memory budget, else stream it; device:
    always on the device; stream: read batches from host memory or disk in a background thread."""
    memory_budget_gb: float = 0.0
    """Device memory the dataset may take, in GiB; 0 means a quarter of device memory (2 GiB on CPU)."""
    prefetch: int = 2
    """Streaming: compiled calls' worth of batches (K batches each) read ahead and placed on the
    device while the current call runs."""
    shuffle_window_mb: int = 32
    """Streaming: MiB of rows shuffled together (the shuffle buffer); blocks of ~1 MiB are read whole."""
    last_batch: LastBatch = "drop"
    """A loader's short last batch (an iterable of batches passed to fit): drop it, or pad it to a full
    batch with its own first rows; either way every compiled call keeps one batch shape."""
    accept_changed: bool = False
    """Resume: continue even though the training data differ from those the checkpoint was trained
    on (refused by default; noted in metrics.jsonl when accepted)."""
    allow_nan: bool = False
    """Arrays and a loader's batches may hold NaN (missing labels a loss masks, as Flax's
    ogbg_molpcba example stores them); Inf is still refused, and so is NaN read from files."""

    def __post_init__(self) -> None:
        _plain_numbers(self)
        _check_choice("data.placement", self.placement, Placement)
        _check_choice("data.last_batch", self.last_batch, LastBatch)
        _check_non_negative("data.memory_budget_gb", self.memory_budget_gb)
        _check(isinstance(self.prefetch, int) and self.prefetch >= 1, f"data.prefetch={self.prefetch!r} must be >= 1")
        _check(isinstance(self.shuffle_window_mb, int) and self.shuffle_window_mb >= 1,
               f"data.shuffle_window_mb={self.shuffle_window_mb!r} must be an integer >= 1")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints in <run dir>/checkpoints (written only when the run has a directory)."""

    enabled: bool = True
    """Write checkpoints at each epoch end (and every `every_steps`, every `every`)."""
    every_steps: int = 0
    """Also save every N optimizer steps, at the next compiled-call boundary; 0: epoch ends only."""
    keep_last: int = 3
    """Keep the newest N checkpoints."""
    keep_best: int = 1
    """Also keep the N checkpoints with the best `best_metric`."""
    best_metric: str = "val_loss"
    """Epoch metric that ranks checkpoints: val_loss, train_loss or val_<metric>."""
    best_mode: BestMode = "min"
    """Whether lower (min) or higher (max) `best_metric` is better."""
    every: float | str = 0
    """Also save every this much wall time, at the next compiled-call boundary (Keras's
    BackupAndRestore save_freq, in time): seconds, or 90s, 10m, 1.5h, 1h30m; 0: not by time."""

    def __post_init__(self) -> None:
        _plain_numbers(self)
        _check_choice("checkpoint.best_mode", self.best_mode, BestMode)
        parse_duration(self.every, "checkpoint.every")
        _check(isinstance(self.every_steps, int) and self.every_steps >= 0,
               f"checkpoint.every_steps={self.every_steps!r} must be an integer >= 0")
        _check(isinstance(self.keep_last, int) and self.keep_last >= 1,
               f"checkpoint.keep_last={self.keep_last!r} must be an integer >= 1")
        _check(isinstance(self.keep_best, int) and self.keep_best >= 0,
               f"checkpoint.keep_best={self.keep_best!r} must be an integer >= 0")


EARLY_STOPPING_REASON = "stopped early: "
"""How the early-stopping hook's stop reason begins (summary.json's `stop_reason`); a run that another
hook stopped (`RunView.stop`) gives that hook's reason, and a resume continues it."""


@dataclasses.dataclass(frozen=True)
class EarlyStoppingConfig:
    """Stop training when an epoch metric stops improving (the `EarlyStopping` hook)."""

    patience: int = 0
    """Epochs without improvement before training stops; 0 disables early stopping."""
    metric: str = "val_loss"
    """Epoch metric to watch: val_loss, train_loss or val_<metric>."""
    mode: BestMode = "min"
    """Whether lower (min) or higher (max) is better."""
    min_delta: float = 0.0
    """Smallest change that counts as an improvement."""
    restore_best: bool = False
    """At the end of training the model takes the weights of the epoch with the best `metric`
    (Keras's `restore_best_weights`), whether or not early stopping is on (patience 0 watches
    without stopping): a copy in device memory made when that epoch ended, or after a resume that
    epoch's checkpoint (kept by `checkpoint.keep_best` on the same metric). summary.json's
    `restored_epoch` names it; the checkpoints and `FitResult.state` keep the last step's state."""

    def __post_init__(self) -> None:
        _plain_numbers(self)
        _check(isinstance(self.restore_best, bool), f"early_stopping.restore_best={self.restore_best!r} must be "
                                                    "True or False")
        _check_choice("early_stopping.mode", self.mode, BestMode)
        _check(isinstance(self.patience, int) and self.patience >= 0,
               f"early_stopping.patience={self.patience!r} must be an integer >= 0")
        _check_non_negative("early_stopping.min_delta", self.min_delta)


@dataclasses.dataclass(frozen=True)
class DistConfig:
    """Many processes (hosts) through jax.distributed. Without a coordinator, a job JAX's own detection
    finds is joined (a SLURM step of several tasks, an Open MPI job, a pod of a Kubernetes indexed Job
    or JobSet, a host of a Cloud TPU slice; `jaxtrain.distributed.detected_cluster()` says which);
    otherwise the run is one process."""

    coordinator: str = ""
    """host:port where process 0 serves JAX's coordination service (every process gives the same)."""
    num_processes: int = 0
    """Processes in the job (with a coordinator). 1 without a coordinator: this process trains alone
    even inside a detected cluster (what each worker of a sweep does)."""
    process_id: int = -1
    """This process's index, 0 .. num_processes-1 (with a coordinator)."""
    timeout_s: float = 60.0
    """Seconds to wait for the coordinator at start-up, and for a silent peer before this process
    stops with a message rather than waiting forever."""

    def __post_init__(self) -> None:
        _plain_numbers(self)
        _check_positive("dist.timeout_s", self.timeout_s)
        if not self.coordinator:
            _check(self.num_processes in (0, 1) and self.process_id == -1,
                   "dist.num_processes (but 1: alone) and dist.process_id need dist.coordinator (host:port of "
                   "process 0)")
            return
        _check(re.fullmatch(r"[^\s:]+:\d{1,5}", self.coordinator) is not None,
               f"dist.coordinator={self.coordinator!r} must be host:port, e.g. node001:12345")
        _check(isinstance(self.num_processes, int) and self.num_processes >= 1,
               f"dist.num_processes={self.num_processes!r} must be an integer >= 1 with dist.coordinator")
        _check(isinstance(self.process_id, int) and 0 <= self.process_id < self.num_processes,
               f"dist.process_id={self.process_id!r} is out of range: use 0 .. {self.num_processes - 1} for "
               f"{self.num_processes} processes")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train: epochs, batching, fused execution, logging, optimizer and data placement."""

    epochs: int = 10
    """Passes over the training set (or blocks of steps_per_epoch steps)."""
    steps_per_epoch: int = 0
    """0: an epoch is one pass over the training set. N: an epoch is N steps on batches drawn without
    replacement from a fresh permutation of the training set, for iteration-based training (nanoGPT:
    evaluate every N iterations); N * batch_size must not exceed the training set."""
    batch_size: int = 32
    """Samples per optimizer step."""
    eval_batch_size: int = 0
    """Samples per evaluation batch; 0 uses batch_size."""
    seed: int = 0
    """Seed for initialisation, shuffling and every random key of the run."""
    val_split: float = 0.0
    """Fraction of the training rows held out for validation when no val_data is given (Keras's
    `validation_split`): the last rows, as Keras takes them, before any shuffling (shuffle ordered
    data first). 0: none held out."""
    steps_per_call: int = 0
    """Optimizer steps per compiled call (K); 0 picks the smallest K that keeps per-call overhead
    under 2% of compute."""
    step_form: str = "auto"
    """How a call runs its K steps: scan (fused in a lax.scan loop), unroll (programs of a few
    unrolled steps), step (the plain jitted step, dispatched K times without a host sync), or auto:
    timed on the run's first steps, fastest kept (XLA:CPU runs convolutions ~10x slower in a loop).
    The forms round differently: auto's decision is kept (in the compile cache, else in
    ~/.cache/jaxtrain/forms; JAXTRAIN_FORM_MEMORY=off keeps none) and reused by later runs of the
    same program on the machine, so that they compute bit for bit alike."""
    rewrite: str = "auto"
    """XLA:CPU's slow ops in the loss rewritten before differentiation (results equal within 1e-5):
    convolutions as im2col + one matmul, max pools as strided maxima (their gradients are slow on
    XLA:CPU in a loop or not). auto: on the CPU when the loss holds them; on; off."""
    log_every: int = 200
    """Steps between training-metric lines in metrics.jsonl (each one a host sync)."""
    eval_every: int = 1
    """Epochs between evaluations on the validation set (the last epoch is always evaluated)."""
    optim: OptimConfig = OptimConfig()
    """Optimizer settings."""
    data: DataConfig = DataConfig()
    """Data placement settings."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """Checkpoint settings."""
    early_stopping: EarlyStoppingConfig = EarlyStoppingConfig()
    """Early stopping settings (off by default)."""
    on_nan: OnNaN = "stop"
    """On a NaN/Inf loss or gradient: stop (exit code 3), or skip that update and count it."""
    tensorboard: bool = True
    """Write TensorBoard scalars to <run dir>/tensorboard (when the run has a directory)."""
    precision: Precision = "fp32"
    """Compute dtype of the forward and backward: fp32, bf16, or fp16 (with dynamic loss scaling).
    Parameters, optimizer state, losses and normalisation statistics stay float32."""
    loss_scale_init: float = 2.0**15
    """fp16: the initial loss scale (halved on each overflow, whose update is skipped)."""
    loss_scale_period: int = 2000
    """fp16: optimizer steps without overflow after which the loss scale doubles."""
    grad_accum: int = 1
    """Micro-batches of batch_size per optimizer step, accumulated inside the compiled call: a step
    sees grad_accum x batch_size samples for the activation memory of one micro-batch."""
    mesh: str = "auto"
    """Devices as a mesh: auto (every device, data parallel), data=N, fsdp=N or data=N,fsdp=M (FSDP:
    parameters and optimizer state split over fsdp). The sizes multiply to the number of devices."""
    track: str = ""
    """Experiment trackers beside TensorBoard, comma-separated: mlflow, wandb, csv (e.g. mlflow,csv).
    Each records the config, the metrics by step, the summary and the run files; a resumed run
    continues the same tracked run. Needs a run directory; mlflow and wandb are pip packages."""
    ema: float = 0.0
    """Exponential moving average of the weights: 0 off; a decay d in (0, 1), e.g. 0.999: after each
    update ema = d * ema + (1 - d) * params (from the initial weights), inside the compiled call. It is
    evaluated beside the raw weights (val_ema_loss, ...), saved in checkpoints, and used by predict and
    export when they are asked for the averaged weights."""
    max_time: float | str = 0
    """A deadline: the run's wall-time budget, from the start of training to its end (seconds, or 90s,
    10m, 1.5h, 1h30m; 0: none). The run plans its steps from its measured time per step, fits the
    learning-rate schedule (warmup and decay) to them, and ends with its final evaluation and
    checkpoint before the deadline; `epochs` no longer limits it. A resume with a longer max_time
    continues the run (the budget counts every session's time)."""

    def __post_init__(self) -> None:
        _plain_numbers(self)
        parse_duration(self.max_time, "max_time")
        parse_mesh(self.mesh)
        _check_choice("on_nan", self.on_nan, OnNaN)
        _check_choice("precision", self.precision, Precision)
        _check_positive("loss_scale_init", self.loss_scale_init)
        for field in ("epochs", "batch_size", "log_every", "eval_every", "grad_accum", "loss_scale_period"):
            value = getattr(self, field)
            _check(isinstance(value, int) and value >= 1, f"{field}={value!r} must be an integer >= 1")
        _check(self.step_form in STEP_FORMS,
               f"step_form={self.step_form!r} must be one of {', '.join(STEP_FORMS)}")
        _check(self.rewrite in REWRITES, f"rewrite={self.rewrite!r} must be one of {', '.join(REWRITES)}")
        for field in ("eval_batch_size", "steps_per_call", "steps_per_epoch"):
            value = getattr(self, field)
            _check(
                isinstance(value, int) and value >= 0,
                f"{field}={value!r} must be an integer >= 1, or 0 for automatic",
            )
        unknown = [n.strip() for n in self.track.split(",") if n.strip() and n.strip() not in TRACKERS]
        _check(not unknown, f"unknown tracker {unknown[0]!r} in track={self.track!r}; choose among "
                            f"{', '.join(TRACKERS)}" if unknown else "")
        _check(isinstance(self.val_split, (int, float)) and 0 <= self.val_split < 1,
               f"val_split={self.val_split!r} must be a fraction in (0, 1) of the training rows, e.g. 0.1 (0: none)")
        _check(isinstance(self.ema, (int, float)) and 0 <= self.ema < 1,
               f"ema={self.ema!r} must be 0 (off) or a decay in (0, 1), e.g. 0.999")
        _check(isinstance(self.seed, int) and 0 <= self.seed <= MAX_SEED,
               f"seed={self.seed!r} must be an integer from 0 to {MAX_SEED} (JAX keys hold 32 bits: larger seeds "
               "would repeat smaller ones)")

    @property
    def max_time_s(self) -> float:
        """`max_time` in seconds (0.0: no deadline)."""
        return parse_duration(self.max_time, "max_time")

    @property
    def samples_per_step(self) -> int:
        """Samples one optimizer step sees: batch_size x grad_accum."""
        return self.batch_size * self.grad_accum


def to_dict(config: DataclassInstance) -> dict:
    """A JSON-ready dict of a (nested) config dataclass."""
    return dataclasses.asdict(config)


def flat_dict(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`to_dict`'s nesting flattened: `{"optim": {"lr": 1e-3}}` -> `{"optim.lr": 1e-3}`; tuples
    become lists, as JSON reads them back."""
    out = {}
    for k, v in values.items():
        if isinstance(v, dict):
            out.update(flat_dict(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


def from_dict(cls: type[Config], values: dict, where: str = "") -> Config:
    """Rebuilds a (nested) config dataclass from `to_dict`'s output; unknown keys are an error."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(where + k for k in unknown)} for {cls.__name__}")
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = from_dict(hint, value, f"{where}{name}.")
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)
