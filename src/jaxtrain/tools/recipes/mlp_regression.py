"""`mlp-regression`: the case-study workload.

A protein-structure-like regression: 128 features → 64 targets, 50,000 samples, batch 32,
10 epochs, MLP 128→512→512→64 with ReLU, MSE loss, Adam 1e-3. The data are synthetic and
deterministic from a seed: features with per-feature offsets and scales (so normalisation
matters), targets from a fixed random two-layer tanh teacher plus Gaussian noise.

`--data.path FILE.h5` trains on a file from `jaxtrain data generate mlp-regression` instead (or
`--data.npy DIR` on a folder of .npy shards from `... --format npy`), of any size:
`--data.placement auto` holds it on the device when it fits the budget, else streams it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING, Any

from jaxtrain import ConfigError, DataConfig, DataError
from jaxtrain.tools.recipes.base import Recipe, RecipeConfig, Workload, split_rows

if TYPE_CHECKING:  # JAX and NumPy are imported by the functions that use them: the configs and --help need none
    import jax
    import numpy as np
    from flax import nnx

    from jaxtrain.models import MLP


@dataclasses.dataclass(frozen=True)
class RegressionDataConfig(DataConfig):
    """The synthetic regression dataset, made in memory or read from an HDF5 file."""

    path: str = ""
    """An HDF5 file from `jaxtrain data generate mlp-regression FILE.h5` (datasets features, targets;
    its last val_samples rows are the validation set). Empty: make the data in memory from the
    settings below."""
    npy: str = ""
    """A folder of .npy shards (features-*.npy, targets-*.npy) from `jaxtrain data generate
    mlp-regression DIR --format npy` or written with np.save: read like path, in place, in bounded
    memory (its last val_samples rows are the validation set)."""
    samples: int = 50_000
    """Samples in all; the last val_samples are the validation set."""
    val_samples: int = 5_000
    """Samples held out for validation."""
    features: int = 128
    """Input features per sample."""
    targets: int = 64
    """Regression targets per sample."""
    teacher_width: int = 256
    """Hidden width of the random teacher network that makes the targets."""
    label_noise: float = 0.1
    """Std of the Gaussian noise added to the targets."""
    input_noise: float = 0.0
    """Std of Gaussian noise added to the normalised inputs during training (augmentation)."""
    seed: int = 1234
    """Seed of the dataset (independent of the training seed)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for field in ("samples", "features", "targets", "teacher_width"):
            if getattr(self, field) < 1:
                raise ConfigError(f"data.{field}={getattr(self, field)} must be an integer >= 1")
        if not 0 <= self.val_samples < self.samples:
            raise ConfigError(f"data.val_samples={self.val_samples} must be >= 0 and below data.samples={self.samples}")
        for field in ("label_noise", "input_noise"):
            if not (math.isfinite(getattr(self, field)) and getattr(self, field) >= 0):
                raise ConfigError(f"data.{field}={getattr(self, field)} must be a finite number >= 0")
        if self.seed < 0:
            raise ConfigError(f"data.seed={self.seed} must be an integer >= 0")


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    """The model."""

    hidden: tuple[int, ...] = (512, 512)
    """Hidden layer widths."""

    def __post_init__(self) -> None:
        for width in self.hidden:
            if not isinstance(width, int) or width < 1:
                raise ConfigError(f"model.hidden={' '.join(map(str, self.hidden))}: every width must be an integer "
                                  f">= 1, not {width!r}")


@dataclasses.dataclass(frozen=True)
class MLPRegressionConfig(RecipeConfig):
    """mlp-regression: MLP 128→512→512→64, MSE, Adam 1e-3, batch 32, 10 epochs."""

    data: RegressionDataConfig = RegressionDataConfig()
    """Dataset and placement settings."""
    model: MLPConfig = MLPConfig()
    """Model settings."""


def make_data(config: RegressionDataConfig) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The train and validation splits as dicts {"x": (N, F) float32, "y": (N, T) float32}.

    Rows 0..N-1 of `jaxtrain.data.synthetic.regression_rows`: with the default sizes, the rows of
    `jaxtrain data generate mlp-regression OUT.h5 --samples N --seed SEED`; the last val_samples validate.
    """
    from jaxtrain.engine import regression_rows

    rows = regression_rows(config.seed, 0, config.samples, features=config.features, targets=config.targets,
                           teacher_width=config.teacher_width, label_noise=config.label_noise)
    n_train = config.samples - config.val_samples
    x, y = rows["features"], rows["targets"]  # (N, F), (N, T)
    return {"x": x[:n_train], "y": y[:n_train]}, {"x": x[n_train:], "y": y[n_train:]}


def mse_loss(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean squared error over the batch and targets; also reports mean absolute error."""
    import jax.numpy as jnp

    err = model(batch["x"]).astype(jnp.float32) - batch["y"].astype(jnp.float32)  # (B, T), float32
    return jnp.mean(err**2), {"mae": jnp.mean(jnp.abs(err))}


HDF5_KEYS = {"x": "features", "y": "targets"}  # batch names -> the datasets `data generate` writes
STATS_ROWS = 100_000  # rows read to normalise a file that carries no feature_mean/feature_std attributes


def open_hdf5(config: RegressionDataConfig) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    """(train source, validation source or None, feature mean, feature std) of `config.path`, or of
    the .npy shards in `config.npy`."""
    import numpy as np

    from jaxtrain.data import HDF5Source, NpySource

    val_rows = config.val_samples
    if config.path and config.npy:
        raise ConfigError("data.path and data.npy are both given; train on one of them")
    opener, where = (HDF5Source, config.path) if config.path else (NpySource, config.npy)
    train, val = split_rows(opener, where, HDF5_KEYS, val_rows)
    for key, name in HDF5_KEYS.items():
        if len(train.row_shapes[key]) != 1:
            shape = (len(train) + val_rows, *train.row_shapes[key])
            raise DataError(f"{name!r} in {where} has shape {shape}; mlp-regression needs rows of one axis, "
                            f"(samples, {name}): store 1-D {name} as (samples, 1)")
    if "feature_mean" in train.attrs and "feature_std" in train.attrs:
        mean, std = np.asarray(train.attrs["feature_mean"]), np.asarray(train.attrs["feature_std"])
        for name, value in (("feature_mean", mean), ("feature_std", std)):
            wrong = (f"has shape {value.shape}" if value.shape != train.row_shapes["x"] else "holds NaN/Inf"
                     if not np.isfinite(value).all() else "holds negative values"
                     if name == "feature_std" and (value < 0).any() else "")
            if wrong:
                raise DataError(f"the {name} attribute of {where} {wrong}; it must be finite, of shape "
                                f"{train.row_shapes['x']}{' and >= 0' * (name == 'feature_std')}: fix or delete it")
    else:
        x = train.read(0, min(len(train), STATS_ROWS))["x"]
        mean, std = x.mean(0), x.std(0)
    return train, val, mean.astype(np.float32), std.astype(np.float32)


def _check_no_remat(config: MLPRegressionConfig) -> None:
    if config.remat != "none":
        raise ConfigError(f"--remat {config.remat}: mlp-regression's MLP has no repeated blocks to recompute; "
                          "--remat works with char-gpt, mnist-cnn, fashion-mnist-cnn and hdf5-sequence")


def host_memory_bytes() -> int:
    """Physical memory of this machine (where the data are made and, on CPU, trained)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 1 << 60  # unknown: refuse nothing


def _check_fits(what: str, nbytes: int, advice: str) -> None:
    from jaxtrain.engine import format_bytes

    if nbytes > host_memory_bytes():
        raise ConfigError(f"{what} would take about {format_bytes(nbytes)}, more than this machine's "
                          f"{format_bytes(host_memory_bytes())} of memory; {advice}")


def build(config: MLPRegressionConfig) -> Workload:
    from jaxtrain import data as data_lib

    _check_no_remat(config)  # before any data is made or opened
    d = config.data
    if not (d.path or d.npy):  # float32 features and targets, a copy of each while made, and the teacher
        _check_fits(f"data.samples={d.samples:,} rows of {d.features:,} features and {d.targets:,} targets",
                    4 * (2 * d.samples * (d.features + d.targets) + d.teacher_width * (d.features + d.targets)),
                    "lower data.samples, data.features or data.targets")
    if config.data.path or config.data.npy:
        train, val, mean, std = open_hdf5(config.data)
        features, targets = train.row_shapes["x"][0], train.row_shapes["y"][0]
    else:
        train, val = make_data(config.data)
        val = val if len(val["x"]) else None
        mean, std = train["x"].mean(0), train["x"].std(0)
        features, targets = config.data.features, config.data.targets
    info = {"features": int(features), "targets": int(targets)}
    return Workload(
        model=build_model(config, info),
        loss_fn=mse_loss,
        train=train,
        val=val,
        preprocess=data_lib.normalize("x", mean, std),
        augment=data_lib.gaussian_noise("x", config.data.input_noise) if config.data.input_noise else None,
        info=info,
        inputs="x",
    )


def build_model(config: MLPRegressionConfig, info: dict) -> MLP:
    _check_no_remat(config)
    sizes = (info["features"], *config.model.hidden, info["targets"])
    params = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))  # weights and biases
    _check_fits(f"an MLP {'→'.join(f'{n:,}' for n in sizes)} ({params:,} parameters, with gradients and Adam's "
                "two moments)", 16 * params, "lower model.hidden")

    from jaxtrain.models import MLP, compiled_init

    return compiled_init(lambda rngs: MLP(sizes, rngs=rngs), config.seed)


RECIPE = Recipe(
    name="mlp-regression",
    description="MLP 128→512→512→64 regression on 50k synthetic samples (the case-study workload)",
    config=MLPRegressionConfig(),
    build=build,
    model=build_model,
)
