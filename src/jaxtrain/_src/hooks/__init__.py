"""Hooks: small objects that react to the training loop's events (see `hooks.base`)."""

from jaxtrain._src.hooks.base import Hook, LambdaHook, Run, RunHook, RunView
from jaxtrain._src.hooks.checkpointing import CheckpointHook
from jaxtrain._src.hooks.early_stopping import EarlyStopping, RestoreBest
from jaxtrain._src.hooks.evaluation import EvalHook
from jaxtrain._src.hooks.memory import MemoryHook
from jaxtrain._src.hooks.metrics import MetricsHook
from jaxtrain._src.hooks.plateau import ReduceOnPlateau
from jaxtrain._src.hooks.profile import ProfileBudgetReached, ProfileHook
from jaxtrain._src.hooks.progress import PlotHook, ProgressHook
from jaxtrain._src.hooks.run_files import RunFilesHook
from jaxtrain._src.hooks.tensorboard import TensorBoard
from jaxtrain._src.hooks.trackers import CSV, MLflow, Tracker, WandB

__all__ = [
    "CSV",
    "CheckpointHook",
    "EarlyStopping",
    "EvalHook",
    "Hook",
    "LambdaHook",
    "MemoryHook",
    "MLflow",
    "MetricsHook",
    "PlotHook",
    "ProfileBudgetReached",
    "ProfileHook",
    "ProgressHook",
    "ReduceOnPlateau",
    "RestoreBest",
    "Run",
    "RunFilesHook",
    "RunHook",
    "RunView",
    "TensorBoard",
    "Tracker",
    "WandB",
]
