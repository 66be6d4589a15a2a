"""jaxtrain: fast, memory-efficient neural-network training on JAX by default."""

from jaxtrain import data, hooks, models
from jaxtrain._src.calls import AutoSteps
from jaxtrain._src.checkpoint import CheckpointError
from jaxtrain._src.config import (
    CheckpointConfig,
    DataConfig,
    DistConfig,
    EarlyStoppingConfig,
    OptimConfig,
    TrainConfig,
)
from jaxtrain._src.errors import ConfigError, DataError, JaxtrainError, NonFiniteLossError
from jaxtrain._src.hooks import EarlyStopping, Hook, LambdaHook, TensorBoard
from jaxtrain._src.loop import FitResult, TrainingStopped, fit
from jaxtrain._src.optim import build_optimizer, build_schedule
from jaxtrain._src.state import TrainState, init_state
from jaxtrain._src.step import make_eval_step, make_evaluate, make_multi_step, make_train_step

__version__ = "0.1.0"


def __getattr__(name: str):
    """`jaxtrain.load` (a finished run's files) comes from the tools, imported on first use: importing
    jaxtrain to train does not load the tools (YAML, the recipe registry)."""
    if name == "load":
        from jaxtrain.tools.runs import load

        return load
    raise AttributeError(f"module 'jaxtrain' has no attribute {name!r}")
