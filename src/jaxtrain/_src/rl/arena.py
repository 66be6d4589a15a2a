"""Evaluation matches of the clique game: the network with search against an opponent, B games
at once in one compiled call.

One program plays every match of an evaluation: the opponent (a uniformly random player, a
network with search — the previous iteration's weights —, or an exact solver) and the seat are
arguments, so the search is compiled once. The games of a match advance in lockstep, so move t
is the first player's when t is even; a finished game's further moves are no-ops. The network
under evaluation searches without exploration (deterministic given its inputs); against another
network both sides explore, so that the games differ.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxtrain._src.rl import clique
from jaxtrain._src.rl.network import Forward, masked_logits
from jaxtrain._src.rl.search import SearchConfig, make_search

Player = Callable[[Any, clique.State, jax.Array], jax.Array]  # (variables, states, key) -> (B,) moves

RANDOM, PREVIOUS, SOLVER = 0, 1, 2  # opponents


class Outcome(NamedTuple):
    """Rates over the games of a match, from the evaluated network's side."""

    win: float
    draw: float
    loss: float
    mean_length: float


def random_player(variables: Any, states: clique.State, key: jax.Array) -> jax.Array:
    """A uniformly random legal move."""
    logits = masked_logits(jnp.zeros(states.colours.shape, jnp.float32), clique.legal_actions(states))
    return jax.random.categorical(key, logits)


def make_match(game: clique.Game, forward: Forward, search: SearchConfig, num_games: int,
               solver: Player | None = None):
    """`match(mine, theirs, solver_variables, opponent, mine_first, key) -> (winner, length)`.

    `num_games` games from the empty board between the network with variables `mine` and
    `opponent` (RANDOM, PREVIOUS: the network with variables `theirs`, or SOLVER: `solver` with
    `solver_variables`), `mine_first` saying who moves first. Returns (B,) winners (+1 first
    player, -1 second, 0 draw) and game lengths. Pure and jittable.
    """
    search_fn = make_search(game, forward, search)
    step_all = jax.vmap(functools.partial(clique.step, game))
    others = [random_player, solver or random_player]  # what moves without a search

    def match(mine: Any, theirs: Any, solver_variables: Any, opponent: jax.Array, mine_first: jax.Array,
              key: jax.Array) -> tuple[jax.Array, jax.Array]:
        def move(states: clique.State, inputs: tuple[jax.Array, jax.Array]):
            t, key = inputs
            my_move = (t % 2 == 0) == mine_first

            def searched(states: clique.State) -> jax.Array:
                variables = jax.tree.map(lambda a, b: jnp.where(my_move, a, b), mine, theirs)
                explore = opponent == PREVIOUS  # two networks: both sample, so that the games differ
                return search_fn(variables, states, key, explore).action.astype(jnp.int32)

            def unsearched(states: clique.State) -> jax.Array:
                branches = [lambda s, p=p: p(solver_variables, s, key).astype(jnp.int32) for p in others]
                return jax.lax.switch(jnp.where(opponent == SOLVER, 1, 0), branches, states)

            action = jax.lax.cond(my_move | (opponent == PREVIOUS), searched, unsearched, states)
            return step_all(states, action), None

        moves = jnp.arange(game.num_edges)
        final, _ = jax.lax.scan(move, clique.init_batch(game, num_games),
                                (moves, jax.random.split(key, game.num_edges)))
        return final.winner, final.num_moves

    return match


def outcome(winner: Any, length: Any, mine_first: bool) -> Outcome:
    """The evaluated network's win, draw and loss rates (host floats) of a match's results."""
    mine = jnp.asarray(winner) * (1 if mine_first else -1)
    return Outcome(win=float(jnp.mean(mine == 1)), draw=float(jnp.mean(mine == 0)),
                   loss=float(jnp.mean(mine == -1)), mean_length=float(jnp.mean(length)))
