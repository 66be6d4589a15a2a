"""`jaxtrain sweep`: spaces, a study that re-running continues, trials as run directories whose
command reproduces them, pruning, the report, and bad input as one line."""

import dataclasses
import json
import os
import shlex
import signal
import socket
import sys

import optuna
import pytest
from _runs import draws_of_workers

from jaxtrain._src.errors import ConfigError
from jaxtrain.tools import cli, sweep
from jaxtrain.tools.recipes import get_recipe

FLAGS = ["--data.samples", "600", "--data.val-samples", "88", "--data.features", "8", "--data.targets", "4",
         "--data.teacher-width", "8", "--model.hidden", "32", "--epochs", "3"]
SPACE = ["--space", "optim.lr=loguniform:1e-4:1e-1", "--space", "model.hidden=choice:16,32"]


def test_spaces_parse_and_apply_to_any_field():
    assert sweep.parse_space("optim.lr=loguniform:1e-4:1e-2") == sweep.Space("optim.lr", "loguniform", 1e-4, 1e-2)
    assert sweep.parse_space("model.hidden=choice:64,128").choices == (64, 128)
    assert sweep.parse_space("batch_size=int:16:64").kind == "int"
    for bad, message in (("optim.lr", "write NAME=KIND:ARGS"), ("optim.lr=normal:0:1", "unknown kind 'normal'"),
                         ("optim.lr=loguniform:0:1", "LOW > 0"), ("x=uniform:2:1", "need LOW < HIGH"),
                         ("x=int:1:2.5", "whole numbers"), ("x=choice:", "choice needs values")):
        with pytest.raises(ConfigError, match=message):
            sweep.parse_space(bad)
    config = get_recipe("mlp-regression").config
    changed = sweep.apply_values(config, {"optim.lr": 0.01, "model.hidden": 64, "batch_size": 16})
    assert (changed.optim.lr, changed.model.hidden, changed.batch_size) == (0.01, (64, 64), 16)
    with pytest.raises(ConfigError, match="no field 'lrr'"):
        sweep.apply_values(config, {"optim.lrr": 0.1})
    with pytest.raises(ConfigError, match="must be a positive number"):
        sweep.apply_values(config, {"optim.lr": -1.0})
    assert sweep.without_flags(["--epochs", "3", "--model.hidden", "8", "8", "--seed", "1"], ["model.hidden"]) == [
        "--epochs", "3", "--seed", "1"]


def test_sweep_runs_trials_as_run_directories_continues_and_reproduces_the_best(tmp_path, capsys, monkeypatch):
    from jaxtrain.tools import runs

    released, release = [], runs.release_compiled_programs
    monkeypatch.setattr(runs, "release_compiled_programs", lambda: (released.append(1), release()))
    monkeypatch.setattr(runs, "_first_run", True)  # as in a fresh process
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "mlp-regression", *FLAGS, *SPACE, "--trials", "3", "--out", str(out)]) == 0
    assert released == [1]  # the first trial's build; the next trials keep what theirs compile
    printed = capsys.readouterr().out
    assert "study mlp-regression: 3 trials" in printed and "reproduce it with:" in printed
    assert "(fANOVA)" not in printed  # left to the report: their scikit-learn import outlasts a small sweep's end
    assert f"parameter importances and plots: jaxtrain sweep report {out}" in printed
    study = sweep.load_study(out)
    finished = [t for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE,
                                                       optuna.trial.TrialState.PRUNED)]
    assert len(finished) == 3 and sorted(p.name for p in out.glob("trial-*")) == [f"trial-000{i}" for i in range(3)]
    # the same command with more trials continues the study: one more, never a second directory per trial
    assert cli.main(["sweep", "mlp-regression", *FLAGS, *SPACE, "--trials", "4", "--out", str(out)]) == 0
    assert cli.main(["sweep", "mlp-regression", *FLAGS, *SPACE, "--trials", "4", "--out", str(out)]) == 0
    assert len(sweep.load_study(out).trials) == 4 and len(list(out.glob("trial-*"))) == 4
    assert len({t.params["optim.lr"] for t in sweep.load_study(out).trials}) == 4  # no values drawn twice
    # what a trial prints and keeps may change; what it trains may not: its objective would not compare
    assert sweep.load_study(out).user_attrs["settings"]["epochs"] == 3
    assert cli.main(["sweep", "mlp-regression", *FLAGS, *SPACE, "--quiet", "--checkpoint.no-enabled", "--trials", "4",
                     "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["sweep", "mlp-regression", *FLAGS, "--epochs", "2", "--optim.name", "sgd", *SPACE,
                     "--trials", "5", "--out", str(out)]) == 2
    assert ("trained its trials with --epochs 3, --optim.name adam, not --epochs 2, --optim.name sgd: their "
            "val_loss would not compare;") in _one_line(capsys)
    assert len(sweep.load_study(out).trials) == 4
    best = sweep.load_study(out).best_trial
    summary = json.loads((out / f"trial-{best.number:04d}" / "summary.json").read_text())
    assert summary["best_val_loss"] == pytest.approx(best.value, rel=1e-9)
    command = shlex.split(best.user_attrs["command"])
    command += ["--run-dir", str(tmp_path / "again")]  # printed without one: runs/ by default
    assert cli.main(command[1:] + ["--quiet"]) == 0  # the best trial's command, run again
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert again["best_val_loss"] == pytest.approx(best.value, rel=1e-6)
    capsys.readouterr()
    assert cli.main(["sweep", "report", str(out)]) == 0
    assert "parameter importances (fANOVA): " in capsys.readouterr().out
    assert all((out / f"sweep-{name}.png").is_file() for name in ("history", "parallel", "slices"))


def test_a_pruned_trial_stops_at_the_epoch_the_pruner_names(tmp_path):
    recipe = get_recipe("mlp-regression")
    config = cli.parse_config(type(recipe.config), recipe.config, list(FLAGS), "test")
    study = sweep.sweep(recipe, config, [sweep.parse_space("optim.lr=loguniform:1e-4:1e-1")], 2, tmp_path,
                        pruner=optuna.pruners.ThresholdPruner(upper=0.0))  # any loss is too high: prune
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.PRUNED] * 2
    for t in study.trials:
        summary = json.loads((tmp_path / f"trial-{t.number:04d}" / "summary.json").read_text())
        assert summary["status"] == "stopped early" and summary["epochs"] == 1  # not the 3 asked for
    # a trial that reaches its last epoch did all its work: complete, whatever the pruner says there
    last = sweep.sweep(recipe, dataclasses.replace(config, epochs=1), [sweep.parse_space("optim.lr=choice:1e-3")], 1,
                       tmp_path / "one-epoch", pruner=optuna.pruners.ThresholdPruner(upper=0.0))
    assert [t.state for t in last.trials] == [optuna.trial.TrialState.COMPLETE]
    summary = json.loads((tmp_path / "one-epoch" / "trial-0000" / "summary.json").read_text())
    assert summary["status"] == "completed" and last.trials[0].value == summary["best_val_loss"]


def test_a_diverging_trial_fails_and_the_sweep_goes_on(tmp_path):
    recipe = get_recipe("mlp-regression")
    config = cli.parse_config(type(recipe.config), recipe.config, list(FLAGS), "test")
    study = sweep.sweep(recipe, config, [sweep.parse_space("optim.lr=choice:1e12")], 2, tmp_path, pruner="none")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL] * 2  # both ran, neither stopped it
    summary = json.loads((tmp_path / "trial-0001" / "summary.json").read_text())
    assert summary["status"] == "stopped: non-finite loss"


def test_bad_sweeps_are_one_line_and_exit_2(tmp_path, capsys):
    for args, message in ((["--space", "optim.nope=uniform:0:1", "--trials", "1"], "the config has no field 'nope'"),
                          (["--trials", "1"], "a sweep needs at least one --space"),
                          (SPACE, "a sweep needs --trials N and --out DIR")):
        out = [] if "--trials" not in args else ["--out", str(tmp_path / "s")]
        assert cli.main(["sweep", "mlp-regression", *FLAGS, *args, *out]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert cli.main(["sweep", "report", str(tmp_path / "none")]) == 2
    assert "holds no study.db" in capsys.readouterr().err


def test_a_sweep_without_optuna_is_one_line_naming_the_extra_and_leaves_no_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # the base install alone (make demo): no sweep extra
    out = tmp_path / "s"
    for command in (["sweep", "mlp-regression", *FLAGS, *SPACE, "--trials", "1", "--out", str(out)],
                    ["sweep", "report", str(out)]):
        assert cli.main(command) == 2
        assert 'needs optuna, which is not installed' in (line := _one_line(capsys)), line
        assert 'pip install -e ".[sweep]"' in line, line
    assert not out.exists()


def test_a_sweep_refused_in_a_folder_it_made_leaves_no_lock_behind(tmp_path, monkeypatch):
    def refuse(*args):
        raise ConfigError("the storage failed")

    monkeypatch.setattr(sweep._Job, "open", refuse)
    for out in (tmp_path / "new", tmp_path / "held"):
        if out.name == "held":  # a folder the user made, or holding more than the lock, is left as it is
            out.mkdir()
        with pytest.raises(ConfigError, match="the storage failed"):
            sweep.sweep(get_recipe("mlp-regression"), get_recipe("mlp-regression").config,
                        [sweep.parse_space("optim.lr=loguniform:1e-4:1e-2")], 1, out)
    assert not (tmp_path / "new").exists() and (tmp_path / "held").is_dir()


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_storages_seeds_spaces_and_sizes_are_one_line_naming_the_flag_before_any_work(tmp_path, capsys,
                                                                                             monkeypatch):
    out = tmp_path / "s"
    lr = ["--space", "optim.lr=loguniform:1e-4:1e-2"]
    for args, message in (
            ([*lr, "--storage", "bogus://x"], "--storage bogus://x is not a database URL SQLAlchemy can open"),
            ([*lr, "--storage", f"sqlite:///{tmp_path}/missing/study.db"], "unable to open database file; its folder"),
            ([*lr, "--storage", f"postgresql://u:secret@127.0.0.1:{_closed_port()}/db"], "Connection refused"),
            ([*lr, "--seed", str(2**70)], f"--seed {2**70}: the sampler's seed must be an integer from 0 to"),
            (["--space", "optim.lr=uniform:1e-4:inf"], "'inf' is not a finite number"),
            (["--space", "optim=choice:1,2"], "'optim' is a section of the config, not a field; name one of its "
                                              "fields (optim.name, optim.lr,"),
            ([*lr, "--space", "optim.lr=uniform:1e-4:1e-2"], "--space optim.lr is given twice"),
            (["--space", "optim.b1=uniform:0.5:1.5"], "the config refuses 1.5"),  # the high end, not only the low
            (["--space", "optim.name=choice:adam,nope"], "the config refuses 'nope'"),
            (["--space", "epochs=uniform:1:3"], "epochs takes whole numbers, and uniform draws fractions; write "
                                                "epochs=int:1:3"),
            ([*lr, "--workers", str(os.cpu_count() + 1)], f"--workers {os.cpu_count() + 1}: this machine gives the "
                                                          "sweep"),
            ([*lr, "--trials", "100000"], "--trials 100000: past 10,000 trials"),
            # what `fit` would refuse at the trial that draws it, against the training set (512 rows)
            (["--space", "batch_size=int:16:4096"], "--space batch_size=int:16:4096: at its largest batch, "
                                                    "batch_size=4096 is larger than the training set (512 samples)"),
            (["--space", "grad_accum=choice:1,64"], "batch_size x grad_accum = 2048 is larger than the training set"),
            (["--space", "data.val_samples=int:88:590"], "at data.val_samples=590, batch_size=32 is larger than the "
                                                         "training set (10 samples)"),
            ([*lr, "--trials", "2000", "--population", "2000"], "--population 2000: a population's trials are all "
                                                                "asked before any trains")):
        trials = [] if "--trials" in args else ["--trials", "1"]
        assert cli.main(["sweep", "mlp-regression", *FLAGS, *args, *trials, "--out", str(out)]) == 2, args
        line = _one_line(capsys)
        assert message in line, line
        assert "secret" not in line and not list(out.glob("trial-*")), line  # no password shown; nothing trained
    # the machine's memory: workers of this process's size, a population's states on the device
    monkeypatch.setattr(sweep, "_cores", lambda: 4)
    monkeypatch.setattr(sweep, "WORKER_BYTES", 2**50)
    assert cli.main(["sweep", "mlp-regression", *FLAGS, *lr, "--trials", "1", "--workers", "2", "--out",
                     str(out)]) == 2
    assert "of memory available: pass --workers 1 or fewer" in _one_line(capsys)
    from jaxtrain.tools import tune

    monkeypatch.setattr(tune, "_device_memory", lambda device: (2**16, "the test's 64 KiB"))
    assert cli.main(["sweep", "mlp-regression", *FLAGS, *lr, "--trials", "64", "--population", "64", "--out",
                     str(out)]) == 2
    assert "more than the test's 64 KiB: pass --population" in _one_line(capsys)


def test_unreadable_and_incompatible_studies_are_one_line(tmp_path, capsys):
    lr = ["--space", "optim.lr=loguniform:1e-4:1e-2"]
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "study.db").write_bytes(os.urandom(4096))
    for command in (["sweep", "mlp-regression", *FLAGS, *lr, "--trials", "1", "--out", str(damaged)],
                    ["sweep", "report", str(damaged)]):
        assert cli.main(command) == 2
        assert "file is not a database; it is not a study" in _one_line(capsys)
    out = tmp_path / "s"
    out.mkdir()
    study = optuna.create_study(storage=f"sqlite:///{out / 'study.db'}", study_name="mlp-regression")
    study.add_trial(optuna.trial.create_trial(params={"optim.lr": 1e-3}, value=1.0, distributions={
        "optim.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)}))
    for args, message in (([*lr, "--direction", "max"], "is set to minimize, not maximize: give its --direction"),
                          (["--space", "optim.lr=uniform:1e-4:1e-2"],
                           "drew optim.lr as optim.lr=loguniform:0.0001:0.01; keep that kind")):
        assert cli.main(["sweep", "mlp-regression", *FLAGS, *args, "--trials", "2", "--out", str(out)]) == 2
        assert message in _one_line(capsys)
    assert len(optuna.load_study(study_name="mlp-regression", storage=f"sqlite:///{out / 'study.db'}").trials) == 1


def test_the_sweep_folder_is_locked_and_its_links_are_refused(tmp_path, capsys):
    from jaxtrain._src.run_guard import lock_directory

    lr = ["--space", "optim.lr=loguniform:1e-4:1e-2"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("keep")
    for name, target, what in (("trial-0000", elsewhere, "folder"), ("study.db", elsewhere / "precious", "file"),
                               (".lock", elsewhere / "precious", "lock")):
        out = tmp_path / name.strip(".")
        out.mkdir()
        (out / name).symlink_to(target)
        assert cli.main(["sweep", "mlp-regression", *FLAGS, *lr, "--trials", "1", "--out", str(out)]) == 2
        line = _one_line(capsys)
        assert f"{out / name} is a symbolic link" in line and "--out" in line, line
    assert [p.name for p in elsewhere.iterdir()] == ["precious"] and (elsewhere / "precious").read_text() == "keep"
    out = tmp_path / "busy"
    with lock_directory(out, "sweep folder", "--out", "that sweep"):  # another sweep writing into it now
        assert cli.main(["sweep", "mlp-regression", *FLAGS, *lr, "--trials", "1", "--out", str(out)]) == 2
        assert f"sweep folder {out} is in use by process {os.getpid()}" in _one_line(capsys)
    assert not list(out.glob("trial-*"))


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # the test asks as workers would
def test_workers_asking_from_one_history_draw_apart(tmp_path):
    """Four workers' handles on one study, each asking while the others' trials run (as W worker
    processes do), draw 16 distinct values, TPE's startup and its model alike; a later run of the
    study draws apart from them too. A sampler seeded once per worker drew alike when seeds met."""
    job = dataclasses.replace(_job(tmp_path, trials=20), sampler="tpe")
    drawn = draws_of_workers(job)  # opened alike: the trial, not the worker, seeds the draw
    assert len(set(drawn)) == 16, drawn
    again = job.open()  # the study run again
    for _ in range(4):
        trial = again.ask()
        drawn.append(job.prepare(trial, "")[0]["optim.lr"])
        again.tell(trial, 1.0)
    assert len(set(drawn)) == 20
    seeds = [t.user_attrs["sampler_seed"] for t in again.trials]
    assert seeds == [sweep.trial_seed(0, n) for n in range(20)]  # recorded, and reproducible from --seed


class _StopWithSigterm(optuna.pruners.BasePruner):
    """Sends this process SIGTERM at the first epoch's end, as a scheduler stopping the sweep would."""

    def prune(self, study, trial) -> bool:
        if len(trial.intermediate_values) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return False


def test_sigterm_in_a_trial_stops_the_sweep_and_its_values_are_asked_again(tmp_path):
    recipe = get_recipe("mlp-regression")
    config = cli.parse_config(type(recipe.config), recipe.config, list(FLAGS), "test")
    space = [sweep.parse_space("optim.lr=loguniform:1e-4:1e-2")]
    with pytest.raises(sweep.SweepStopped, match="stopped by SIGTERM: trial 0 was stopped") as stopped:
        sweep.sweep(recipe, config, space, 1, tmp_path, pruner=_StopWithSigterm())
    assert stopped.value.exit_code == 143
    study = sweep.load_study(tmp_path)
    assert [t.state.name for t in study.trials] == ["FAIL", "WAITING"]
    assert study.trials[1].params == study.trials[0].params and study.trials[1].system_attrs["failed_trial"] == 0
    study = sweep.sweep(recipe, config, space, 1, tmp_path, pruner="none")  # the same sweep again
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]
    assert study.trials[1].params == study.trials[0].params
    assert json.loads((tmp_path / "trial-0001" / "summary.json").read_text())["status"] == "completed"


def _job(tmp_path, trials, heartbeat=1):
    recipe = get_recipe("mlp-regression")
    config = cli.parse_config(type(recipe.config), recipe.config, list(FLAGS), "test")
    return sweep._Job(recipe, config, (sweep.parse_space("optim.lr=loguniform:1e-4:1e-2"),), trials, str(tmp_path),
                      f"sqlite:///{tmp_path / 'study.db'}", "s", "val_loss", "minimize", "tpe", "none", 0, (),
                      heartbeat)


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # the test asks as a worker would
def test_a_trial_whose_worker_died_is_failed_and_asked_again_with_its_values(tmp_path, capsys):
    job = _job(tmp_path, trials=1)
    study = job.open()
    dead = study.ask({"optim.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
    study._storage.record_heartbeat(dead._trial_id)  # one beat, then silence: its worker is gone
    job.work(study, sweep.Console(), "")
    states = {t.number: t.state for t in study.trials}
    assert states == {0: optuna.trial.TrialState.FAIL, 1: optuna.trial.TrialState.COMPLETE}
    again = study.trials[1]
    assert again.params == dead.params and again.system_attrs["failed_trial"] == 0
    assert "waiting for them" in capsys.readouterr().out  # while the dead trial still looked alive
    assert (tmp_path / "trial-0001" / "summary.json").is_file() and not (tmp_path / "trial-0000").exists()


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # the test asks as a worker would
def test_a_trial_asked_past_the_end_is_not_run(tmp_path, capsys):
    job = _job(tmp_path, trials=1)
    study = job.open()
    job.work(study, sweep.Console(), "")
    late = study.ask()  # as a second worker would, between its count and its ask
    with pytest.raises(sweep._Surplus):
        job.run(late, sweep.Console(), "")
    assert late.user_attrs.get("surplus") is True and "run_dir" not in late.user_attrs
    assert not (tmp_path / "trial-0001").exists()
    study.tell(late, state=optuna.trial.TrialState.FAIL)
    sweep.print_report(study, sweep.Console(), "val_loss")
    assert "study s: 1 trials" in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # the test asks as a worker would
def test_a_population_asked_past_the_end_trains_only_the_trials_still_wanted(tmp_path):
    """The population's trials share one read of the study: of three asked when one more is wanted
    (another worker ran the rest), the first trains and the two after it are surplus, as they are
    with a read per trial."""
    job = _job(tmp_path, trials=2)
    study = job.open()
    done = study.ask()  # as another worker's trial, completed
    study.tell(done, 1.0)
    assert job.run_population(study, 3, sweep.Console(quiet=True), "") == 3
    states = {t.number: (t.state, t.user_attrs.get("surplus")) for t in study.trials}
    assert states == {0: (optuna.trial.TrialState.COMPLETE, None), 1: (optuna.trial.TrialState.COMPLETE, None),
                      2: (optuna.trial.TrialState.FAIL, True), 3: (optuna.trial.TrialState.FAIL, True)}
    assert (tmp_path / "trial-0001" / "summary.json").is_file()
    assert not (tmp_path / "trial-0002").exists() and not (tmp_path / "trial-0003").exists()


def test_two_workers_share_the_study_on_sqlite(tmp_path, capfd):
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "mlp-regression", *FLAGS, *SPACE, "--trials", "4", "--workers", "2", "--out", str(out),
                     "--pruner", "none"]) == 0
    printed = capfd.readouterr().out  # the workers' lines, written by other processes
    assert "worker 1: trial" in printed and "worker 2: trial" in printed
    study = sweep.load_study(out)
    # Both workers may count 3 finished and ask at once: the later trial is then surplus, failed unrun
    # and left out of the report (test_a_trial_asked_past_the_end_is_not_run makes that race happen)
    ran = [t for t in study.trials if not t.user_attrs.get("surplus")]
    assert [t.state for t in ran] == [optuna.trial.TrialState.COMPLETE] * 4
    surplus = [t for t in study.trials if t.user_attrs.get("surplus")]
    assert all(t.state == optuna.trial.TrialState.FAIL and not t.params for t in surplus)
    assert sorted(p.name for p in out.glob("trial-*")) == [f"trial-000{i}" for i in range(4)]
    assert len({(t.params["optim.lr"], t.params["model.hidden"]) for t in ran}) == 4  # drawn apart
    assert f"study {study.study_name}: 4 trials" in printed  # the report counts the trials that ran


def test_a_population_sweep_groups_trials_by_shape_and_each_trial_reproduces_alone(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "mlp-regression", *FLAGS, *SPACE, "--trials", "5", "--population", "4",
                     "--pruner", "none", "--out", str(out)]) == 0
    assert "one of a population of" in capsys.readouterr().out
    study = sweep.load_study(out)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 5  # 4 asked at once, then 1
    assert not any("population" in t.user_attrs for t in study.trials)  # --scheduler none (default): fixed, as before
    summaries = {t.number: json.loads((out / f"trial-{t.number:04d}" / "summary.json").read_text())
                 for t in study.trials}
    first = [t for t in study.trials if t.number < 4]
    for t in first:  # grouped by the model's width: a population holds the trials of one shape
        same = sum(o.params["model.hidden"] == t.params["model.hidden"] for o in first)
        assert summaries[t.number]["population"] == {"members": same, "formulation": "tuple"}
        assert summaries[t.number]["best_val_loss"] == pytest.approx(t.value, rel=1e-12)
    best = study.best_trial
    command = shlex.split(best.user_attrs["command"])
    command += ["--run-dir", str(tmp_path / "again")]  # printed without one: runs/ by default
    assert cli.main(command[1:] + ["--quiet"]) == 0  # the trial trained alone: the same validation loss
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert again["best_val_loss"] == pytest.approx(best.value, rel=1e-6)


# Optuna calls its heartbeat API experimental; the sweep uses it (and silences the warning) the same way
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_trials_asked_by_hand_beat_their_heartbeats_and_go_stale_when_their_worker_stops(tmp_path):
    import time

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(storage=storage)
    with pytest.warns(UserWarning, match="Heartbeat"):
        trial = study.ask()
    with sweep._Heartbeats(study, [trial], 1):
        time.sleep(3)
        optuna.storages.fail_stale_trials(study)
        assert study.trials[0].state == optuna.trial.TrialState.RUNNING  # beating: not stale
    time.sleep(3)  # the worker's beats stopped (as when it dies)
    optuna.storages.fail_stale_trials(study)
    assert study.trials[0].state == optuna.trial.TrialState.FAIL


def test_pruned_and_diverging_members_of_a_population_end_alone(tmp_path):
    recipe = get_recipe("mlp-regression")
    config = cli.parse_config(type(recipe.config), recipe.config, list(FLAGS), "test")
    study = sweep.sweep(recipe, config, [sweep.parse_space("optim.lr=loguniform:1e-4:1e-1")], 2, tmp_path / "pruned",
                        pruner=optuna.pruners.ThresholdPruner(upper=0.0), population=2)  # any loss: prune
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.PRUNED] * 2
    for t in study.trials:
        summary = json.loads((tmp_path / "pruned" / f"trial-{t.number:04d}" / "summary.json").read_text())
        assert summary["status"] == "stopped early" and summary["epochs"] == 1
    study = sweep.sweep(recipe, config, [sweep.parse_space("optim.lr=choice:1e12,1e-3")], 4, tmp_path / "nan",
                        pruner="none", population=4, sampler="random")
    states = {t.params["optim.lr"]: t.state for t in study.trials}
    assert states == {1e12: optuna.trial.TrialState.FAIL, 1e-3: optuna.trial.TrialState.COMPLETE}


def test_a_populations_pruner_reads_the_study_once_an_epoch_and_decides_as_should_prune(tmp_path):
    """Members of a population ask the median pruner through one view of the study per epoch: the
    same decisions as `Trial.should_prune`, with the completed trials read once, not once a member."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0))
    for value in (1.0, 2.0, 3.0):  # completed trials: the median at epoch 1 is 2.0
        done = study.ask()
        done.report(value, 1)
        study.tell(done, value)
    members = [study.ask() for _ in range(4)]
    shared = sweep._StudyAtEpoch(study)
    reads = []
    get_trials = study.get_trials
    study.get_trials = lambda *a, **k: reads.append(k.get("states")) or get_trials(*a, **k)
    decisions = []
    for trial, value in zip(members, (0.5, 2.5, 1.5, 9.0)):
        trial.report(value, 1)
        decisions.append(sweep._Report(trial, "val_loss", shared)._should_prune(1))
    assert len(reads) == 1  # four members, one read of the completed trials
    study.get_trials = get_trials
    assert decisions == [t.should_prune() for t in members] == [False, True, False, True]


def test_two_workers_never_take_the_same_waiting_trial(tmp_path, monkeypatch):
    """A re-asked (waiting) trial is taken by one worker only. Two handles on one SQLite study (as two
    worker processes hold) read the trial at once, each pausing between its read and its write:
    without the write lock at BEGIN both took it (the race seen in the two-worker SIGTERM test)."""
    import threading
    import time

    from optuna.storages._rdb import models

    job = _job(tmp_path, trials=1)
    first, second = job.open(), job.open()
    first.enqueue_trial({"optim.lr": 1e-3})
    find = models.TrialModel.find_or_raise_by_id.__func__

    def slow_find(cls, trial_id, session, for_update=False):
        trial = find(cls, trial_id, session, for_update)
        if for_update:
            time.sleep(0.3)  # both readers inside their read-then-write
        return trial

    monkeypatch.setattr(models.TrialModel, "find_or_raise_by_id", classmethod(slow_find))
    taken = []
    threads = [threading.Thread(target=lambda s=s: taken.append(s._pop_waiting_trial_id())) for s in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken, key=lambda t: t is None) == [first.trials[0]._trial_id, None]  # one took it, once


def test_workers_opening_a_new_sqlite_study_at_the_same_instant_do_not_race(tmp_path):
    """Two workers creating one SQLite database's tables at once met "table ... already exists" (or a
    second schema version row) in 8 of 10 tries without `_one_creator`; threads race like processes."""
    import threading

    for attempt in range(5):
        url = f"sqlite:///{tmp_path / f'study-{attempt}.db'}"
        start, errors = threading.Barrier(2), []

        def open_storage(url=url, start=start, errors=errors):
            start.wait()
            try:
                with sweep._one_creator(url):
                    optuna.storages.RDBStorage(url)
            except Exception as e:  # what the race raised, to report
                errors.append(str(e).splitlines()[0])

        workers = [threading.Thread(target=open_storage) for _ in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert errors == []
    with sweep._one_creator(f"sqlite:///{tmp_path / 'options.db'}?timeout=5"):  # the URL's options name no file
        pass
    assert (tmp_path / "options.db").is_file() and not list(tmp_path.glob("options.db?*"))
