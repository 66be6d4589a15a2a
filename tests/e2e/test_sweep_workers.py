"""Workers of `jaxtrain sweep` sharing one study in a real PostgreSQL server (started here from the
pgserver wheel): one worker is SIGKILLed mid-trial, the others fail and ask its trial again, the
study ends with exactly N finished trials, each in a run directory of its own, and the same
command run again adds nothing. The heartbeat is 2 s (stale after 6 s), not 1: a live trial
starved of the CPU for 3 s in a loaded test run would be failed too."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

optuna = pytest.importorskip("optuna")
pgserver = pytest.importorskip("pgserver")
psutil = pytest.importorskip("psutil")

FLAGS = ["--data.samples", "3000", "--data.val-samples", "200", "--data.features", "8", "--data.targets", "4",
         "--data.teacher-width", "8", "--model.hidden", "32", "--epochs", "3"]


@pytest.fixture
def postgres(tmp_path):
    server = pgserver.get_server(tmp_path / "pg", cleanup_mode="stop")
    yield server.get_uri()
    server.cleanup()


def _workers(parent: subprocess.Popen) -> list:
    """The parent's worker processes (multiprocessing's spawned children, not its resource tracker)."""
    return [p for p in psutil.Process(parent.pid).children()
            if any("spawn_main" in part for part in p.cmdline())]


def test_workers_on_postgresql_survive_a_killed_worker(tmp_path, postgres):
    out = tmp_path / "sweep"
    command = ["sweep", "mlp-regression", *FLAGS, "--space", "optim.lr=loguniform:1e-4:1e-2", "--trials", "4",
               "--workers", "2", "--storage", postgres, "--study", "pg", "--out", str(out), "--heartbeat", "2",
               "--pruner", "none"]
    parent = subprocess.Popen([sys.executable, "-m", "jaxtrain", *command], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while len(list(out.glob("trial-*"))) < 2:  # both workers are inside a trial
        assert parent.poll() is None and time.monotonic() < deadline, parent.communicate()[0]
        time.sleep(0.05)
    victim = _workers(parent)[0]
    victim.send_signal(signal.SIGKILL)
    printed, _ = parent.communicate(timeout=180)
    assert parent.returncode == 0, printed
    assert "was killed by signal 9" in printed and "again: its worker died" in printed, printed

    study = optuna.load_study(study_name="pg", storage=postgres)
    states = optuna.trial.TrialState
    finished = [t for t in study.trials if t.state in (states.COMPLETE, states.PRUNED)]
    failed = [t for t in study.trials if t.state == states.FAIL]
    assert len(finished) == 4 and len(failed) == 1, [(t.number, t.state) for t in study.trials]
    retried = [t for t in finished if t.system_attrs.get("failed_trial") == failed[0].number]
    assert len(retried) == 1 and retried[0].params == failed[0].params
    run_dirs = [t.user_attrs["run_dir"] for t in study.trials]
    assert len(set(run_dirs)) == len(run_dirs) == 5  # no run directory holds two trials
    for t in finished:
        assert json.loads((out / f"trial-{t.number:04d}" / "summary.json").read_text())["status"] == "completed"

    # the same command again: the study has its 4 trials, nothing more runs
    again = subprocess.run([sys.executable, "-m", "jaxtrain", *command], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert len(optuna.load_study(study_name="pg", storage=postgres).trials) == 5
    assert len(list(out.glob("trial-*"))) == 5

    # the best trial's command reproduces its validation loss
    best = study.best_trial
    line = shlex.split(best.user_attrs["command"])
    line[line.index("--run-dir") + 1] = str(tmp_path / "again")
    subprocess.run([sys.executable, "-m", "jaxtrain", *line[1:], "--quiet"], check=True, timeout=120)
    summary = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert summary["best_val_loss"] == pytest.approx(best.value, rel=1e-6)
