"""AlphaZero's search in plain Python, one clique game at a time: the "before" of the self-play benchmark.

This is how self-play is usually first written: the rules in Python, a tree of node objects, and
one network call per expanded node, batch size 1. `jaxtrain.rl.clique` is the same game as pure JAX
functions, which a batched, jitted search can run for many games at once.

Each node keeps, for every edge a, its prior P(a), visit count N(a) and value sum W(a), the values
seen from the node's mover. A simulation descends from the root by PUCT,

    a* = argmax_a  Q(a) + c_puct P(a) sqrt(N) / (1 + N(a)),    Q(a) = W(a) / N(a) (0 while N(a) = 0),

where N = 1 + sum_a N(a) counts the node's own evaluation (as in mctx), until it leaves the tree.
The new node is evaluated by the network, or by the rules if the game is over there: the mover who
completed a clique has lost, so the new node's mover has won (+1); a full board is a draw (0). The
value, from the new node's mover's side, is backed up with its sign flipped at every level (the
game is two-player and zero-sum). The root is evaluated before the first simulation, and Dirichlet
noise can be mixed into its prior; the search returns the root's visit counts.

The network is any `net(observation) -> (logits, value)`: the (E, 2) float32 observation of
`clique.observation` (plane 0 the mover's edges, plane 1 the opponent's), E logits over edges (the
illegal ones are masked here) and a value in [-1, 1] for the mover.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import numpy as np

from jaxtrain._src.rl.clique import Game

Net = Callable[[np.ndarray], tuple[np.ndarray, float]]  # (E, 2) observation -> (E,) logits, value for the mover


class GameRecord(NamedTuple):
    """One self-play game.

    Attributes:
      steps: one `(observation, policy, player)` per move: the (E, 2) float32 observation before
        the move, the (E,) float32 visit-count distribution of its search, and the mover (+1/-1).
        The value target of a step is `winner * player`.
      actions: the edge coloured at each move.
      winner: +1 or -1, the player who did not complete a clique; 0 for a draw.
    """

    steps: list[tuple[np.ndarray, np.ndarray, int]]
    actions: list[int]
    winner: int


@functools.cache
def _cliques_through(game: Game) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """For each edge, the edge lists of the k-cliques through it, as Python tuples (fast to loop over)."""
    return tuple(
        tuple(tuple(int(x) for x in game.clique_edges[c]) for c in game.edge_cliques[e]) for e in range(game.num_edges)
    )


def completes_clique(game: Game, colours: list[int], edge: int, player: int) -> bool:
    """Whether `player`, having just coloured `edge` (already set in `colours`), owns a k-clique through it."""
    return any(all(colours[x] == player for x in clique) for clique in _cliques_through(game)[edge])


def observation(colours: list[int] | np.ndarray, to_play: int) -> np.ndarray:
    """(E, 2) float32 from the mover's side, as `clique.observation`: plane 0 the mover's edges, plane 1
    the opponent's."""
    relative = np.asarray(colours, np.int8) * np.int8(to_play)
    return np.stack([relative == 1, relative == -1], axis=-1).astype(np.float32)


class _Node:
    """A position in the tree with the statistics of its moves, from its mover's side.

    `children[a]` is the node after move a, or a float once that move ends the game: the result
    for the mover there (+1 when move a completed a clique, 0 for a draw).
    """

    __slots__ = ("legal", "prior", "visits", "value_sum", "count", "children")

    def __init__(self, legal: np.ndarray, prior: np.ndarray):
        self.legal = legal  # (E,) bool
        self.prior = prior  # (E,) float64, 0 on illegal moves
        self.visits = np.zeros(len(prior), np.int64)  # N(a)
        self.value_sum = np.zeros(len(prior))  # W(a)
        self.count = 1  # N = 1 + sum_a N(a): the node's own evaluation and every simulation through it
        self.children: dict[int, _Node | float] = {}


def _evaluate(net: Net, colours: list[int], to_play: int) -> tuple[_Node, float]:
    """A new node for a live position, with the network's prior (softmax over legal moves) and value."""
    legal = np.asarray(colours) == 0
    logits, value = net(observation(colours, to_play))
    logits = np.where(legal, np.asarray(logits, np.float64), -np.inf)
    prior = np.exp(logits - logits.max())
    return _Node(legal, prior / prior.sum()), float(value)


def _select(node: _Node, c_puct: float) -> int:
    """The PUCT move: argmax_a Q(a) + c_puct P(a) sqrt(N) / (1 + N(a)); the lowest edge on ties."""
    q = np.divide(node.value_sum, node.visits, out=np.zeros_like(node.value_sum), where=node.visits > 0)
    u = c_puct * node.prior * math.sqrt(node.count) / (1 + node.visits)
    return int(np.argmax(np.where(node.legal, q + u, -np.inf)))


def _simulate(game: Game, net: Net, root: _Node, colours: list[int], to_play: int, c_puct: float) -> None:
    """One simulation: descend by PUCT, expand one node (or reach the end of the game), back up."""
    colours = list(colours)
    node, player, free = root, to_play, colours.count(0)
    path = []
    while True:
        action = _select(node, c_puct)
        path.append((node, action))
        colours[action] = player
        free -= 1
        child = node.children.get(action)
        if child is None:  # leaves the tree: expand
            if completes_clique(game, colours, action, player):
                child = value = 1.0  # the player who moved lost: the next mover has won
            elif free == 0:
                child = value = 0.0  # a full board without a clique: a draw
            else:
                child, value = _evaluate(net, colours, -player)
            node.children[action] = child
            break
        if not isinstance(child, _Node):  # the game is over there
            value = child
            break
        node, player = child, -player
    # `value` is for the mover of the last position reached; each parent's mover is the other player.
    for node, action in reversed(path):
        value = -value
        node.visits[action] += 1
        node.value_sum[action] += value
        node.count += 1


def _search(
    game: Game,
    colours: list[int],
    to_play: int,
    net: Net,
    simulations: int,
    rng: np.random.Generator,
    c_puct: float,
    dirichlet_alpha: float | None,
    dirichlet_fraction: float,
) -> np.ndarray:
    root, _ = _evaluate(net, colours, to_play)
    if dirichlet_alpha is not None:
        legal = np.flatnonzero(root.legal)
        noise = rng.dirichlet(np.full(len(legal), dirichlet_alpha))
        root.prior[legal] = (1 - dirichlet_fraction) * root.prior[legal] + dirichlet_fraction * noise
    for _ in range(simulations):
        _simulate(game, net, root, colours, to_play, c_puct)
    return root.visits


def search(
    game: Game,
    colours: list[int] | np.ndarray,
    to_play: int,
    net: Net,
    simulations: int,
    rng: np.random.Generator,
    c_puct: float = 1.25,
    dirichlet_alpha: float | None = None,
    dirichlet_fraction: float = 0.25,
) -> np.ndarray:
    """AlphaZero's search (PUCT) from one live position.

    Args:
      game: the clique game.
      colours: (E,) the board, 0 for an uncoloured edge, else the player (+1/-1) who coloured it.
      to_play: the player to move, +1 or -1.
      net: `net(observation) -> (logits, value)`, called once for the root and once per expanded
        live node (at most `simulations + 1` calls).
      simulations: the number of simulations (>= 1); the visit counts sum to it.
      rng: draws the Dirichlet noise.
      c_puct: the weight of the prior against the mean value.
      dirichlet_alpha: when set, the root's prior becomes (1 - f) P + f Dir(alpha) over the legal
        moves, with f = `dirichlet_fraction` (AlphaZero: alpha about 10 / E, f = 0.25).
      dirichlet_fraction: f above.

    Returns:
      (E,) int64, the root's visit counts; 0 on coloured edges.

    Raises:
      ValueError: for a board of the wrong size or content, a finished game, or simulations < 1.
    """
    colours = [int(c) for c in np.asarray(colours).ravel()]
    board = np.asarray(colours)
    if board.shape != (game.num_edges,) or not np.isin(board, (-1, 0, 1)).all():
        raise ValueError(f"colours must be {game.num_edges} values in {{-1, 0, 1}}, got shape {board.shape}")
    if to_play not in (-1, 1):
        raise ValueError(f"to_play must be +1 or -1, got {to_play}")
    if simulations < 1:
        raise ValueError(f"simulations must be at least 1, got {simulations}")
    on_cliques = board[game.clique_edges]  # (C, K)
    if (on_cliques == 1).all(axis=1).any() or (on_cliques == -1).all(axis=1).any() or 0 not in colours:
        raise ValueError("the game is over at this position: a player owns a k-clique or no edge is left")
    return _search(game, colours, to_play, net, simulations, rng, c_puct, dirichlet_alpha, dirichlet_fraction)


def _sample(visits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """A move with probability proportional to N(a)^(1/T); the most visited (random among ties) at T = 0."""
    if temperature == 0:
        return int(rng.choice(np.flatnonzero(visits == visits.max())))
    weights = (visits / visits.max()) ** (1 / temperature)  # scaled first: no overflow at small T
    return int(rng.choice(len(visits), p=weights / weights.sum()))


def play_game(
    game: Game,
    net: Net,
    simulations: int,
    rng: np.random.Generator,
    c_puct: float = 1.25,
    temperature: float = 1.0,
    dirichlet_alpha: float | None = None,
    dirichlet_fraction: float = 0.25,
) -> GameRecord:
    """One self-play game from the empty board: a fresh `search` before every move (no tree reuse).

    Args:
      game: the clique game.
      net: as in `search`.
      simulations: simulations per move.
      rng: draws the noise and the moves.
      c_puct, dirichlet_alpha, dirichlet_fraction: as in `search`.
      temperature: moves are drawn with probability proportional to N(a)^(1/T); 0 plays the most
        visited move.

    Returns:
      The game's steps, moves and winner.
    """
    if simulations < 1:
        raise ValueError(f"simulations must be at least 1, got {simulations}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    colours, to_play = [0] * game.num_edges, 1
    steps, actions = [], []
    while True:
        visits = _search(game, colours, to_play, net, simulations, rng, c_puct, dirichlet_alpha, dirichlet_fraction)
        steps.append((observation(colours, to_play), (visits / visits.sum()).astype(np.float32), to_play))
        action = _sample(visits, temperature, rng)
        actions.append(action)
        colours[action] = to_play
        if completes_clique(game, colours, action, to_play):
            return GameRecord(steps, actions, winner=-to_play)
        if len(actions) == game.num_edges:
            return GameRecord(steps, actions, winner=0)
        to_play = -to_play
