"""The `jaxtrain` command's persistent compilation cache: a second run loads every program the first
compiled and trains to the same bits; off and a user's own cache are respected."""

import json
import os
import subprocess
import sys

import pytest

TRAIN = ["-m", "jaxtrain", "train", "mlp-regression", "--data.samples", "600", "--data.val-samples", "100",
         "--epochs", "2", "--model.hidden", "16", "--steps-per-call", "5", "--quiet", "--no-tensorboard"]


def _run(tmp_path, run: str, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR",
                                                                 "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
    environ.update(env)
    return subprocess.run([sys.executable, *TRAIN, "--run-dir", str(tmp_path / run)], capture_output=True,
                          text=True, env=environ, timeout=300)


def _entries(directory) -> set[str]:
    return {p.name for p in directory.iterdir()} if directory.is_dir() else set()


@pytest.mark.slow  # two fresh processes
def test_a_second_run_compiles_nothing_and_trains_to_the_same_bits(tmp_path):
    # The first run's cache is the default one (under XDG_CACHE_HOME); the second names that folder in
    # JAXTRAIN_COMPILE_CACHE, and its own default folder stays empty: both settings are read, and one run that
    # compiles serves both checks (a third process compiled everything again only to find the default folder).
    cache = tmp_path / "home" / "jaxtrain" / "xla"
    first = _run(tmp_path, "a", XDG_CACHE_HOME=str(tmp_path / "home"))
    assert first.returncode == 0, first.stderr[-2000:]
    entries = _entries(cache)
    assert len(entries) >= 3  # the training call, evaluation (and the model's init)
    second = _run(tmp_path, "b", JAXTRAIN_COMPILE_CACHE=str(cache), XDG_CACHE_HOME=str(tmp_path / "other"))
    assert second.returncode == 0, second.stderr[-2000:]
    assert _entries(cache) == entries  # every program came from the cache
    assert not _entries(tmp_path / "other" / "jaxtrain" / "xla")  # JAXTRAIN_COMPILE_CACHE chose the folder
    rows = [[{k: v for k, v in json.loads(line).items() if not k.endswith("_s") and k != "input_wait_fraction"}
             for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()] for run in ("a", "b")]
    assert rows[0] == rows[1]
    memory = json.loads((tmp_path / "a" / "summary.json").read_text()).get("memory")
    if memory is not None:  # Linux: the command limited the free heap its threads keep (JAXTRAIN_HEAP)
        assert memory["heap"] is None or "kept to 16.0 MiB" in memory["heap"]  # None: not glibc


def test_off_and_a_users_own_cache_are_respected(monkeypatch):
    import jax

    from jaxtrain import enable_compile_cache

    own = jax.config.jax_compilation_cache_dir  # the test run's own cache (conftest), if any
    monkeypatch.setenv("JAXTRAIN_COMPILE_CACHE", "off")
    assert enable_compile_cache() is None
    monkeypatch.setenv("JAXTRAIN_COMPILE_CACHE", "")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/somewhere/theirs")
    assert str(enable_compile_cache()) == (own or "/somewhere/theirs")  # kept, not replaced
    assert jax.config.jax_compilation_cache_dir == own


@pytest.fixture
def no_jax_cache(monkeypatch):
    """No cache configured for JAX (the suite configures its own): enable_compile_cache picks its own
    directory; JAX's settings are put back afterwards."""
    import jax

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_compilation_cache_max_size")
    saved = {name: getattr(jax.config, name) for name in names}
    jax.config.update("jax_compilation_cache_dir", None)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    yield
    for name, value in saved.items():
        jax.config.update(name, value)


def test_the_cache_is_made_private_whatever_the_umask(tmp_path, monkeypatch, no_jax_cache):
    from jaxtrain import enable_compile_cache

    monkeypatch.setenv("JAXTRAIN_COMPILE_CACHE", str(tmp_path / "xla"))
    umask = os.umask(0)
    try:
        assert enable_compile_cache() == tmp_path / "xla"
    finally:
        os.umask(umask)
    assert (tmp_path / "xla").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_a_cache_others_may_write_to_is_not_used(tmp_path, monkeypatch, capsys, no_jax_cache, mode):
    import jax

    from jaxtrain import enable_compile_cache

    shared = tmp_path / "xla"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.setenv("JAXTRAIN_COMPILE_CACHE", str(shared))
    assert enable_compile_cache() is None and jax.config.jax_compilation_cache_dir is None
    err = capsys.readouterr().err.strip()
    assert err == (f"note: the compile cache {shared} is not used: others may write to it (mode {mode:o}), and its "
                   "programs are native code this process would run; give JAXTRAIN_COMPILE_CACHE a directory of "
                   "your own (or JAXTRAIN_COMPILE_CACHE=off)")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a folder away needs root")
def test_a_cache_another_user_owns_is_not_used(tmp_path, monkeypatch, capsys, no_jax_cache):
    from jaxtrain import enable_compile_cache

    theirs = tmp_path / "xla"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 4242, -1)
    monkeypatch.setenv("JAXTRAIN_COMPILE_CACHE", str(theirs))
    assert enable_compile_cache() is None
    assert "it belongs to user id 4242, not to this user (0)" in capsys.readouterr().err


def test_a_cache_on_a_read_only_disk_is_one_note(tmp_path, monkeypatch, capsys, no_jax_cache):
    import errno

    from jaxtrain import enable_compile_cache
    from jaxtrain._src import compile_cache

    def read_only(folder):  # what a write meets on a read-only mount (root writes through mode bits alone)
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(compile_cache, "probe_writable", read_only)
    monkeypatch.setenv("JAXTRAIN_COMPILE_CACHE", str(tmp_path / "xla"))
    assert enable_compile_cache() is None
    assert capsys.readouterr().err.strip() == (
        f"note: the compile cache {tmp_path / 'xla'} is not used: it cannot be written (Read-only file system); "
        "programs are compiled afresh (give JAXTRAIN_COMPILE_CACHE another directory, or JAXTRAIN_COMPILE_CACHE=off)")


def test_a_full_disk_under_the_cache_warns_nothing(tmp_path, monkeypatch, no_jax_cache):
    import errno
    import warnings

    import jax
    import jax.numpy as jnp

    from jaxtrain import enable_compile_cache

    def full(*args, **kwargs):  # what writing an entry meets once the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setenv("JAXTRAIN_COMPILE_CACHE", str(tmp_path / "xla"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert enable_compile_cache() == tmp_path / "xla"
        monkeypatch.setattr("jax._src.compilation_cache.put_executable_and_time", full)
        jax.jit(lambda x: x * 3.0 + 1.0)(jnp.arange(7.0)).block_until_ready()
    assert not [w for w in caught if "compilation cache" in str(w.message)]
