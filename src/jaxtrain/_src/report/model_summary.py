"""The model summary: each module's path, type, output shape, parameters and bytes, as Keras'
`model.summary()` and Lightning's ModelSummary print it.

Output shapes come from tracing the loss on one abstract training batch (`jax.eval_shape`: nothing
is computed or allocated) while every module class of the model records what its `__call__`
returns, so any model and loss work without saying which field the model reads. Parameters are
the model's `nnx.Param` variables (what the optimizer trains); other state (batch statistics,
RNG counters) is counted apart. FLOPs per step come from the compiled training call's XLA cost
analysis, when the backend gives one.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx

from jaxtrain._src.memory import format_bytes

_RECORDING = threading.local()  # {id(module): path} of the model being traced, and what each returned


def _count(state: Any) -> tuple[int, int]:
    leaves = [x for x in jax.tree.leaves(state) if hasattr(x, "shape")]
    return (sum(int(np.prod(x.shape)) for x in leaves),
            sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves
                if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)))


def _path(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _shape_text(out: Any) -> str:
    shapes = [tuple(x.shape) for x in jax.tree.leaves(out) if hasattr(x, "shape")]
    text = ", ".join(str(s) for s in shapes)  # (256, 15), (256,)
    return text if len(shapes) == 1 else f"[{text}]"


def model_summary(model: nnx.Module, trace: Callable[[nnx.Module, Any], Any] | None = None,
                  example: Any = None) -> dict[str, Any]:
    """The summary of `model`: `{"modules": [{path, type, output, params, bytes, state}], "params",
    "param_bytes", "state", "state_bytes"}`.

    Args:
      model: the Flax NNX model.
      trace: `trace(model, example)` calls the model (e.g. the loss on a batch); run under
        `jax.eval_shape` to learn each module's output shape. None leaves outputs out.
      example: `trace`'s inputs, arrays or `jax.ShapeDtypeStruct`s.

    The modules are listed in the order the trace first calls them (the model first), then those
    it never calls.
    """
    modules = list(nnx.iter_modules(model))
    rows, outputs = [], {}
    if trace is not None:
        outputs = _trace_outputs(model, trace, example, modules)
    order = {path: i for i, path in enumerate(outputs)}  # dicts keep the order of the first calls
    modules.sort(key=lambda pm: (bool(pm[0]), order.get(_path(pm[0]), len(order))))
    for path, module in modules:
        params = _count(nnx.state(module, nnx.Param))
        state = _count(nnx.state(module, nnx.Not(nnx.Param)))
        rows.append({"path": _path(path) or "(model)", "type": type(module).__name__,
                     "output": outputs.get(_path(path)), "params": params[0], "bytes": params[1] + state[1],
                     "state": state[0]})
    total_params, param_bytes = _count(nnx.state(model, nnx.Param))
    total_state, state_bytes = _count(nnx.state(model, nnx.Not(nnx.Param)))
    return {"modules": rows, "params": total_params, "param_bytes": param_bytes, "state": total_state,
            "state_bytes": state_bytes}


def _trace_outputs(model: nnx.Module, trace: Callable[[nnx.Module, Any], Any], example: Any,
                   modules: list) -> dict[str, str]:
    """`{path: output shape}` of every module `trace` calls, from one abstract evaluation."""
    graphdef, state = nnx.split(model)
    classes = {type(m) for _, m in modules}
    originals = {cls: cls.__dict__.get("__call__") for cls in classes}
    recorded: dict[str, str] = {}

    def wrap(cls: type) -> Callable:
        inner = cls.__call__

        def call(self, *args, **kwargs):
            out = inner(self, *args, **kwargs)
            paths = getattr(_RECORDING, "paths", None)
            if paths is not None and id(self) in paths:
                recorded.setdefault(paths[id(self)], _shape_text(out))  # the first call's, in call order
            return out

        return call

    def traced(state: Any, example: Any) -> Any:
        clone = nnx.merge(graphdef, state)
        _RECORDING.paths = {id(m): _path(p) for p, m in nnx.iter_modules(clone)}
        return trace(clone, example)

    try:
        for cls in classes:
            cls.__call__ = wrap(cls)
        jax.eval_shape(traced, state, example)
    except Exception:  # noqa: BLE001 - a model the trace cannot run abstractly: no output shapes
        return {}
    finally:
        _RECORDING.paths = None
        for cls, original in originals.items():
            if original is None:
                del cls.__call__
            else:
                cls.__call__ = original
    return recorded


def summary_lines(summary: dict[str, Any], depth: int | None = None, flops: float | None = None) -> list[str]:
    """The summary as text lines: a table of the modules (those at most `depth` levels deep), then
    the totals and the FLOPs per step."""
    rows = [r for r in summary["modules"]
            if depth is None or r["path"] == "(model)" or r["path"].count(".") < depth]
    header = ("module", "type", "output", "params", "bytes")
    table = [header] + [(r["path"], r["type"], r["output"] or "", f"{r['params']:,}", format_bytes(r["bytes"]))
                        for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  " + "  ".join(cell.ljust(w) if i < 3 else cell.rjust(w) for i, (cell, w) in
                              enumerate(zip(row, widths))).rstrip() for row in table]
    hidden = len(summary["modules"]) - len(rows)
    if hidden:
        lines.append(f"  ({hidden} deeper modules not shown: `jaxtrain summary RECIPE` lists every one)")
    lines.append(f"  parameters: {summary['params']:,} trainable ({format_bytes(summary['param_bytes'])}); "
                 f"other state: {summary['state']:,} values ({format_bytes(summary['state_bytes'])}: batch "
                 "statistics, RNG counters)")
    if flops:
        lines.append(f"  FLOPs per training step: {flops / 1e9:,.3f} GFLOP (XLA cost analysis of the compiled call)")
    return lines
