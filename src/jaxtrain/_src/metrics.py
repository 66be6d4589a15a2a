"""Exact metrics from sums and counts: F1, precision, recall, top-k and mean accuracy over a whole epoch.

A batch mean averaged over batches is not the epoch's value for a metric that is not a mean of
per-row values (F1 is a ratio of counts), nor for a mean whose batches hold unequal numbers of
rows (a ragged last batch, masked rows). A metric here, as in clu.metrics, torchmetrics or
keras.metrics, is a zero state, an update from a batch, a merge and a compute:

- calling a metric, `F1(average="macro")(logits, labels, mask=...)`, is the update: it returns a
  `Stat`, the batch's sufficient statistics (a confusion count, a sum and a count), computed
  inside the compiled step;
- `Stat.merge` adds two (`Stat.zero()` is the identity): the engine adds the batches' statistics
  over the epoch, on the device for validation and in float64 on the host for training, summed
  over every device's rows (the step is one program over the global batch);
- `Stat.compute()` gives the epoch's float once, at the end.

A loss function returns them beside its batch means, under the name the epoch record uses:

    def loss_fn(model, batch, key):
        logits = model(batch["x"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
        return loss, {"f1": metrics.F1(average="macro")(logits, batch["y"]),
                      "top5": metrics.TopK(5)(logits, batch["y"])}

Everything is pure and jit-friendly: a `Stat` is a pytree whose leaves are the counts and whose
metric (static, hashable) says how to compute. A batch's counts are int32; added up on the device
(`merge`, `total`: validation's batches) an int32 count carries into a second int32 word, the part
`<name>.hi` (multiples of 2**31), so that an epoch's counts do not wrap at 2**31 elements; on the
host, where training's steps are added, they are float64 (exact to 2**53). A masked `Mean` with
fractional weights sums its weights in float32.

Scores: `logits` of shape (..., C) with integer `labels` (...) are multi-class (the prediction is
the argmax); scores of the labels' shape are binary (positive where `score > threshold`, 0 by
default: logits; pass 0.5 for probabilities) or, if integer, predicted class ids.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain._src.errors import ConfigError

__all__ = ["F1", "Accuracy", "Mean", "Metric", "Precision", "Recall", "Stat", "TopK", "compute", "is_stat"]

Average = Literal["binary", "macro", "micro"]
HI = ".hi"  # the part `<name>.hi` of an int32 count added up on the device: its multiples of 2**31


def _wide(parts: dict[str, Any]) -> dict[str, Any]:
    """`parts` with every int32 count that has no carry word yet split into (its low 31 bits, `<name>.hi`:
    its multiples of 2**31, -1 for a negative one); a count of one batch is its low word, 0 its high."""
    wide = dict(parts)
    for k, v in parts.items():
        if v.dtype == jnp.int32 and not k.endswith(HI) and k + HI not in parts:
            wide[k], wide[k + HI] = v & jnp.int32(2**31 - 1), v >> 31
    return wide


def _carry_add(a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
    """Two counts as (low 31 bits, multiples of 2**31) added exactly: the low words (each < 2**31) sum
    in uint32 without wrapping, and their bit 31 carries into the high word."""
    low = a[0].astype(jnp.uint32) + b[0].astype(jnp.uint32)
    return (low & jnp.uint32(2**31 - 1)).astype(jnp.int32), a[1] + b[1] + (low >> 31).astype(jnp.int32)


def _joined(parts: dict[str, Any], dtype: Any) -> dict[str, Any]:
    """Each count with its carry word as one number of `dtype`; parts without one as they are (their bits kept)."""
    return {k: v.astype(dtype) + parts[k + HI].astype(dtype) * 2.0**31 if k + HI in parts else v
            for k, v in parts.items() if not k.endswith(HI)}


class Stat:
    """A metric's sufficient statistics over some rows: `parts` (name -> array of sums or counts)
    and the `metric` that computes from them. A pytree: the parts are its leaves, the metric static."""

    __slots__ = ("metric", "parts")

    def __init__(self, metric: "Metric", parts: dict[str, Any]):
        self.metric, self.parts = metric, dict(parts)

    def zero(self) -> "Stat":
        """The statistics of no rows (the identity of `merge`)."""
        return Stat(self.metric, {k: jnp.zeros_like(v) for k, v in self.parts.items()})

    def merge(self, other: "Stat") -> "Stat":
        """The statistics of both sets of rows (sums and counts added; int32 counts carry into `<name>.hi`)."""
        a, b = (_wide(stat.parts) for stat in (self, other))
        parts = {k: a[k] + b[k] for k in a if a[k].dtype != jnp.int32}
        for k in a:
            if a[k].dtype == jnp.int32 and not k.endswith(HI):
                parts[k], parts[k + HI] = _carry_add((a[k], a[k + HI]), (b[k], b[k + HI]))
        return Stat(self.metric, parts)

    def compute(self) -> float:
        """The metric's value over the rows counted, as a Python float (on the host)."""
        return float(self.metric.compute(_joined({k: np.asarray(v, np.float64) for k, v in self.parts.items()},
                                                 np.float64)))

    def __repr__(self) -> str:
        return f"Stat({self.metric!r}, {self.parts!r})"


jax.tree_util.register_pytree_node(
    Stat, lambda s: (tuple(s.parts[k] for k in sorted(s.parts)), (s.metric, tuple(sorted(s.parts)))),
    lambda aux, leaves: Stat(aux[0], dict(zip(aux[1], leaves))))


def is_stat(x: Any) -> bool:
    return isinstance(x, Stat)


class Metric:
    """The base of the metrics: `metric(*batch) -> Stat` (the update), `compute(parts, xp)`: the value
    from summed parts, with `xp` NumPy (float64, on the host) or jax.numpy (inside a compiled function)."""

    def compute(self, parts: dict[str, Any], xp: Any = np) -> Any:  # pragma: no cover - each metric defines it
        raise NotImplementedError


def _weights(mask: Any, shape: tuple[int, ...]) -> jax.Array:
    """The rows to count, as a boolean array of `shape` (all of them without a mask)."""
    if mask is None:
        return jnp.ones(shape, bool)
    mask = jnp.asarray(mask)
    if mask.shape != shape:
        raise ConfigError(f"a metric's mask has shape {mask.shape} but its labels have shape {shape}; give one "
                          f"entry per label (True or 1 for the rows to count)")
    return mask.astype(bool)


def _ratio(num: Any, den: Any, xp: Any = np) -> Any:
    """num / den, 0 where den is 0 (no rows: sklearn's zero_division=0); `xp` is NumPy or jax.numpy."""
    return xp.where(den > 0, num / xp.where(den > 0, den, 1), 0.0)


@dataclasses.dataclass(frozen=True)
class Mean(Metric):
    """The exact mean of per-row `values` over the rows counted: `Mean()(values, mask=None)`.
    `mask` may weigh rows (a weighted mean; counts become float32 sums)."""

    def __call__(self, values: Any, mask: Any = None) -> Stat:
        values = jnp.asarray(values, jnp.float32)
        if mask is not None and not jnp.issubdtype(jnp.asarray(mask).dtype, jnp.bool_):
            w = jnp.broadcast_to(jnp.asarray(mask, jnp.float32), values.shape)
            return Stat(self, {"total": jnp.sum(values * w), "count": jnp.sum(w)})
        w = _weights(mask, values.shape)
        return Stat(self, {"total": jnp.sum(jnp.where(w, values, 0.0)), "count": jnp.sum(w, dtype=jnp.int32)})

    def compute(self, parts: dict[str, Any], xp: Any = np) -> Any:
        return _ratio(parts["total"], parts["count"], xp)


def _predicted(scores: Any, labels: Any, threshold: float) -> tuple[jax.Array, jax.Array, int | None]:
    """(predicted class, labels, classes or None for binary)."""
    scores, labels = jnp.asarray(scores), jnp.asarray(labels)
    if scores.ndim == labels.ndim + 1 and scores.shape[-1] == 1:  # a binary model's (N, 1) logits: one score a row
        scores = scores[..., 0]
    if scores.ndim == labels.ndim + 1:
        return jnp.argmax(scores, axis=-1), labels.astype(jnp.int32), scores.shape[-1]
    if scores.shape != labels.shape:
        raise ConfigError(f"a metric got scores of shape {scores.shape} for labels of shape {labels.shape}; give "
                          f"logits (..., classes) for labels (...), or one score per label")
    if jnp.issubdtype(scores.dtype, jnp.integer):
        return scores.astype(jnp.int32), labels.astype(jnp.int32), None
    return (scores > threshold).astype(jnp.int32), labels.astype(jnp.int32), None


@dataclasses.dataclass(frozen=True)
class Accuracy(Metric):
    """The exact share of rows predicted right: `Accuracy()(scores, labels, mask=None)` (scores as
    the module says: logits (..., C) or one binary score per label)."""

    threshold: float = 0.0

    def __call__(self, scores: Any, labels: Any, mask: Any = None) -> Stat:
        predicted, labels, _ = _predicted(scores, labels, self.threshold)
        w = _weights(mask, labels.shape)
        return Stat(self, {"correct": jnp.sum(w & (predicted == labels), dtype=jnp.int32),
                           "count": jnp.sum(w, dtype=jnp.int32)})

    def compute(self, parts: dict[str, Any], xp: Any = np) -> Any:
        return _ratio(parts["correct"], parts["count"], xp)


@dataclasses.dataclass(frozen=True)
class TopK(Metric):
    """The exact share of rows whose label is among the `k` highest logits:
    `TopK(5)(logits, labels, mask=None)`, logits (..., C), integer labels (...). A tie with the
    label's logit counts for the label."""

    k: int = 5

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"TopK(k={self.k!r}): k must be an integer >= 1")

    def __call__(self, logits: Any, labels: Any, mask: Any = None) -> Stat:
        logits, labels = jnp.asarray(logits), jnp.asarray(labels).astype(jnp.int32)
        if logits.ndim != labels.ndim + 1:
            raise ConfigError(f"TopK takes logits (..., classes) for labels (...); got logits of shape "
                              f"{logits.shape} for labels of shape {labels.shape}")
        own = jnp.take_along_axis(logits, labels[..., None], axis=-1)  # the label's logit
        above = jnp.sum(logits > own, axis=-1)  # classes ranked strictly above the label
        w = _weights(mask, labels.shape)
        return Stat(self, {"correct": jnp.sum(w & (above < self.k), dtype=jnp.int32),
                           "count": jnp.sum(w, dtype=jnp.int32)})

    def compute(self, parts: dict[str, Any], xp: Any = np) -> Any:
        return _ratio(parts["correct"], parts["count"], xp)


@dataclasses.dataclass(frozen=True)
class _Confusion(Metric):
    """True positives, false positives and false negatives per class (binary: of `pos_label`)."""

    average: Average = "binary"
    num_classes: int | None = None
    threshold: float = 0.0
    pos_label: int = 1

    def __post_init__(self) -> None:
        if self.average not in ("binary", "macro", "micro"):
            raise ConfigError(f"{type(self).__name__}(average={self.average!r}): average must be 'binary', 'macro' "
                              f"or 'micro'")

    def __call__(self, scores: Any, labels: Any, mask: Any = None) -> Stat:
        predicted, labels, classes = _predicted(scores, labels, self.threshold)
        w = _weights(mask, labels.shape)
        if self.average == "binary":
            p, t = predicted == self.pos_label, labels == self.pos_label
            count = lambda x: jnp.sum(w & x, dtype=jnp.int32)  # noqa: E731
            return Stat(self, {"tp": count(p & t), "fp": count(p & ~t), "fn": count(~p & t)})
        classes = self.num_classes or classes
        if classes is None:
            raise ConfigError(f"{type(self).__name__}(average={self.average!r}) of predicted class ids needs "
                              f"num_classes= (or pass logits (..., classes))")
        ids = jnp.arange(classes)
        p = (predicted[..., None] == ids) & w[..., None]  # (..., C)
        t = (labels[..., None] == ids) & w[..., None]
        axes = tuple(range(p.ndim - 1))
        return Stat(self, {"tp": jnp.sum(p & t, axis=axes, dtype=jnp.int32),
                           "fp": jnp.sum(p & ~t, axis=axes, dtype=jnp.int32),
                           "fn": jnp.sum(~p & t, axis=axes, dtype=jnp.int32)})

    def compute(self, parts: dict[str, Any], xp: Any = np) -> Any:
        tp, fp, fn = parts["tp"], parts["fp"], parts["fn"]
        if self.average == "micro":
            tp, fp, fn = tp.sum(), fp.sum(), fn.sum()
        # macro: the unweighted mean over the classes that occur (labelled or predicted), as sklearn averages
        present = (tp + fp + fn) > 0
        return xp.sum(xp.where(present, self.score(tp, fp, fn, xp), 0.0)) / xp.maximum(xp.sum(present), 1)

    def score(self, tp: Any, fp: Any, fn: Any, xp: Any) -> Any:  # pragma: no cover
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Precision(_Confusion):
    """tp / (tp + fp), from counts over the epoch: `Precision(average="binary"|"macro"|"micro",
    num_classes=None, threshold=0.0, pos_label=1)(scores, labels, mask=None)`. A class never
    predicted scores 0 (sklearn's zero_division=0); macro averages the classes unweighted."""

    def score(self, tp: Any, fp: Any, fn: Any, xp: Any) -> Any:
        return _ratio(tp, tp + fp, xp)


@dataclasses.dataclass(frozen=True)
class Recall(_Confusion):
    """tp / (tp + fn), from counts over the epoch (arguments as `Precision`)."""

    def score(self, tp: Any, fp: Any, fn: Any, xp: Any) -> Any:
        return _ratio(tp, tp + fn, xp)


@dataclasses.dataclass(frozen=True)
class F1(_Confusion):
    """2 tp / (2 tp + fp + fn), from counts over the epoch (arguments as `Precision`); macro is the
    unweighted mean of the classes' F1, as sklearn's `f1_score(average="macro")`."""

    def score(self, tp: Any, fp: Any, fn: Any, xp: Any) -> Any:
        return _ratio(2 * tp, 2 * tp + fp + fn, xp)


# --- the engine's side: batch means and Stats in one metrics dict ---

def as_float32(metrics: dict[str, Any]) -> dict[str, Any]:
    """Batch means as float32 (the dtype metrics are reported in); a Stat's counts keep their dtype."""
    return {k: v if is_stat(v) else jnp.asarray(v).astype(jnp.float32) for k, v in metrics.items()}


def mean_micro(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics of micro-batches stacked on axis 0 as the batch's: means averaged, Stats added up."""
    return {k: jax.tree.map(lambda x: x.sum(axis=0), v) if is_stat(v) else v.mean(axis=0) for k, v in metrics.items()}


def row_sums(metrics: dict[str, Any], rows: int) -> dict[str, Any]:
    """A batch's metrics as sums over its `rows` rows: a batch mean times `rows`, a Stat as it is."""
    return {k: v if is_stat(v) else v * rows for k, v in metrics.items()}


def total(stacked: dict[str, Any]) -> dict[str, Any]:
    """Per-batch sums stacked on axis 0, added up (a Stat's int32 counts with their carry: `Stat.merge`)."""
    return {k: _stat_total(v) if is_stat(v) else jnp.sum(v) for k, v in stacked.items()}


def _stat_total(stat: Stat) -> Stat:
    """A Stat of parts stacked on axis 0, added up: int32 counts by a reduction that carries (`_carry_add`)."""
    parts = _wide(stat.parts)
    summed = {k: v.sum(axis=0) for k, v in parts.items() if v.dtype != jnp.int32}
    for k, v in parts.items():
        if v.dtype == jnp.int32 and not k.endswith(HI):
            zero = jnp.zeros((), jnp.int32)
            summed[k], summed[k + HI] = jax.lax.reduce((v, parts[k + HI]), (zero, zero), _carry_add, (0,))
    return Stat(stat.metric, summed)


def widen(sums: dict[str, Any]) -> dict[str, Any]:
    """Sums as `add` returns them (a Stat's int32 counts with their carry words): the zeros that
    sums added up on the device start from."""
    return {k: Stat(v.metric, _wide(v.parts)) if is_stat(v) else v for k, v in sums.items()}


def add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two dicts of sums added (a Stat merged)."""
    return {k: a[k].merge(b[k]) if is_stat(a[k]) else a[k] + b[k] for k in a}


def host_sums(sums: dict[str, Any]) -> dict[str, Any]:
    """Sums fetched to the host: floats, Stats of float64 parts (so that blocks add up exactly; each
    count with its carry word as one number)."""
    return {k: Stat(v.metric, _joined({p: np.asarray(x, np.float64) for p, x in v.parts.items()}, np.float64))
            if is_stat(v) else float(np.float64(v)) for k, v in jax.device_get(sums).items()}


def compute(sums: dict[str, Any], rows: int) -> dict[str, float]:
    """The epoch's values from its sums over `rows` rows (on the host): a sum of batch means divided
    by `rows`, a Stat computed."""
    return {k: v.compute() if is_stat(v) else float(v) / rows for k, v in host_sums(sums).items()}


def compute_traced(sums: dict[str, Any], rows: int) -> dict[str, jax.Array]:
    """`compute` inside a compiled function (float32 arrays)."""
    return {k: v.metric.compute(_joined(v.parts, jnp.float32), jnp) if is_stat(v) else v / rows
            for k, v in sums.items()}
