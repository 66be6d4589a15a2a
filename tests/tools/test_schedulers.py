"""`jaxtrain sweep --population P --scheduler halving|pbt`: a slot's trial is replaced by another
trial of the study (the sampler's next, or a perturbed copy of a better one that records its parent)
without compiling again; what cannot adapt is one line."""

import json

import jax
import pytest
from jax._src import monitoring  # the public module registers listeners but cannot remove them

from jaxtrain.tools import cli, schedulers, sweep

FLAGS = ["--data.samples", "256", "--data.val-samples", "64", "--data.features", "8", "--data.targets", "4",
         "--data.teacher-width", "8", "--model.hidden", "16", "--epochs", "3", "--batch-size", "64"]
LR = ["--space", "optim.lr=loguniform:1e-4:1e-1"]


@pytest.fixture
def compiles_at_each_step(monkeypatch):
    """(XLA programs compiled so far in this process, the same at each scheduler step)."""
    count, at = [0], []

    def listen(event, seconds, **kwargs):
        count[0] += event == "/jax/core/compile/backend_compile_duration"

    jax.monitoring.register_event_duration_secs_listener(listen)
    step = schedulers._Scheduler.__call__
    monkeypatch.setattr(schedulers._Scheduler, "__call__", lambda self, *a: at.append(count[0]) or step(self, *a))
    yield count, at
    monitoring.unregister_event_duration_listener(listen)


def test_halving_refills_a_pruned_slot_with_the_sampler_next_trial_without_compiling_again(tmp_path,
                                                                                          compiles_at_each_step):
    compiled, at = compiles_at_each_step
    assert cli.main(["sweep", "mlp-regression", *FLAGS, *LR, "--trials", "6", "--population", "4", "--scheduler",
                     "halving", "--sampler", "random", "--out", str(tmp_path), "--quiet"]) == 0
    assert len(at) == 2 and compiled[0] == at[0]  # after the first epoch, nothing compiled: refills included
    trials = sweep.load_study(tmp_path).trials
    assert len(trials) == 6
    pruned = [t.number for t in trials if t.state.name == "PRUNED"]
    assert len(pruned) >= 2 and set(pruned) & {0, 1, 2, 3}  # the worse half at rung 1, at least
    for t in trials[4:]:  # the refills: trials of their own, in the slots of pruned ones, from epoch 1
        summary = json.loads((tmp_path / f"trial-{t.number:04d}" / "summary.json").read_text())
        assert summary["population"]["joined_epoch"] == 1 and summary["population"]["parent"] is None
        assert min(t.intermediate_values) == 1  # its epochs counted from its start


def test_pbt_copies_the_best_into_the_worst_with_perturbed_numbers_and_records_parents(tmp_path,
                                                                                      compiles_at_each_step):
    compiled, at = compiles_at_each_step
    assert cli.main(["sweep", "mlp-regression", *FLAGS, *LR, "--trials", "4", "--population", "4", "--scheduler",
                     "pbt", "--pbt-every", "1", "--sampler", "random", "--out", str(tmp_path), "--quiet"]) == 0
    assert len(at) == 2 and compiled[0] == at[0]
    trials = {t.number: t for t in sweep.load_study(tmp_path).trials}
    children = [t for t in trials.values() if "pbt_parent" in t.user_attrs]
    assert [c.user_attrs["pbt_epoch"] for c in children] == [1, 2]  # a quarter of 4 slots, every epoch
    for child in children:
        parent, epoch = trials[child.user_attrs["pbt_parent"]], child.user_attrs["pbt_epoch"]
        replaced = next(t for t in trials.values() if t.user_attrs.get("pbt_replaced_by") == child.number)
        live = [t for t in trials.values() if epoch in t.intermediate_values and t.number != child.number]
        assert parent.intermediate_values[epoch] == min(t.intermediate_values[epoch] for t in live)  # the best
        assert replaced.intermediate_values[epoch] == max(t.intermediate_values[epoch] for t in live)  # the worst
        lr, was = child.params["optim.lr"], parent.params["optim.lr"]
        assert lr in (pytest.approx(was * 0.8), pytest.approx(was * 1.2)) or 1e-4 <= lr <= 1e-1  # or drawn anew
        population = json.loads((tmp_path / f"trial-{child.number:04d}" / "summary.json").read_text())["population"]
        assert population["parent"] == str(tmp_path / f"trial-{parent.number:04d}")
        assert population["slot"] == child.user_attrs["slot"] and child.state.name == "COMPLETE"


def test_what_cannot_adapt_is_one_line(tmp_path, capsys):
    for args, message in (([*LR, "--scheduler", "pbt"], "--scheduler pbt adapts a population: pass --population"),
                          ([*LR, "--population", "4", "--scheduler", "asha"], "--scheduler asha: choose none, "),
                          (["--space", "model.hidden=choice:8,16", "--population", "4", "--scheduler", "halving"],
                           "--space model.hidden=choice:8,16: at 8 it changes more than the optimizer's numbers")):
        assert cli.main(["sweep", "mlp-regression", *FLAGS, *args, "--trials", "4", "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1

