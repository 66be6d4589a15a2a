"""Batched prediction: a trained model's outputs for every row of some inputs.

`predict(model, data)` runs the model's evaluation-mode forward (dropout off, batch-norm running
statistics) over `data` in batches of one shape: one compiled program, the last partial batch
padded to the full size and its padding rows dropped from the outputs, never a second compile.
The preprocessing the model was trained with runs inside the compiled forward, as in evaluation.
Inputs are read a batch at a time (a row source such as an HDF5 file is read in contiguous
blocks), and the next batch is handed to the device while the current one computes, so memory
holds a few batches whatever the size of the inputs; `predict_batches` yields the outputs batch
by batch for callers that write them out as they come (`jaxtrain predict`). Input rows holding NaN
or Inf are refused by default, naming them (their outputs would be NaN): `allow_nonfinite=True`
predicts them anyway. Finite inputs whose outputs are not (values far outside the training data's
range, 3e38, overflow the model) are predicted, with one note counting those rows.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxtrain._src.data.arrays import is_source, num_rows
from jaxtrain._src.errors import ConfigError, DataError, argument
from jaxtrain._src.report.notes import note
from jaxtrain._src.sharding import Layout, make_layout
from jaxtrain._src.state import eval_graphdef, split_params
from jaxtrain._src.step import Preprocess

__all__ = ["Forward", "predict", "predict_batches"]

DEFAULT_BATCH_SIZE = 256
_JITTED: dict[Any, Callable] = {}  # the jitted forwards of the latest models predicted with (see `Forward.jitted`)


Inputs = str | tuple[str, ...]  # the field the model is called on, or the fields of its positional arguments


def check_inputs(inputs: Any) -> Inputs:
    """`inputs` as a field name or a tuple of them (a list becomes a tuple)."""
    if isinstance(inputs, (list, tuple)) and inputs and all(isinstance(k, str) for k in inputs):
        if len(set(inputs)) < len(inputs):
            raise ConfigError(f"inputs={tuple(inputs)!r} names a field twice; name each of the model's arrays once")
        return tuple(inputs)
    if not isinstance(inputs, str):
        raise ConfigError(f"inputs={inputs!r} must be a field name, or a tuple of names for a model called with "
                          f"several arrays, e.g. inputs=('image', 'text') for model(batch['image'], batch['text'])")
    return inputs


def call_model(inputs: Inputs) -> Callable[[nnx.Module, dict], Any]:
    """`model(batch[inputs])`, or with a tuple `model(batch[a], batch[b], ...)`."""
    if isinstance(inputs, str):
        return lambda model, batch: model(batch[inputs])
    return lambda model, batch: model(*(batch[k] for k in inputs))


def _fields(data: Any, inputs: Any) -> tuple[Any, Inputs]:
    """`data` as a dict of fields, and the field(s) the model is called on."""
    if isinstance(data, (tuple, list)) and data and all(hasattr(x, "shape") for x in data):
        names = check_inputs(inputs) if inputs is not None else tuple(f"x{i}" for i in range(len(data)))
        if isinstance(names, str) or len(names) != len(data):
            raise ConfigError(f"predict got {len(data)} arrays but inputs={inputs!r}: name one field per array, "
                              f"in the order the model takes them")
        return dict(zip(names, data)), names
    if isinstance(data, dict) or is_source(data):
        fields = list(data.keys() if isinstance(data, dict) else data.row_shapes)
        if inputs is None:
            if len(fields) != 1:
                raise ConfigError(f"the inputs have the fields {', '.join(fields)}: pass inputs= the one the model "
                                  f"is called on (a tuple of them for a model called with several arrays)")
            inputs = fields[0]
        return data, check_inputs(inputs)
    if not hasattr(data, "shape") or not getattr(data, "ndim", 0):
        raise ConfigError(f"predict takes an array of samples (a leading batch axis), a dict of them, a tuple of "
                          f"them (a model called with several arrays) or a row source; got {type(data).__name__}")
    inputs = check_inputs(inputs or "x")
    if not isinstance(inputs, str):
        raise ConfigError(f"predict got one array but inputs={inputs!r} names {len(inputs)} fields: pass a dict "
                          f"or a tuple of arrays, one per field")
    return {inputs: data}, inputs


class Forward:
    """A model's evaluation-mode forward, compiled once per batch shape and placed on a mesh.

    Args:
      model: the trained Flax NNX model.
      preprocess: `batch -> batch`, traced into the forward (the training run's preprocessing).
      inputs: the field of the (preprocessed) batch the model is called on, or a tuple of fields
        for a model called with several arrays, `model(batch[a], batch[b])`.
      layout: the mesh to run on (batches split over its data axis); default one device.
      forward: `forward(model, batch) -> outputs`, for models not called as `model(batch[inputs])`.
    """

    def __init__(self, model: nnx.Module, preprocess: Preprocess | None = None, inputs: Inputs = "x",
                 layout: Layout | None = None, forward: Callable[[nnx.Module, dict], Any] | None = None):
        self.layout = layout if layout is not None else make_layout("data=1")
        self.graphdef = eval_graphdef(model)  # eval mode; the model itself is left as it was
        _, params, rest = split_params(model)
        variables = (params, rest)
        self.shardings = self.layout.state_shardings(variables)
        self.variables = self.layout.put(variables, self.shardings)
        self.inputs, self.preprocess = check_inputs(inputs), preprocess
        self._forward = forward
        self.call = forward if forward is not None else call_model(self.inputs)
        self._compiled: dict[Any, Any] = {}

    def function(self) -> Callable[[Any, dict], Any]:
        """The pure `f(variables, batch) -> outputs` this compiles."""
        graphdef, preprocess, call = self.graphdef, self.preprocess, self.call

        def f(variables: Any, batch: dict) -> Any:
            if preprocess is not None:
                try:
                    batch = preprocess(batch)
                except KeyError as e:
                    raise ConfigError(f"the preprocessing reads the field {e.args[0]!r}, which the inputs do not "
                                      f"have (fields: {', '.join(batch)}); pass the inputs under that name") from None
            model = nnx.merge(graphdef, *variables, copy=True)
            return call(model, batch)

        return f

    def jitted(self, fields: Any) -> Callable:
        """The forward jitted for batches with these fields. Shared by every `Forward` of the same
        model structure, preprocessing, input field and placement, so that calling `predict` again
        compiles nothing (each batch shape compiles once, on its first call)."""
        layout = self.layout
        key = (self.graphdef, self.preprocess, self.inputs, self._forward, tuple(sorted(fields)),
               tuple(jax.tree.leaves(self.shardings)), layout.batch)
        try:
            hash(key)
            shared = _JITTED
        except TypeError:  # a model attribute or preprocessing object that cannot be hashed: this Forward's own
            key, shared = tuple(sorted(fields)), self._compiled
        if key not in shared:
            if len(shared) >= 16:
                shared.pop(next(iter(shared)))
            shared[key] = jax.jit(self.function(), out_shardings=layout.batch,
                                  in_shardings=(self.shardings, {k: layout.batch for k in fields}))
        self._compiled[key] = shared[key]
        return shared[key]

    def compiles(self) -> int:
        """Programs compiled so far (one per batch shape)."""
        return sum(f._cache_size() for f in self._compiled.values())

    def __call__(self, batch: dict) -> Any:
        """The outputs for `batch` (host or device arrays), computing asynchronously."""
        return self.jitted(batch)(self.variables, batch)


def _batches(data: dict | Any, batch_size: int, allow_nonfinite: bool = False) -> Iterator[tuple[dict, int]]:
    """`(batch, valid)`: host batches of `batch_size` rows, the last padded by repeating its final
    row; `valid` rows of each are real. Rows holding NaN or Inf are refused unless `allow_nonfinite`."""
    n = num_rows(data)
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        block = data.read(start, stop) if is_source(data) else {k: np.asarray(v[start:stop]) for k, v in data.items()}
        if not allow_nonfinite:
            _refuse_nonfinite(block, start)
        valid = stop - start
        if valid < batch_size:
            block = {k: np.concatenate([v, np.repeat(v[-1:], batch_size - valid, axis=0)]) for k, v in block.items()}
        yield block, valid


def _refuse_nonfinite(block: dict[str, np.ndarray], start: int) -> None:
    """Raises DataError naming the first few rows of `block` (rows `start`... of the inputs) that
    hold NaN or Inf in a floating field."""
    for name, v in block.items():
        if v.dtype.kind not in "fc" or np.isfinite(v).all():
            continue
        bad = np.flatnonzero(~np.isfinite(v.reshape(len(v), -1)).all(axis=1)) + start  # (k,) row numbers
        rows = ", ".join(f"{r:,}" for r in bad[:5]) + (f" and {len(bad) - 5:,} more" if len(bad) > 5 else "")
        many = len(bad) > 1
        raise DataError(f"input row{'s' if many else ''} {rows} (field {name!r}) hold{'' if many else 's'} NaN or Inf,"
                        f" so their outputs would too: fix or drop those rows, or pass "
                        f"{argument('allow_nonfinite', True)} to predict them anyway", rows=bad[:5].tolist())


def predict_batches(model: nnx.Module | Forward, data: Any, *, batch_size: int | None = None,
                    preprocess: Preprocess | None = None, inputs: Inputs | None = None,
                    layout: Layout | None = None, allow_nonfinite: bool = False) -> Iterator[Any]:
    """The model's outputs (NumPy pytrees) batch by batch, in the order of `data`'s rows; see
    `predict`. While one batch's outputs are copied back, the next batch is computing."""
    data, inputs = _fields(data, inputs)
    n = num_rows(data)
    if n == 0:
        raise ConfigError("the inputs have no rows to predict")
    forward = model if isinstance(model, Forward) else Forward(model, preprocess, inputs, layout)
    devices = forward.layout.num_devices  # a batch is split over every device of the mesh
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be >= 1")
    size = min(batch_size or DEFAULT_BATCH_SIZE, n)
    size = -(-size // devices) * devices  # a multiple of the data axis: each device takes equal rows
    pending: collections.deque = collections.deque()
    overflowed = _Overflow()
    for block, valid in _batches(data, size, allow_nonfinite):
        pending.append((forward(block), valid))
        if len(pending) > 1:
            yield overflowed.count(_host(*pending.popleft()))
    while pending:
        yield overflowed.count(_host(*pending.popleft()))
    if overflowed.rows and not allow_nonfinite:  # finite inputs (checked above), outputs that are not
        note(f"the outputs of {overflowed.rows:,} of {n:,} rows are NaN or Inf (first: row {overflowed.first:,}) "
             "although their inputs are finite: values far outside the training data's range overflow the "
             "model; check the inputs' scale and preprocessing")


class _Overflow:
    """Counts the rows whose floating outputs are not finite, batch by batch."""

    def __init__(self) -> None:
        self.rows, self.seen, self.first = 0, 0, -1

    def count(self, outputs: Any) -> Any:
        leaves = jax.tree.leaves(outputs)
        bad = np.zeros(len(leaves[0]) if leaves else 0, bool)  # (valid rows,)
        for y in leaves:
            if y.dtype.kind in "fc" and y.ndim:
                bad |= ~np.isfinite(y.reshape(len(y), -1)).all(axis=1)
        if bad.any() and not self.rows:
            self.first = self.seen + int(np.argmax(bad))
        self.rows, self.seen = self.rows + int(bad.sum()), self.seen + len(bad)
        return outputs


def _host(outputs: Any, valid: int) -> Any:
    return jax.tree.map(lambda y: np.asarray(y)[:valid], outputs)


def predict(model: nnx.Module, data: Any, *, batch_size: int | None = None, preprocess: Preprocess | None = None,
            inputs: Inputs | None = None, layout: Layout | None = None, allow_nonfinite: bool = False) -> Any:
    """The trained model's outputs for every row of `data`, as NumPy arrays.

    Runs the evaluation-mode forward (dropout off, batch-norm running statistics), compiled once
    for one batch shape; the last partial batch is padded, not recompiled. Memory holds a few
    batches whatever the size of `data`; only the outputs are gathered whole.

    Args:
      model: the trained Flax NNX model, e.g. `jaxtrain.load(run_dir, model=...)`.
      data: an array of samples (leading batch axis), a dict of such arrays, a tuple of them for a
        model called with several arrays (`model(a, b)`), or a row source such as
        `jaxtrain.data.HDF5Source` (read in contiguous blocks).
      batch_size: rows per compiled call (default 256, or fewer rows if `data` has fewer); on a
        mesh, rounded up to a multiple of its devices.
      preprocess: the training run's `batch -> batch` preprocessing (e.g. `jaxtrain.data.normalize`),
        applied inside the compiled forward exactly as in evaluation.
      inputs: the field of the batch the model is called on, `model(batch[inputs])`; a bare array
        is that field (default "x"); a dict with one field needs none. A tuple of fields calls the
        model with several arrays: `inputs=("image", "text")` is `model(batch["image"], batch["text"])`
        (a tuple of arrays as `data` names them "x0", "x1", ... unless `inputs` names them).
      layout: a mesh (`jaxtrain.distributed`'s layouts) to split batches over; default one device.
      allow_nonfinite: predict input rows that hold NaN or Inf (refused by default: DataError
        naming the first few rows).

    Returns:
      The model's output pytree with a leading axis of `len(data)` rows.

    Example:
      >>> y = jaxtrain.predict(model, x_raw, preprocess=jaxtrain.data.normalize("x", mean, std))
      >>> y = jaxtrain.predict(two_tower, {"user": u, "item": i}, inputs=("user", "item"))
    """
    parts = list(predict_batches(model, data, batch_size=batch_size, preprocess=preprocess, inputs=inputs,
                                 layout=layout, allow_nonfinite=allow_nonfinite))
    return jax.tree.map(lambda *ys: np.concatenate(ys), *parts)


def as_float32(tree: Any) -> Any:
    """Floating arrays of `tree` as float32 (the dtype predictions are written in)."""
    return jax.tree.map(lambda y: y.astype(np.float32) if jnp.issubdtype(y.dtype, jnp.floating) else y, tree)
