"""SIGKILL in the middle of an adaptive sweep (`jaxtrain sweep --population P --scheduler pbt|halving`),
then the same command again: the population continues from the newest epoch every slot saved and the
study and every trial's weights end as the uninterrupted sweep's, bit for bit (the tuple formulation, on
the CPU)."""

import os
import signal
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from flax import nnx

from jaxtrain.engine import checkpoint_steps
from jaxtrain.tools import cli, runs, sweep

DATA = ["mlp-regression", "--data.samples", "256", "--data.val-samples", "64", "--data.features", "8",
        "--data.targets", "4", "--data.teacher-width", "8", "--model.hidden", "16", "--batch-size", "64",
        "--steps-per-call", "1", "--space", "optim.lr=loguniform:1e-4:1e-1", "--sampler", "random", "--quiet"]
FLAGS = [*DATA, "--epochs", "3", "--trials", "4", "--population", "4", "--scheduler", "pbt", "--pbt-every", "1"]
# the fewest that reach a refill: of 2 slots at rung 1 (epoch 1), the worse is pruned and takes the third trial
HALVING = [*DATA, "--epochs", "2", "--trials", "3", "--population", "2", "--scheduler", "halving"]

# argv[1] "pbt": killed at its second call after the tenth save: in epoch 3 (the last), after two PBT steps
# (4 saves and a copy's each); "refill": killed as a slot takes its new trial, before that trial's first save
CHILD = textwrap.dedent("""
    import os, signal, sys
    from jaxtrain._src import moments
    from jaxtrain.tools import cli

    seen = {"checkpoint saved": 0, "call": 0}

    def kill(name, facts):
        if name in seen:
            seen[name] += 1
        if sys.argv[1] == "refill" and name == "slot refilled":
            os.kill(os.getpid(), signal.SIGKILL)
        if sys.argv[1] == "pbt" and seen["checkpoint saved"] >= 10 and name == "call" and (
                seen.setdefault("after", 0) or True):
            seen["after"] += 1
            if seen["after"] == 2:
                os.kill(os.getpid(), signal.SIGKILL)

    moments.listen(kill)
    sys.exit(cli.main(["sweep", *sys.argv[2:]]))
""")
ATTRS = ("pbt_parent", "pbt_epoch", "slot", "pbt_replaced_by", "joined_epoch", "report_offset", "population")


def _trials(out):
    return {t.number: (t.state.name, t.params, t.value, t.intermediate_values,
                       {k: t.user_attrs.get(k) for k in ATTRS}) for t in sweep.load_study(out).trials}


def _weights(run_dir):
    model = runs.load(run_dir, checkpoint="latest")
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def _killed(tmp_path, kill, flags):
    """The study of the sweep of `flags` killed (`kill`, CHILD's argv[1])."""
    killed = subprocess.run([sys.executable, "-c", CHILD, kill, *flags, "--out", str(tmp_path / "killed")],
                            capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    return sweep.load_study(tmp_path / "killed")


def _resumed_as_whole(tmp_path, flags):
    """Resumes the killed sweep and runs it whole; checks they end the same; returns the trials."""
    assert cli.main(["sweep", *flags, "--out", str(tmp_path / "killed")]) == 0  # the same command: it resumes
    assert cli.main(["sweep", *flags, "--out", str(tmp_path / "whole")]) == 0
    resumed, whole = _trials(tmp_path / "killed"), _trials(tmp_path / "whole")
    assert resumed == whole
    assert all(state in ("COMPLETE", "PRUNED") for state, *_ in whole.values())
    for number in whole:
        got, want = (_weights(tmp_path / run / f"trial-{number:04d}") for run in ("killed", "whole"))
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    return whole


@pytest.mark.slow
def test_a_pbt_sweep_killed_mid_epoch_resumes_to_the_uninterrupted_sweep_bit_for_bit(tmp_path):
    interrupted = _killed(tmp_path, "pbt", FLAGS)
    assert sum(t.state.name == "RUNNING" for t in interrupted.trials) == 4  # the slots' trials, mid-epoch 3
    whole = _resumed_as_whole(tmp_path, FLAGS)
    assert len(whole) == 4 + 2  # a copy at each of epochs 1 and 2
    assert all(state == "COMPLETE" for state, *_ in whole.values())


@pytest.mark.slow
def test_a_halving_sweep_killed_before_a_refill_saved_resumes_to_the_uninterrupted_sweep_bit_for_bit(tmp_path):
    interrupted = _killed(tmp_path, "refill", HALVING)
    refill = interrupted.trials[-1]  # in the study, in its slot, no checkpoint yet
    assert refill.state.name == "RUNNING" and refill.user_attrs["joined_epoch"] == 1
    assert not checkpoint_steps(tmp_path / "killed" / f"trial-{refill.number:04d}" / "checkpoints")
    whole = _resumed_as_whole(tmp_path, HALVING)
    assert len(whole) == 3 and whole[refill.number][0] == "COMPLETE"  # not failed and asked again
