"""A trained model as a self-contained artifact that runs without its Python code.

`export(model, example, directory)` writes:

- `model.jax_export`: the evaluation-mode forward serialized by `jax.export` (StableHLO) with the
  weights inside as constants and a symbolic batch dimension, the preprocessing the model was
  trained with folded in, so that it takes raw inputs;
- `signature.json`: the input's and outputs' names, dtypes and shapes (the batch axis written
  "batch"), the preprocessing folded in, the platforms and the JAX version;
- `weights.safetensors`: the weights by readable name (`jaxtrain.load_weights` reads them back);
- `README.md`: the few lines that run it with nothing but `jax` (and `flatbuffers`) installed:

      from jax import export
      forward = export.deserialize(open("model.jax_export", "rb").read())
      outputs = forward.call(inputs)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx

from jaxtrain._src.data.transforms import to_spec
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.predict import Forward
from jaxtrain._src.step import Preprocess
from jaxtrain._src.weights import save_weights

__all__ = ["export"]

ARTIFACT = "model.jax_export"
BATCH = "batch"

_README = """# An exported jaxtrain model

`{artifact}` is the model's evaluation-mode forward{folded},
serialized with `jax.export` (StableHLO), its weights inside. It runs with nothing but JAX
installed (`pip install "jax=={version}" flatbuffers`; the deserializer needs flatbuffers), on
{platforms}:

```python
import numpy as np
from jax import export

forward = export.deserialize(open("{artifact}", "rb").read())
inputs = np.zeros(({example}), np.{dtype})  # any number of rows: the first axis is symbolic
outputs = forward.call(inputs)
```

Input `{name}`: {input_shape} {dtype}. Outputs: {outputs}. `signature.json` says the same for
programs; `weights.safetensors` holds the weights by name (`jaxtrain.load_weights(model, path)`,
`safetensors.numpy.load_file(path)`).
"""


def _shape_text(shape: Sequence[Any]) -> list[Any]:
    return [d if isinstance(d, int) else BATCH for d in shape]


def export(model: nnx.Module, example: Any, directory: str | os.PathLike, *, preprocess: Preprocess | None = None,
           inputs: str = "x", platforms: Sequence[str] | None = None,
           metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """Writes `model` as a self-contained artifact to `directory` (see the module's docstring);
    returns its signature.

    Args:
      model: the trained Flax NNX model (run in evaluation mode: dropout off, batch-norm averages).
      example: raw inputs of the shape and dtype to serve (an array with a leading batch axis, or
        abstract `jax.ShapeDtypeStruct`); only their per-row shape and dtype matter.
      directory: where the files go (made if absent; files of an earlier export are replaced).
      preprocess: the training run's preprocessing, traced into the artifact so that it takes raw
        inputs (e.g. `jaxtrain.data.normalize`).
      inputs: the field of the batch the model is called on (`model(preprocess(batch)[inputs])`).
      platforms: where the artifact may run, e.g. ("cpu", "cuda"); default this machine's.
      metadata: JSON-ready facts that join signature.json (the run, its step, ...).
    """
    row, dtype = tuple(example.shape[1:]), np.dtype(example.dtype)
    forward = Forward(model, preprocess, inputs)
    f, variables = forward.function(), jax.device_get(forward.variables)

    def serve(x: jax.Array) -> Any:
        return f(variables, {inputs: x})

    (batch,) = jax.export.symbolic_shape(BATCH)
    spec = jax.ShapeDtypeStruct((batch, *row), dtype)
    platforms = tuple(platforms) if platforms else (jax.devices()[0].platform,)
    try:
        exported = jax.export.export(jax.jit(serve), platforms=platforms)(spec)
    except Exception as e:  # noqa: BLE001 - the model's own tracing error, said in one line
        raise ConfigError(f"the model cannot be exported with a symbolic batch size: {type(e).__name__}: "
                          f"{str(e).strip().splitlines()[0][:300]}") from None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ARTIFACT).write_bytes(exported.serialize())
    outputs = jax.tree_util.tree_leaves_with_path(exported.out_tree.unflatten(exported.out_avals))
    out = [{"name": jax.tree_util.keystr(p, simple=True, separator=".") or "outputs", "dtype": str(a.dtype),
            "shape": _shape_text(a.shape)} for p, a in outputs]
    signature = {
        "format": "jax.export", "artifact": ARTIFACT, "jax_version": jax.__version__,
        "platforms": list(platforms),
        "inputs": [{"name": inputs, "dtype": str(dtype), "shape": [BATCH, *row]}],
        "outputs": out, "preprocess": to_spec(preprocess), **(metadata or {}),
    }
    (directory / "signature.json").write_text(json.dumps(signature, indent=2) + "\n")
    save_weights(model, directory / "weights.safetensors")
    folded = f", with its preprocessing ({to_spec(preprocess)['kind']}) folded in" if to_spec(preprocess) else (
        ", with its preprocessing folded in" if preprocess is not None else "")
    (directory / "README.md").write_text(_README.format(
        artifact=ARTIFACT, folded=folded, version=jax.__version__, platforms=", ".join(platforms),
        example=", ".join(str(d) for d in (2, *row)) + ("," if not row else ""), dtype=dtype.name, name=inputs,
        input_shape=f"(batch, {', '.join(map(str, row))})" if row else "(batch,)",
        outputs="; ".join(f"`{o['name']}` ({', '.join(map(str, o['shape']))}) {o['dtype']}" for o in out)))
    return signature
