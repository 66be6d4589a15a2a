"""jaxtrain: fast, memory-efficient neural-network training on JAX by default."""

from jaxtrain import data, models
from jaxtrain.config import DataConfig, OptimConfig, TrainConfig
from jaxtrain.errors import ConfigError, DataError, JaxtrainError, NonFiniteLossError
from jaxtrain.loop import FitResult, fit
from jaxtrain.optim import build_optimizer, build_schedule
from jaxtrain.state import TrainState, init_state
from jaxtrain.step import make_eval_step, make_evaluate, make_multi_step, make_train_step

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DataConfig",
    "DataError",
    "FitResult",
    "JaxtrainError",
    "NonFiniteLossError",
    "OptimConfig",
    "TrainConfig",
    "TrainState",
    "build_optimizer",
    "build_schedule",
    "data",
    "fit",
    "init_state",
    "make_eval_step",
    "make_evaluate",
    "make_multi_step",
    "make_train_step",
    "models",
]
