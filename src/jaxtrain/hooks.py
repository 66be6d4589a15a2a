"""Hooks: small objects that react to the training loop's events.

Subclass `Hook` (or use `LambdaHook`) and pass it to `fit(..., hooks=[...])`; its events receive a
read-only `RunView`. `ProfileHook` configures the end-of-run step profile (budget, trace).
Early stopping, checkpoints, TensorBoard and the run files are set in `TrainConfig`; the loop
adds and orders those hooks itself.
"""

from jaxtrain._src.hooks.base import Hook, LambdaHook, RunView
from jaxtrain._src.hooks.profile import ProfileHook

__all__ = ["Hook", "LambdaHook", "ProfileHook", "RunView"]
