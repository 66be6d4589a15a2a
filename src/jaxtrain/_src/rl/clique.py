"""The clique-avoidance game on the complete graph K_n, as pure JAX functions.

Two players take turns colouring one uncoloured edge of K_n, each in their own colour. A player
who completes a k-clique in their own colour loses; when every edge is coloured and nobody has,
the game is a draw. With n = 6, k = 3 this is the game Sim: since the Ramsey number R(3,3) = 6,
every 2-colouring of K_6 has a monochromatic triangle, so Sim never draws (and it is a
second-player win with perfect play). With n = 14, k = 4 draws are possible (R(4,4) = 18).

A `Game(n, k)` is a static, hashable description holding NumPy tables; a `State` is a pytree of
arrays. `init`, `step`, `legal_actions`, `reward` and `observation` are pure and jittable; bind
the game and vmap for a batch of B games:

    game = Game(6, 3)
    states = init_batch(game, B)                        # every leaf has a leading (B,)
    states = jax.vmap(functools.partial(step, game))(states, actions)   # actions: (B,) int

Players are +1 (moves first) and -1. Edge `e` joins vertices `game.edges[e]`; edges are
numbered in `itertools.combinations(range(n), 2)` order.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike


def _frozen(array: ArrayLike) -> np.ndarray:
    array = np.asarray(array, np.int32)
    array.setflags(write=False)
    return array


@dataclasses.dataclass(frozen=True)
class Game:
    """The static description of the game: sizes and index tables.

    Equal (and hashable) by `(n, k)` only, so a `Game` can be a static argument of `jax.jit`.
    With E = C(n,2) edges, C = C(n,k) cliques, K = C(k,2) edges per clique and
    M = C(n-2,k-2) cliques through each edge:

    Attributes:
      n: number of vertices.
      k: size of the clique a player must not complete in their own colour.
      num_edges: E, also the number of actions.
      edges: (E, 2) int32, the vertices `i < j` of each edge.
      edge_index: (n, n) int32, the edge joining `i` and `j` (symmetric; -1 on the diagonal).
      clique_edges: (C, K) int32, the edges of each k-clique.
      edge_cliques: (E, M) int32, the cliques (rows of `clique_edges`) that contain each edge.
    """

    n: int
    k: int
    num_edges: int = dataclasses.field(init=False, compare=False)
    edges: np.ndarray = dataclasses.field(init=False, compare=False, repr=False)
    edge_index: np.ndarray = dataclasses.field(init=False, compare=False, repr=False)
    clique_edges: np.ndarray = dataclasses.field(init=False, compare=False, repr=False)
    edge_cliques: np.ndarray = dataclasses.field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 2 <= self.k <= self.n:
            raise ValueError(f"Game(n={self.n}, k={self.k}): need 2 <= k <= n")
        edges = list(itertools.combinations(range(self.n), 2))
        edge_index = np.full((self.n, self.n), -1)
        for e, (i, j) in enumerate(edges):
            edge_index[i, j] = edge_index[j, i] = e
        clique_edges = [
            [edge_index[i, j] for i, j in itertools.combinations(clique, 2)]
            for clique in itertools.combinations(range(self.n), self.k)
        ]
        edge_cliques: list[list[int]] = [[] for _ in edges]
        for c, clique in enumerate(clique_edges):
            for e in clique:
                edge_cliques[e].append(c)
        # Frozen dataclass: fields computed here are set through object.__setattr__.
        object.__setattr__(self, "num_edges", len(edges))
        object.__setattr__(self, "edges", _frozen(edges))
        object.__setattr__(self, "edge_index", _frozen(edge_index))
        object.__setattr__(self, "clique_edges", _frozen(clique_edges))
        object.__setattr__(self, "edge_cliques", _frozen(edge_cliques))
        assert self.edge_cliques.shape == (len(edges), math.comb(self.n - 2, self.k - 2))


class State(NamedTuple):
    """One position, as a pytree of arrays (a batch of B games adds a leading (B,) to each).

    Colours are absolute: +1 is the player who moved first, -1 the other, whoever is to move.
    They are int8 because a search tree (mctx) stores one board per node.

    Attributes:
      colours: (E,) int8, 0 for an uncoloured edge, else the player (+1/-1) who coloured it.
      to_play: () int8, the player to move next (+1 or -1; still alternates at the end).
      terminal: () bool, whether the game is over.
      winner: () int8, +1 or -1 once a player has lost, 0 for a draw or a game still going.
      num_moves: () int32, edges coloured so far.
    """

    colours: jax.Array
    to_play: jax.Array
    terminal: jax.Array
    winner: jax.Array
    num_moves: jax.Array


def init(game: Game) -> State:
    """The empty board, player +1 to move."""
    return State(
        colours=jnp.zeros((game.num_edges,), jnp.int8),
        to_play=jnp.ones((), jnp.int8),
        terminal=jnp.zeros((), bool),
        winner=jnp.zeros((), jnp.int8),
        num_moves=jnp.zeros((), jnp.int32),
    )


def init_batch(game: Game, batch_size: int) -> State:
    """B empty boards: `init(game)` with a leading (B,) on every leaf."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (batch_size, *x.shape)), init(game))


def step(game: Game, state: State, action: jax.Array) -> State:
    """The mover colours edge `action`; they lose if that completes a k-clique in their colour.

    Only the M = C(n-2,k-2) cliques through the new edge can have been completed, so the check
    reads M * C(k,2) colours, not the whole board. An illegal action (an edge already coloured,
    or an index outside [0, E)) and any action once the game is over leave the state unchanged:
    mask actions with `legal_actions` to make progress.

    Args:
      game: the static game description.
      state: the position before the move.
      action: () int, the edge to colour.

    Returns:
      The position after the move, with the other player to move.
    """
    mover = state.to_play
    in_range = (action >= 0) & (action < game.num_edges)
    edge = jnp.clip(action, 0, game.num_edges - 1)
    legal = in_range & ~state.terminal & (state.colours[edge] == 0)

    colours = state.colours.at[edge].set(mover)
    cliques = jnp.asarray(game.clique_edges)[jnp.asarray(game.edge_cliques)[edge]]  # (M, K) edge ids
    completed = jnp.any(jnp.all(colours[cliques] == mover, axis=1))  # some clique is all the mover's
    num_moves = state.num_moves + 1
    after = State(
        colours=colours,
        to_play=-mover,
        terminal=completed | (num_moves == game.num_edges),
        winner=jnp.where(completed, -mover, jnp.int8(0)),
        num_moves=num_moves,
    )
    return jax.tree.map(lambda new, old: jnp.where(legal, new, old), after, state)


def legal_actions(state: State) -> jax.Array:
    """(E,) bool, the uncoloured edges; all False once the game is over."""
    return (state.colours == 0) & ~state.terminal[..., None]


def reward(state: State, player: jax.Array | int) -> jax.Array:
    """() float32, the outcome for `player` (+1/-1): +1 win, -1 loss, 0 draw or not over yet."""
    return (state.winner * jnp.asarray(player, jnp.int8)).astype(jnp.float32)


def observation(state: State) -> jax.Array:
    """(E, 2) float32 from the mover's side: plane 0 marks the mover's edges, plane 1 the
    opponent's. The same board with the other player to move swaps the planes."""
    relative = state.colours * state.to_play[..., None]  # +1 mine, -1 theirs, 0 uncoloured
    return jnp.stack([relative == 1, relative == -1], axis=-1).astype(jnp.float32)
