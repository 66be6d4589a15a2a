"""The AlphaZero workload: replay ring, search, self-play, evaluation matches and the recipe."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxtrain._src.rl import arena, clique, solver
from jaxtrain._src.rl.network import PolicyValueMLP, alphazero_loss, make_forward, relative_board
from jaxtrain._src.rl.replay import add, empty_ring
from jaxtrain._src.rl.search import SearchConfig, make_search
from jaxtrain._src.rl.selfplay import Positions, make_self_play

SIM = clique.Game(6, 3)


def _net(game=SIM, seed=0):
    model = PolicyValueMLP(game.num_edges, width=32, depth=2, rngs=nnx.Rngs(seed))
    return model, *make_forward(model)


@functools.cache
def _search(policy):
    """One compiled search per policy (16 simulations) over batches of 24, shared by the tests."""
    _, forward, variables = _net()
    return jax.jit(make_search(SIM, forward, SearchConfig(simulations=16, policy=policy))), variables


def _random_states(game, num, rng, moves_max=None):
    """Random non-terminal positions reached by random legal play."""
    states = []
    step = jax.jit(functools.partial(clique.step, game))
    while len(states) < num:
        state = clique.init(game)
        for _ in range(rng.integers(0, moves_max or game.num_edges)):
            legal = np.flatnonzero(np.asarray(clique.legal_actions(state)))
            nxt = step(state, rng.choice(legal))
            if bool(nxt.terminal):
                break
            state = nxt
        states.append(state)
    return jax.tree.map(lambda *xs: jnp.stack(xs), *states)


def test_ring_add_keeps_the_newest_valid_rows_in_order():
    rng = np.random.default_rng(0)
    capacity, E = 7, 3
    ring, reference = empty_ring(capacity, E), []  # reference: every valid row ever added, in order
    counter = 0
    for n in (4, 5, 9, 2, 20):
        valid = rng.random(n) < 0.6
        board = np.arange(counter, counter + n)[:, None].repeat(E, 1).astype(np.int8) % 100
        counter += n
        value = board[:, 0].astype(np.float32)
        positions = Positions(jnp.asarray(board), jnp.asarray(board, jnp.float32), jnp.asarray(value),
                              jnp.asarray(valid))
        ring = jax.jit(add)(ring, positions)
        reference += [v for v, ok in zip(value, valid) if ok]
        newest = reference[-capacity:]
        assert int(ring.size) == len(newest) and int(ring.added) == len(reference)
        # Slot of the i-th valid row ever added is i % capacity.
        start = len(reference) - len(newest)
        held = {(start + i) % capacity: v for i, v in enumerate(newest)}
        for slot, v in held.items():
            assert float(ring.value[slot]) == v and float(ring.policy[slot, 0]) == v
        assert int(ring.next) == len(reference) % capacity


@pytest.mark.parametrize("policy", ["gumbel", "muzero"])
def test_search_never_chooses_an_illegal_move_and_targets_only_legal_ones(policy):
    search, variables = _search(policy)
    states = _random_states(SIM, 24, np.random.default_rng(1))
    for explore in (True, False):
        out = search(variables, states, jax.random.key(2), explore)
        legal = np.asarray(clique.legal_actions(states))
        assert legal[np.arange(24), np.asarray(out.action)].all()
        weights = np.asarray(out.action_weights)
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
        assert (weights[~legal] == 0).all()


def _position(moves):
    state = clique.init(SIM)
    for move in moves:
        state = clique.step(SIM, state, SIM.edge_index[move])
    return state


def test_search_finds_the_only_safe_move_with_an_untrained_network():
    # +1 owns 0-1, 0-2, 1-3, 2-3, 4-5; -1 owns 0-3, 1-2, 0-4, 1-5 and is to move: several of -1's
    # moves complete a triangle of its own colour (and lose at once), others do not.
    moves = [(0, 1), (0, 3), (0, 2), (1, 2), (1, 3), (0, 4), (2, 3), (1, 5), (4, 5)]
    state = _position(moves)
    assert int(state.to_play) == -1
    legal = np.flatnonzero(np.asarray(clique.legal_actions(state)))
    losing = [a for a in legal if bool(clique.step(SIM, state, a).terminal)]
    safe = [a for a in legal if a not in losing]
    assert losing and safe  # the premise: some moves lose at once, some do not
    batch = jax.tree.map(lambda x: jnp.broadcast_to(x, (24, *x.shape)), state)  # the shape `_search` compiled for
    for policy in ("gumbel", "muzero"):
        search, variables = _search(policy)
        out = search(variables, batch, jax.random.key(0), False)
        assert set(np.asarray(out.action).tolist()) <= set(safe), policy


def test_self_play_positions_targets_and_outcomes_are_consistent():
    _, forward, variables = _net()
    B = 8
    positions, games = jax.jit(make_self_play(SIM, forward, SearchConfig(simulations=8), B))(variables,
                                                                                          jax.random.key(3))
    valid = np.asarray(positions.valid).reshape(SIM.num_edges, B)
    length, winner = np.asarray(games.length), np.asarray(games.winner)
    np.testing.assert_array_equal(valid.sum(0), length)  # one valid row per move played
    assert ((length >= 5) & (length <= 15)).all() and set(np.unique(winner)) <= {-1, 1}  # Sim: no draws
    board = np.asarray(positions.board).reshape(SIM.num_edges, B, -1)
    value = np.asarray(positions.value).reshape(SIM.num_edges, B)
    policy = np.asarray(positions.policy).reshape(SIM.num_edges, B, -1)
    for t in range(SIM.num_edges):
        mover = 1 if t % 2 == 0 else -1  # move t of a game in progress is the first player's when t is even
        rows = valid[t]
        np.testing.assert_array_equal(value[t][rows], (winner * mover)[rows])
        assert (np.abs(board[t][rows]).sum(-1) == t).all()  # t edges coloured before move t
        assert (policy[t][rows][board[t][rows] != 0] == 0).all()  # targets only on uncoloured edges
        np.testing.assert_allclose(policy[t][rows].sum(-1), 1.0, atol=1e-5)


@pytest.mark.xla_defaults
def test_debug_mode_plays_the_same_moves_without_jit():
    _, forward, variables = _net()
    play = make_self_play(SIM, forward, SearchConfig(simulations=2), 2, moves=1)
    compiled = jax.jit(play)(variables, jax.random.key(4))
    with jax.disable_jit():
        eager = play(variables, jax.random.key(4))
    np.testing.assert_array_equal(np.asarray(compiled[0].board), np.asarray(eager[0].board))
    np.testing.assert_allclose(np.asarray(compiled[0].policy), np.asarray(eager[0].policy), atol=1e-5)


def test_match_against_the_solver_and_random_players():
    _, forward, variables = _net()
    player, table = solver.solver_player(SIM)
    match = jax.jit(arena.make_match(SIM, forward, SearchConfig(simulations=4), 16, player))
    # The solver playing second wins every game against an untrained network (Sim is a second-player win).
    winner, length = match(variables, variables, table, arena.SOLVER, True, jax.random.key(5))
    assert arena.outcome(winner, length, True).loss == 1.0
    # The random opponent: both seats give finished games with a winner; a network that searches beats it often.
    for first in (True, False):
        winner, length = match(variables, variables, table, arena.RANDOM, first, jax.random.key(6))
        assert (np.asarray(length) >= 5).all() and set(np.unique(np.asarray(winner))) <= {-1, 1}


@pytest.mark.xla_defaults
def test_loss_masks_coloured_edges_and_matches_a_numpy_reference():
    model, _, _ = _net()
    rng = np.random.default_rng(7)
    board = rng.integers(-1, 2, size=(5, SIM.num_edges)).astype(np.int8)
    policy = rng.random((5, SIM.num_edges)).astype(np.float32) * (board == 0)
    policy /= policy.sum(-1, keepdims=True)
    value = rng.choice([-1.0, 1.0], size=5).astype(np.float32)
    loss, metrics = alphazero_loss(model, {"board": jnp.asarray(board), "policy": jnp.asarray(policy),
                                           "value": jnp.asarray(value)}, jax.random.key(0))
    logits, v = (np.asarray(x, np.float64) for x in model(jnp.asarray(np.stack([board == 1, board == -1], -1),
                                                                        jnp.float32)))
    ce = 0.0
    for row in range(5):  # log-softmax over the uncoloured edges only
        legal = board[row] == 0
        z = logits[row][legal]
        log_p = z - z.max() - np.log(np.exp(z - z.max()).sum())
        ce -= np.sum(policy[row][legal] * log_p) / 5
    np.testing.assert_allclose(float(metrics["policy_loss"]), ce, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["value_loss"]), np.mean((v - value) ** 2), rtol=1e-5)
    np.testing.assert_allclose(float(loss), ce + np.mean((v - value) ** 2), rtol=1e-5)


def test_relative_board_is_the_mover_view():
    state = _position([(0, 1), (2, 3)])  # +1 owns 0-1, -1 owns 2-3; +1 to move
    board = np.asarray(relative_board(state))
    assert board[SIM.edge_index[0, 1]] == 1 and board[SIM.edge_index[2, 3]] == -1


def test_symmetry_augment_keeps_the_solver_value_and_moves_targets_with_edges():
    from jaxtrain._src.rl.network import make_symmetry_augment

    table = solver.solve(SIM)
    states = _random_states(SIM, 32, np.random.default_rng(8))
    board = np.asarray(relative_board(states))  # (B, E) mover's view
    policy = np.eye(SIM.num_edges, dtype=np.float32)[np.arange(32) % SIM.num_edges]  # one-hot on an edge
    batch = {"board": jnp.asarray(board), "policy": jnp.asarray(policy), "value": jnp.zeros(32)}
    out = jax.jit(make_symmetry_augment(SIM))(batch, jax.random.key(9))
    new_board, new_policy = np.asarray(out["board"]), np.asarray(out["policy"])
    assert (new_board != board).any()  # relabelled, not copied
    for b in range(32):
        mover = 1 if (np.abs(board[b]).sum() % 2 == 0) else -1  # absolute colours: first player is +1
        before = solver.position_index(SIM, board[b] * mover)
        after = solver.position_index(SIM, new_board[b] * mover)
        assert table[before] == table[after]  # the same position under other vertex names
        # The target moved with its edge: the colour counts agree and the targeted edge's colour is kept.
        np.testing.assert_array_equal(np.sort(new_board[b]), np.sort(board[b]))
        assert new_board[b][new_policy[b].argmax()] == board[b][policy[b].argmax()]
