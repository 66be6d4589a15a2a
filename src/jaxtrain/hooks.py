"""Hooks: small objects that react to the training loop's events.

Subclass `Hook` (or use `LambdaHook`) and pass it to `fit(..., hooks=[...])`; its events receive a
read-only `RunView`. `ProfileHook` configures the end-of-run step profile (budget, trace).
Early stopping, checkpoints, TensorBoard, the run files and the trackers named by
`TrainConfig.track` are set in `TrainConfig`; the loop adds and orders those hooks itself.
`MLflow`, `WandB` and `CSV` may also be passed in `hooks` with settings of their own.
"""

from jaxtrain._src.hooks.base import Hook, LambdaHook, RunView
from jaxtrain._src.hooks.profile import ProfileHook
from jaxtrain._src.hooks.trackers import CSV, MLflow, WandB

__all__ = ["CSV", "Hook", "LambdaHook", "MLflow", "ProfileHook", "RunView", "WandB"]
