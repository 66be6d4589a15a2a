"""The plain-Python AlphaZero search (benchmarks.python_mcts): it avoids losing moves and finds forced
wins in hand-built Sim positions, and its games follow the JAX rules of jaxtrain.rl.clique.

The positions' premises (which moves lose at once, which replies all lose) are checked here with a
triangle test written from the vertices, not with the module's clique tables."""

import itertools

import jax
import numpy as np
import pytest

from benchmarks.python_mcts import GameRecord, play_game, search
from jaxtrain._src.rl import clique

SIM = clique.Game(6, 3)
EDGES = list(itertools.combinations(range(6), 2))  # edge e joins EDGES[e]
SIMULATIONS = 400


def board(mine: list[tuple[int, int]], theirs: list[tuple[int, int]], mover: int) -> list[int]:
    """The colours of a Sim board where `mover` owns the edges `mine` and the other player `theirs`."""
    colours = [0] * len(EDGES)
    for edge in mine:
        colours[EDGES.index(edge)] = mover
    for edge in theirs:
        colours[EDGES.index(edge)] = -mover
    return colours


def loses_at_once(colours: list[int], e: int, player: int) -> bool:
    """Whether `player` colouring the free edge e makes a triangle in their colour."""
    i, j = EDGES[e]
    return any(
        colours[EDGES.index(tuple(sorted((i, v))))] == player and colours[EDGES.index(tuple(sorted((j, v))))] == player
        for v in range(6)
        if v not in (i, j)
    )


def uniform_net(observation: np.ndarray) -> tuple[np.ndarray, float]:
    return np.zeros(len(observation), np.float32), 0.0


def test_search_avoids_the_moves_that_lose_at_once():
    # The opponent owns the star at vertex 0; the mover owns 1-2, 1-3, 1-4, 3-5, 4-5. Of the free
    # edges 1-5, 2-3, 2-4, 2-5, 3-4, all but 2-5 close a triangle of the mover's through vertex 1.
    colours = board([(1, 2), (1, 3), (1, 4), (3, 5), (4, 5)], [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5)], mover=1)
    free = [e for e, c in enumerate(colours) if c == 0]
    safe = [e for e in free if not loses_at_once(colours, e, 1)]
    assert [EDGES[e] for e in safe] == [(2, 5)] and len(free) == 5
    visits = search(SIM, colours, 1, uniform_net, SIMULATIONS, np.random.default_rng(0))
    assert visits.sum() == SIMULATIONS and visits[[e for e, c in enumerate(colours) if c != 0]].sum() == 0
    assert visits[safe].sum() > 0.9 * SIMULATIONS, visits


def test_search_finds_the_move_after_which_every_reply_loses():
    # The mover (+1) owns 0-3, 0-4, 0-5, 1-2, 2-3; the opponent 0-2, 1-4, 2-4, 3-4, 4-5. Free: 0-1,
    # 1-3, 1-5, 2-5, 3-5. After 0-1 every reply closes an opponent triangle; 1-5 and 2-5 are safe for
    # now but lose later (the opponent then has a safe move), 1-3 and 3-5 lose at once.
    colours = board([(0, 3), (0, 4), (0, 5), (1, 2), (2, 3)], [(0, 2), (1, 4), (2, 4), (3, 4), (4, 5)], mover=1)
    win = EDGES.index((0, 1))
    after = colours.copy()
    after[win] = 1
    assert all(loses_at_once(after, e, -1) for e, c in enumerate(after) if c == 0)
    safe_for_now = [e for e, c in enumerate(colours) if c == 0 and e != win and not loses_at_once(colours, e, 1)]
    assert [EDGES[e] for e in safe_for_now] == [(1, 5), (2, 5)]
    for e in safe_for_now:  # the opponent has a reply that does not lose at once: no forced win in one reply
        after = colours.copy()
        after[e] = 1
        assert not all(loses_at_once(after, r, -1) for r, c in enumerate(after) if c == 0)
    visits = search(SIM, colours, 1, uniform_net, SIMULATIONS, np.random.default_rng(0))
    assert np.argmax(visits) == win and visits[win] > 0.5 * SIMULATIONS, visits


def random_net(seed: int):
    """A network with random logits and values (a fresh draw per call)."""
    rng = np.random.default_rng(seed)

    def net(observation: np.ndarray) -> tuple[np.ndarray, float]:
        assert observation.shape == (SIM.num_edges, 2) and observation.dtype == np.float32
        return rng.normal(size=SIM.num_edges).astype(np.float32), float(rng.uniform(-1, 1))

    return net


def replay(record: GameRecord) -> None:
    """Plays the record's moves in the JAX environment and checks every step and the outcome."""
    step = jax.jit(clique.step, static_argnums=0)
    state = clique.init(SIM)
    for t, ((observation, policy, player), action) in enumerate(zip(record.steps, record.actions)):
        assert not bool(state.terminal), f"the game was over before move {t}"
        legal = np.asarray(clique.legal_actions(state))
        assert legal[action], f"move {t} ({action}) is illegal"
        np.testing.assert_array_equal(observation, clique.observation(state))
        assert player == int(state.to_play)
        assert policy.dtype == np.float32 and abs(policy.sum() - 1) < 1e-6 and policy[~legal].sum() == 0
        state = step(SIM, state, action)
    assert bool(state.terminal) and int(state.winner) == record.winner


@pytest.mark.parametrize("seed", [0, 1])
def test_a_self_play_game_follows_the_jax_rules(seed):
    record = play_game(SIM, random_net(seed), 32, np.random.default_rng(seed), dirichlet_alpha=0.3)
    assert len(record.steps) == len(record.actions) >= 5 and record.winner in (-1, 1)  # Sim never draws
    replay(record)


def test_self_play_is_deterministic_given_the_seeds():
    first, second = (play_game(SIM, random_net(2), 16, np.random.default_rng(3), dirichlet_alpha=0.3) for _ in "ab")
    assert first.actions == second.actions and first.winner == second.winner
    for a, b in zip(first.steps, second.steps):
        np.testing.assert_array_equal(a[1], b[1])


def test_the_network_is_called_once_per_expanded_live_node():
    calls = []

    def counting_net(observation):
        calls.append(observation)
        return uniform_net(observation)

    visits = search(SIM, [0] * SIM.num_edges, 1, counting_net, 50, np.random.default_rng(0))
    # From the empty board no game ends within 3 moves, and every simulation expands one new node.
    assert visits.sum() == 50 and len(calls) == 51


def test_bad_positions_are_clear_errors():
    rng = np.random.default_rng(0)
    over = board([(0, 1), (0, 2), (1, 2)], [(3, 4), (3, 5)], mover=1)  # +1 owns the triangle 0-1-2
    with pytest.raises(ValueError, match="the game is over"):
        search(SIM, over, -1, uniform_net, 8, rng)
    with pytest.raises(ValueError, match="15 values"):
        search(SIM, [0] * 10, 1, uniform_net, 8, rng)
    with pytest.raises(ValueError, match="to_play"):
        search(SIM, [0] * 15, 0, uniform_net, 8, rng)
    with pytest.raises(ValueError, match="simulations"):
        search(SIM, [0] * 15, 1, uniform_net, 0, rng)
