"""`jaxtrain bench faults` in quick mode, and how it judges and reports a resumed run."""

import contextlib
import io
import json

import numpy as np
import pytest

from benchmarks import faults
from jaxtrain._src.checkpoint import _average_as_params

MOMENTS = ("async-save", "bit-flip", "disk-full", "changed-data")
ONE = {"trials": 1, "killed": 1, "completed": 1, "equal": 1, "handled": 1, "skipped": 0, "attempts": [1]}


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> tuple[int, str, dict]:
    """An async save killed, a bit flipped in the newest checkpoint, a full disk, the data changed before
    the resume: four trials against one uninterrupted reference run (one process, not one per moment),
    every run keeping an average of its weights (`--ema`). Returns the exit code, what it printed and
    its JSON."""
    out = tmp_path_factory.mktemp("faults") / "faults.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = faults.main(faults.FaultsBenchConfig(quick=True, moments=MOMENTS, ema=0.99, out=str(out)))
    return code, printed.getvalue().rstrip(), json.loads(out.read_text())


@pytest.mark.xla_defaults
@pytest.mark.slow
def test_a_run_with_an_average_of_its_weights_resumes_bit_for_bit_after_sigkill(quick):
    """Killed mid-epoch (bit-flip: then one bit flipped in its newest checkpoint) or during an async save,
    a run resumes to every train-state array of the uninterrupted run, the average's included."""
    code, _, results = quick
    assert code == 0 and results["command"][-2:] == ["--ema", "0.99"]
    # The train-state arrays each resumed run must equal hold an average of every parameter (found as
    # `jaxtrain predict --weights ema` finds it; it raises where there is none).
    compared = dict.fromkeys(results["reference"]["arrays"], 0)
    params = [a for a in compared if a.startswith(".params")]
    assert params and _average_as_params(compared, params).keys() == set(params)
    assert results["moments"]["async-save"] == results["moments"]["bit-flip"] == ONE


@pytest.mark.xla_defaults
@pytest.mark.slow
def test_quick_faults_benchmark_handles_each_moment_against_one_reference_run(quick):
    code, printed, results = quick
    trials = {t["moment"]: t for t in results["trials"]}
    assert list(trials) == list(MOMENTS) and code == 0, [t["error"] for t in results["trials"]]
    assert "--resume until it exits 0" in printed  # the table's title
    # The quick run saves at steps 20, 40, 50 (epoch end), 70, 90, 100 (epoch end): six kill points.
    assert results["reference"]["step"] == 100 and results["reference"]["counts"]["async-save"] == 6
    assert results["moments"]["async-save"] == results["moments"]["bit-flip"] == ONE
    trial = trials["async-save"]
    assert trial["killed_at"].startswith(f"async-save #{trial['nth']}: the ") and "save returned" in trial["killed_at"]
    assert trial["completed"] and trial["equal"] and trial["error"] is None
    trial = trials["bit-flip"]
    assert trial["killed_at"].startswith(f"mid-epoch #{trial['nth']}: ") and "one bit flipped" in trial["killed_at"]
    # the refused resume, then the accepted one; not compared with the reference (other data)
    assert results["moments"]["changed-data"] == {**ONE, "equal": None, "attempts": [2]}
    trial = trials["changed-data"]
    assert trial["killed_at"].endswith("the file regenerated with --seed 1") and trial["error"] is None
    if trials["disk-full"]["skipped"]:  # no tmpfs without root: the other three are checked
        assert printed.endswith("3/3 faults handled (1 skipped)\n2/2 resumed runs equal the uninterrupted run")
        pytest.skip(trials["disk-full"]["error"])
    assert printed.endswith("4/4 faults handled\n3/3 resumed runs equal the uninterrupted run")
    assert results["moments"]["disk-full"] == ONE
    trial = trials["disk-full"]
    assert trial["killed_at"].startswith("disk full (") and "error: cannot write a checkpoint to " in trial["killed_at"]
    assert results["equal"] == 3 and results["handled"] == results["total"] == 4


def test_a_failure_is_handled_only_as_exit_2_and_one_error_line_naming_the_file():
    line = "error: the training data changed since checkpoint step 50 was saved (/d/data.h5: other values)"
    assert faults.one_error_line(2, line + "\n", naming="/d/data.h5") == []
    assert faults.one_error_line(2, line, naming="/e/other.h5") == [f"the error line does not name /e/other.h5: {line}"]
    assert faults.one_error_line(1, "Traceback (most recent call last):\n  ...\nOSError: [Errno 28]") == [
        "exit code 1, not 2", "a traceback on stderr",
        "3 lines on stderr, not one `error:` line (last: OSError: [Errno 28])"]
    assert faults.one_error_line(2, "note: something\n" + line) == [
        f"2 lines on stderr, not one `error:` line (last: {line})"]


def test_hdf5_args_train_from_the_file_instead_of_generated_data(tmp_path):
    args = faults.train_args(faults.FaultsBenchConfig(samples=2_000, val_samples=400))
    h5 = faults.hdf5_args(args, tmp_path / "d.h5")
    assert "--data.samples" not in h5 and h5[h5.index("--data.path") + 1] == str(tmp_path / "d.h5")
    assert h5[h5.index("--data.val-samples") + 1] == "400" and len(h5) == len(args)


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
                           equal=True, handled=True),
              faults.Trial("evaluation", 1, 1, error="not killed: the kill point was never reached (the run finished)")]
    faults.print_report(trials, ("start-up", "mid-epoch", "evaluation"), Console(width=200))
    printed = capsys.readouterr().out
    assert "start-up trial 1 (killed at start-up #2: making the feed): resume attempt 2 failed (exit code 2): " \
           "error: run directory /x does not exist" in printed
    assert "evaluation trial 1: not killed: the kill point was never reached" in printed
    assert "mid-epoch trial" not in printed
    assert printed.rstrip().endswith("1/3 resumed runs equal the uninterrupted run")
    assert faults.summarize(trials, ("start-up", "mid-epoch", "evaluation")) == {
        "start-up": {"trials": 1, "killed": 1, "completed": 0, "equal": 0, "handled": 0, "skipped": 0, "attempts": [2]},
        "mid-epoch": {"trials": 1, "killed": 1, "completed": 1, "equal": 1, "handled": 1, "skipped": 0,
                      "attempts": [1]},
        "evaluation": {"trials": 1, "killed": 0, "completed": 0, "equal": 0, "handled": 0, "skipped": 0,
                       "attempts": [0]},
    }


def test_report_counts_handled_faults_apart_from_equal_runs_and_skipped_ones(capsys):
    from rich.console import Console

    trials = [faults.Trial("disk-full", 1, 1, skipped=True, error="skipped: cannot mount a tmpfs here (needs root)"),
              faults.Trial("changed-data", 1, 3, killed_at="mid-epoch #3: step 45", attempts=2, completed=True,
                           handled=True),
              faults.Trial("changed-data", 2, 5, killed_at="mid-epoch #5: step 65", attempts=2, completed=True,
                           error="metrics.jsonl has no note row naming the changed file")]
    faults.print_report(trials, ("disk-full", "changed-data"), Console(width=200))
    printed = capsys.readouterr().out
    assert "disk-full trial 1: skipped: cannot mount a tmpfs here (needs root)" in printed
    assert "changed-data trial 2 (killed at mid-epoch #5: step 65): metrics.jsonl has no note row" in printed
    assert printed.rstrip().endswith("1/2 faults handled (1 skipped)")
    assert faults.summarize(trials, ("disk-full", "changed-data"))["changed-data"] == {
        "trials": 2, "killed": 2, "completed": 2, "equal": None, "handled": 1, "skipped": 0, "attempts": [2, 2]}


def test_disk_full_is_skipped_with_its_reason_where_no_tmpfs_can_be_mounted(tmp_path, monkeypatch):
    monkeypatch.setattr(faults, "_mount", lambda path, options: "mount: only root can use \"--options\" option")
    reference = _final([])
    trial = faults.run_disk_full(faults.Trial("disk-full", 1, 2), [], tmp_path / "disk", reference, 4 << 20,
                                 faults.FaultsBenchConfig())
    assert trial.skipped and not trial.handled and trial.killed_at is None
    assert trial.error == 'skipped: cannot mount a tmpfs here (needs root): mount: only root can use "--options" option'
