"""Optional packages: which extra of pyproject.toml installs each, and the one line that says so.

jaxtrain imports an optional package only where a feature needs it (Optuna for `jaxtrain sweep`,
MLflow for `track="mlflow"`, ...). A missing one is a `ConfigError` (exit code 2 on the command
line) naming the package, what needs it and the pip command that installs its extra, never a
`ModuleNotFoundError` traceback. Features check with `require` (importing) or `check_installed`
(without importing: before a run directory is claimed); the command line turns any other
`ImportError` of a package named here into the same line (`missing_package`).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from jaxtrain._src.errors import ConfigError

__all__ = ["EXTRAS", "check_installed", "install_command", "missing_package", "require"]

# Each optional package's import name -> the extra (pyproject.toml's optional-dependencies) that installs it.
EXTRAS = {
    "optuna": "sweep", "sqlalchemy": "sweep",  # jaxtrain sweep
    "mlflow": "track", "wandb": "track",  # TrainConfig.track
    "torch": "loaders", "grain": "loaders", "datasets": "loaders",  # others' loaders (and benchmarks of them)
}
# jaxtrain's own dependencies that only some features import (plots, HDF5 files, checkpoints,
# self-play's tree search, export): missing, the install itself is incomplete.
BASE = ("matplotlib", "h5py", "orbax", "tensorstore", "tensorboardX", "mctx", "flatbuffers", "filelock", "absl",
        "tyro", "rich", "optax", "flax", "jax", "jaxlib", "numpy")


def install_command(extra: str | None) -> str:
    """The pip command, run in jaxtrain's folder, that installs `extra` (None: jaxtrain itself)."""
    return f'pip install -e ".[{extra}]"' if extra else "pip install -e ."


def _error(package: str, needed_by: str, extra: str | None) -> ConfigError:
    if extra is None:
        what = f"{package}, one of jaxtrain's own dependencies, which is not installed"
    else:
        what = f"{package}, which is not installed (jaxtrain's optional extra {extra!r})"
    return ConfigError(f"{needed_by} needs {what}: run {install_command(extra)} in jaxtrain's folder",
                       package=package, extra=extra)


def _extra_of(package: str, extras: dict[str, str] | None) -> tuple[bool, str | None]:
    """(known, its extra): whether `package` is one of those named here, and the extra installing it."""
    table = {**EXTRAS, **(extras or {})}
    if package in table:
        return True, table[package]
    return package in BASE, None


def require(module: str, needed_by: str, extra: str | None = None) -> ModuleType:
    """Imports `module` (dotted names too), or raises the one-line error.

    Args:
      module: what to import, e.g. "optuna" or "optuna.visualization.matplotlib".
      needed_by: what needs it, for the message ("jaxtrain sweep", "the mlflow tracker").
      extra: the extra that installs it; default the one `EXTRAS` names for its package.

    Raises:
      ConfigError: it (or a package it imports) is not installed, naming the extra and its pip command.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:  # not `cannot import name X`: an installed package of another version
        top = module.partition(".")[0]
        missing = (e.name or top).partition(".")[0]
        known, its_extra = _extra_of(missing, None)
        if not known:  # a dependency of the package is missing: installing the package's extra brings it
            missing, its_extra = top, _extra_of(top, None)[1]
        raise _error(missing, needed_by, extra or its_extra) from None


def check_installed(module: str, needed_by: str, extra: str | None = None) -> None:
    """Raises `require`'s error when the package `module` is not installed, without importing it
    (a check made before anything is written; its features import it when they start)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        found = False
    if not found:
        raise _error(module.partition(".")[0], needed_by, extra or EXTRAS.get(module.partition(".")[0]))


def missing_package(e: ImportError, needed_by: str, extras: dict[str, str] | None = None) -> ConfigError | None:
    """The one-line error for an `ImportError` of a package named here (`extras` overrides
    `EXTRAS`, e.g. torch from the "bench" extra for the benchmarks); None for any other module
    (the user's own code: its error stands), and for a name a package that is installed lacks
    (another version: its own message says more than "not installed")."""
    if not isinstance(e, ModuleNotFoundError):
        return None
    missing = (e.name or "").partition(".")[0]
    known, extra = _extra_of(missing, extras)
    return _error(missing, needed_by, extra) if missing and known else None
