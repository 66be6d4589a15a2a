"""The clique game (jaxtrain.rl.clique) against brute force over all k-subsets of vertices."""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtrain._src import rl
from jaxtrain._src.rl import Game, init, init_batch, legal_actions, observation, reward, step

B = 256  # random games per (n, k): one compile each, shared by the tests below


def test_public_names_are_pinned_and_sorted():
    assert rl.__all__ == sorted(rl.__all__)
    assert set(rl.__all__) == {
        "Arena", "Game", "PolicyValueMLP", "ReplayBuffer", "ReplayFeed", "SearchConfig", "SelfPlay", "State",
        "alphazero_loss", "init", "init_batch", "legal_actions", "make_forward", "make_search", "make_self_play",
        "make_symmetry_augment", "observation", "reward", "step"}


@pytest.mark.parametrize("n, k", [(4, 2), (5, 3), (6, 3), (6, 4), (8, 4), (9, 5), (14, 4)])
def test_tables(n, k):
    game = Game(n, k)
    num_edges, num_cliques, per_clique = math.comb(n, 2), math.comb(n, k), math.comb(k, 2)
    assert game.num_edges == num_edges
    assert [tuple(e) for e in game.edges] == list(itertools.combinations(range(n), 2))
    assert game.clique_edges.shape == (num_cliques, per_clique)
    assert game.edge_cliques.shape == (num_edges, math.comb(n - 2, k - 2))
    # Each row of clique_edges spans exactly k vertices, all rows differ, and edge_cliques is its inverse.
    vertices = {frozenset(game.edges[row].ravel()) for row in game.clique_edges}
    assert len(vertices) == num_cliques and all(len(v) == k for v in vertices)
    for e in range(num_edges):
        containing = {c for c in range(num_cliques) if e in game.clique_edges[c]}
        assert set(game.edge_cliques[e]) == containing
    assert all(game.edge_index[i, j] == game.edge_index[j, i] == e for e, (i, j) in enumerate(game.edges))


def test_game_is_static_and_validated():
    assert Game(6, 3) == Game(6, 3) and hash(Game(6, 3)) == hash(Game(6, 3)) and Game(6, 3) != Game(6, 4)
    with pytest.raises(ValueError, match="2 <= k <= n"):
        Game(3, 4)


@functools.cache
def random_playout(n: int, k: int):
    """A jitted function: (B, E, E) uniform noise -> (B final states, (B, E) actions). Ply t plays
    the legal edge with the largest noise[:, t] (uniform over legal moves); once a game is over its
    mask is empty and the action, edge 0, is a no-op. Noise rather than jax.random halves the compile."""
    game = Game(n, k)

    def one_game(noise):
        def ply(state, u):
            action = jnp.argmax(jnp.where(legal_actions(state), u, -1.0))
            return step(game, state, action), action

        return jax.lax.scan(ply, init(game), noise)

    return jax.jit(jax.vmap(one_game))


def noise(n: int, seed: int) -> np.ndarray:
    num_edges = math.comb(n, 2)
    return np.random.default_rng(seed).random((B, num_edges, num_edges), np.float32)


def reference_playout(n: int, k: int, actions: np.ndarray) -> dict[str, np.ndarray]:
    """The rules in NumPy on a (B, n, n) board: after each move, the mover loses if any k-subset of
    vertices is all in their colour. An action on a coloured edge, or after the end, is skipped."""
    ends = np.array(list(itertools.combinations(range(n), 2)))
    subsets = [list(itertools.combinations(s, 2)) for s in itertools.combinations(range(n), k)]
    num_games, rows = len(actions), np.arange(len(actions))
    board = np.zeros((num_games, n, n), np.int8)
    mover = np.ones(num_games, np.int8)
    over, winner, moves = np.zeros(num_games, bool), np.zeros(num_games, np.int8), np.zeros(num_games, int)
    for t in range(actions.shape[1]):
        i, j = ends[actions[:, t]].T
        move = ~over & (board[rows, i, j] == 0)
        assert np.array_equal(move, ~over), "the sampler picked an illegal move before the end"
        board[rows[move], i[move], j[move]] = board[rows[move], j[move], i[move]] = mover[move]
        lost = np.zeros(num_games, bool)
        for pairs in subsets:
            lost |= np.all([board[:, a, b] == mover for a, b in pairs], axis=0)
        lost &= move
        moves += move
        winner[lost] = -mover[lost]
        over |= lost | (moves == len(ends))
        mover = np.where(move, -mover, mover)
    return {"terminal": over, "winner": winner, "num_moves": moves, "colours": board[:, ends[:, 0], ends[:, 1]]}


@pytest.mark.parametrize("n, k", [(n, k) for n in range(5, 9) for k in (3, 4)])
def test_end_of_game_matches_brute_force(n, k):
    final, actions = random_playout(n, k)(noise(n, seed=n * 10 + k))
    expected = reference_playout(n, k, np.asarray(actions))
    for name, value in expected.items():
        np.testing.assert_array_equal(np.asarray(getattr(final, name)), value, err_msg=name)
    assert np.all(expected["terminal"])
    if k == 3 and n >= 6:  # R(3,3) = 6: no draws
        assert np.all(expected["winner"] != 0)
    if math.comb(k, 2) > (math.comb(n, 2) + 1) // 2:  # a k-clique needs more edges than a player gets
        assert np.all(expected["winner"] == 0)
    if (n, k) in [(5, 3), (7, 4), (8, 4)]:  # draws and both losers all occur under random play
        assert set(expected["winner"]) == {-1, 0, 1}
    np.testing.assert_array_equal(reward(final, 1), expected["winner"])
    np.testing.assert_array_equal(reward(final, -1), -expected["winner"])
    assert not np.any(legal_actions(final))


def test_sim_never_draws():
    """n=6, k=3: random games always end with a loser, and so does every 8/7 colouring of K6."""
    final, _ = random_playout(6, 3)(noise(6, seed=1))
    assert np.all(np.asarray(final.terminal)) and np.all(np.asarray(final.winner) != 0)
    assert np.all(np.asarray(final.num_moves) <= 15)

    edges = list(itertools.combinations(range(6), 2))
    colourings = np.ones((math.comb(15, 7), 15), np.int8)  # first player's 8 edges +1
    for row, second in enumerate(itertools.combinations(range(15), 7)):
        colourings[row, list(second)] = -1  # second player's 7 edges
    triangles = [[edges.index(p) for p in itertools.combinations(t, 2)] for t in itertools.combinations(range(6), 3)]
    mono = np.stack([np.abs(colourings[:, t].sum(axis=1)) == 3 for t in triangles], axis=1)  # (6435, 20)
    assert np.all(mono.any(axis=1))
    game_mono = np.abs(colourings[:, Game(6, 3).clique_edges].sum(axis=-1)) == 3  # same check via the tables
    np.testing.assert_array_equal(np.sort(game_mono, axis=1), np.sort(mono, axis=1))


def paley_colouring_of_k14() -> np.ndarray:
    """(91,) +1/-1 colouring of K14 with no monochromatic K4: 46 edges +1 and 45 edges -1.

    The Paley graph on Z_17 (i ~ j when i - j is a square mod 17) has no K4 and no independent set
    of 4, so the restriction to any 14 vertices, with non-edges in the other colour, has no
    monochromatic K4. Dropping vertices {0, 1, 3}, which span 2 Paley edges (differences 1 and 2
    are squares, 3 is not), leaves 68 - 3 * 8 + 2 = 46 Paley edges out of 91.
    """
    squares = {x * x % 17 for x in range(1, 17)}
    kept = [v for v in range(17) if v not in (0, 1, 3)]
    colours = np.array([1 if (a - b) % 17 in squares else -1 for a, b in itertools.combinations(kept, 2)], np.int8)
    return colours


def test_draw_is_possible_for_n14_k4():
    game = Game(14, 4)
    colours = paley_colouring_of_k14()
    assert (np.sum(colours == 1), np.sum(colours == -1)) == (46, 45)
    edges = list(itertools.combinations(range(14), 2))
    for quad in itertools.combinations(range(14), 4):  # brute force: no monochromatic K4
        assert abs(sum(colours[edges.index(p)] for p in itertools.combinations(quad, 2))) < 6

    rng = np.random.default_rng(0)
    first, second = rng.permutation(np.flatnonzero(colours == 1)), rng.permutation(np.flatnonzero(colours == -1))
    order = np.empty(91, np.int32)
    order[0::2], order[1::2] = first, second  # +1, -1, +1, ..., +1

    def ply(state, action):
        state = step(game, state, action)
        return state, state.terminal

    final, terminal = jax.jit(lambda actions: jax.lax.scan(ply, init(game), actions))(order)
    assert not np.any(terminal[:-1]) and bool(final.terminal)
    assert int(final.winner) == 0 and int(final.num_moves) == 91
    np.testing.assert_array_equal(final.colours, colours)
    assert float(reward(final, 1)) == float(reward(final, -1)) == 0.0


GAME = Game(6, 3)
jit_step = jax.jit(step, static_argnums=0)


def play(actions) -> rl.State:
    state = init(GAME)
    for a in actions:
        state = jit_step(GAME, state, int(a))  # Python ints: one compile, not one per dtype
    return state


def assert_same(a: rl.State, b: rl.State) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


def test_illegal_moves_and_moves_after_the_end_are_no_ops():
    state = play([0, 1])
    for action in [0, 1, -1, GAME.num_edges, 10**6]:  # coloured, out of range
        assert_same(jit_step(GAME, state, action), state)
    # Player +1 colours edges (0,1), (0,2), (1,2): a triangle on the third of their moves.
    e = GAME.edge_index
    over = play([e[0, 1], e[3, 4], e[0, 2], e[3, 5], e[1, 2]])
    assert bool(over.terminal) and int(over.winner) == -1 and int(over.num_moves) == 5
    assert not np.any(legal_actions(over))
    free = int(np.flatnonzero(np.asarray(over.colours) == 0)[0])
    assert_same(jit_step(GAME, over, free), over)


def test_legal_actions_and_observation_flip_with_the_mover():
    state = play([3])  # +1 coloured edge 3, -1 to move
    assert int(state.to_play) == -1
    np.testing.assert_array_equal(legal_actions(state), np.arange(15) != 3)
    obs = observation(state)
    assert obs.shape == (15, 2) and obs.dtype == jnp.float32
    np.testing.assert_array_equal(obs[3], [0, 1])  # the opponent's edge
    state = jit_step(GAME, state, 7)  # -1 coloured edge 7, +1 to move
    obs = observation(state)
    np.testing.assert_array_equal(obs[3], [1, 0])
    np.testing.assert_array_equal(obs[7], [0, 1])
    assert obs.sum() == 2
    flipped = observation(state._replace(to_play=-state.to_play))
    np.testing.assert_array_equal(flipped, obs[:, ::-1])


def test_vmapped_step_matches_one_game_at_a_time_and_does_not_retrace():
    traces = []

    def counted(states, actions):
        traces.append(1)
        return jax.vmap(functools.partial(step, GAME))(states, actions)

    batched_step = jax.jit(counted)
    states = init_batch(GAME, 4)
    for actions in [[0, 1, 2, 3], [0, 5, 2, 3], [4, 1, -1, 14]]:  # some repeat an edge: no-ops
        expected = [jit_step(GAME, jax.tree.map(lambda x: x[b], states), a) for b, a in enumerate(actions)]
        states = batched_step(states, jnp.array(actions))
        for b in range(4):
            assert_same(jax.tree.map(lambda x: x[b], states), expected[b])
    assert len(traces) == 1
    np.testing.assert_array_equal(states.num_moves, [2, 2, 1, 2])
    assert observation(states).shape == (4, 15, 2) and legal_actions(states).shape == (4, 15)
