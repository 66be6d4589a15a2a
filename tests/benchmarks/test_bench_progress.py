"""`jaxtrain bench progress --quick`: the first progress reading, epoch 1's and the run's throughput read from
what a run printed and recorded (the run in-process here: the benchmark's own runs are fresh processes)."""

import json

import pytest

from benchmarks import BENCHMARKS, progress
from jaxtrain.tools.cli import main


def test_quick_progress_compares_the_first_reading_with_the_runs_throughput(monkeypatch, tmp_path, capsys):
    assert "progress" in BENCHMARKS
    recorded = []

    def in_process(run_dir, extra):
        capsys.readouterr()
        assert main(["train", "mlp-regression", "--run-dir", str(run_dir), *extra]) == 0
        printed = capsys.readouterr().out
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        recorded.append((printed, json.loads((run_dir / "summary.json").read_text()), rows))
        return progress.measure(printed, run_dir)

    monkeypatch.setattr(progress, "train_once", in_process)
    out = tmp_path / "progress.json"
    assert progress.main(progress.ProgressBenchConfig(quick=True, out=str(out))) == 0
    assert "first reading ÷ run's throughput: median" in capsys.readouterr().out
    result = json.loads(out.read_text())
    (run,), ((printed, summary, rows),) = result["runs"], recorded
    readings = [line for line in printed.splitlines() if " samples/s ETA" in line and " -- samples/s" not in line]
    assert f" {run['first']:,.0f} samples/s" in readings[0]
    epoch1 = next(r for r in rows if r.get("kind") == "epoch")
    assert run["epoch1"] == pytest.approx(epoch1["samples"] / epoch1["train_time_s"])
    assert run["run"] == summary["samples_per_s"] and run["first_to_run"] == pytest.approx(run["first"] / run["run"])
    assert result["count"] == 1 and result["median_first_to_run"] == pytest.approx(run["first_to_run"])


def test_a_run_without_a_progress_reading_is_one_line(tmp_path):
    with pytest.raises(progress.JaxtrainError, match="printed no progress line with a rate"):
        progress.measure("  epoch 1/2 step 20/78 loss 0.4272 -- samples/s ETA --\n", tmp_path)
