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
from jaxtrain.tools.runs import load

__version__ = "0.1.0"
