"""The policy/value network of the clique game and its AlphaZero loss.

The network reads a position from the mover's side (`clique.observation`: plane 0 the mover's
edges, plane 1 the opponent's) and returns move logits over the E edges and a value in [-1, 1],
the expected outcome for the player to move. Replay batches hold boards as int8 colours relative
to the mover (+1 mine, -1 theirs, 0 uncoloured), the search's policy targets and the game outcomes.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxtrain._src.rl import clique
from jaxtrain._src.state import split_params

Forward = Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]]  # (variables, (B, E, 2)) -> logits, value


class PolicyValueMLP(nnx.Module):
    """A residual MLP over the flattened board with a policy head and a tanh value head.

    Args:
      num_edges: E, the game's edges (the number of actions).
      width: hidden width.
      depth: hidden layers (the first maps the board to `width`; the others are residual).
      rngs: parameter initialisation.
    """

    def __init__(self, num_edges: int, width: int = 128, depth: int = 3, *, rngs: nnx.Rngs):
        self.stem = nnx.Linear(2 * num_edges, width, rngs=rngs)
        self.blocks = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth - 1)])
        self.policy = nnx.Linear(width, num_edges, rngs=rngs)
        self.value = nnx.Linear(width, 1, rngs=rngs)

    def __call__(self, observation: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(B, E, 2) observations → ((B, E) float32 logits, (B,) float32 values in [-1, 1])."""
        h = jax.nn.relu(self.stem(observation.reshape(*observation.shape[:-2], -1)))  # (B, W)
        for block in self.blocks:
            h = h + jax.nn.relu(block(h))
        value = jnp.tanh(self.value(h)[..., 0])
        return self.policy(h).astype(jnp.float32), value.astype(jnp.float32)


def make_forward(model: nnx.Module) -> tuple[Forward, Any]:
    """`(forward, variables)`: a pure `forward(variables, observation)` of `model` and its current
    variables `(params, model_state)`, split as `TrainState` splits them."""
    graphdef, params, rest = split_params(model)

    def forward(variables: Any, observation: jax.Array) -> tuple[jax.Array, jax.Array]:
        return nnx.merge(graphdef, *variables)(observation)

    return forward, (params, rest)


def board_observation(board: jax.Array) -> jax.Array:
    """(..., E) int8 boards relative to the mover → (..., E, 2) float32 observations."""
    return jnp.stack([board == 1, board == -1], axis=-1).astype(jnp.float32)


def relative_board(state: clique.State) -> jax.Array:
    """(..., E) int8: the board from the mover's side (+1 mine, -1 theirs, 0 uncoloured)."""
    return state.colours * state.to_play[..., None]


def masked_logits(logits: jax.Array, legal: jax.Array) -> jax.Array:
    """Illegal moves get the lowest finite logit (all-illegal rows stay finite: a uniform softmax)."""
    return jnp.where(legal, logits, jnp.finfo(logits.dtype).min)


def alphazero_loss(model: nnx.Module, batch: dict[str, jax.Array], key: jax.Array
                   ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Policy cross-entropy against the search's targets plus the value's squared error.

    `batch`: "board" (B, E) int8 relative boards, "policy" (B, E) float32 targets (zero on
    coloured edges), "value" (B,) float32 outcomes for the mover. Logits of coloured edges are
    masked, so the policy's mass is spread over legal moves only.
    """
    board = batch["board"]
    logits, value = model(board_observation(board))
    logits = masked_logits(logits, board == 0)
    policy_loss = optax.softmax_cross_entropy(logits, batch["policy"]).mean()
    value_loss = jnp.mean((value - batch["value"]) ** 2)
    target = batch["policy"]
    target_entropy = -jnp.sum(jnp.where(target > 0, target * jnp.log(jnp.where(target > 0, target, 1.0)), 0.0), -1)
    return policy_loss + value_loss, {"policy_loss": policy_loss, "value_loss": value_loss,
                                      "policy_kl": policy_loss - target_entropy.mean()}


def make_symmetry_augment(game: clique.Game):
    """`augment(batch, key) -> batch`: each position relabelled by its own random permutation of the
    n vertices, boards and policy targets alike (values are unchanged).

    Relabelling the vertices of K_n maps cliques to cliques, so the permuted position is the same
    game position seen under other vertex names, with the same value: n! views of every position
    (720 for Sim) for the network to agree on. Edge f = (i, j) of the new board takes the colour
    (and target) of edge (sigma(i), sigma(j)) of the old one.
    """
    edges, edge_index = jnp.asarray(game.edges), jnp.asarray(game.edge_index)

    def augment(batch: dict[str, jax.Array], key: jax.Array) -> dict[str, jax.Array]:
        B = batch["board"].shape[0]
        sigma = jnp.argsort(jax.random.uniform(key, (B, game.n)), axis=-1)  # (B, n) random permutations
        source = edge_index[sigma[:, edges[:, 0]], sigma[:, edges[:, 1]]]  # (B, E) the old edge of each new one
        take = lambda x: jnp.take_along_axis(x, source, axis=1)  # noqa: E731
        return {**batch, "board": take(batch["board"]), "policy": take(batch["policy"])}

    return augment
