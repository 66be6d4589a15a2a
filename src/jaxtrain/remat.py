"""Gradient checkpointing of a model's blocks."""

from jaxtrain._src.remat import *  # noqa: F401,F403
