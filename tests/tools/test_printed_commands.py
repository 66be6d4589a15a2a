"""Every command jaxtrain prints for the user to run runs as printed: each is read from the output of
a tiny real run and executed through the command's `main` (the printed line split as a shell
splits it), then checked to do what the line says it does. The commands: the resume hint of a
stopped run, a sweep's "reproduce it with" and `sweep report` lines, `tune lr`'s and `tune
batch-size`'s train commands, the profile's `jaxtrain doctor`, and the `jaxtrain data ...` commands
that data errors name."""

import json
import os
import re
import shlex
import signal
from pathlib import Path

import h5py
import pytest
from _runs import log_rows

from jaxtrain.tools.cli import main

# mlp-regression at its smallest: 600 training rows of 8 features, a 32-32 MLP
TINY = ["--data.samples", "600", "--data.val-samples", "100", "--data.features", "8", "--data.targets", "4",
        "--data.teacher-width", "8", "--model.hidden", "32", "32", "--verbosity", "summary"]


def printed(text: str, after: str) -> str:
    """The command printed after `after` (on the same line, or alone on the next when `after` ends
    its line), or inside the backticks that follow it."""
    found = re.search(re.escape(after) + r"\s*(`([^`]+)`|[^\n]+)", text)
    assert found, f"{after!r} is not in:\n{text}"
    return found.group(2) or found.group(1).strip()


def run_as_printed(command: str) -> int:
    args = shlex.split(command)
    assert args[0] == "jaxtrain", command
    return main(args[1:])


def the_run() -> Path:
    """The one run directory under runs/ (where a command without --run-dir trains)."""
    (made,) = Path("runs").iterdir()
    return made


def test_the_resume_hint_of_a_stopped_run_continues_it_to_the_uninterrupted_result(tmp_path, monkeypatch, capsys):
    from jaxtrain._src.hooks.metrics import MetricsHook

    monkeypatch.chdir(tmp_path)
    train = ["train", "mlp-regression", *TINY, "--epochs", "2", "--steps-per-call", "4"]
    assert main([*train, "--run-dir", "runs/whole"]) == 0
    after_call, sent = MetricsHook.after_call, []

    def sigterm_at_step_8(self, run, k, metrics):  # as a scheduler's preemption would, mid-epoch
        after_call(self, run, k, metrics)
        if run.step >= 8 and not sent:
            sent.append(run.step)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(MetricsHook, "after_call", sigterm_at_step_8)
    capsys.readouterr()
    assert main([*train, "--run-dir", "runs/a"]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    command = printed(err, "resume with:")
    assert command == f"jaxtrain train mlp-regression --resume {shlex.quote(str(tmp_path / 'runs' / 'a'))}"
    assert run_as_printed(command) == 0, capsys.readouterr().err
    assert log_rows("runs/a") == log_rows("runs/whole")


def test_a_sweeps_reproduce_and_report_lines_run_as_printed(tmp_path, monkeypatch, capsys):
    from jaxtrain.tools import sweep

    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "mlp-regression", *TINY, "--epochs", "2", "--space", "optim.lr=loguniform:1e-3:1e-1",
                 "--trials", "2", "--pruner", "none", "--out", "sweeps/s"]) == 0
    out = capsys.readouterr().out
    best = sweep.load_study("sweeps/s").best_trial
    assert f"best: trial {best.number} (sweeps/s/trial-{best.number:04d})," in out
    reproduce = printed(out, "reproduce it with:")
    assert "--run-dir" not in reproduce  # the trial's own directory holds the trial: a new one, under runs/
    assert run_as_printed(reproduce) == 0, capsys.readouterr().err
    again = json.loads((the_run() / "summary.json").read_text())
    assert again["best_val_loss"] == pytest.approx(best.value, rel=1e-6)  # the trial, trained again

    capsys.readouterr()
    report = printed(out, "parameter importances and plots:")
    assert report == "jaxtrain sweep report sweeps/s"
    assert run_as_printed(report) == 0
    shown = capsys.readouterr().out
    assert "study mlp-regression: 2 trials" in shown and "parameter importances (fANOVA): optim.lr" in shown
    assert all((tmp_path / "sweeps/s" / f"sweep-{name}.png").is_file() for name in ("history", "parallel", "slices"))


TOLERANCE = 1.1  # a recommended command's best val loss is at most this many times the replaced config's


def best_val_loss(run_dir: str) -> float:
    return json.loads(Path(run_dir, "summary.json").read_text())["best_val_loss"]


def trains_as_well(command: str, replaced: list[str], capsys) -> tuple[dict, str]:
    """Runs the printed `command` and `jaxtrain train ...replaced` (what it replaces) to run directories
    and checks the first's best val loss is within `TOLERANCE` of the second's; returns the first's
    config and what the second printed."""
    assert run_as_printed(command + " --run-dir printed") == 0
    capsys.readouterr()
    assert main(["train", *replaced, "--run-dir", "replaced"]) == 0
    ours, theirs = best_val_loss("printed"), best_val_loss("replaced")
    assert ours <= TOLERANCE * theirs, (command, ours, theirs)
    return json.loads(Path("printed", "config.json").read_text()), capsys.readouterr().out


def test_tune_lr_suggests_a_command_with_the_settings_it_measured(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    measured = ["mlp-regression", *TINY, "--epochs", "1", "--optim.lr", "0.5"]  # a rate too high to train well
    assert main(["tune", "lr", *measured, "--steps", "40", "--out", "lr.png"]) == 0
    out = capsys.readouterr().out
    assert "learning-rate range test, adam, 40 steps" in out and Path("lr.png").is_file()
    assert re.search(r"check: the suggestion \S+ reached val_loss \S+ against \S+ at the config's rate 5.0e-1", out)
    command = printed(out, "train with:")
    args = shlex.split(command)
    assert 1e-7 <= float(args[args.index("--optim.lr") + 1]) <= 10
    assert args[:3] == ["jaxtrain", "train", "mlp-regression"] and args.count("--optim.lr") == 1
    assert shlex.join(TINY) in command and "--steps" not in args and "--out" not in args  # the tune's own
    config, _ = trains_as_well(command, measured, capsys)
    assert config["optim"]["lr"] == float(args[args.index("--optim.lr") + 1])
    assert (config["data"]["samples"], config["model"]["hidden"], config["epochs"]) == (600, [32, 32], 1)


def test_tune_batch_size_recommends_a_command_that_trains_as_well_as_the_config(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    measured = ["mlp-regression", *TINY, "--epochs", "1", "--batch-size", "2"]
    assert main(["tune", "batch-size", *measured, "--max-batch", "8", "--no-throughput", "--out", "bs.png"]) == 0
    out = capsys.readouterr().out
    assert "search ended at max_batch=8" in out and Path("bs.png").is_file()
    assert "available RAM" in out or "memory limit" in out  # the default cap says its source
    assert "check: 500 training samples asked per run" in out and "why: " in out
    # the config's whole run fits in the check: it is run whole (1 epoch of 250 steps of 2), as the command runs
    assert re.search(r"batch +2 lr +1\.0e-3 config +500 samples", out)
    command = printed(out, "recommended:")
    args = shlex.split(command)
    assert shlex.join(TINY) in command and args.count("--batch-size") == 1 and "--max-batch" not in args
    config, profiled = trains_as_well(command, measured, capsys)
    assert config["batch_size"] == int(args[args.index("--batch-size") + 1]) > 2
    assert config["optim"]["lr"] == float(args[args.index("--optim.lr") + 1])
    assert (config["data"]["samples"], config["model"]["hidden"]) == (600, [32, 32])

    # The profile at the end of the replaced run advises flags too (speed only: the same training)
    advised = re.findall(r"^ +(?:Try: +)?\d\. (--[a-z][\w.-]* \S+): ", profiled, re.M)
    assert advised, profiled  # a tiny run is dispatch-bound: a larger K at least
    for i, flag in enumerate(advised):
        assert main(["train", *measured, *flag.split(), "--run-dir", f"advised-{i}"]) == 0, flag
        assert best_val_loss(f"advised-{i}") <= TOLERANCE * best_val_loss("replaced"), flag


def test_the_profiles_doctor_hint_runs_and_a_later_run_reads_the_rate_it_measured(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where the rate is recorded: none yet
    train = ["train", "mlp-regression", *TINY, "--epochs", "1"]
    assert main([*train, "--run-dir", "a"]) == 0
    command = printed(capsys.readouterr().out, "the device's matmul rate is unknown (run")
    assert command == "jaxtrain doctor"
    assert run_as_printed(command) == 0
    assert (tmp_path / "cache" / "jaxtrain" / "machine.json").is_file()
    capsys.readouterr()
    assert main([*train, "--run-dir", "b"]) == 0
    out = capsys.readouterr().out
    assert "matmul rate is unknown" not in out and re.search(r"MFU [\d.]+% of the [\d.]+ \w?FLOP/s float32", out)


def test_the_data_commands_that_data_errors_name_run_as_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "hdf5-sequence"]) == 2  # no file: the error says how to make one
    command = printed(capsys.readouterr().err, "make one with:")
    assert command == "jaxtrain data generate sequence data.h5 --samples 100000"
    assert run_as_printed(command) == 0
    with h5py.File("data.h5") as f:  # what hdf5-sequence reads
        assert {k: f[k].shape[0] for k in ("input_sequences", "labels", "targets")} == dict.fromkeys(
            ("input_sequences", "labels", "targets"), 100_000)

    os.makedirs("my data")  # a path a shell would split
    os.replace("data.h5", "my data/seq.h5")
    assert main(["train", "mlp-regression", "--data.path", "my data/seq.h5", "--quiet"]) == 2
    command = printed(capsys.readouterr().err, "e.g.")
    assert command == "jaxtrain data inspect 'my data/seq.h5'"
    assert run_as_printed(command) == 0
    assert "input_sequences" in capsys.readouterr().out  # it lists the datasets the file has
