"""Benchmarks run in quick mode (their figures are not checked: tests never time the machine)."""

import json
import statistics

import numpy as np
import pytest

from benchmarks import overhead
from jaxtrain.tools.recipes.mlp_regression import RegressionDataConfig, make_data


@pytest.mark.slow
def test_overhead_benchmark_runs_in_quick_mode(tmp_path, capsys):
    out = tmp_path / "overhead.json"
    assert overhead.main(overhead.OverheadConfig(quick=True, out=str(out))) == 0
    printed = capsys.readouterr().out
    assert "hand-written jit + lax.scan" in printed and "jaxtrain.fit" in printed and "nnx.jit" in printed
    results = json.loads(out.read_text())
    assert len(results["fit_epoch_s"]) == len(results["hand_written_epoch_s"]) == 2
    # The reported ratio is jaxtrain's steps/s over the hand-written loop's, from the median epoch times.
    want = statistics.median(results["hand_written_epoch_s"]) / statistics.median(results["fit_epoch_s"])
    assert results["ratio"] == pytest.approx(want, rel=1e-12)
    assert set(results["per_call_s"]) == {"nnx.jit", "jax.jit"}
    # The whole-process table: one fresh run of each in quick mode, its ratio from the median walls.
    assert "whole process, launch to exit" in printed and "whole-process speed" in printed
    walls = results["process"]["wall_s"]
    assert len(walls["jaxtrain train"]) == len(walls["hand-written script"]) == 1
    want = statistics.median(walls["hand-written script"]) / statistics.median(walls["jaxtrain train"])
    assert results["process"]["ratio"] == pytest.approx(want, rel=1e-12)
    assert all(f <= w for f, w in zip(results["process"]["jaxtrain_parts_s"]["fit"], walls["jaxtrain train"]))


@pytest.mark.slow
def test_ladder_quick_runs_and_validates(tmp_path, capsys):
    from benchmarks import ladder, ladder_report

    # The original runs as the benchmark runs every variant, in a fresh child process; rungs 1-5 run in
    # this process through the same function a child calls (`_child`), to spare five interpreter and JAX
    # start-ups, and are validated with the benchmark's own check.
    out = tmp_path / "ladder"
    assert ladder.main(ladder.LadderConfig(quick=True, variants=(0,), out=str(out))) == 0
    payload = json.loads((out / "results.json").read_text())
    assert [r["variant"] for r in payload["results"]] == [0]
    assert (out / "results.md").read_text().startswith("| variant |")
    assert (out / "ladder.png").stat().st_size > 1000
    assert f"was timed on {payload['config']['original_steps']} steps and extrapolated" in capsys.readouterr().out
    rungs = [ladder._child({"variant": v, "config": payload["config"]}) for v in (1, 2, 3, 4, 5)]
    results = sorted(payload["results"] + rungs, key=lambda r: r["variant"])
    config = ladder.LadderConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in payload["config"].items()})
    assert ladder_report.add_derived(results, config, payload["peak_gflops"], ladder.TOLERANCE, ladder.FLOP_PER_SAMPLE)
    assert [r["variant"] for r in results] == [0, 1, 2, 3, 4, 5]
    # The test targets, made independently from the benchmark's data settings.
    _, test = make_data(RegressionDataConfig(samples=payload["config"]["samples"],
                                             val_samples=payload["config"]["test_samples"]))
    for r in results:
        assert r["max_abs_pred_diff"] <= 1e-5 and r["validated"], r
        assert r["epoch_s"] == pytest.approx(r["step_s"] * r["steps_per_epoch"], rel=1e-12)
        assert r["speedup"] == pytest.approx(results[0]["epoch_s"] / r["epoch_s"], rel=1e-12)
        predictions = np.load(out / f"predictions-{r['variant']}.npy")  # (500, 64)
        assert r["test_mse"] == pytest.approx(float(np.mean((predictions - test["y"]) ** 2)), rel=1e-6)
        # Predictions within 1e-5 of variant 0's (|y - p| ~ 1) give test MSEs within ~1e-5 relative of its MSE.
        assert r["test_mse"] == pytest.approx(results[0]["test_mse"], rel=1e-4)
    assert results[0]["extrapolated"] and results[0]["max_abs_pred_diff"] == 0.0


def test_ladder_validation_fails_on_a_prediction_mismatch(tmp_path):
    from benchmarks import ladder, ladder_report

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


@pytest.mark.slow
def test_checkpoint_benchmark_runs_in_quick_mode(tmp_path, capsys):
    from benchmarks import checkpoint

    out = tmp_path / "checkpoint.json"
    assert checkpoint.main(checkpoint.CheckpointBenchConfig(quick=True, out=str(out))) == 0
    results = json.loads(out.read_text())
    assert results["trial"]["kills"] == 0  # quick mode leaves kill-and-resume to tests/benchmarks/test_bench_faults.py
    assert len(results["checkpoint_s"]) == len(results["no_checkpoint_s"]) == 1
    assert "checkpoint overhead:" in capsys.readouterr().out


CHILD = """
import os, sys, time
sys.path.insert(0, {bench!r})  # as torch_models.py imports it: a sibling, without the jaxtrain package
from child import child_main


def work(payload):
    if payload.get("fail"):
        raise ValueError("bad payload\\nsecond line")
    if payload.get("exit"):
        os._exit(payload["exit"])
    time.sleep(payload.get("sleep", 0))
    print("noise before the result")
    return {{"double": 2 * payload["x"], "jax_imported": "jax" in sys.modules}}


child_main(work)
"""


@pytest.mark.slow
def test_run_child_returns_the_childs_result_or_one_error_line(tmp_path):
    from pathlib import Path

    import benchmarks.child as child
    from benchmarks.child import run_child

    script = tmp_path / "work.py"
    script.write_text(CHILD.format(bench=str(Path(child.__file__).parent)))
    assert run_child(script, {"x": 21}) == {"double": 42, "jax_imported": False}
    assert run_child(script, {"fail": True}) == {"error": "ValueError: bad payload"}
    assert run_child(script, {"exit": 3}) == {"error": "exit code 3, no output"}
    assert run_child(script, {"x": 1, "sleep": 30}, timeout=0.5) == {"error": "timed out after 0.5 s"}


@pytest.mark.slow
def test_a_child_imports_the_benchmarks_from_any_directory(tmp_path, monkeypatch):
    # benchmarks/ is not installed: a child started by module name finds it through PYTHONPATH alone
    import os
    import subprocess
    import sys

    from benchmarks.child import CHECKOUT, child_environ

    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "elsewhere"))
    environ = child_environ()
    assert environ["PYTHONPATH"] == f"{CHECKOUT}{os.pathsep}{tmp_path / 'elsewhere'}"
    assert child_environ({"PYTHONPATH": "/a/baseline"})["PYTHONPATH"] == "/a/baseline"  # kept as given
    code = "import benchmarks; print(benchmarks.__file__)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environ, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == str(CHECKOUT / "benchmarks" / "__init__.py"), proc.stderr
