"""The exact solver (jaxtrain.rl.solver) against a plain-Python memoised minimax written here from the rules.

The reference knows nothing of the solver's tables: it numbers edges in itertools.combinations order,
finds a completed clique by trying every k-subset of vertices through the new edge, and compares
results as (outcome, moves to the end) with the winner preferring the shortest game and the loser the
longest. Tolerance: exact (integers).
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtrain._src.rl.clique import Game, State, init_batch, legal_actions, step
from jaxtrain._src.rl.solver import (
    UNREACHABLE,
    decode,
    first_player_value,
    index_of,
    position_index,
    solve,
    solver_policy,
)

SIM = Game(6, 3)
Board = tuple[int, ...]  # a colour (+1, -1, 0) per edge
NUM_POSITIONS = 300  # random reachable Sim positions checked against the reference


class Reference:
    """Minimax over boards as tuples of colours (+1, -1, 0 per edge), memoised in `self.memo`."""

    def __init__(self, n: int, k: int):
        self.n, self.k = n, k
        self.edges = list(itertools.combinations(range(n), 2))
        self.number = {edge: e for e, edge in enumerate(self.edges)}
        self.memo: dict[Board, tuple[int, int]] = {}

    def completes(self, board: Board, e: int, player: int) -> bool:
        """Whether `player` colouring edge e (already on `board`) completes a k-clique in their colour."""
        i, j = self.edges[e]
        others = [v for v in range(self.n) if v not in (i, j)]
        for rest in itertools.combinations(others, self.k - 2):
            vertices = sorted((i, j, *rest))
            if all(board[self.number[pair]] == player for pair in itertools.combinations(vertices, 2)):
                return True
        return False

    def result(self, board: Board, e: int, mover: int) -> tuple[int, int]:
        """(outcome for `mover`, moves to the end) of `mover` colouring the free edge e."""
        after = board[:e] + (mover,) + board[e + 1 :]
        if self.completes(after, e, mover):
            return -1, 1
        if 0 not in after:
            return 0, 1
        outcome, moves = self.value(after)
        return -outcome, moves + 1

    def value(self, board: Board) -> tuple[int, int]:
        """(outcome for the mover: +1, 0, -1; moves to the end) of a live position under perfect play."""
        if board not in self.memo:
            mover = 1 if board.count(1) == board.count(-1) else -1
            results = [self.result(board, e, mover) for e, c in enumerate(board) if c == 0]
            # Best first: a win over a draw over a loss; the shortest win, the longest loss.
            self.memo[board] = max(results, key=lambda r: (r[0], -r[1] if r[0] > 0 else r[1]))
        return self.memo[board]

    def index(self, board: Board) -> int:
        return sum({0: 0, 1: 1, -1: 2}[c] * 3**e for e, c in enumerate(board))


def random_positions(reference: Reference, count: int, seed: int) -> tuple[list[Board], list[Board]]:
    """`count` live boards reached by uniform random play stopped at a random ply in [6, E - 1], and
    the boards of the games among those that ended first (their last mover completed a clique)."""
    rng = np.random.default_rng(seed)
    num_edges = len(reference.edges)
    live, finished = [], []
    while len(live) < count:
        board, mover = (0,) * num_edges, 1
        for _ in range(rng.integers(6, num_edges)):
            e = int(rng.choice([e for e, c in enumerate(board) if c == 0]))
            board = board[:e] + (mover,) + board[e + 1 :]
            if reference.completes(board, e, mover):
                finished.append(board)
                break
            mover = -mover
        else:
            live.append(board)
    return live, finished


@pytest.fixture(scope="module")
def sim_table() -> np.ndarray:
    return solve(SIM)


@pytest.fixture(scope="module")
def sim_positions() -> tuple[Reference, list[Board], list[Board]]:
    reference = Reference(6, 3)
    live, finished = random_positions(reference, NUM_POSITIONS, seed=0)
    return reference, live, finished


def test_sim_is_a_second_player_win(sim_table):
    # An established result (Mead, Rosa & Huang 1974), independent of this code.
    assert first_player_value(sim_table) < 0
    assert decode(first_player_value(sim_table))[0] == -1
    assert sim_table.dtype == np.int8 and sim_table.shape == (3**15,) and not sim_table.flags.writeable


def test_sim_table_matches_minimax(sim_table, sim_positions):
    reference, live, finished = sim_positions
    for board in live:
        assert decode(sim_table[reference.index(board)]) == reference.value(board), board
    assert len(finished) > 20
    for board in finished:  # the player who just moved completed a clique: the mover has won, 0 moves to the end
        assert decode(sim_table[reference.index(board)]) == (1, 0), board


@pytest.mark.parametrize("n, k", [(4, 3), (5, 3), (5, 4)])
def test_every_reachable_position_of_small_games_matches_minimax(n, k):
    """All reachable live positions, draws included (R(3,3) = 6: K_4 and K_5 can end in a draw)."""
    reference = Reference(n, k)
    num_edges = len(reference.edges)
    reference.value((0,) * num_edges)  # fills the memo with every live position reachable from the start
    table = solve(Game(n, k))
    for board, (outcome, moves) in reference.memo.items():
        expected = (0, None) if outcome == 0 else (outcome, moves)
        assert decode(table[reference.index(board)]) == expected, board
    assert any(outcome == 0 for outcome, _ in reference.memo.values())  # draws are checked too
    # A board with the wrong counts is no position of the game.
    assert table[reference.index((1, 1) + (0,) * (num_edges - 2))] == UNREACHABLE


def test_position_index_and_index_of(sim_positions):
    reference, live, finished = sim_positions
    boards = live + finished
    expected = np.array([reference.index(board) for board in boards])
    colours = np.array(boards, np.int8)
    assert [position_index(SIM, c) for c in colours] == list(expected)
    np.testing.assert_array_equal(jax.jit(index_of, static_argnums=0)(SIM, jnp.asarray(colours)), expected)


def state_of(boards: list[Board]) -> State:
    colours = np.array(boards, np.int8)
    num_moves = (colours != 0).sum(axis=1)
    return State(
        colours=jnp.asarray(colours),
        to_play=jnp.asarray(np.where(num_moves % 2 == 0, 1, -1), jnp.int8),
        terminal=jnp.zeros(len(boards), bool),
        winner=jnp.zeros(len(boards), jnp.int8),
        num_moves=jnp.asarray(num_moves, jnp.int32),
    )


def test_policy_plays_a_best_legal_move(sim_table, sim_positions):
    reference, live, _ = sim_positions
    policy = jax.jit(jax.vmap(solver_policy(SIM, sim_table)))
    actions = np.asarray(policy(state_of(live), jax.random.split(jax.random.key(0), len(live))))
    wins = 0
    for board, action in zip(live, actions):
        assert board[action] == 0, (board, action)
        mover = 1 if board.count(1) == board.count(-1) else -1
        # The move's result equals the position's value: a winning move when one exists (the
        # quickest), else the longest defence.
        assert reference.result(board, int(action), mover) == reference.value(board), (board, action)
        wins += reference.value(board)[0] == 1
    assert 20 < wins < len(live) - 20  # both winning and losing positions are checked


def test_policy_as_second_player_beats_random_play(sim_table):
    num_games = 200
    policy = jax.vmap(solver_policy(SIM, sim_table))

    @jax.jit
    def play(key: jax.Array) -> tuple[State, jax.Array]:
        def ply(states, key):
            random_key, policy_key = jax.random.split(key)
            uniform = jax.random.uniform(random_key, states.colours.shape)
            random_move = jnp.argmax(jnp.where(legal_actions(states), uniform, -1.0), axis=1)
            solver_move = policy(states, jax.random.split(policy_key, num_games))
            actions = jnp.where(states.to_play == 1, random_move, solver_move)
            legal = jnp.take_along_axis(legal_actions(states), actions[:, None], axis=1)[:, 0]
            return jax.vmap(functools.partial(step, SIM))(states, actions), legal | states.terminal

        return jax.lax.scan(ply, init_batch(SIM, num_games), jax.random.split(key, SIM.num_edges))

    final, legal = play(jax.random.key(1))
    assert bool(jnp.all(legal)), "a move of a live game was illegal"
    assert bool(jnp.all(final.terminal)) and bool(jnp.all(final.winner == -1))


def test_policy_in_a_finished_game_returns_the_no_op(sim_table):
    # +1 has just completed the triangle 0-1-2 (edges 0, 1, 5): the game is over, no move is legal.
    board = (1, 1, -1, -1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    states = state_of([board])._replace(terminal=jnp.ones(1, bool), winner=jnp.full(1, -1, jnp.int8))
    action = jax.jit(jax.vmap(solver_policy(SIM, sim_table)))(states, jax.random.split(jax.random.key(0), 1))
    assert int(action[0]) == 0
    after = jax.jit(step, static_argnums=0)(SIM, jax.tree.map(lambda x: x[0], states), action[0])
    np.testing.assert_array_equal(after.colours, board)  # clique.step ignores it


def test_too_large_a_game_is_a_clear_error():
    with pytest.raises(ValueError, match=r"21 edges.*at most 15 edges"):
        solve(Game(7, 3))
    with pytest.raises(ValueError, match="at most 15 edges"):
        index_of(Game(7, 3), jnp.zeros(21, jnp.int8))
    with pytest.raises(ValueError, match=r"needs \(14348907,\)"):
        solver_policy(SIM, np.zeros(10, np.int8))
    with pytest.raises(ValueError, match="unreachable"):
        decode(UNREACHABLE)
