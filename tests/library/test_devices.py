"""The `devices(n)` marker (tests/_devices.py): a marked test sees n devices and can compute across them;
the suite's XLA_FLAGS and the `xla_defaults` marker that runs a test without them; the conftest's release of
what each module compiled."""

import os
import types
from pathlib import Path

import _devices
import conftest
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _devices import CHILD_ENV, DEFAULTS_ENV, SUITE_XLA_FLAGS
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


@pytest.mark.slow
@pytest.mark.devices(4)
def test_marked_test_sees_four_devices():
    if os.environ.get(CHILD_ENV):  # re-run in a child: exactly the forced virtual CPU devices
        assert os.environ[CHILD_ENV] == "4"
        assert jax.device_count() == 4 and {d.platform for d in jax.devices()} == {"cpu"}
    else:  # this process already had enough devices
        assert jax.device_count() >= 4


@pytest.mark.slow
@pytest.mark.devices(4)
def test_sum_over_an_array_sharded_across_four_devices():
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    x = np.random.default_rng(0).normal(size=(4 * 64, 8)).astype(np.float32)  # (N, D), N split 4 ways
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    assert len(xs.sharding.device_set) == 4
    shards = sorted(xs.addressable_shards, key=lambda s: s.index[0].start)
    for i, shard in enumerate(shards):  # each device holds its own quarter of the rows
        np.testing.assert_array_equal(np.asarray(shard.data), x[i * 64 : (i + 1) * 64])

    want = np.sum(x.astype(np.float64) ** 2, axis=0)  # (D,)
    got = jax.jit(lambda a: jnp.sum(a**2, axis=0))(xs)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
    # An explicit cross-device reduction: per-device partial sums, then a psum over the mesh axis.
    psum = jax.jit(jax.shard_map(lambda a: jax.lax.psum(jnp.sum(a**2, axis=0), "data"), mesh=mesh,
                                 in_specs=P("data"), out_specs=P()))
    np.testing.assert_allclose(np.asarray(psum(xs)), want, rtol=1e-5)


def test_the_suite_runs_with_its_xla_flags_unless_told_not_to():
    flags = os.environ.get("XLA_FLAGS", "")
    assert (SUITE_XLA_FLAGS in flags) != bool(os.environ.get(DEFAULTS_ENV)), flags


@pytest.mark.slow
@pytest.mark.xla_defaults
def test_marked_test_runs_with_xlas_default_code_generation():
    assert SUITE_XLA_FLAGS not in os.environ.get("XLA_FLAGS", "")
    if os.environ.get(CHILD_ENV):  # re-run in a child: no devices asked, the rest of XLA_FLAGS kept
        assert os.environ[CHILD_ENV] == "0" and os.environ[DEFAULTS_ENV]


@pytest.mark.slow
def test_a_test_run_in_a_child_sets_its_fixtures_up_there_only(pytester, monkeypatch, tmp_path):
    """A module fixture of a marked test is built once, in the child: here it would be built for nothing."""
    log = tmp_path / "built.txt"
    monkeypatch.setenv("XLA_FLAGS", SUITE_XLA_FLAGS)  # as in the suite, also where it runs with XLA's defaults
    monkeypatch.delenv(DEFAULTS_ENV, raising=False)
    pytester.makepyfile(test_marked=f"""
        import os
        import pytest

        @pytest.fixture(scope="module")
        def built():
            with open({str(log)!r}, "a") as f:
                f.write(os.environ.get({CHILD_ENV!r}, "here") + "\\n")

        @pytest.mark.xla_defaults
        def test_one(built, tmp_path):
            assert os.environ.get({CHILD_ENV!r}) == "0"

        @pytest.mark.xla_defaults
        def test_two(built):
            pass
        """)
    pytester.makeconftest(f"""
        import sys
        import pytest

        sys.path.insert(0, {str(Path(_devices.__file__).parent)!r})
        import _devices

        def pytest_configure(config):
            for marker in _devices.MARKERS:
                config.addinivalue_line("markers", marker)

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_setup(item):
            _devices.runtest_setup(item)

        @pytest.hookimpl(tryfirst=True)
        def pytest_pyfunc_call(pyfuncitem):
            return _devices.pyfunc_call(pyfuncitem)
        """)  # the suite's hooks; in the child they run the tests as they are
    pytester.runpytest_inprocess("-p", "no:xdist", "-p", "no:cacheprovider").assert_outcomes(passed=2)
    assert log.read_text().split() == ["0"]


@pytest.mark.parametrize("limit, kept", [(0, False), (2**60, True)])
def test_a_module_ends_with_its_programs_released_when_the_worker_is_above_the_limit(pytester, monkeypatch,
                                                                                     limit, kept):
    """The suite's conftest drops what the modules compiled when one ends with its worker's memory above
    RELEASE_ABOVE_BYTES (the memory otherwise grows module by module), and keeps it below, where the next
    module may use it again: a program the first module compiled is gone in the second, or still there."""
    monkeypatch.setattr(conftest, "RELEASE_ABOVE_BYTES", limit)
    pytester.makepyfile(shared="import jax\nf = jax.jit(lambda x: x * 2.0)\n", test_a="""
        from shared import f
        def test_compiles():
            f(1.0)
            assert f._cache_size() == 1
        def test_still_there_within_the_module():
            assert f._cache_size() == 1
        """, test_b=f"""
        from shared import f
        def test_in_the_next_module():
            assert f._cache_size() == {int(kept)}
        """)
    suite = types.ModuleType("suite")  # a plugin holding the suite's fixture (without it: the first case fails)
    suite.fixture = conftest._programs_released_after_each_module
    pytester.runpytest_inprocess("-p", "no:xdist", "-p", "no:cacheprovider", plugins=[suite]).assert_outcomes(passed=3)
