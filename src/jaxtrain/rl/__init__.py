"""Reinforcement learning: games and self-play."""

from jaxtrain.rl.clique import Game, State, init, init_batch, legal_actions, observation, reward, step

__all__ = ["Game", "State", "init", "init_batch", "legal_actions", "observation", "reward", "step"]
