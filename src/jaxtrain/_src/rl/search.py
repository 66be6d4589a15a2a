"""Batched Monte-Carlo tree search over the clique game with DeepMind's `mctx`.

A search runs on B positions at once inside one compiled program. The tree's embeddings are
game states; `recurrent_fn` steps the game and evaluates the network. Values are from the
point of view of the player to move, so the discount between a move and the next position's
value is -1 (the other player moves next) and 0 once the game has ended; the reward of a move is
the outcome for its mover (in the clique game -1 when the move completes a clique of the
mover's colour). Illegal moves are masked at the root (`invalid_actions`) and in every
expanded node (their prior logits set to the lowest finite value).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp
import mctx

from jaxtrain._src.rl import clique
from jaxtrain._src.rl.network import Forward, masked_logits

POLICIES = ("gumbel", "muzero")


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """How each move is searched."""

    simulations: int = 32
    """Simulations per move (network evaluations per game per move)."""
    policy: Literal["gumbel", "muzero"] = "gumbel"
    """gumbel: Gumbel MuZero (sequential halving over sampled actions, improved-policy targets;
    strong with few simulations); muzero: PUCT with Dirichlet noise at the root, visit-count targets."""
    max_considered_actions: int = 16
    """Gumbel: actions sampled at the root before sequential halving."""
    dirichlet_alpha: float = 0.3
    """MuZero: Dirichlet noise concentration at the root (self-play only)."""
    dirichlet_fraction: float = 0.25
    """MuZero: weight of the noise in the root prior (self-play only)."""


def make_search(game: clique.Game, forward: Forward, config: SearchConfig):
    """`search(variables, states, key, explore=True) -> mctx.PolicyOutput` over a batch of B states.

    With `explore` (self-play; a Python or traced bool), Gumbel samples its root actions with
    Gumbel noise and MuZero adds Dirichlet noise and samples its move from the visit counts;
    without it (evaluation) the search is deterministic given its inputs: Gumbel without noise,
    MuZero's most-visited move.
    """

    def root(variables: Any, states: clique.State) -> mctx.RootFnOutput:
        logits, value = forward(variables, clique.observation(states))
        return mctx.RootFnOutput(prior_logits=masked_logits(logits, clique.legal_actions(states)), value=value,
                                 embedding=states)

    def recurrent_fn(variables: Any, key: jax.Array, action: jax.Array, states: clique.State
                     ) -> tuple[mctx.RecurrentFnOutput, clique.State]:
        after = jax.vmap(functools.partial(clique.step, game))(states, action)
        logits, value = forward(variables, clique.observation(after))
        mover_reward = jax.vmap(clique.reward)(after, states.to_play)
        output = mctx.RecurrentFnOutput(
            reward=jnp.where(states.terminal, 0.0, mover_reward),  # a finished game earns nothing more
            discount=jnp.where(after.terminal, 0.0, -1.0),
            prior_logits=masked_logits(logits, clique.legal_actions(after)),
            value=jnp.where(after.terminal, 0.0, value),
        )
        return output, after

    def search(variables: Any, states: clique.State, key: jax.Array, explore: Any = True) -> mctx.PolicyOutput:
        invalid = ~clique.legal_actions(states)
        invalid = invalid & ~jnp.all(invalid, axis=-1, keepdims=True)  # a finished game: any move (a no-op)
        noise = jnp.where(explore, 1.0, 0.0)
        if config.policy == "gumbel":
            return mctx.gumbel_muzero_policy(
                variables, key, root(variables, states), recurrent_fn, config.simulations, invalid_actions=invalid,
                max_num_considered_actions=config.max_considered_actions, gumbel_scale=noise)
        output = mctx.muzero_policy(
            variables, key, root(variables, states), recurrent_fn, config.simulations, invalid_actions=invalid,
            dirichlet_fraction=config.dirichlet_fraction * noise, dirichlet_alpha=config.dirichlet_alpha)
        most_visited = jnp.argmax(output.action_weights, axis=-1).astype(output.action.dtype)
        return output.replace(action=jnp.where(explore, output.action, most_visited))

    if config.policy not in POLICIES:
        raise ValueError(f"policy={config.policy!r} must be one of {POLICIES}")
    return search
