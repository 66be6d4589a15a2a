"""`jaxtrain train alphazero`: bad input, a run's files, draws, and SIGKILL + resume exactness."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxtrain._src.checkpoint import Checkpointer
from jaxtrain.tools.cli import main

TINY = ["--game-batch-size", "8", "--simulations", "4", "--eval-games", "8", "--steps-per-epoch", "4",
        "--steps-per-call", "4", "--training-batch-size", "32", "--width", "16", "--depth", "2",
        "--replay-size", "512", "--verbosity", "summary", "--no-tensorboard"]


@pytest.mark.parametrize("flags, message", [
    (["--k", "7"], "--k 7 must be between 3 and --vertices (6)"),
    (["--k", "2"], "--k 2 must be between 3"),
    (["--vertices", "25", "--k", "4"], "--vertices 25 must be between 3 and 20"),
    (["--game-batch-size", "0"], "--game-batch-size 0 must be >= 1"),
    (["--training-batch-size", "0"], "--training-batch-size 0 must be >= 1"),
    (["--simulations", "-1"], "--simulations -1 must be >= 1"),
    (["--num-episodes", "-5"], "--num-episodes -5 must be >= 1"),
])
def test_bad_input_is_one_line_and_exit_2(flags, message, tmp_path, capsys):
    assert main(["train", "alphazero", *flags, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_num_episodes_sets_the_iterations():
    from jaxtrain.tools.recipes.alphazero import AlphaZeroConfig

    assert AlphaZeroConfig(num_episodes=1000, game_batch_size=64).epochs == 16
    assert AlphaZeroConfig(epochs=5).epochs == 5


def test_a_game_that_can_draw_reports_draws_and_the_run_files(tmp_path, capsys):
    # K_5 has 2-colourings without a monochromatic triangle (R(3,3) = 6): n = 5, k = 3 can draw, and is
    # small enough for the solver (n = 14, k = 4 is the same code with bigger tables: docs/benchmarks.md).
    run_dir = tmp_path / "run"
    assert main(["train", "alphazero", "--vertices", "5", "--k", "3", "--epochs", "1", *TINY,
                 "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "Self-Play:      8 games" in out and "draws" in out and "Val Draw Random First" in out
    epoch = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "epoch"][0]
    assert epoch["games"] == 8 and 0.0 <= epoch["draws"] <= 1.0 and epoch["game_length"] <= 10
    for key in ("val_win_random_first", "val_draw_random_second", "val_win_previous_second",
                "val_win_solver_second", "val_draw_solver_first"):
        assert 0.0 <= epoch[key] <= 1.0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and "final_val_draw_random_first" in summary
    assert (run_dir / "curves.png").stat().st_size > 1000


def _checkpoint(run_dir, step):
    flat, _ = Checkpointer(run_dir / "checkpoints", read_only=True).read(step)
    return {k: np.asarray(v) for k, v in flat.items()}


@pytest.mark.xla_defaults
@pytest.mark.slow
def test_sigkill_and_resume_equals_an_uninterrupted_run(tmp_path):
    """Parameters, optimizer state, RNG and the replay ring of the resumed run's last checkpoint
    equal the uninterrupted run's, bit for bit; every iteration checkpointed. (n = 5 as in the test above:
    the same programs, compiled once for the file.)"""
    args = ["train", "alphazero", "--vertices", "5", "--k", "3", "--epochs", "12", *TINY]
    reference = tmp_path / "reference"
    assert main([*args, "--run-dir", str(reference)]) == 0

    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "jaxtrain", *args, "--run-dir", str(killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        ckpt_dir = killed / "checkpoints"
        steps = Checkpointer(ckpt_dir, read_only=True).steps() if ckpt_dir.is_dir() else []
        if steps and steps[-1] >= 8:  # two iterations saved
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stderr.close()
    if proc.returncode == 0:
        pytest.skip("the run finished before SIGKILL arrived")
    assert proc.returncode == -signal.SIGKILL
    assert main([*args, "--run-dir", str(killed), "--resume", str(killed)]) == 0

    a, b = _checkpoint(reference, 48), _checkpoint(killed, 48)
    assert a.keys() == b.keys() and any(k.startswith("feed:") for k in a)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert int(a["feed:.added"]) > 0
