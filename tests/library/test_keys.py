"""The run's keys from its seed, drawn on the host, against JAX's own `split` (the independent reference)."""

import jax
import numpy as np
import pytest

from jaxtrain._src.keys import seed_keys

SEEDS = [0, 1, 42, 1234, 2**31 - 1, 2**31, 2**32 - 1, *np.random.default_rng(0).integers(0, 2**32, 12).tolist()]


def _words(keys):
    return [np.asarray(jax.random.key_data(k)) for k in keys]


@pytest.mark.parametrize("partitionable", [True, False])
def test_the_seeds_keys_are_jaxs_split_of_the_seed_bit_for_bit(partitionable):
    with jax.threefry_partitionable(partitionable):  # JAX's two counting orders
        for seed in SEEDS:
            got, want = _words(seed_keys(seed)), _words(jax.random.split(jax.random.key(seed)))
            assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)), seed
            assert all(str(jax.random.key_impl(k)) == "threefry2x32" for k in seed_keys(seed))


def test_another_key_implementation_is_split_by_jax():
    with jax.default_prng_impl("rbg"):
        got = _words(seed_keys(7))
        want = _words(jax.random.split(jax.random.key(7)))
        assert got[0].shape == (4,) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
