"""`jaxtrain bench precision` and `jaxtrain bench preprocess` in quick mode (never how fast).

(Apart from tests/library/test_precision.py and test_data_cache.py, so that `pytest -n 2 --dist loadfile`
runs these quick benchmarks beside the library's tests.)"""

import os

import pytest

from jaxtrain.tools.cli import main

OFFLINE = os.environ.get("JAXTRAIN_DATA_DIR")
needs_data = pytest.mark.skipif(not OFFLINE, reason="JAXTRAIN_DATA_DIR (the offline datasets) is not set")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv("JAXTRAIN_CACHE_DIR", str(directory))
    monkeypatch.delenv("JAXTRAIN_CACHE", raising=False)
    return directory


@pytest.mark.slow
def test_bench_precision_quick_prints_every_setting(capsys):
    assert main(["bench", "precision", "--quick"]) == 0
    out = capsys.readouterr().out
    for setting in ("fp32", "bf16", "fp16", "batch 8", "2 x accum 4"):
        assert setting in out, setting
    assert "False" not in out  # every setting's loss is finite


@pytest.mark.slow
@needs_data
def test_bench_preprocess_runs_in_quick_mode(cache_dir, capsys):
    assert main(["bench", "preprocess", "--quick"]) == 0  # 1 when cached and uncached arrays differ
    assert "warm" in capsys.readouterr().out
    assert not cache_dir.exists()  # it works in temporary directories of its own


def test_bench_preprocess_refuses_zero_repeats(capsys):
    assert main(["bench", "preprocess", "--repeats", "0"]) == 2
    assert "repeats=0 must be an integer >= 1" in capsys.readouterr().err
