"""SIGKILL in the middle of a PBT sweep (`jaxtrain sweep --population 4 --scheduler pbt`), then the same
command again: the population continues from the newest epoch every slot saved and the study and every
trial's weights end as the uninterrupted sweep's, bit for bit (the tuple formulation, on the CPU)."""

import os
import signal
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from flax import nnx

from jaxtrain.tools import cli, runs, sweep

FLAGS = ["mlp-regression", "--data.samples", "256", "--data.val-samples", "64", "--data.features", "8",
         "--data.targets", "4", "--data.teacher-width", "8", "--model.hidden", "16", "--epochs", "3", "--batch-size",
         "64", "--steps-per-call", "1", "--space", "optim.lr=loguniform:1e-4:1e-1", "--trials", "4", "--population",
         "4", "--scheduler", "pbt", "--pbt-every", "1", "--sampler", "random", "--quiet"]

# killed at its second call after the tenth save: in epoch 3 (the last), after two PBT steps (4 saves and a
# copy's each)
CHILD = textwrap.dedent("""
    import os, signal, sys
    from jaxtrain._src import moments
    from jaxtrain.tools import cli

    seen = {"checkpoint saved": 0, "call": 0}

    def kill(name, facts):
        if name in seen:
            seen[name] += 1
        if seen["checkpoint saved"] >= 10 and name == "call" and (seen.setdefault("after", 0) or True):
            seen["after"] += 1
            if seen["after"] == 2:
                os.kill(os.getpid(), signal.SIGKILL)

    moments.listen(kill)
    sys.exit(cli.main(["sweep", *sys.argv[1:]]))
""")


def _trials(out):
    return {t.number: (t.state.name, t.params, t.value, t.intermediate_values,
                       {k: t.user_attrs.get(k) for k in ("pbt_parent", "pbt_epoch", "slot", "pbt_replaced_by")})
            for t in sweep.load_study(out).trials}


def _weights(run_dir):
    model = runs.load(run_dir, checkpoint="latest")
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.mark.slow
def test_a_pbt_sweep_killed_mid_epoch_resumes_to_the_uninterrupted_sweep_bit_for_bit(tmp_path):
    killed = subprocess.run([sys.executable, "-c", CHILD, *FLAGS, "--out", str(tmp_path / "killed")],
                            capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    interrupted = sweep.load_study(tmp_path / "killed")
    assert sum(t.state.name == "RUNNING" for t in interrupted.trials) == 4  # the slots' trials, mid-epoch 3
    assert cli.main(["sweep", *FLAGS, "--out", str(tmp_path / "killed")]) == 0  # the same command: it resumes
    assert cli.main(["sweep", *FLAGS, "--out", str(tmp_path / "whole")]) == 0
    resumed, whole = _trials(tmp_path / "killed"), _trials(tmp_path / "whole")
    assert resumed == whole and len(whole) == 4 + 2  # a copy at each of epochs 1 and 2
    assert all(state == "COMPLETE" for state, *_ in whole.values())
    for number in whole:
        got, want = (_weights(tmp_path / run / f"trial-{number:04d}") for run in ("killed", "whole"))
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
