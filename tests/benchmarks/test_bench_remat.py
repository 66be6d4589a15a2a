"""`jaxtrain bench remat` and `jaxtrain bench attention` in quick mode (tiny workloads; never how fast).

(Files of their own, apart from tests/library/test_remat.py and test_attention.py, so that
`pytest -n 2 --dist loadfile` runs these quick benchmarks beside the library's tests.)"""

import jax
import optax
import pytest
from flax import nnx

from jaxtrain._src.models import GPT, GPTConfig

ATOL = 1e-6  # as tests/library/test_remat.py: remat recomputes the same float32 operations


def _gpt(mode, **kw):
    config = GPTConfig(**{"block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, "dropout": 0.1, **kw})
    return GPT(13, config, remat=mode, rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_remat_benchmark_measures_a_tiny_workload():
    from benchmarks import remat as bench

    workload = bench.Workload(
        "tiny gpt", lambda m: _gpt(m, n_layer=1, dropout=0.0, block_size=8), bench._lm_loss,
        {"tokens": jax.random.randint(jax.random.key(0), (2, 9), 0, 13)}, optax.adamw(1e-3),
    )
    rows = bench.measure(workload, repeats=1)
    assert [r["variant"] for r in rows] == list(bench.VARIANTS)
    assert all(r["max_grad_diff"] <= ATOL and r["temp_mib"] > 0 and r["ms"] > 0 for r in rows)


@pytest.mark.slow
def test_attention_benchmark_runs_in_quick_mode(capsys):
    from benchmarks import attention as bench

    assert bench.main(bench.AttentionBenchConfig(quick=True)) == 0
    out = capsys.readouterr().out
    assert "heads_major" in out and "xla" in out and "fastest" in out
