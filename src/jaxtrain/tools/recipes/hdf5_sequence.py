"""`hdf5-sequence`: a 1-D CNN over protein-like token sequences streamed from an HDF5 file.

Make a file with `jaxtrain data generate sequence data.h5 --samples N` (datasets
`input_sequences` int8 (N, L), `targets` float32 (N, 2), `labels` int32 (N,)), then
`jaxtrain train hdf5-sequence --data.path data.h5`. The last `val_samples` rows are the
validation set (held on the device); the rest streams in bounded memory (`placement=stream` by
default, since this recipe exists to show it; `auto` holds small files on the device).

Tasks: regression of both targets (MSE; the first is a linear function of symbol counts, the
second counts a two-residue motif), or classification of `labels` (4 quartile classes).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from jaxtrain import ConfigError, DataConfig, DataError, OptimConfig
from jaxtrain.tools.recipes.base import Recipe, RecipeConfig, Workload, split_rows

if TYPE_CHECKING:  # JAX and NumPy are imported by the functions that use them: the configs and --help need none
    import jax
    from flax import nnx

    from jaxtrain.data import HDF5Source
    from jaxtrain.models import SequenceCNN

Task = Literal["regression", "classification"]


@dataclasses.dataclass(frozen=True)
class SequenceDataConfig(DataConfig):
    """The HDF5 file and how it is read."""

    placement: Literal["auto", "device", "stream"] = "stream"
    path: str = ""
    """HDF5 file from `jaxtrain data generate sequence FILE.h5 --samples N` (required)."""
    val_samples: int = 10_000
    """Rows at the end of the file held out for validation."""
    task: Task = "regression"
    """regression: predict `targets` (MSE); classification: predict `labels` (cross-entropy)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.val_samples < 0:
            raise ConfigError(f"data.val_samples={self.val_samples} must be >= 0")
        if self.task not in ("regression", "classification"):
            raise ConfigError(f"data.task={self.task!r} is not allowed; choose regression or classification")


@dataclasses.dataclass(frozen=True)
class SequenceModelConfig:
    """The 1-D CNN."""

    embed: int = 32
    """Token embedding width."""
    channels: int = 64
    """Channels of every convolution."""
    layers: int = 3
    """Convolution layers."""
    kernel: int = 5
    """Convolution width (odd)."""


@dataclasses.dataclass(frozen=True)
class HDF5SequenceConfig(RecipeConfig):
    """hdf5-sequence: a 1-D CNN on streamed sequences, Adam 1e-3, batch 64, 3 epochs."""

    epochs: int = 3
    batch_size: int = 64
    eval_batch_size: int = 1000
    optim: OptimConfig = OptimConfig(name="adam", lr=1e-3)
    data: SequenceDataConfig = SequenceDataConfig()
    """Data settings."""
    model: SequenceModelConfig = SequenceModelConfig()
    """Model settings."""


def regression_loss(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array):
    """MSE over both targets; also the per-target MSE."""
    import jax.numpy as jnp

    err = model(batch["x"]).astype(jnp.float32) - batch["y"].astype(jnp.float32)  # (B, 2), float32
    per_target = jnp.mean(err**2, axis=0)  # (2,)
    return per_target.mean(), {"mse_hydrophobicity": per_target[0], "mse_motif": per_target[1]}


def classification_loss(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array):
    """Cross-entropy over the classes; also the accuracy."""
    import jax.numpy as jnp
    import optax

    logits = model(batch["x"]).astype(jnp.float32)  # (B, classes); float32 whatever the compute dtype
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["y"])}


def build(config: HDF5SequenceConfig) -> Workload:
    from jaxtrain.data import HDF5Source

    d = config.data
    if not d.path:
        raise ConfigError("hdf5-sequence needs --data.path FILE.h5; make one with: "
                          "jaxtrain data generate sequence data.h5 --samples 100000")
    keys = {"x": "input_sequences", "y": "targets" if d.task == "regression" else "labels"}
    train, val = split_rows(HDF5Source, d.path, keys, d.val_samples)
    _check_layout(train, d)
    vocab = int(train.attrs.get("alphabet_size", 256))
    outputs = train.row_shapes["y"][0] if d.task == "regression" else int(train.attrs.get("num_classes", 4))
    info = {"vocab": vocab, "outputs": int(outputs)}
    # Tokens index the embedding and labels the logits: out of range, JAX clamps or yields NaN silently.
    ranges = {"x": ("token", vocab, "alphabet_size")}
    if d.task == "classification":
        ranges["y"] = ("label", int(outputs), "num_classes")
    train, val = InRange(train, ranges), InRange(val, ranges) if val is not None else None
    loss = regression_loss if d.task == "regression" else classification_loss
    return Workload(build_model(config, info), loss, train, val, info=info, inputs="x")


def _check_layout(source: HDF5Source, d: SequenceDataConfig) -> None:
    """Integer token rows (L,); float target rows (T,) for regression, integer labels () for classification."""
    shapes, dtypes = source.row_shapes, source.dtypes
    name = source.keys
    wrong = None
    if len(shapes["x"]) != 1 or dtypes["x"].kind not in "iu":
        wrong = f"{name['x']!r} has rows {shapes['x']} of {dtypes['x']}; it must hold integer tokens, (samples, length)"
    elif d.task == "regression" and len(shapes["y"]) != 1:
        wrong = f"{name['y']!r} has rows {shapes['y']}; regression needs (samples, targets): store 1-D targets as " \
                "(samples, 1)"
    elif d.task == "classification" and (shapes["y"] != () or dtypes["y"].kind not in "iu"):
        wrong = f"{name['y']!r} has rows {shapes['y']} of {dtypes['y']}; classification needs integer labels, " \
                "(samples,)"
    if wrong:
        raise DataError(f"{wrong} (in {d.path})")


class InRange:
    """A row source whose integer arrays are checked, on every read, to lie in [0, limit).

    Args:
      source: the source to read (its other attributes pass through).
      ranges: batch name -> (what a value is, limit, the file attribute that sets the limit).
    """

    def __init__(self, source: HDF5Source, ranges: dict[str, tuple[str, int, str]]):
        self._source, self._ranges = source, ranges

    def __getattr__(self, name: str):
        if name.startswith("_"):  # not yet set (copy, pickle): no recursion through self._source
            raise AttributeError(name)
        return getattr(self._source, name)

    def __len__(self) -> int:
        return len(self._source)

    def read(self, start: int, stop: int) -> dict:
        rows = self._source.read(start, stop)
        for key, (what, limit, attr) in self._ranges.items():
            block = rows[key]
            if len(block) and (block.min() < 0 or block.max() >= limit):
                import numpy as np

                bad = ((block < 0) | (block >= limit)).reshape(len(block), -1).any(axis=1)
                row = self._source.start + start + int(np.argmax(bad))
                value = block[(block < 0) | (block >= limit)][0]  # row-major: in the first bad row
                raise DataError(f"{self._source.keys[key]!r} in {self._source.path} holds {what} {int(value)} at row "
                                f"{row:,}, outside 0..{limit - 1} (the file's {attr} is {limit}); fix the file or "
                                f"its {attr} attribute")
        return rows


def build_model(config: HDF5SequenceConfig, info: dict) -> SequenceCNN:
    from jaxtrain.models import SequenceCNN, compiled_init

    m = config.model
    return compiled_init(lambda rngs: SequenceCNN(info["vocab"], info["outputs"], embed=m.embed, channels=m.channels,
                                                  layers=m.layers, kernel=m.kernel, remat=config.remat, rngs=rngs),
                         config.seed)


RECIPE = Recipe(
    name="hdf5-sequence",
    description="1-D CNN on protein-like sequences streamed from HDF5 (make one with `jaxtrain data generate`)",
    config=HDF5SequenceConfig(),
    build=build,
    model=build_model,
)
