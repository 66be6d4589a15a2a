"""Benchmarks run in quick mode (their figures are not checked: tests never time the machine)."""

import json

from jaxtrain.bench import overhead


def test_overhead_benchmark_runs_in_quick_mode(tmp_path, capsys):
    out = tmp_path / "overhead.json"
    assert overhead.main(overhead.OverheadConfig(quick=True, out=str(out))) == 0
    printed = capsys.readouterr().out
    assert "hand-written jit + lax.scan" in printed and "jaxtrain.fit" in printed and "nnx.jit" in printed
    results = json.loads(out.read_text())
    assert len(results["fit_epoch_s"]) == len(results["hand_written_epoch_s"]) == 2
    assert results["ratio"] > 0 and set(results["per_call_s"]) == {"nnx.jit", "jax.jit"}
