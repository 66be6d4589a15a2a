"""Workers of `jaxtrain sweep` sharing one study in a real PostgreSQL server (started here from the
pgserver wheel): one worker is SIGKILLed mid-trial, the others fail and ask its trial again, the
study ends with exactly N finished trials, each in a run directory of its own, and the same
command run again adds nothing; workers asking from one history draw apart. The heartbeat is 2 s
(stale after 6 s), not 1: a live trial starved of the CPU for 3 s in a loaded test run would be
failed too. And the sweep owns its workers: SIGTERM ends them and their trials are asked again by
the same command; a worker dies with its parent, SIGKILL included."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from _runs import draws_of_workers

optuna = pytest.importorskip("optuna")
pgserver = pytest.importorskip("pgserver")
psutil = pytest.importorskip("psutil")

FLAGS = ["--data.samples", "3000", "--data.val-samples", "200", "--data.features", "8", "--data.targets", "4",
         "--data.teacher-width", "8", "--model.hidden", "32", "--epochs", "3"]


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    """One server for the module (starting it is the slow part); each test has a study of its own."""
    server = pgserver.get_server(tmp_path_factory.mktemp("pg"), cleanup_mode="stop")
    yield server.get_uri()
    server.cleanup()


def _workers(parent: subprocess.Popen) -> list:
    """The parent's worker processes (multiprocessing's spawned children, not its resource tracker)."""
    return [p for p in psutil.Process(parent.pid).children()
            if any("spawn_main" in part for part in p.cmdline())]


def _running_after(processes: list, timeout: float) -> list:
    """Those of `processes` still running after `timeout` seconds. A zombie has ended: only its
    reaping by the process that adopted it is left (about 1 s for the init process here; not ours to wait for)."""
    end = time.monotonic() + timeout
    while True:
        running = []
        for p in processes:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    running.append(p)
            except psutil.NoSuchProcess:
                pass
        if not running or time.monotonic() >= end:
            return running
        time.sleep(0.01)


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
    ran = [t for t in study.trials if not t.user_attrs.get("surplus")]  # asked past the end in a race: unrun
    finished = [t for t in ran if t.state in (states.COMPLETE, states.PRUNED)]
    failed = [t for t in ran if t.state == states.FAIL]
    assert len(finished) == 4 and len(failed) == 1, [(t.number, t.state) for t in study.trials]
    retried = [t for t in finished if t.system_attrs.get("failed_trial") == failed[0].number]
    assert len(retried) == 1 and retried[0].params == failed[0].params
    run_dirs = [t.user_attrs["run_dir"] for t in ran]
    assert len(set(run_dirs)) == len(run_dirs) == 5  # no run directory holds two trials
    assert len({t.params["optim.lr"] for t in finished}) == 4  # the two workers drew apart
    for t in finished:
        assert json.loads((out / f"trial-{t.number:04d}" / "summary.json").read_text())["status"] == "completed"

    # the same command again: the study has its 4 trials, nothing more runs (in this process: what runs here is
    # the command's code; its own process would add only the start-up of Python and JAX)
    from jaxtrain.tools import cli, sweep

    assert cli.main(command) == 0
    assert len(optuna.load_study(study_name="pg", storage=postgres).trials) == len(study.trials)
    assert len(list(out.glob("trial-*"))) == 5

    # the best trial's command reproduces its validation loss
    best = study.best_trial
    line = shlex.split(best.user_attrs["command"])
    line += ["--run-dir", str(tmp_path / "again")]  # printed without one: runs/ by default
    assert cli.main([*line[1:], "--quiet"]) == 0
    summary = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert summary["best_val_loss"] == pytest.approx(best.value, rel=1e-6)

    # 16 trials asked by 4 workers in turn on one PostgreSQL study: 16 distinct values (on this server,
    # not a second one: starting it is the slow part)
    from jaxtrain.tools.recipes import get_recipe

    recipe = get_recipe("mlp-regression")
    config = cli.parse_config(type(recipe.config), recipe.config, [], "test")
    job = sweep._Job(recipe, config, (sweep.parse_space("optim.lr=loguniform:1e-4:1e-2"),), 16, str(tmp_path), postgres,
                     "draws", "val_loss", "minimize", "tpe", "none", 0, (), 10)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage")  # asked by hand, as workers would
        drawn = draws_of_workers(job)
    assert len(set(drawn)) == 16, drawn


def test_the_cluster_templates_run_workers_of_one_study(tmp_path, postgres):
    """examples/slurm/sweep-array.sbatch and examples/kubernetes/sweep-indexed-job.yaml as written (the
    recipe fixed smaller), run here as one array task and one pod: two workers of one PostgreSQL study.
    The pod has an indexed Job's environment, a cluster JAX would detect (and, without the `kubernetes`
    package, refuse to join in one line): its trials train alone all the same."""
    import yaml

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "STORAGE": postgres, "TRIALS": "4", "SEED": "0"}
    slurm = subprocess.Popen(
        ["bash", str(root / "examples/slurm/sweep-array.sbatch")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env={**env, "VENV": sys.prefix, "SWEEPS_ROOT": str(tmp_path), "SLURM_JOB_NAME": "sweep-mlp",
                        "SLURM_ARRAY_TASK_ID": "0", "RECIPE_FLAGS": " ".join(SMALL)})
    job = yaml.safe_load((root / "examples/kubernetes/sweep-indexed-job.yaml").read_text())
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    values = {"TRIALS": "4", "STORAGE": postgres}  # the pod's env: the secret's URL, the count
    assert {e["name"] for e in container["env"]} == set(values)
    command = [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], part) for part in container["command"]]
    [mount] = container["volumeMounts"]
    command = [part.replace(mount["mountPath"], str(tmp_path)) for part in command]  # the shared volume, here
    assert command[:3] == ["jaxtrain", "sweep", "mlp-regression"]
    pod_env = {**env, "KUBERNETES_SERVICE_HOST": "127.0.0.1", "JOB_COMPLETION_INDEX": "1"}
    kube = subprocess.Popen([sys.executable, "-m", "jaxtrain", *command[1:3], *SMALL, *command[3:]],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=pod_env)
    for worker in (slurm, kube):
        printed, _ = worker.communicate(timeout=240)
        assert worker.returncode == 0, printed

    assert job["spec"]["completionMode"] == "Indexed"
    study = optuna.load_study(study_name="sweep-mlp", storage=postgres)
    states = optuna.trial.TrialState
    finished = [t for t in study.trials if t.state in (states.COMPLETE, states.PRUNED)]  # the median pruner's
    assert len(finished) == 4 and len({t.params["optim.lr"] for t in finished}) == 4, study.trials
    for t in finished:  # one directory each, under the one OUT both templates name
        assert (tmp_path / "sweep-mlp" / f"trial-{t.number:04d}" / "summary.json").is_file()


SMALL = ["--data.samples", "600", "--data.val-samples", "88", "--data.features", "8", "--data.targets", "4",
         "--data.teacher-width", "8", "--model.hidden", "32", "--epochs", "3"]


@pytest.mark.slow
def test_sigterm_ends_a_two_worker_sweep_and_the_same_command_finishes_it(tmp_path, capfd):
    out = tmp_path / "sweep"
    command = [sys.executable, "-m", "jaxtrain", "sweep", "mlp-regression", *SMALL, "--space",
               "optim.lr=loguniform:1e-4:1e-2", "--trials", "2", "--workers", "2", "--out", str(out),
               "--pruner", "none"]
    parent = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while not list(out.glob("trial-*/config.json")):  # a worker is training a trial
        assert parent.poll() is None and time.monotonic() < deadline, parent.communicate()[0]
        time.sleep(0.05)
    workers = _workers(parent)
    parent.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    printed, _ = parent.communicate(timeout=60)
    alive = _running_after(workers, timeout=max(0.0, 3 - (time.monotonic() - sent)))
    assert not alive, (alive, printed)  # no worker outlives the sweep by 3 s
    assert parent.returncode == 143, printed
    errors = [line for line in printed.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert len(errors) == 1 and errors[0].startswith("error: stopped by SIGTERM: its 2 workers ended;"), printed
    assert "leaked" not in printed  # the killed workers' semaphores: removed without a warning

    study = optuna.load_study(study_name="mlp-regression", storage=f"sqlite:///{out / 'study.db'}")
    states = optuna.trial.TrialState
    failed = [t for t in study.trials if t.state == states.FAIL]
    waiting = [t for t in study.trials if t.state == states.WAITING]
    assert failed and not [t for t in study.trials if t.state == states.RUNNING], study.trials
    assert sorted(t.system_attrs["failed_trial"] for t in waiting) == [t.number for t in failed if t.params]
    # the same command: the stopped trials' values again, the study finished, one directory per trial (run in
    # this process: its workers are processes of their own all the same)
    from jaxtrain.tools import cli

    assert cli.main(command[3:]) == 0
    assert "again: the sweep was stopped)" in capfd.readouterr().out
    study = optuna.load_study(study_name="mlp-regression", storage=f"sqlite:///{out / 'study.db'}")
    finished = [t for t in study.trials if t.state == states.COMPLETE]
    assert len(finished) == 2 and {t.params["optim.lr"] for t in finished} <= {t.params["optim.lr"] for t in failed}
    assert {p.name for p in out.glob("trial-*")} <= {f"trial-{t.number:04d}" for t in study.trials}
    for t in finished:  # a directory of its own, trained to the end
        assert json.loads((out / f"trial-{t.number:04d}" / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_a_worker_dies_with_its_parent_even_by_sigkill():
    child = ("import time; from jaxtrain.tools.sweep import _die_with_parent; _die_with_parent(); "
             "print('ready', flush=True); time.sleep(120)")
    middle = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen([sys.executable, "
                               f"'-c', {child!r}]); print(p.pid, flush=True); p.wait()"],
                              stdout=subprocess.PIPE, text=True)
    pid = int(middle.stdout.readline())
    assert middle.stdout.readline().strip() == "ready"
    assert os.getpgid(pid) == pid  # its own process group: the terminal's Ctrl-C reaches the sweep alone
    child = psutil.Process(pid)
    middle.kill()
    middle.wait()
    middle.stdout.close()
    alive = _running_after([child], timeout=3)
    for process in alive:
        process.kill()  # not left behind by a failing test
    assert not alive
