"""A trained model as a self-contained artifact that runs without its Python code.

`export(model, example, directory)` writes:

- `model.jax_export`: the evaluation-mode forward serialized by `jax.export` (StableHLO) with the
  weights inside as constants and a symbolic batch dimension, the preprocessing the model was
  trained with folded in, so that it takes raw inputs;
- `signature.json`: the inputs' and outputs' names, dtypes and shapes (the batch axis written
  "batch"), the preprocessing folded in, the platforms, the JAX version, and the SHA-256 of
  model.jax_export (`artifact_sha256`) and of the weights' bytes (`weights_sha256`, as
  weights.safetensors records it);
- `weights.safetensors`: the weights by readable name (`jaxtrain.load_weights` reads them back,
  checking their checksum);
- `README.md`: the few lines that check the artifact's checksum and run it with nothing but `jax`
  (and `flatbuffers`) installed:

      from jax import export
      forward = export.deserialize(open("model.jax_export", "rb").read())
      outputs = forward.call(inputs)

Each file is written whole or not at all, never through a symbolic link (`safe_files`);
signature.json goes last, so its checksums say which files belong together. A new folder is
written beside its name and renamed into place when complete: an export that fails, or is killed
(SIGKILL included), leaves no folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import keyword
import os
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx

from jaxtrain._src.data.transforms import to_spec
from jaxtrain._src.errors import ConfigError, argument
from jaxtrain._src.predict import Forward, Inputs, check_inputs
from jaxtrain._src.safe_files import partial_folder, write_bytes, write_error, write_text
from jaxtrain._src.step import Preprocess
from jaxtrain._src.weights import write_weights

__all__ = ["check_directory", "check_platforms", "export"]

ARTIFACT = "model.jax_export"
BATCH = "batch"
FILES = ("weights.safetensors", ARTIFACT, "README.md", "signature.json")  # in the order they are written
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # jax.export's built-in platforms

_README = """# An exported jaxtrain model

`{artifact}` is the model's evaluation-mode forward{folded},
serialized with `jax.export` (StableHLO), its weights inside. It runs with nothing but JAX
installed (`pip install "jax=={version}" flatbuffers`; the deserializer needs flatbuffers), on
{platforms}:

```python
import hashlib, json
import numpy as np
from jax import export

blob = open("{artifact}", "rb").read()
assert hashlib.sha256(blob).hexdigest() == json.load(open("signature.json"))["artifact_sha256"], "damaged"
forward = export.deserialize(blob)
{example_lines}  # any number of rows: the first axis is symbolic
outputs = forward.call({call_args})
```

{inputs_text}. Outputs: {outputs}. `signature.json` says the same for
programs; `weights.safetensors` holds the weights by name (`jaxtrain.load_weights(model, path)`,
which checks their SHA-256, `safetensors.numpy.load_file(path)`).
"""


def _shape_of(row: tuple[int, ...]) -> str:
    return f"(batch, {', '.join(map(str, row))})" if row else "(batch,)"


def _shape_text(shape: Sequence[Any]) -> list[Any]:
    return [d if isinstance(d, int) else BATCH for d in shape]


def export(model: nnx.Module, example: Any, directory: str | os.PathLike, *, preprocess: Preprocess | None = None,
           inputs: Inputs = "x", platforms: Sequence[str] | None = None,
           metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """Writes `model` as a self-contained artifact to `directory` (see the module's docstring);
    returns its signature.

    Args:
      model: the trained Flax NNX model (run in evaluation mode: dropout off, batch-norm averages).
      example: raw inputs of the shape and dtype to serve (an array with a leading batch axis, or
        abstract `jax.ShapeDtypeStruct`); only their per-row shape and dtype matter. For several
        inputs, a tuple of them in the order of `inputs` (or a dict by field).
      directory: where the files go (made if absent; files of an earlier export are replaced).
      preprocess: the training run's preprocessing, traced into the artifact so that it takes raw
        inputs (e.g. `jaxtrain.data.normalize`).
      inputs: the field of the batch the model is called on (`model(preprocess(batch)[inputs])`), or
        a tuple of fields for a model called with several arrays: `inputs=("a", "b")` exports
        `model(batch["a"], batch["b"])`, and the artifact is called `forward.call(a, b)` (one
        symbolic batch size shared by all).
      platforms: where the artifact may run, e.g. ("cpu", "cuda"); default this machine's.
      metadata: JSON-ready facts that join signature.json (the run, its step, ...).
    """
    inputs = check_inputs(inputs)
    names = (inputs,) if isinstance(inputs, str) else inputs
    examples = _examples(example, names)
    rows = [(tuple(x.shape[1:]), np.dtype(x.dtype)) for x in examples]
    platforms = check_platforms(platforms)
    directory = check_directory(Path(directory))
    forward = Forward(model, preprocess, inputs)
    f, variables = forward.function(), jax.device_get(forward.variables)

    def serve(*xs: jax.Array) -> Any:
        return f(variables, dict(zip(names, xs)))

    (batch,) = jax.export.symbolic_shape(BATCH)
    specs = [jax.ShapeDtypeStruct((batch, *row), dtype) for row, dtype in rows]
    try:
        exported = jax.export.export(jax.jit(serve), platforms=platforms)(*specs)
    except Exception as e:  # noqa: BLE001 - the model's own tracing error, said in one line
        raise ConfigError(f"the model cannot be exported with a symbolic batch size: {type(e).__name__}: "
                          f"{str(e).strip().splitlines()[0][:300]}") from None
    artifact = bytes(exported.serialize())
    recipe = to_spec(preprocess)
    outputs = jax.tree_util.tree_leaves_with_path(jax.tree.unflatten(exported.out_tree, exported.out_avals))
    out = [{"name": jax.tree_util.keystr(p, simple=True, separator=".") or "outputs", "dtype": str(a.dtype),
            "shape": _shape_text(a.shape)} for p, a in outputs]
    signature = {
        "format": "jax.export", "artifact": ARTIFACT, "jax_version": jax.__version__,
        "platforms": list(platforms),
        "inputs": [{"name": name, "dtype": str(dtype), "shape": [BATCH, *row]}
                   for name, (row, dtype) in zip(names, rows)],
        "outputs": out, "preprocess": recipe, **(metadata or {}),
        "artifact_sha256": hashlib.sha256(artifact).hexdigest(),
    }
    folded = f", with its preprocessing ({recipe['kind']}) folded in" if recipe else (
        ", with its preprocessing folded in" if preprocess is not None else "")
    readme = _README.format(
        artifact=ARTIFACT, folded=folded, version=jax.__version__, platforms=", ".join(platforms),
        example_lines="\n".join(f"{v} = np.zeros(({', '.join(str(d) for d in (2, *row))}{',' if not row else ''}), "
                                 f"np.{dtype.name})" for v, (row, dtype) in zip(_variables(names), rows)),
        call_args=", ".join(_variables(names)),
        inputs_text=("Input " if len(names) == 1 else "Inputs, in this order: ") + "; ".join(
            f"`{name}`: {_shape_of(row)} {dtype.name}" for name, (row, dtype) in zip(names, rows)),
        outputs="; ".join(f"`{o['name']}` ({', '.join(map(str, o['shape']))}) {o['dtype']}" for o in out))
    try:
        # A new folder is written whole beside its name and renamed into place (a kill leaves it
        # absent); an existing one, which may hold other files, takes the files one by one.
        directory.parent.mkdir(parents=True, exist_ok=True)
        with partial_folder(directory) if not directory.exists() else contextlib.nullcontext(directory) as into:
            signature["weights_sha256"] = write_weights(model, into / "weights.safetensors")
            write_bytes(into / ARTIFACT, artifact)
            write_text(into / "README.md", readme)
            write_text(into / "signature.json", json.dumps(signature, indent=2) + "\n")  # last: the checksums
    except OSError as e:
        raise write_error(directory, e, "export elsewhere") from None
    return signature


def _examples(example: Any, names: tuple[str, ...]) -> list[Any]:
    """The example array of each input field, in the order of `names`."""
    if isinstance(example, dict):
        missing = [k for k in names if k not in example]
        if missing:
            raise ConfigError(f"the example has no field {missing[0]!r}; give one array per input ({', '.join(names)})")
        examples = [example[k] for k in names]
    elif isinstance(example, (tuple, list)):
        examples = list(example)
    else:
        examples = [example]
    if len(examples) != len(names) or not all(hasattr(x, "shape") and len(x.shape) for x in examples):
        raise ConfigError(f"export got {len(examples)} example{'s' if len(examples) != 1 else ''} for "
                          f"{len(names)} input{'s' if len(names) != 1 else ''} ({', '.join(names)}): give one array "
                          f"with a leading batch axis per input, in that order")
    return examples


def _variables(names: tuple[str, ...]) -> list[str]:
    """Python variable names for the README's example: `inputs` for one input, else the fields'."""
    if len(names) == 1:
        return ["inputs"]
    out = []
    for name in names:
        text = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
        out.append(text if text.isidentifier() and not keyword.iskeyword(text) else f"x_{text}")
    return out


def check_platforms(platforms: Sequence[str] | None) -> tuple[str, ...]:
    """The platforms to export for, each one jax.export knows (default: this machine's).

    Raises:
      ConfigError: a platform it does not know (one line naming those it does).
    """
    if isinstance(platforms, str):
        platforms = [platforms]
    wanted = tuple(dict.fromkeys(str(p).strip().lower() for p in platforms or ()))
    unknown = [p for p in wanted if p not in PLATFORMS]
    if unknown:
        hint = " (gpu is cuda or rocm)" if "gpu" in unknown else ""
        raise ConfigError(f"unknown platform{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for "
                          f"{argument('platforms')}; jax.export knows {', '.join(PLATFORMS)}{hint}",
                          platforms=unknown)
    return wanted or (jax.export.default_export_platform(),)


def check_directory(directory: Path) -> Path:
    """Refuses an export folder that is a symbolic link (the files would land in the folder it names)
    or an existing file."""
    if directory.is_symlink():
        raise ConfigError(f"{directory} is a symbolic link (to {os.readlink(directory)}); an export writes into a "
                          f"folder of its own: give the real folder or another {argument('out', python='directory')}",
                          path=directory)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{directory} is a file, not a folder; choose another "
                          f"{argument('out', python='directory')}", path=directory)
    return directory
