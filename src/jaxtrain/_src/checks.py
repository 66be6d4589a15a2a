"""Misuse of `fit` caught before anything is compiled or written, as one clear line each.

A loss that is not a scalar, a `loss_fn` that does not return `(loss, metrics)`, metrics that are
not scalar batch means, validation data shaped unlike the training data: each would otherwise
fail deep inside JAX (or, for per-sample metrics, be averaged silently). The checks are
structural first (keys, row shapes, dtype kinds), then one `jax.eval_shape` of what a training
step applies to a batch — preprocess, augment, then `loss_fn` on the merged model in training mode,
as in `step.make_train_step` — on an abstract batch: no FLOPs, no device memory, one trace.

The trace also shows which integer labels are class indices: an integer field named like labels
(`label`, `labels`, `y`, `target`, `targets`, or the second of an `(x, y)` pair) that reaches
`loss_fn` unchanged, where the model's output has the labels' shape plus one axis of C >= 2 (logits
`(B, C)` for labels `(B,)`, `(B, T, V)` for tokens `(B, T)`). Such labels must lie in 0..C-1: one
out of range gives a NaN loss (or, negative, silently picks a class from the end), so their
minimum and maximum are read where they enter (in-memory arrays whole, a row source's first batch).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import threading
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxtrain._src import data as data_lib
from jaxtrain._src.errors import ConfigError, DataError, JaxtrainError, argument, setting
from jaxtrain._src.metrics import is_stat
from jaxtrain._src.state import in_mode, split_params
from jaxtrain._src.step import Augment, Batch, LossFn, Preprocess

__all__ = ["abstract_batch", "check_finite_arrays", "check_fit_inputs", "check_labels", "check_loss_fn",
           "check_numbers", "check_parameters", "check_path_length", "check_same_rows"]

FINITE_CHECK_ELEMENTS = 1 << 26  # elements of one array checked whole for NaN/Inf; larger arrays are sampled
_SHAPE_ERROR = re.compile(r"shape|dimension", re.IGNORECASE)  # how JAX's shape mismatches read
LABEL_NAMES = ("label", "labels", "y", "target", "targets")  # integer fields read as class indices


def check_fit_inputs(model: nnx.Module, loss_fn: LossFn, train_data: Any, val_data: Any, batch_size: int,
                     preprocess: Preprocess | None = None, augment: Augment | None = None,
                     allow_nan: bool = False) -> None:
    """Checks `fit`'s data and `loss_fn` together (see the module docstring).

    Raises:
      DataError: validation data unlike the training data; a batch the model or loss cannot take;
        class labels outside the model's classes.
      ConfigError: `loss_fn` does not return a float scalar loss and a dict of scalar metrics.
    """
    check_parameters(model)
    check_numbers(train_data, "train_data")
    if val_data is not None:
        check_numbers(val_data, "val_data")
    batch = abstract_batch(train_data, batch_size, "train_data")
    check_finite_arrays(train_data, "train_data", allow_nan=allow_nan)
    if val_data is not None:
        check_same_rows(batch, abstract_batch(val_data, batch_size, "val_data"))
        check_finite_arrays(val_data, "val_data", allow_nan=allow_nan)
    classes = check_loss_fn(model, loss_fn, batch, preprocess, augment)
    if val_data is not None and has_modes(model):  # evaluation runs the model in its other mode
        check_loss_fn(model, loss_fn, abstract_batch(val_data, batch_size, "val_data"), preprocess, train=False)
    check_labels(train_data, classes, batch_size, "train_data")
    if val_data is not None:
        check_labels(val_data, classes, batch_size, "val_data")


def check_parameters(model: nnx.Module) -> None:
    """Raises ConfigError when `model` has no `nnx.Param` to train, or one whose dtype is not a float
    (gradients need floating-point parameters: JAX's own error would come from inside the trace)."""
    params = nnx.to_flat_state(nnx.state(model, nnx.Param))
    if not len(params):
        raise ConfigError(f"the model ({type(model).__name__}) has no nnx.Param to train; create its weights as "
                          "nnx.Param (nnx.Linear, nnx.Conv, ... do)")
    for path, variable in params:
        dtype = np.dtype(variable.get_value().dtype)
        if not jnp.issubdtype(dtype, jnp.inexact):
            name = ".".join(map(str, path))
            raise ConfigError(f"model parameter {name} is {dtype}: gradients need floating-point parameters; "
                              "create it as a float array, or keep it out of training as an nnx.Variable")


def check_numbers(data: Any, name: str = "data") -> None:
    """Raises DataError where an array of the pytree `data` holds strings or Python objects (NumPy's
    dtypes U, S and O): JAX takes numbers only."""
    if hasattr(data, "abstract_batch") or data_lib.is_source(data):
        return  # sources check their rows as they read them
    for path, x in jax.tree.flatten_with_path(data)[0]:
        dtype = _dtype(x)
        if dtype.kind in "USO":
            what = "Python objects (ragged rows, or mixed types)" if dtype.kind == "O" else "strings"
            raise DataError(f"{name}{jax.tree_util.keystr(path)} holds {what} ({dtype}); turn it into numbers "
                            "first (tokenize text, encode labels, pad rows to one length)")


def has_modes(model: nnx.Module) -> bool:
    """Whether a module of `model` computes otherwise in evaluation mode (it has `deterministic` or
    `use_running_average`, the attributes `state.in_mode` sets)."""
    return any(hasattr(m, "deterministic") or hasattr(m, "use_running_average") for _, m in nnx.iter_modules(model))


def abstract_batch(data: Any, batch_size: int, name: str = "data") -> Batch:
    """A batch of `data` (a pytree of arrays or a row source) as `jax.ShapeDtypeStruct`s of shape (B, ...).

    Raises:
      DataError: a pytree without arrays, with a scalar, or with arrays of different lengths.
    """
    if hasattr(data, "abstract_batch"):  # data made during the run (a replay buffer)
        return data.abstract_batch(batch_size)
    if data_lib.is_source(data):
        if hasattr(data, "row_shapes") and hasattr(data, "dtypes"):
            shapes, dtypes = data.row_shapes, data.dtypes
        else:  # a source with only the protocol's read()
            row = data.read(0, 1)
            shapes, dtypes = {k: v.shape[1:] for k, v in row.items()}, {k: v.dtype for k, v in row.items()}
        batch = {k: jax.ShapeDtypeStruct((batch_size, *shapes[k]), np.dtype(dtypes[k])) for k in shapes}
        return data.unflatten(batch) if hasattr(data, "unflatten") else batch
    data_lib.num_samples(data, name)  # the same errors the feed would raise
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((batch_size, *np.shape(x)[1:]), _dtype(x)), data)


def check_finite_arrays(data: Any, name: str = "data", max_elements: int = FINITE_CHECK_ELEMENTS,
                        allow_nan: bool = False) -> None:
    """Raises DataError where a float array of the pytree `data` holds NaN or Inf (Inf only, with
    `allow_nan`), naming the array, its key and the first bad row. Row sources check each block
    they read (`data.sources`); arrays
    are checked here, where they enter `fit`: whole up to `max_elements` elements, beyond that
    evenly spaced blocks of rows holding about `max_elements` in all (a device array is checked
    on its device).
    """
    if hasattr(data, "abstract_batch") or data_lib.is_source(data):
        return
    for path, x in jax.tree.flatten_with_path(data)[0]:
        if not jnp.issubdtype(_dtype(x), jnp.inexact) or np.ndim(x) == 0 or np.shape(x)[0] == 0:
            continue
        xp = jnp if isinstance(x, jax.Array) else np
        n, row = np.shape(x)[0], max(1, int(np.prod(np.shape(x)[1:])))
        blocks = [(0, n)]
        if n * row > max_elements:  # sampled: 16 blocks spread over the rows, the first and last included
            rows = max(1, max_elements // row // 16)
            starts = np.linspace(0, n - rows, 16).astype(int)
            blocks = [(int(a), int(a) + rows) for a in starts]
        for lo, hi in blocks:
            block = xp.reshape(x[lo:hi], (hi - lo, -1))
            bad = (xp.isinf(block) if allow_nan else ~xp.isfinite(block)).any(axis=1)
            if bool(bad.any()):
                key = jax.tree_util.keystr(path)
                sampled = " (rows sampled: the array is large)" if len(blocks) > 1 else ""
                what, fix = ("Inf", "") if allow_nan else ("NaN/Inf", f", or {setting('data.allow_nan', True)} if "
                                                                      "the loss masks NaN (missing labels)")
                raise DataError(f"{name}{key} contains {what}, first bad row {lo + int(xp.argmax(bad)):,}{sampled}; "
                                f"clean the data or drop those rows{fix}")


def check_path_length(path: Any, name: str = "run_dir") -> None:
    """Raises ConfigError where `path` cannot be created because a name in it, or the whole path, is
    longer than the filesystem allows (255 bytes a name on most), before anything is made."""
    if path is None:
        return
    path = Path(path).absolute()
    existing = next((p for p in path.parents if _exists(p)), Path("/"))
    try:
        name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    long = max(path.parts, key=lambda part: len(os.fsencode(part)))
    if len(os.fsencode(long)) > name_max:
        raise ConfigError(f"{argument(name)} holds a name of {len(os.fsencode(long)):,} bytes ({long[:24]}…); "
                          f"the filesystem allows {name_max} a name: choose a shorter {argument(name)}")
    if len(os.fsencode(str(path))) >= path_max:
        raise ConfigError(f"{argument(name)} is {len(os.fsencode(str(path))):,} bytes long; the filesystem allows "
                          f"{path_max - 1}: choose a shorter {argument(name)}")


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long to look up
        return False


def check_same_rows(train: Batch, val: Batch) -> None:
    """Validation batches must have the training batches' keys, row shapes and kinds of dtype.

    Raises:
      DataError: naming the first difference.
    """
    t, v = _named(train), _named(val)
    if list(t) != list(v):
        what = "keys" if isinstance(train, Mapping) and isinstance(val, Mapping) else "arrays"
        raise DataError(f"validation data have {what} {list(v)} but training data have {list(t)}; "
                        f"give both the same {what if what == 'keys' else 'structure'}")
    for k in t:
        of = f" {k!r}" if k else ""
        if t[k].shape[1:] != v[k].shape[1:]:
            raise DataError(f"validation data{of} have rows of shape {v[k].shape[1:]} but training data{of} have "
                            f"{t[k].shape[1:]}; give both the same row shape")
        if _kind(t[k].dtype) != _kind(v[k].dtype):
            raise DataError(f"validation data{of} are {v[k].dtype} ({_kind(v[k].dtype)}) but training data{of} are "
                            f"{t[k].dtype} ({_kind(t[k].dtype)}); give both the same kind of dtype")


def check_loss_fn(model: nnx.Module, loss_fn: LossFn, batch: Batch, preprocess: Preprocess | None = None,
                  augment: Augment | None = None, train: bool = True) -> dict[str, tuple[int, tuple, tuple]]:
    """Traces one step's forward pass on the abstract `batch` with `jax.eval_shape` and checks
    that `loss_fn` returns `(loss, metrics)`: a float scalar and a dict of scalar batch means.
    `train` False: evaluation's pass instead (the model in evaluation mode, a validation batch).

    Returns:
      The class labels the trace found (see the module docstring): `{path: (C, logits shape,
      labels shape)}`, `path` as `jax.tree_util.keystr` writes it (`['y']`, `[1]`).

    Raises:
      DataError: a missing batch key, or a shape mismatch inside preprocess, augment or the model.
      ConfigError: what `loss_fn` returned cannot be trained on or logged.
    """
    _check_signature(loss_fn)
    graphdef, params, model_state = split_params(in_mode(model, train=train))
    seen: dict[str, Any] = {"outputs": []}  # what the trace saw, as shapes: no tracer leaves it
    candidates = _label_candidates(batch)

    def forward(params: nnx.State, model_state: nnx.State, batch: Batch) -> None:
        augment_key, loss_key = jax.random.split(jax.random.key(0))
        labels = {path: leaf for path, leaf in _by_path(batch).items() if path in candidates}
        seen.update(stage="preprocess", batch=_shapes(batch))
        if preprocess is not None:
            batch = preprocess(batch)
        seen.update(stage="augment", batch=_shapes(batch))
        if augment is not None:
            batch = augment(batch, augment_key)
        seen.update(stage="loss_fn", batch=_shapes(batch))
        # labels the loss gets as they are in the data: the same tracer, not one that preprocess made
        reaching = _by_path(batch)
        seen["labels"] = {path: _shapes(leaf) for path, leaf in labels.items() if reaching.get(path) is leaf}
        model = nnx.merge(graphdef, params, model_state, copy=True)
        with _recording(model, seen["outputs"]):
            seen["out"] = _shapes(loss_fn(model, batch, loss_key))

    try:
        jax.eval_shape(forward, params, model_state, batch)
    except JaxtrainError:
        raise
    except Exception as e:  # the user's code may raise anything: each becomes one line
        if "stage" not in seen:
            raise
        # raised by preprocess, augment or loss_fn (the model runs inside it)
        transformed = preprocess is not None or augment is not None
        if isinstance(e, (KeyError, IndexError, TypeError, ValueError)):
            _raise_misuse(e, seen["stage"], seen["batch"], transformed=transformed, train=train)
        _raise_theirs(e, seen["stage"], seen["batch"], train)
    _check_outputs(seen["out"], jax.tree.leaves(batch)[0].shape[0])
    return _classes(seen["labels"], seen["outputs"])


def _check_signature(loss_fn: LossFn) -> None:
    """Raises ConfigError when `loss_fn` cannot be called as `loss_fn(model, batch, key)`."""
    try:
        signature = inspect.signature(loss_fn)
    except (TypeError, ValueError):  # no signature to read (a builtin, some callables): the trace will tell
        return
    try:
        signature.bind(None, None, None)
    except TypeError:
        raise ConfigError(f"loss_fn must take (model, batch, key) and return (loss, metrics); it takes {signature}: "
                          "add the arguments it lacks (an unused key included)") from None


def _label_candidates(batch: Batch) -> set[str]:
    """Paths of the integer fields of `batch` named like class labels (or the `y` of an `(x, y)` pair)."""
    pair = isinstance(batch, (tuple, list)) and len(batch) == 2
    out = set()
    for path, leaf in jax.tree.flatten_with_path(batch)[0]:
        last = path[-1] if path else None
        name = str(getattr(last, "key", getattr(last, "name", "")))
        second = pair and len(path) == 1 and getattr(last, "idx", None) == 1
        dtype = getattr(leaf, "dtype", None)
        if (name.lower() in LABEL_NAMES or second) and dtype is not None and jnp.issubdtype(dtype, jnp.integer):
            out.add(jax.tree_util.keystr(path))
    return out


def _by_path(tree: Any) -> dict[str, Any]:
    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree.flatten_with_path(tree)[0]}


def _classes(labels: dict[str, jax.ShapeDtypeStruct], outputs: list[Any]) -> dict[str, tuple[int, tuple, tuple]]:
    """`{path: (C, logits shape, labels shape)}` for the labels whose shape plus one axis of C >= 2
    is the shape of a float output of the model (one C only: two different ones say nothing)."""
    logits = [o for out in outputs for o in jax.tree.leaves(out)
              if isinstance(o, jax.ShapeDtypeStruct) and jnp.issubdtype(o.dtype, jnp.floating) and o.ndim >= 2]
    found = {}
    for path, label in labels.items():
        matches = {o.shape for o in logits if o.shape[:-1] == label.shape and o.shape[-1] >= 2}
        if len(matches) == 1:
            (shape,) = matches
            found[path] = (shape[-1], shape, label.shape)
    return found


_CALLS = threading.local()  # the model whose calls are recorded, and the list they go to


@functools.lru_cache(maxsize=64)
def _recording_class(cls: type) -> type:
    """A subclass of `cls` whose calls record their outputs' shapes while `_recording` is on."""
    def __call__(self, *args, **kwargs):
        out = cls.__call__(self, *args, **kwargs)  # as super() would: the class recording derives from
        target = getattr(_CALLS, "target", None)
        if target is not None and target[0] is self:
            target[1].append(_shapes(out))
        return out

    recording = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                            "__qualname__": cls.__qualname__})
    return recording


@contextlib.contextmanager
def _recording(model: nnx.Module, outputs: list[Any]) -> Iterator[None]:
    """Records the shapes of what `model` (a copy only this trace holds) returns when called; a
    model class that cannot be subclassed so is simply not recorded."""
    try:
        if callable(model):
            object.__setattr__(model, "__class__", _recording_class(type(model)))
    except TypeError:  # __slots__, a final class, ...
        pass
    _CALLS.target = (model, outputs)
    try:
        yield
    finally:
        _CALLS.target = None


def check_labels(data: Any, classes: dict[str, tuple[int, tuple, tuple]], batch_size: int,
                 name: str = "data") -> None:
    """Raises DataError where class labels of `data` (`classes`, from `check_loss_fn`) fall outside
    0..C-1, naming their range, the first bad row and the model's classes. In-memory arrays are read
    whole (a device array on its device); a row source only in its first batch; data made during
    the run or a loader's batches not at all.
    """
    if not classes or hasattr(data, "abstract_batch"):
        return
    first = ""
    if data_lib.is_source(data):
        n = min(len(data), batch_size)
        rows = data.read(0, n)
        data, first = (data.unflatten(rows) if hasattr(data, "unflatten") else rows), f" in its first {n:,} rows"
    leaves = _by_path(data)
    for path, (C, logits, label_shape) in classes.items():
        x = leaves.get(path)
        if x is None or np.ndim(x) == 0 or np.shape(x)[0] == 0:
            continue
        if isinstance(x, jax.Array) and not x.is_fully_addressable:  # another process holds part of it
            continue
        x = x if isinstance(x, jax.Array) else np.asarray(x)
        xp = jnp if isinstance(x, jax.Array) else np
        lo, hi = int(xp.min(x)), int(xp.max(x))
        if 0 <= lo and hi < C:
            continue
        out = (x < 0) | (x >= C)
        row = int(xp.argmax(xp.reshape(out, (np.shape(x)[0], -1)).any(axis=1)))
        values = np.asarray(x[row]).reshape(-1)  # one row to the host
        value = int(values[(values < 0) | (values >= C)][0])
        more = f" or give the model {hi + 1} outputs" if lo >= 0 else ""
        raise DataError(f"{name}{path} holds label {value} at row {row:,} (labels {lo}..{hi}{first}), outside "
                        f"0..{C - 1}: the model's outputs have {C} classes (logits {logits} for labels "
                        f"{label_shape}); map the labels to 0..{C - 1}{more}",
                        key=path, value=value, row=row, low=lo, high=hi, classes=C)


def _check_outputs(out: Any, batch_size: int) -> None:
    pair = "loss_fn must return (loss, metrics), a float scalar and a dict of scalar batch means"
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        got = (f"one array of shape {out.shape} (return (loss, {{}}) when there are no metrics)"
               if isinstance(out, jax.ShapeDtypeStruct) else f"a {type(out).__name__}"
               + (f" of {len(out)} items" if isinstance(out, (tuple, list)) else ""))
        raise ConfigError(f"{pair}; it returned {got}")
    loss, metrics = out
    if not isinstance(loss, jax.ShapeDtypeStruct):
        raise ConfigError(f"{pair}; its loss is a {type(loss).__name__}")
    if loss.shape != ():
        raise ConfigError(f"loss_fn must return (loss, metrics) with loss a scalar; it returned a loss of shape "
                          f"{loss.shape}: reduce it, e.g. jnp.mean(per_sample)")
    if not jnp.issubdtype(loss.dtype, jnp.floating):
        raise ConfigError(f"loss_fn returned a loss of dtype {loss.dtype}; gradients need a float scalar, "
                          "e.g. loss.astype(jnp.float32)")
    if not isinstance(metrics, Mapping):
        raise ConfigError(f"{pair} ({{}} for none); its metrics are a {type(metrics).__name__}")
    for name, value in metrics.items():
        if not isinstance(name, str):
            raise ConfigError(f"metric names must be strings; loss_fn returned a metric named {name!r}")
        if is_stat(value):  # sums and counts (jaxtrain.metrics), added up over the epoch
            continue
        if not isinstance(value, jax.ShapeDtypeStruct):
            raise ConfigError(f"metric {name!r} is a {type(value).__name__}; metrics must be scalar batch means "
                              "such as jnp.mean(...) or jaxtrain.metrics' (e.g. metrics.F1()(logits, labels))")
        if value.shape != ():
            per_sample = ", one value per sample" if value.shape[:1] == (batch_size,) else ""
            raise ConfigError(f"metric {name!r} has shape {value.shape}{per_sample}; return a scalar batch mean "
                              "such as jnp.mean(...)")


def _raise_misuse(e: Exception, stage: str, batch: Any, transformed: bool, train: bool = True) -> None:
    """Raises DataError for an error of the user's code that plainly comes from the batch; returns otherwise."""
    after = " (after preprocess/augment)" if transformed and stage == "loss_fn" else ""
    kind = "training" if train else "validation"
    if not train:
        after += " with the model in evaluation mode, as validation runs it"
    if isinstance(e, KeyError) and isinstance(batch, Mapping) and e.args and e.args[0] not in batch:
        raise DataError(f"{stage} asked a {kind} batch for key {e.args[0]!r} but its keys are "
                        f"{list(batch)}{after}; name the data's arrays as {stage} expects") from e
    sequence = isinstance(batch, (tuple, list))
    if sequence and isinstance(e, TypeError) and "indices must be integers" in str(e):
        raise DataError(f"{stage} indexes a {kind} batch by name but {kind} batches are a "
                        f"{type(batch).__name__} of {len(batch)} arrays{after}; pass a dict of arrays") from e
    if sequence and isinstance(e, IndexError) and "out of range" in str(e):
        raise DataError(f"{stage} indexes past the end of a {kind} batch, a {type(batch).__name__} of "
                        f"{len(batch)} arrays{after}") from e
    if isinstance(e, (TypeError, ValueError)) and not isinstance(e, jax.errors.JAXTypeError) and \
            _SHAPE_ERROR.search(str(e)):
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{stage} failed on a {kind} batch of {_describe(batch)}{after}: {first}") from e


def _raise_theirs(e: Exception, stage: str, batch: Any, train: bool) -> None:
    """Raises ConfigError naming what the user's code raised and where (its innermost frame outside JAX and
    Flax), the original exception chained to it (`__cause__`) with its whole traceback."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not re.search(r"[/\\](jax|jaxlib|flax|jaxtrain)[/\\]", f.filename)]
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno} (in {frames[-1].name})" if frames else ""
    message = str(e).strip().splitlines()[0] if str(e).strip() else ""
    raise ConfigError(f"{stage} raised {type(e).__name__}{where} on a {'training' if train else 'validation'} batch "
                      f"of {_describe(batch)}{': ' + message if message else ''} (one step is traced before training; "
                      "its traceback is chained to this error)") from e


def _shapes(tree: Any) -> Any:
    """`tree` with every array (or tracer, or Python number) replaced by its shape and dtype."""
    def spec(x: Any) -> Any:
        if isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float)):
            return jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x))
        return x

    return jax.tree.map(spec, tree)


def _named(batch: Batch) -> dict[str, jax.ShapeDtypeStruct]:
    """Leaves by name: dict keys and tuple positions joined by '/' ('' for a bare array)."""
    def name(path: tuple) -> str:
        return "/".join(str(getattr(p, "key", getattr(p, "idx", getattr(p, "name", p)))) for p in path)

    return {name(path): leaf for path, leaf in jax.tree.flatten_with_path(batch)[0]}


def _describe(batch: Any) -> str:
    """`x: float32 (32, 5), y: float32 (32, 3)`."""
    return ", ".join(f"{k or 'array'}: {v.dtype} {v.shape}" if isinstance(v, jax.ShapeDtypeStruct) else
                     f"{k or 'leaf'}: {type(v).__name__}" for k, v in _named(batch).items())


def _dtype(x: Any) -> np.dtype:
    return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype


def _kind(dtype: Any) -> str:
    for kind, base in (("bool", jnp.bool_), ("integer", jnp.integer), ("float", jnp.floating),
                       ("complex", jnp.complexfloating)):
        if jnp.issubdtype(dtype, base):
            return kind
    return str(dtype)
