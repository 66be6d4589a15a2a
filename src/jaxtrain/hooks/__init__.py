"""Hooks: small objects that react to the training loop's events (see `hooks.base`)."""

from jaxtrain.hooks.base import Hook, LambdaHook, Run
from jaxtrain.hooks.checkpointing import CheckpointHook
from jaxtrain.hooks.early_stopping import EarlyStopping
from jaxtrain.hooks.evaluation import EvalHook
from jaxtrain.hooks.metrics import MetricsHook
from jaxtrain.hooks.profile import ProfileBudgetReached, ProfileHook
from jaxtrain.hooks.progress import PlotHook, ProgressHook
from jaxtrain.hooks.run_files import RunFilesHook
from jaxtrain.hooks.tensorboard import TensorBoard

__all__ = [
    "CheckpointHook",
    "EarlyStopping",
    "EvalHook",
    "Hook",
    "LambdaHook",
    "MetricsHook",
    "PlotHook",
    "ProfileBudgetReached",
    "ProfileHook",
    "ProgressHook",
    "Run",
    "RunFilesHook",
    "TensorBoard",
]
