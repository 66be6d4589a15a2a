"""`evaluate(model, loss_fn, data)`: a trained model's evaluation-mode loss and metrics over a whole
dataset (a test set), exact over every row, from Python.

The same machinery as `fit`'s validation (`step.make_eval_step`, `step.make_evaluate_sums`): the
data on the device, full batches under one `lax.map` and the last partial batch as one smaller
batch in the same compiled program, so no row is dropped or counted twice; batch means are summed
times their batch's rows and divided by the rows, Stats (`jaxtrain.metrics`) added up and computed.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxtrain._src import data as data_lib
from jaxtrain._src import metrics as metrics_lib
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.state import TrainState, eval_graphdef, split_params
from jaxtrain._src.step import Batch, LossFn, Preprocess, make_eval_step, make_evaluate_sums

__all__ = ["evaluate", "evaluate_state"]

DEFAULT_BATCH_SIZE = 256
MetricsFn = Callable[[nnx.Module, Batch], dict[str, Any]]
_JITTED: dict[Any, Callable] = {}  # the compiled passes of the latest evaluations (a second call compiles nothing)


def evaluate_state(eval_step: Callable[[TrainState, Batch], Any], state: TrainState, data: Batch, batch_size: int,
                   key: Any = None) -> dict[str, float]:
    """`eval_step`'s metrics over every row of `data` (device or host arrays), as floats: one
    compiled pass (kept under `key` when given, so that the same pass is not compiled twice)."""
    n = data_lib.num_samples(data, "data")
    B = min(batch_size, n)
    if key is None or (key := (key, n, B)) not in _JITTED:
        fn = jax.jit(make_evaluate_sums(eval_step, n, B))
        if key is None:
            return metrics_lib.compute(fn(state, data), n)
        if len(_JITTED) >= 8:
            _JITTED.pop(next(iter(_JITTED)))
        _JITTED[key] = fn
    return metrics_lib.compute(_JITTED[key](state, data), n)


def evaluate(model: nnx.Module, loss_fn: LossFn, data: Batch, *, batch_size: int | None = None,
             preprocess: Preprocess | None = None, metrics: MetricsFn | None = None,
             seed: int = 0) -> dict[str, float]:
    """The evaluation-mode loss and metrics of `model` over every row of `data`, as `fit`'s
    validation computes them: `{"loss": ..., <metric>: ...}`.

    Batch means are exact over all rows (each batch's mean weighted by its rows, the last partial
    batch included); metrics returned as `jaxtrain.metrics` Stats (F1, TopK, ...) are computed from
    their counts over all rows. The pass is compiled once (a second call on data of the same shape
    compiles nothing).

    Args:
      model: the trained Flax NNX model (run in evaluation mode: dropout off, batch-norm averages;
        the model itself is left as it is).
      loss_fn: `loss_fn(model, batch, key) -> (loss, metrics)`, as given to `fit`.
      data: a pytree of arrays with one row per sample (a dict of arrays, as `fit` takes), held on
        the device for the pass.
      batch_size: rows per batch (default 256, or fewer if `data` has fewer).
      preprocess: the training run's `batch -> batch` preprocessing, applied inside the pass.
      metrics: `metrics(model, batch) -> dict`, more metrics (batch means or Stats) to compute beside
        those `loss_fn` returns, e.g. `lambda m, b: {"f1": jaxtrain.metrics.F1()(m(b["x"]), b["y"])}`.
      seed: the key `loss_fn` gets (only a loss that samples uses it).

    Example:
      >>> jaxtrain.evaluate(model, loss_fn, {"x": x_test, "y": y_test})
      {'loss': 0.31, 'accuracy': 0.912, 'f1': 0.905}
    """
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ConfigError(f"batch_size={batch_size!r} must be an integer >= 1")
    if data_lib.num_samples(data, "data") == 0:
        raise ConfigError("the data to evaluate have no rows")
    graphdef = eval_graphdef(model)
    _, params, rest = split_params(model)
    state = TrainState(jnp.zeros((), jnp.int32), params, rest, optax.EmptyState(), jax.random.key(seed))
    step_loss = loss_fn if metrics is None else _with_metrics(loss_fn, metrics)
    eval_step = make_eval_step(graphdef, step_loss, preprocess)
    shapes = tuple((jax.tree.structure(data), *((x.shape, str(x.dtype)) for x in jax.tree.leaves(data))))
    key: Any = (graphdef, loss_fn, metrics, preprocess, shapes)
    try:
        hash(key)
    except TypeError:  # a model attribute or a loss object that cannot be hashed: compiled afresh each call
        key = None
    return evaluate_state(eval_step, state, data, batch_size or DEFAULT_BATCH_SIZE, key=key)


def _with_metrics(loss_fn: LossFn, metrics: MetricsFn) -> LossFn:
    def loss_and_metrics(model: nnx.Module, batch: Batch, key: jax.Array) -> tuple[jax.Array, dict[str, Any]]:
        loss, own = loss_fn(model, batch, key)
        return loss, {**own, **metrics(model, batch)}

    return loss_and_metrics
