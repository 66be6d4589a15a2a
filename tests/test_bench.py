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


def test_ladder_quick_runs_and_validates(tmp_path, capsys):
    from jaxtrain.bench import ladder

    out = tmp_path / "ladder"
    config = ladder.LadderConfig(quick=True, variants=(0, 1, 2, 3, 4, 5), out=str(out))
    assert ladder.main(config) == 0
    results = json.loads((out / "results.json").read_text())["results"]
    assert [r["variant"] for r in results] == [0, 1, 2, 3, 4, 5]
    for r in results:
        assert r["max_abs_pred_diff"] <= 1e-5 and r["validated"], r
        assert r["epoch_s"] > 0 and r["speedup"] > 0 and r["test_mse"] > 0
    assert results[0]["extrapolated"] and results[0]["max_abs_pred_diff"] == 0.0
    assert (out / "results.md").read_text().startswith("| variant |")
    assert (out / "ladder.png").stat().st_size > 1000
    assert "was timed on 30 steps and extrapolated" in capsys.readouterr().out


def test_ladder_validation_fails_on_a_prediction_mismatch(tmp_path):
    import numpy as np

    from jaxtrain.bench import ladder, ladder_report

    config = ladder.LadderConfig(out=str(tmp_path))
    preds = np.zeros((10, 64), np.float32)
    np.save(tmp_path / "predictions-0.npy", preds)
    np.save(tmp_path / "predictions-5.npy", preds + 2e-5)
    timing = {"step_s": 0.01, "epoch_s": 1.0, "compile_s": 0.5, "first_step_s": 0.5}
    results = [{"variant": 0, "name": "original", **timing}, {"variant": 5, "name": "jaxtrain", **timing}]
    assert not ladder_report.add_derived(results, config, 100.0, ladder.TOLERANCE, ladder.FLOP_PER_SAMPLE)
    assert results[1]["max_abs_pred_diff"] == np.float32(2e-5) and not results[1]["validated"]
    np.save(tmp_path / "predictions-5.npy", preds + 5e-6)
    assert ladder_report.add_derived(results, config, 100.0, ladder.TOLERANCE, ladder.FLOP_PER_SAMPLE)


def test_checkpoint_benchmark_runs_in_quick_mode(tmp_path, capsys):
    from jaxtrain.bench import checkpoint

    out = tmp_path / "checkpoint.json"
    assert checkpoint.main(checkpoint.CheckpointBenchConfig(quick=True, out=str(out))) == 0
    results = json.loads(out.read_text())
    trial = results["trial"]
    assert trial["all_bit_exact"] and trial["bit_exact"] == trial["kills"] <= 1
    assert len(results["checkpoint_s"]) == len(results["no_checkpoint_s"]) == 1
    assert "checkpoint overhead:" in capsys.readouterr().out
