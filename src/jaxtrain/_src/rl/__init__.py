"""Reinforcement learning: the clique game, batched self-play with mctx, a replay feed and hooks.

`jaxtrain.fit(model, alphazero_loss, ReplayBuffer(capacity, E), config, hooks=[SelfPlay(...), Arena(...)])`
is the AlphaZero loop; `jaxtrain train alphazero` builds it (`jaxtrain.tools.recipes.alphazero`).
"""

from jaxtrain._src.rl.clique import Game, State, init, init_batch, legal_actions, observation, reward, step
from jaxtrain._src.rl.hooks import Arena, SelfPlay
from jaxtrain._src.rl.network import PolicyValueMLP, alphazero_loss, make_forward, make_symmetry_augment
from jaxtrain._src.rl.replay import ReplayBuffer, ReplayFeed
from jaxtrain._src.rl.search import SearchConfig, make_search
from jaxtrain._src.rl.selfplay import make_self_play

__all__ = [
    "Arena", "Game", "PolicyValueMLP", "ReplayBuffer", "ReplayFeed", "SearchConfig", "SelfPlay", "State",
    "alphazero_loss", "init", "init_batch", "legal_actions", "make_forward", "make_search", "make_self_play",
    "make_symmetry_augment", "observation", "reward", "step",
]
