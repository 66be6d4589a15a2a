"""An exact solver of small clique games (Sim included) by backward induction over every position.

A position of a game with E <= 15 edges is a base-3 number, one digit per edge:

    index = sum_e d_e * 3**e,    d_e = 0 (uncoloured), 1 (coloured +1, the first player), 2 (coloured -1)

Whose move it is follows from the counts: +1 moves when both players have coloured as many edges,
-1 when +1 has coloured one more. `solve(game)` fills a table over all 3**E indices (int8) with the
value of each position for the player to move, with the game's length folded in so that a winner
prefers the quickest win and a loser the longest defence:

    value = +(100 - d)   the mover wins, the game ending d moves from here (d = 0: the opponent
                         has just completed a clique in their own colour);
    value = -(100 - d)   the mover loses, d moves from here (d >= 1);
    value = 0            a draw (both play on to the full board);
    value = UNREACHABLE  (-128) no game reaches this index: wrong counts, or the mover already owns
                         a k-clique (the game ended a move earlier).

With C(s) the children of s (one per uncoloured edge, coloured by the mover), the recursion is

    V(s) = max_{c in C(s)} -(V(c) - sign(V(c)))

(a child won in d moves is a loss in d + 1 for the parent, and a child lost in d a win in d + 1).
Values of positions that play cannot reach but whose counts are consistent (say, the mover's
opponent owning two cliques with no edge in common) are filled in by the same rules and carry no
meaning. Layer m holds the positions with m coloured edges; all of a layer is computed at once
with NumPy from layer m + 1, so Sim (3**15 = 14.3M indices, 3.5M with consistent counts) takes
0.35-0.6 s on a shared 2-core VM: no disk cache is needed, `solve` keeps one table per game.

    game = Game(6, 3)
    table = solve(game)                      # (3**15,) int8, cached per game in memory
    first_player_value(table)                # -85: Sim is a second-player win, in all 15 moves
    policy = solver_policy(game, table)      # (State, key) -> () int32 action, jittable, vmappable
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain._src.rl.clique import Game, State, legal_actions

MAX_EDGES = 15  # 3**15 int8 values: 14 MB; 3**21 (K_7) would be 10 GB
WIN = 100  # the value of a position whose mover has just won (0 moves to the end)
UNREACHABLE = -128  # indices no game reaches


def _check_size(game: Game) -> None:
    if game.num_edges > MAX_EDGES:
        raise ValueError(
            f"Game(n={game.n}, k={game.k}) has {game.num_edges} edges: a table of 3**{game.num_edges} positions is "
            f"too large to solve exactly; the solver handles at most {MAX_EDGES} edges (n <= 6)"
        )


def _powers(num_edges: int) -> np.ndarray:
    """(E,) int64, the place value 3**e of edge e."""
    return 3 ** np.arange(num_edges, dtype=np.int64)


@functools.cache
def solve(game: Game) -> np.ndarray:
    """The value for the player to move of every position of `game`, by backward induction.

    Args:
      game: a clique game with at most 15 edges (n <= 6).

    Returns:
      (3**E,) int8, read-only, indexed by `position_index`; the encoding is in the module
      docstring. Computed once per game and process (under half a second for Sim), then shared.

    Raises:
      ValueError: when the game has more than 15 edges.
    """
    _check_size(game)
    num_edges = game.num_edges
    powers = _powers(num_edges)
    # Edge sets as bitmasks over E bits: the place-value sum of each set, and whether it holds a
    # k-clique, are lookups in tables of 2**E entries.
    bits = (np.arange(2**num_edges)[:, None] >> np.arange(num_edges)) & 1  # (2**E, E)
    place = (bits * powers).sum(axis=1)  # (2**E,) sum of 3**e over the set
    clique_masks = (1 << game.clique_edges.astype(np.int64)).sum(axis=1)  # (C,)
    masks = np.arange(2**num_edges)
    has_clique = np.zeros(2**num_edges, bool)
    for clique in clique_masks:
        has_clique |= (masks & clique) == clique

    table = np.full(3**num_edges, UNREACHABLE, np.int8)
    for m in range(num_edges, -1, -1):
        first, second = _layer(num_edges, m)  # (N,) disjoint bitmasks of the two players' edges
        index = place[first] + 2 * place[second]
        mover_digit, mover, opponent = (1, first, second) if m % 2 == 0 else (2, second, first)
        over = has_clique[opponent]  # the opponent's last move completed a clique: the mover has won
        live = ~over & ~has_clique[mover]
        values = np.where(over, WIN, UNREACHABLE).astype(np.int16)
        if m == num_edges:
            values[live] = 0  # a full board without a clique: a draw
        else:
            index_live, free = index[live], ~(first[live] | second[live])
            best = np.full(len(index_live), -(WIN + 1), np.int16)
            for e in range(num_edges):
                legal = ((free >> e) & 1).astype(bool)
                child = table[index_live[legal] + mover_digit * powers[e]].astype(np.int16)
                best[legal] = np.maximum(best[legal], -child + np.sign(child))  # the child's value, for the mover
            values[live] = best
        table[index] = values
    table.setflags(write=False)
    return table


def _layer(num_edges: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Every position with m coloured edges and consistent counts, as two (N,) int64 bitmasks:
    the first player's ceil(m / 2) edges and the second player's floor(m / 2)."""
    coloured = np.array([sum(1 << e for e in edges) for edges in itertools.combinations(range(num_edges), m)])
    # The positions of the set bits of each coloured set, lowest first: (S, m).
    set_bits = (coloured[:, None] >> np.arange(num_edges) & 1).astype(bool)
    positions = np.nonzero(set_bits)[1].reshape(len(coloured), m)
    # Which of those m edges are the first player's: (P, m) 0/1, one row per choice.
    num_first = (m + 1) // 2
    choices = np.zeros((math.comb(m, num_first), m), np.int64)
    for row, chosen in enumerate(itertools.combinations(range(m), num_first)):
        choices[row, list(chosen)] = 1
    first = (1 << positions) @ choices.T  # (S, P): the sum of the chosen edges' bits
    second = coloured[:, None] & ~first
    return first.ravel(), second.ravel()


def position_index(game: Game, colours: np.ndarray | list[int]) -> int:
    """The table index of a board: sum_e d_e 3**e with digit 0, 1, 2 for colour 0, +1, -1.

    Args:
      game: the game (at most 15 edges).
      colours: (E,) ints in {-1, 0, +1}, as in `State.colours`.
    """
    _check_size(game)
    colours = np.asarray(colours, np.int64)
    if colours.shape != (game.num_edges,):
        raise ValueError(f"colours has shape {colours.shape}; Game(n={game.n}, k={game.k}) needs ({game.num_edges},)")
    return int(np.dot(np.where(colours == -1, 2, colours), _powers(game.num_edges)))


def index_of(game: Game, colours: jax.Array) -> jax.Array:
    """`position_index` in JAX: (..., E) colours in {-1, 0, +1} -> (...) int32 (3**15 < 2**31)."""
    _check_size(game)
    digits = jnp.where(colours == -1, 2, colours).astype(jnp.int32)  # (..., E)
    return jnp.sum(digits * jnp.asarray(_powers(game.num_edges), jnp.int32), axis=-1)


def first_player_value(table: np.ndarray) -> int:
    """The value of the empty board for the first player, in the table's encoding (see the module
    docstring): negative when the second player wins with perfect play."""
    return int(table[0])


def decode(value: int) -> tuple[int, int | None]:
    """A table value as (outcome for the mover: +1 win, -1 loss, 0 draw; moves to the end).

    The moves to the end of a draw are not stored (None): it is the number of uncoloured edges.

    Raises:
      ValueError: for UNREACHABLE.
    """
    value = int(value)
    if value == UNREACHABLE:
        raise ValueError("the position is unreachable: no game of the solved size gets there")
    if value == 0:
        return 0, None
    return (1 if value > 0 else -1), WIN - abs(value)


def solver_policy(game: Game, table: np.ndarray) -> Callable[[State, jax.Array], jax.Array]:
    """A perfect player: the legal move whose resulting position is best for the mover.

    It looks up every child's value in `table` (copied once to the default device), turns it into
    the mover's value (`-(v - sign(v))`) and plays the best: the quickest win, else a draw, else
    the longest defence. Ties are broken uniformly at random with `key`. A finished game has no
    legal move; the policy then returns 0, which `clique.step` ignores.

    The table is closed over, so it is a constant of every program that calls the policy: Sim's
    14 MB add about 0.25 s to each compilation, and no transfer per call.

    Args:
      game: the game `table` solves.
      table: (3**E,) int8, from `solve(game)`.

    Returns:
      `policy(state, key) -> () int32`, pure, jittable and vmappable (over states and keys).
    """
    _check_size(game)
    if table.shape != (3**game.num_edges,):
        raise ValueError(f"table has shape {table.shape}; Game(n={game.n}, k={game.k}) needs ({3**game.num_edges},)")
    values, policy = jnp.asarray(table), _table_policy(game)
    return lambda state, key: policy(values, state, key)


def _table_policy(game: Game) -> Callable[[jax.Array, State, jax.Array], jax.Array]:
    """`policy(values, state, key) -> () int32`: `solver_policy` with the table as an argument."""
    powers = jnp.asarray(_powers(game.num_edges), jnp.int32)

    def policy(values: jax.Array, state: State, key: jax.Array) -> jax.Array:
        legal = legal_actions(state)  # (E,)
        index = index_of(game, state.colours)
        digit = jnp.where(state.to_play == 1, 1, 2).astype(jnp.int32)
        children = jnp.where(legal, index + digit * powers, index)  # (E,); an illegal move reads its own index
        child = values[children].astype(jnp.int32)
        score = (-child + jnp.sign(child)).astype(jnp.float32)  # integers: noise in [0, 1) only breaks ties
        score = score + jax.random.uniform(key, score.shape)
        return jnp.argmax(jnp.where(legal, score, -jnp.inf)).astype(jnp.int32)

    return policy


def solver_player(game: Game) -> tuple[Callable[[jax.Array, State, jax.Array], jax.Array], jax.Array]:
    """The solver as an arena player: `(player, values)` with `player(values, states, key) -> (B,)`
    moves for a batch of states and `values` the solved table on the device. The table is an
    argument, not a constant compiled into the program."""
    policy = _table_policy(game)

    def player(values: jax.Array, states: State, key: jax.Array) -> jax.Array:
        keys = jax.random.split(key, states.colours.shape[0])
        return jax.vmap(policy, in_axes=(None, 0, 0))(values, states, keys)

    return player, jnp.asarray(solve(game))
