"""SIGKILL in the middle of an adaptive sweep (`jaxtrain sweep --population P --scheduler halving|pbt`),
mid-epoch or as a slot takes its new trial (before that trial's first save), then the same command
again: the population continues from the newest epoch every slot saved, the new trial as its refill
started it, and the study and every trial's weights end as the uninterrupted sweep's, bit for bit (the
tuple formulation, on the CPU)."""

import json
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
        "--steps-per-call", "1", "--space", "optim.lr=loguniform:1e-4:1e-1", "--sampler", "random", "--quiet",
        "--epochs", "2", "--population", "2"]
# the fewest that reach a refill after epoch 1 (of 2): halving prunes the worse of the 2 slots at rung 1 and its
# slot takes the third trial; PBT copies the better slot's run into the worse's slot (the third trial)
FLAGS = {"halving": [*DATA, "--trials", "3", "--scheduler", "halving"],
         "pbt": [*DATA, "--trials", "2", "--scheduler", "pbt", "--pbt-every", "1"]}

# argv[1] "refill": killed as a slot takes its new trial, after the trial is in the study and before its first
# save; "mid-epoch": at the second call after the third save (2 slots' and the copy's): in epoch 2, the last
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
        if sys.argv[1] == "mid-epoch" and seen["checkpoint saved"] >= 3 and name == "call" and (
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


def _files(run_dir):
    """A trial's run directory: what it holds, its checkpoints' steps and its summary's `population` (slot,
    joined_epoch, parent)."""
    population = json.loads((run_dir / "summary.json").read_text())["population"]
    if population.get("parent"):  # a sibling's run directory: its name
        population["parent"] = os.path.relpath(population["parent"], run_dir.parent)
    return sorted(p.name for p in run_dir.iterdir()), checkpoint_steps(run_dir / "checkpoints"), population


def _weights(run_dir):
    model = runs.load(run_dir, checkpoint="latest")
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.mark.slow
@pytest.mark.parametrize("scheduler, kill", [("halving", "refill"), ("pbt", "refill"), ("pbt", "mid-epoch")])
def test_an_adaptive_sweep_killed_resumes_to_the_uninterrupted_sweep_bit_for_bit(tmp_path, capsys, scheduler, kill):
    flags = FLAGS[scheduler]
    killed = subprocess.run([sys.executable, "-c", CHILD, kill, *flags, "--out", str(tmp_path / "killed")],
                            capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    interrupted = sweep.load_study(tmp_path / "killed").trials
    refill = interrupted[2]  # the trial that took a slot after epoch 1
    assert refill.state.name == "RUNNING" and refill.user_attrs["joined_epoch"] == 1
    saved = checkpoint_steps(tmp_path / "killed" / f"trial-{refill.number:04d}" / "checkpoints")
    assert bool(saved) == (kill == "mid-epoch")  # in the study, in its slot: saved, or not yet
    assert cli.main(["sweep", *flags, "--out", str(tmp_path / "killed")]) == 0  # the same command: it resumes
    parent = refill.user_attrs.get("pbt_parent")  # one line says how the refill starts again (3 steps an epoch)
    start = "fresh weights" if parent is None else f"the checkpoint of {tmp_path / 'killed' / f'trial-{parent:04d}'}"
    told = "trial-0002 took its slot after epoch 1 and has no checkpoint yet; it starts again there, at step 3, from"
    assert (f"{told} {start}\n" in capsys.readouterr().err) == (kill == "refill")
    assert cli.main(["sweep", *flags, "--out", str(tmp_path / "whole")]) == 0
    resumed, whole = _trials(tmp_path / "killed"), _trials(tmp_path / "whole")
    assert resumed == whole and len(whole) == 3  # the refill not failed and asked again
    assert all(state == "COMPLETE" for state, *_ in whole.values() if scheduler == "pbt")  # PBT prunes nothing
    for number in whole:
        got, want = (_weights(tmp_path / run / f"trial-{number:04d}") for run in ("killed", "whole"))
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
        # the refill's files and its summary's slot, joined_epoch and parent as the uninterrupted run's
        assert _files(tmp_path / "killed" / f"trial-{number:04d}") == _files(tmp_path / "whole" / f"trial-{number:04d}")
