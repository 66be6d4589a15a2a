"""jaxtrain: fast, memory-efficient neural-network training on JAX by default."""

from jaxtrain import data, distributed, hooks, models, sharding, tune
from jaxtrain.calls import AutoSteps
from jaxtrain.checkpoint import CheckpointError
from jaxtrain.config import (
    CheckpointConfig,
    DataConfig,
    DistConfig,
    EarlyStoppingConfig,
    OptimConfig,
    TrainConfig,
)
from jaxtrain.errors import ConfigError, DataError, JaxtrainError, NonFiniteLossError
from jaxtrain.hooks import EarlyStopping, Hook, LambdaHook, TensorBoard
from jaxtrain.loop import FitResult, TrainingStopped, fit
from jaxtrain.optim import build_optimizer, build_schedule
from jaxtrain.runs import load
from jaxtrain.state import TrainState, init_state
from jaxtrain.step import make_eval_step, make_evaluate, make_multi_step, make_train_step

__version__ = "0.1.0"

__all__ = [
    "AutoSteps",
    "CheckpointConfig",
    "CheckpointError",
    "ConfigError",
    "DataConfig",
    "DataError",
    "DistConfig",
    "EarlyStopping",
    "EarlyStoppingConfig",
    "FitResult",
    "Hook",
    "JaxtrainError",
    "LambdaHook",
    "NonFiniteLossError",
    "OptimConfig",
    "TensorBoard",
    "TrainConfig",
    "TrainState",
    "TrainingStopped",
    "build_optimizer",
    "build_schedule",
    "data",
    "distributed",
    "fit",
    "hooks",
    "init_state",
    "load",
    "make_eval_step",
    "make_evaluate",
    "make_multi_step",
    "make_train_step",
    "models",
    "sharding",
    "tune",
]
