"""Self-play: B games at once in one compiled call, every move a batched search.

All B games advance together, one move per step of a `lax.scan` of E (the number of edges, the
longest possible game) steps; a finished game's later moves are no-ops and its positions are
marked invalid. Each position records the board from the mover's side, the search's policy
target (Gumbel's improved policy or MuZero's visit counts) and the mover; after the last move the
value target of every position is the game's outcome for its mover, computed on the device.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxtrain._src.rl import clique
from jaxtrain._src.rl.network import Forward, relative_board
from jaxtrain._src.rl.search import SearchConfig, make_search


class Positions(NamedTuple):
    """The positions of B games of E moves, flattened to N = E * B rows (move-major).

    Attributes:
      board: (N, E) int8 boards from the mover's side.
      policy: (N, E) float32 search policy targets.
      value: (N,) float32 the game's outcome for the mover (+1 win, -1 loss, 0 draw).
      valid: (N,) bool, False for moves after a game ended.
    """

    board: jax.Array
    policy: jax.Array
    value: jax.Array
    valid: jax.Array


class GameStats(NamedTuple):
    """Per game of a self-play batch: (B,) arrays."""

    length: jax.Array  # moves played
    winner: jax.Array  # +1 first player, -1 second, 0 draw


def make_self_play(game: clique.Game, forward: Forward, search: SearchConfig, num_games: int,
                   moves: int | None = None):
    """`self_play(variables, key) -> (Positions, GameStats)`: `num_games` games from the empty board.

    Pure and jittable: jit it once per run (the network's variables are an argument). `moves`
    stops the games after that many moves (default E: every game ends; fewer for tests).
    """
    moves = moves or game.num_edges
    search_fn = make_search(game, forward, search)
    step_all = jax.vmap(functools.partial(clique.step, game))

    def self_play(variables: Any, key: jax.Array) -> tuple[Positions, GameStats]:
        def move(states: clique.State, key: jax.Array):
            output = search_fn(variables, states, key)
            record = (relative_board(states), output.action_weights, states.to_play, ~states.terminal)
            return step_all(states, output.action), record

        start = clique.init_batch(game, num_games)
        final, (board, policy, mover, valid) = jax.lax.scan(move, start, jax.random.split(key, moves))
        value = (final.winner[None, :] * mover).astype(jnp.float32)  # (moves, B): the outcome for each mover
        flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731 - (E, B, ...) -> (E*B, ...)
        positions = Positions(flat(board), flat(policy).astype(jnp.float32), flat(value), flat(valid))
        return positions, GameStats(final.num_moves, final.winner)

    return self_play
