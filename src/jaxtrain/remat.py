"""Gradient checkpointing of a model's blocks: `call(block, x, mode=...)` recomputes what `mode` says
in the backward pass (`none`, `blocks`, `dots`, `full`)."""

from jaxtrain._src.remat import MODES, Mode, call, check_mode, policy

__all__ = ["MODES", "Mode", "call", "check_mode", "policy"]
