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


@pytest.mark.slow  # three fresh processes
def test_a_second_run_compiles_nothing_and_trains_to_the_same_bits(tmp_path):
    cache = tmp_path / "cache"
    first = _run(tmp_path, "a", JAXTRAIN_COMPILE_CACHE=str(cache))
    assert first.returncode == 0, first.stderr[-2000:]
    entries = _entries(cache)
    assert len(entries) >= 3  # the training call, evaluation, the permutation (and the model's init)
    second = _run(tmp_path, "b", JAXTRAIN_COMPILE_CACHE=str(cache))
    assert second.returncode == 0, second.stderr[-2000:]
    assert _entries(cache) == entries  # every program came from the cache
    rows = [[{k: v for k, v in json.loads(line).items() if not k.endswith("_s") and k != "input_wait_fraction"}
             for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()] for run in ("a", "b")]
    assert rows[0] == rows[1]
    memory = json.loads((tmp_path / "a" / "summary.json").read_text()).get("memory")
    if memory is not None:  # Linux: the command limited the free heap its threads keep (JAXTRAIN_HEAP)
        assert memory["heap"] is None or "kept to 16.0 MiB" in memory["heap"]  # None: not glibc
    default = _run(tmp_path, "e", XDG_CACHE_HOME=str(tmp_path / "home"))
    assert default.returncode == 0 and _entries(tmp_path / "home" / "jaxtrain" / "xla")


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
