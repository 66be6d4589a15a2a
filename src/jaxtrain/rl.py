"""Reinforcement learning: the clique game, batched self-play with mctx, a replay feed and hooks."""

from jaxtrain._src.rl import *  # noqa: F401,F403
from jaxtrain._src.rl import __all__  # noqa: F401
