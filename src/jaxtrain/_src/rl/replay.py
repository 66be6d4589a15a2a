"""A replay buffer on the device and the feed that trains from it.

The buffer is a ring of C positions held as device arrays; self-play appends each batch of
games' valid positions (the oldest are overwritten once it is full). `ReplayBuffer` is what a
user hands `fit` as its training data: `fit` asks it for its feed (`make_feed`), a `ReplayFeed`
whose compiled calls sample every step's batch uniformly from the filled part of the ring,
inside the call, with a key folded from the run's data key and the global step (so batches do
not depend on how steps are grouped into calls, and a resumed run draws the same ones). The
ring's arrays are part of every checkpoint (`Feed.arrays`).

An "epoch" of such a run is one iteration: new games (a hook such as
`jaxtrain.rl.hooks.SelfPlay` adds them at its start), then `steps_per_epoch` updates.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain._src.config import TrainConfig
from jaxtrain._src.data.arrays import Placement
from jaxtrain._src.errors import ConfigError, setting
from jaxtrain._src.rl.selfplay import Positions
from jaxtrain._src.sharding import Layout


class Ring(NamedTuple):
    """The buffer's arrays (C positions of E edges).

    Attributes:
      board: (C, E) int8 boards from the mover's side.
      policy: (C, E) float32 policy targets.
      value: (C,) float32 value targets.
      size: () int32, positions held (at most C).
      next: () int32, where the next position is written.
      added: () int32, positions added since the start (the ring holds the newest `size`).
    """

    board: jax.Array
    policy: jax.Array
    value: jax.Array
    size: jax.Array
    next: jax.Array
    added: jax.Array


def empty_ring(capacity: int, num_edges: int) -> Ring:
    return Ring(board=jnp.zeros((capacity, num_edges), jnp.int8), policy=jnp.zeros((capacity, num_edges), jnp.float32),
                value=jnp.zeros((capacity,), jnp.float32), size=jnp.zeros((), jnp.int32),
                next=jnp.zeros((), jnp.int32), added=jnp.zeros((), jnp.int32))


def add(ring: Ring, positions: Positions) -> Ring:
    """`ring` with the valid rows of `positions` appended in order, the oldest overwritten when full.

    Pure and jittable: valid rows are compacted by a prefix sum and scattered to their ring slots
    (invalid rows, and all but the newest C valid rows, to an out-of-range slot that is dropped).
    """
    capacity = ring.board.shape[0]
    valid = positions.valid
    n = jnp.sum(valid, dtype=jnp.int32)
    rank = jnp.cumsum(valid, dtype=jnp.int32) - 1  # (N,) order among the valid rows
    keep = valid & (rank >= n - capacity)
    slot = jnp.where(keep, (ring.next + rank) % capacity, capacity)

    def put(old: jax.Array, new: jax.Array) -> jax.Array:
        return old.at[slot].set(new.astype(old.dtype), mode="drop")

    return Ring(board=put(ring.board, positions.board), policy=put(ring.policy, positions.policy),
                value=put(ring.value, positions.value), size=jnp.minimum(ring.size + n, capacity),
                next=(ring.next + n) % capacity, added=ring.added + n)


def sample(ring: Ring, key: jax.Array, batch_size: int) -> dict[str, jax.Array]:
    """A batch of `batch_size` positions drawn uniformly (with replacement) from the filled ring."""
    index = jax.random.randint(key, (batch_size,), 0, jnp.maximum(ring.size, 1))
    return {"board": ring.board[index], "policy": ring.policy[index], "value": ring.value[index]}


class ReplayBuffer:
    """Training data made during the run: pass it to `fit` as `train_data`.

    Args:
      capacity: C, positions the ring holds.
      num_edges: E, the row width (the game's number of edges).
    """

    def __init__(self, capacity: int, num_edges: int):
        if capacity < 1 or num_edges < 1:
            raise ConfigError(f"replay buffer capacity={capacity} and num_edges={num_edges} must be >= 1")
        self.capacity, self.num_edges = capacity, num_edges

    def abstract_batch(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
        """A batch as `fit`'s input checks see it."""
        E = self.num_edges
        return {"board": jax.ShapeDtypeStruct((batch_size, E), jnp.int8),
                "policy": jax.ShapeDtypeStruct((batch_size, E), jnp.float32),
                "value": jax.ShapeDtypeStruct((batch_size,), jnp.float32)}

    def make_feed(self, config: TrainConfig, data_key: jax.Array, layout: Layout) -> "ReplayFeed":
        return ReplayFeed(self, config, data_key, layout)


class ReplayFeed:
    """The `feeds.Feed` of a `ReplayBuffer`: batches sampled from the device ring inside each call."""

    fingerprint = None  # data made in the run: no training set for a resume to compare

    def __init__(self, buffer: ReplayBuffer, config: TrainConfig, data_key: jax.Array, layout: Layout):
        if layout.num_devices > 1:
            raise ConfigError(f"a replay buffer trains on one device but the mesh has {layout.num_devices}; "
                              f"use {setting('mesh', 'data=1')}", num_devices=layout.num_devices)
        if not config.steps_per_epoch:
            raise ConfigError(f"training from a replay buffer needs {setting('steps_per_epoch', placeholder='N')} "
                              "(updates per iteration)")
        self.placement = Placement("replay", f"replay ring of {buffer.capacity:,} positions")
        self.num_samples = buffer.capacity
        self.steps_per_epoch, self.dropped = config.steps_per_epoch, 0
        self._B, self._key, self._layout = config.samples_per_step, data_key, layout
        self.ring = empty_ring(buffer.capacity, buffer.num_edges)
        self.device_bytes = sum(x.nbytes for x in self.ring)
        self._step = 0  # global step of the next call's first step
        self._add: Callable[[Ring, Positions], Ring] = jax.jit(add, donate_argnums=0)

    def add(self, positions: Positions) -> None:
        """Appends self-play positions (the previous ring's buffers are reused)."""
        self.ring = self._add(self.ring, positions)

    def setup(self, compile: Callable, start: tuple[int, int] = (1, 0)) -> None:
        pass

    def make_step(self, train_step: Callable) -> Callable:
        B = self._B

        def step_at(state: Any, ring: Ring, key: jax.Array, start: jax.Array, i: jax.Array):
            return train_step(state, sample(ring, jax.random.fold_in(key, start + i), B))

        return step_at

    def abstract_args(self, k: int) -> tuple[Any, ...]:
        shape = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)  # noqa: E731
        return jax.tree.map(shape, self.ring), shape(self._key), jax.ShapeDtypeStruct((), jnp.int32)

    def start_epoch(self, epoch: int, position: int) -> None:
        self._step = (epoch - 1) * self.steps_per_epoch + position

    def next_args(self, k: int, previous: Any = None) -> tuple[Any, ...]:
        args = (self.ring, self._key, np.int32(self._step))
        self._step += k
        return args

    def epoch_stats(self, train_s: float) -> dict[str, float]:
        return {"replay_size": int(self.ring.size), "replay_added": int(self.ring.added)}

    def describe(self) -> str:
        return (f"a replay ring on the device ({self.num_samples:,} positions, {self.device_bytes / 2**20:,.1f} MiB, "
                f"filled by self-play), batches sampled inside each call")

    def get_state(self) -> dict[str, Any]:
        return {"placement": "replay", "data_key": np.asarray(jax.random.key_data(self._key)).tolist()}

    def arrays(self) -> Ring:
        return self.ring

    def set_state(self, state: dict[str, Any], arrays: Any = None) -> None:
        if "data_key" in state:
            self._key = jax.random.wrap_key_data(jnp.asarray(state["data_key"], jnp.uint32))
        if arrays is not None:
            self.ring = Ring(*arrays)

    def close(self) -> None:
        pass
