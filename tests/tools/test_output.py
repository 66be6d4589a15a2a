"""What a run says about itself: `--quiet` prints the final result alone (a run's, a sweep's); the
K, the compiled programs and the form's figures in summary.json agree with the calls that ran; no
shell completion is offered that does not work."""

import json
import re

import pytest
from conftest import mse, regression_data, silent, small_mlp

from jaxtrain import DataConfig, TrainConfig
from jaxtrain._src.choosers import AutoSteps
from jaxtrain._src.data.sources import ArraySource
from jaxtrain._src.loop import RunOptions, run
from jaxtrain._src.report.profile_report import profile_lines
from jaxtrain.tools.cli import main

SMALL = ["--data.samples", "1000", "--data.val-samples", "200", "--model.hidden", "16", "--epochs", "1",
         "--checkpoint.no-enabled", "--no-tensorboard"]


def test_quiet_prints_the_final_result_and_nothing_else(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "mlp-regression", *SMALL, "--quiet", "--run-dir", str(run_dir)]) == 0
    out, err = capsys.readouterr()
    summary = json.loads((run_dir / "summary.json").read_text())
    lines = out.splitlines()
    assert err == "" and len(lines) == 4, out  # no header, K, epoch blocks, profile or memory
    assert lines[0].startswith(f"mlp-regression completed: 1 epoch, {summary['steps']} steps in ")
    assert lines[1] == f"  best val_loss {summary['best_val_loss']:.6f} (epoch 1)"
    assert lines[2] == (f"  final train_loss {summary['final_train_loss']:.6f}, "
                        f"val_loss {summary['final_val_loss']:.6f}, val_mae {summary['final_val_mae']:.6f}")
    assert lines[3] == f"  run dir: {run_dir}"
    assert (run_dir / "curves.png").is_file()  # drawn all the same, not announced


def test_quiet_on_a_resume_wins_over_the_verbosity_the_run_was_started_with(tmp_path, capsys):
    run_dir, small = tmp_path / "run", [a for a in SMALL if a != "--checkpoint.no-enabled"]
    assert main(["train", "mlp-regression", *small, "--verbosity", "summary", "--run-dir", str(run_dir)]) == 0
    assert len(capsys.readouterr().out.splitlines()) > 20  # summaries, profile, memory
    assert main(["train", "mlp-regression", "--resume", str(run_dir), "--epochs", "2", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and len(out.splitlines()) == 4 and out.startswith("mlp-regression completed: 2 epochs"), out


def test_quiet_sweep_prints_its_result_not_a_line_per_trial(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "mlp-regression", *SMALL, "--space", "optim.lr=loguniform:1e-3:1e-2", "--trials", "1",
                 "--out", str(out), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines
    assert lines[0] == f"study mlp-regression: 1 trials (1 complete) in {out}"
    assert lines[1].startswith(f"best: trial 0 ({out}/trial-0000), val_loss ")
    assert lines[2].startswith("  jaxtrain train mlp-regression ")


def _compiled(profile):
    """(k, why, calls) of each training call program the run compiled."""
    return [(c["k"], c["why"], c["calls"]) for c in profile["compiles"] if c["what"] == "train call"]


def test_a_short_run_reports_the_k_its_one_call_ran():
    # 30 steps, one call: its time (every call counts as slow here) cannot change a K no call is left for.
    config = TrainConfig(epochs=1, batch_size=16)
    slow = RunOptions(console=silent(), auto_steps=AutoSteps(slow_call_s=0.0))
    result = run(small_mlp(), mse, regression_data(480), None, config, verbosity="summary", session=slow)
    p = result.summary["profile"]
    assert result.summary["steps_per_call"] == 30 and p["steps_per_call"] == 30 and p["longest_call"] == 30
    assert _compiled(p) == [(30, "the run's K, automatic (a run too short for measuring K to pay)", 1)]
    printed = slow.console.file.getvalue()
    assert "K=16" not in printed and "1 call of up to K=30" in printed


def test_a_short_streamed_run_labels_each_program_by_the_calls_it_ran():
    # 20 steps an epoch, 2 epochs: the first call (K_b = 20) is slow, so K_a = 16 from then on; streamed
    # batches need a program per call length: 20, 16, and the epoch's remaining 4.
    config = TrainConfig(epochs=2, batch_size=10, data=DataConfig(placement="stream"))
    session = RunOptions(console=silent(), auto_steps=AutoSteps(slow_call_s=0.0))
    result = run(small_mlp(), mse, ArraySource(regression_data(200)), None, config, verbosity="summary",
                 session=session)
    p = result.summary["profile"]
    seconds = re.search(r"took (\d+\.\d) s", _compiled(p)[0][1]).group(1)  # the first call's time
    assert _compiled(p) == [
        (20, f"a short run's K_b, until its first call (20 steps) took {seconds} s; K=16 from then on", 1),
        (16, f"the run's K, K_a: a call of 20 steps took {seconds} s", 1),
        (4, "last call of the epoch: the 4 steps left after calls of K=16", 1)]
    assert sum(calls for *_, calls in _compiled(p)) == p["calls"] == 3 and p["steps"] == 40
    assert result.summary["steps_per_call"] == 16 and p["longest_call"] == 20
    lines = [line for line in profile_lines(p) if line.startswith("  compiled ")]
    assert [line.split()[1] for line in lines] == ["K=20", "K=16", "K=4"] and all(line.endswith("; 1 call")
                                                                             for line in lines)
    assert "40 steps in 3 calls of up to 20 steps (K=16)" in profile_lines(p)[0]


def test_the_loop_is_timed_per_step_apart_from_its_calls_fixed_cost():
    # 450 steps an epoch: the form and K are both measured, the form's loop segments on K_b's program
    # (128 steps, most of them skipped): the call's own time is measured apart and not counted per step.
    config = TrainConfig(epochs=1, batch_size=16)
    session = RunOptions(console=silent(), auto_steps=AutoSteps(short_run_calls=0))
    result = run(small_mlp(), mse, regression_data(7200), None, config, verbosity="summary", session=session)
    form, p = result.summary["step_form"], result.summary["profile"]
    # A step of this small model is lost in the noise of a call's fixed time: about 0, not a call's time.
    assert form["why"].startswith("measured: ") and form["loop_ms_per_call"] > form["ms_per_step"]["scan"] >= 0
    assert f" ms/step + {form['loop_ms_per_call']:.3g} ms per call" in form["why"]
    (step,) = [c for c in p["compiles"] if c["what"] == "train step"]
    assert step["why"].startswith("timing probe of the step's form")
    assert any(line.startswith("  compiled 1 step ") for line in profile_lines(p))
    if form["form"] == "scan":  # as a step this small runs (a loaded machine's timings may decide otherwise)
        assert (step["why"], step["calls"]) == ("timing probe of the step's form", 0)  # it timed a copy
        k_b, why, calls = _compiled(p)[0]
        assert k_b == 128 and why.startswith("timing probe of the automatic K") and calls >= 6


def test_tyros_completion_flags_are_refused_and_not_offered(tmp_path, capsys):
    script = tmp_path / "jaxtrain.bash"
    for flag in (["--tyro-write-completion", "bash", str(script)], ["--tyro-print-completion", "bash"]):
        assert main(["train", "mlp-regression", *flag]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == f"error: {flag[0]}: jaxtrain offers no shell completion (tyro's script would " \
                                    "complete one command's options, not jaxtrain's commands); nothing was written\n"
    assert not script.exists()
    with pytest.raises(SystemExit) as info:  # tyro's help, which lists no completion either
        main(["train", "mlp-regression", "--help"])
    assert info.value.code == 0 and "completion" not in capsys.readouterr().out
