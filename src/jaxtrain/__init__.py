"""jaxtrain: fast, memory-efficient neural-network training on JAX by default.

The public API is what this module lists in `__all__` (docs/api.md says what each name is for),
with the modules `jaxtrain.data`, `jaxtrain.models`, `jaxtrain.hooks`, `jaxtrain.metrics`, `jaxtrain.remat` and
`jaxtrain.distributed`, and `jaxtrain.rl` (it loads mctx, so it is imported only when used).
`jaxtrain.engine` is the public low tier under `fit` (the program builder, a run with a tool's
options, the checkpointer, ...), imported only when used. Everything under `jaxtrain._src` is
private; the command line, recipes and diagnosis tools are under `jaxtrain.tools`, above the library
(the benchmarks are the repository's, not installed).

Each public name is imported on first use (PEP 562 `__getattr__`): `import jaxtrain` alone loads
no JAX, so that `jaxtrain --help` and `--version` answer at once (JAX, Flax and Optax take about
a second to import); `jaxtrain.fit` and `from jaxtrain import fit` work as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The one place the version is written: pyproject.toml reads it (tool.setuptools.dynamic) and
# `jaxtrain --version` prints it.
__version__ = "0.1.0"

if TYPE_CHECKING:  # what type checkers and readers see; at run time `__getattr__` imports the same
    from jaxtrain import data, distributed, hooks, metrics, models, remat
    from jaxtrain._src.adaptive import Refill, Slot
    from jaxtrain._src.checkpoint import CheckpointError
    from jaxtrain._src.compile_cache import enable_compile_cache
    from jaxtrain._src.config import (
        CheckpointConfig,
        DataConfig,
        DistConfig,
        EarlyStoppingConfig,
        OptimConfig,
        TrainConfig,
    )
    from jaxtrain._src.errors import ConfigError, DataError, JaxtrainError, NonFiniteLossError
    from jaxtrain._src.evaluate import evaluate
    from jaxtrain._src.export import export
    from jaxtrain._src.hooks.base import Hook, LambdaHook, RunView
    from jaxtrain._src.load import load
    from jaxtrain._src.loop import FitResult, TrainingStopped, fit
    from jaxtrain._src.memory import limit_free_heap
    from jaxtrain._src.optim import build_optimizer, build_schedule, log_learning_rate
    from jaxtrain._src.population import Member, fit_population
    from jaxtrain._src.predict import predict
    from jaxtrain._src.run_guard import RESUMABLE
    from jaxtrain._src.state import TrainState
    from jaxtrain._src.weights import load_weights, save_weights

# public name -> the module it comes from (the imports above; tests/library/test_api.py checks they agree)
_HOMES = {
    "CheckpointConfig": "jaxtrain._src.config",
    "CheckpointError": "jaxtrain._src.checkpoint",
    "ConfigError": "jaxtrain._src.errors",
    "DataConfig": "jaxtrain._src.config",
    "DataError": "jaxtrain._src.errors",
    "DistConfig": "jaxtrain._src.config",
    "EarlyStoppingConfig": "jaxtrain._src.config",
    "FitResult": "jaxtrain._src.loop",
    "Hook": "jaxtrain._src.hooks.base",
    "JaxtrainError": "jaxtrain._src.errors",
    "LambdaHook": "jaxtrain._src.hooks.base",
    "Member": "jaxtrain._src.population",
    "Refill": "jaxtrain._src.adaptive",
    "Slot": "jaxtrain._src.adaptive",
    "NonFiniteLossError": "jaxtrain._src.errors",
    "OptimConfig": "jaxtrain._src.config",
    "RESUMABLE": "jaxtrain._src.run_guard",
    "RunView": "jaxtrain._src.hooks.base",
    "TrainConfig": "jaxtrain._src.config",
    "TrainState": "jaxtrain._src.state",
    "TrainingStopped": "jaxtrain._src.loop",
    "build_optimizer": "jaxtrain._src.optim",
    "build_schedule": "jaxtrain._src.optim",
    "enable_compile_cache": "jaxtrain._src.compile_cache",
    "evaluate": "jaxtrain._src.evaluate",
    "export": "jaxtrain._src.export",
    "fit": "jaxtrain._src.loop",
    "fit_population": "jaxtrain._src.population",
    "limit_free_heap": "jaxtrain._src.memory",
    "load": "jaxtrain._src.load",
    "load_weights": "jaxtrain._src.weights",
    "log_learning_rate": "jaxtrain._src.optim",
    "predict": "jaxtrain._src.predict",
    "save_weights": "jaxtrain._src.weights",
}
_MODULES = ("data", "distributed", "hooks", "metrics", "models", "remat")

__all__ = [
    "CheckpointConfig",
    "CheckpointError",
    "ConfigError",
    "DataConfig",
    "DataError",
    "DistConfig",
    "EarlyStoppingConfig",
    "FitResult",
    "Hook",
    "JaxtrainError",
    "LambdaHook",
    "Member",
    "NonFiniteLossError",
    "OptimConfig",
    "RESUMABLE",
    "Refill",
    "RunView",
    "Slot",
    "TrainConfig",
    "TrainState",
    "TrainingStopped",
    "build_optimizer",
    "build_schedule",
    "data",
    "distributed",
    "enable_compile_cache",
    "evaluate",
    "export",
    "fit",
    "fit_population",
    "hooks",
    "limit_free_heap",
    "load",
    "load_weights",
    "log_learning_rate",
    "metrics",
    "models",
    "predict",
    "remat",
    "save_weights",
]


def __getattr__(name: str) -> Any:
    """A public name's value, imported on its first use and kept (later lookups do not come here)."""
    if name in _MODULES:
        return importlib.import_module(f"jaxtrain.{name}")  # the import binds it on this package
    if name not in _HOMES:
        raise AttributeError(f"module 'jaxtrain' has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_HOMES[name]), name)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
