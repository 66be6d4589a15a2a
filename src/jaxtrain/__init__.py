"""jaxtrain: fast, memory-efficient neural-network training on JAX by default.

The public API is what this module lists in `__all__` (docs/api.md says what each name is for),
with the modules `jaxtrain.data`, `jaxtrain.models`, `jaxtrain.hooks`, `jaxtrain.remat` and
`jaxtrain.distributed`, and `jaxtrain.rl` (it loads mctx, so it is imported only when used).
Everything under `jaxtrain._src` is private; the command line, recipes, benchmarks and diagnosis
tools are under `jaxtrain.tools`, above the library.
"""

from jaxtrain import data, distributed, hooks, models, remat
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
from jaxtrain._src.export import export
from jaxtrain._src.hooks.base import Hook, LambdaHook, RunView
from jaxtrain._src.load import load
from jaxtrain._src.loop import FitResult, TrainingStopped, fit
from jaxtrain._src.memory import limit_free_heap
from jaxtrain._src.optim import build_optimizer, build_schedule
from jaxtrain._src.population import Member, fit_population
from jaxtrain._src.predict import predict
from jaxtrain._src.run_guard import RESUMABLE
from jaxtrain._src.state import TrainState
from jaxtrain._src.weights import load_weights, save_weights

__version__ = "0.1.0"

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
    "RunView",
    "TrainConfig",
    "TrainState",
    "TrainingStopped",
    "build_optimizer",
    "build_schedule",
    "data",
    "distributed",
    "enable_compile_cache",
    "export",
    "fit",
    "fit_population",
    "hooks",
    "limit_free_heap",
    "load",
    "load_weights",
    "models",
    "predict",
    "remat",
    "save_weights",
]
