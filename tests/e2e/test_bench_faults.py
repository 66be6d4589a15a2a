"""`jaxtrain bench faults` in quick mode, and how it judges and reports a resumed run."""

import json

import numpy as np
import pytest

from jaxtrain.tools.bench import faults


@pytest.mark.slow
def test_quick_faults_benchmark_resumes_an_async_save_kill_to_an_equal_run(tmp_path, capsys):
    out = tmp_path / "faults.json"
    config = faults.FaultsBenchConfig(quick=True, moments=("async-save",), out=str(out))
    assert faults.main(config) == 0
    printed = capsys.readouterr().out
    assert "--resume until it exits 0" in printed  # the table's title
    assert printed.rstrip().endswith("1/1 resumed runs equal the uninterrupted run")
    results = json.loads(out.read_text())
    assert results["moments"] == {"async-save": {"trials": 1, "killed": 1, "completed": 1, "equal": 1,
                                                 "attempts": [1]}}
    assert results["equal"] == results["total"] == 1
    # The quick run saves at steps 20, 40, 50 (epoch end), 70, 90, 100 (epoch end): six kill points.
    assert results["reference"] == {"step": 100, "counts": {**results["reference"]["counts"], "async-save": 6}}
    (trial,) = results["trials"]
    assert trial["killed_at"].startswith(f"async-save #{trial['nth']}: the ") and "save returned" in trial["killed_at"]
    assert trial["completed"] and trial["equal"] and trial["error"] is None


@pytest.mark.slow
def test_quick_faults_benchmark_resumes_past_a_bit_flipped_checkpoint(tmp_path, capsys):
    out = tmp_path / "faults.json"
    assert faults.main(faults.FaultsBenchConfig(quick=True, moments=("bit-flip",), out=str(out))) == 0
    assert capsys.readouterr().out.rstrip().endswith("1/1 resumed runs equal the uninterrupted run")
    results = json.loads(out.read_text())
    assert results["moments"]["bit-flip"] == {"trials": 1, "killed": 1, "completed": 1, "equal": 1, "attempts": [1]}
    (trial,) = results["trials"]
    assert trial["killed_at"].startswith(f"mid-epoch #{trial['nth']}: ") and "one bit flipped" in trial["killed_at"]


def _final(rows, step=100, scale=1.0):
    return faults.Final(step, {"['params']['w']": np.arange(4, dtype=np.float32) * scale}, rows)


def test_differences_find_a_changed_state_and_duplicated_or_missing_rows():
    rows = [{"kind": "train", "step": 10}, {"kind": "epoch", "epoch": 1, "step": 50, "val_loss": 0.5},
            {"kind": "train", "step": 60}, {"kind": "epoch", "epoch": 2, "step": 100, "val_loss": 0.25}]
    reference = _final(rows)
    assert faults.differences(_final(list(rows)), reference) == []
    found = faults.differences(_final(rows[:3] + [rows[2], {**rows[3], "val_loss": 0.3}], scale=2.0), reference)
    assert found == ["1 of 1 train-state arrays differ (e.g. ['params']['w'])",
                     "metrics.jsonl has duplicated rows: train step 60 x2",
                     "epoch 2 val_loss differs from the reference's"]
    found = faults.differences(_final(rows[1:], step=90), reference)
    assert found == ["newest checkpoint is step 90, the reference's 100",
                     "metrics.jsonl rows missing [('train', 10)], unexpected []"]


def test_report_lists_each_failed_resume_with_its_error_line(capsys):
    from rich.console import Console

    trials = [faults.Trial("start-up", 1, 2, killed_at="start-up #2: making the feed", attempts=2,
                           error="resume attempt 2 failed (exit code 2): error: run directory /x does not exist"),
              faults.Trial("mid-epoch", 1, 5, killed_at="mid-epoch #5: step 85", attempts=1, completed=True,
                           equal=True),
              faults.Trial("evaluation", 1, 1, error="not killed: the kill point was never reached (the run finished)")]
    faults.print_report(trials, ("start-up", "mid-epoch", "evaluation"), Console(width=200))
    printed = capsys.readouterr().out
    assert "start-up trial 1 (killed at start-up #2: making the feed): resume attempt 2 failed (exit code 2): " \
           "error: run directory /x does not exist" in printed
    assert "evaluation trial 1: not killed: the kill point was never reached" in printed
    assert "mid-epoch trial" not in printed
    assert printed.rstrip().endswith("1/3 resumed runs equal the uninterrupted run")
    assert faults.summarize(trials, ("start-up", "mid-epoch", "evaluation")) == {
        "start-up": {"trials": 1, "killed": 1, "completed": 0, "equal": 0, "attempts": [2]},
        "mid-epoch": {"trials": 1, "killed": 1, "completed": 1, "equal": 1, "attempts": [1]},
        "evaluation": {"trials": 1, "killed": 0, "completed": 0, "equal": 0, "attempts": [0]},
    }
