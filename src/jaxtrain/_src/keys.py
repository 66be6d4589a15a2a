"""The run's two keys from its seed: `jax.random.split(jax.random.key(seed))`, drawn on the host.

JAX compiles `split` (a threefry hash) and the unstacking of its result at every start: 0.06-0.15 s
of a 2-core machine, more than a short run's other set-up, for two 64-bit keys. For the default
`threefry2x32` implementation the same bits come from the same hash in NumPy (in both of JAX's
counting orders, `jax_threefry_partitionable` on or off); any other implementation is split by JAX.
"""

from __future__ import annotations

import jax
import numpy as np

__all__ = ["seed_keys"]

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def seed_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """(step key, data key): the two halves of `jax.random.split(jax.random.key(seed))`, bit for bit."""
    root = jax.random.key(seed)  # compiled once per process (an NNX model's `nnx.Rngs` has done it)
    if str(jax.random.key_impl(root)) != "threefry2x32":
        step_key, data_key = jax.random.split(root)
        return step_key, data_key
    k1, k2 = (np.uint32(w) for w in np.asarray(jax.random.key_data(root)))
    # the flag as set now (a `jax.threefry_partitionable` context included); untyped, hence getattr
    if getattr(jax.config, "jax_threefry_partitionable"):  # key i hashes the 64-bit count i as (high, low) words
        bits = _threefry2x32(k1, k2, np.zeros(2, np.uint32), np.arange(2, dtype=np.uint32))
        words = np.stack(bits, axis=-1)  # (2, 2): key i is (bits[0][i], bits[1][i])
    else:  # the counts 0..3 hashed as two halves, then read back as two keys of two words
        words = np.concatenate(_threefry2x32(k1, k2, np.arange(2, dtype=np.uint32),
                                             np.arange(2, 4, dtype=np.uint32))).reshape(2, 2)
    step_key, data_key = (jax.random.wrap_key_data(w) for w in words)
    return step_key, data_key


def _threefry2x32(k1: np.uint32, k2: np.uint32, x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Threefry-2x32 hash of the counts (x0, x1) under key (k1, k2): 20 rounds, the key injected
    every 4 (Salmon et al., 2011), as `jax._src.random.threefry2x32` computes it, in uint32 arithmetic."""
    ks = (k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA))
    with np.errstate(over="ignore"):  # additions wrap modulo 2**32, as the hash means them to
        x0, x1 = x0 + ks[0], x1 + ks[1]
        for i in range(5):
            for r in _ROTATIONS[i % 2]:
                x0 = x0 + x1
                x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
            x0 = x0 + ks[(i + 1) % 3]
            x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1
