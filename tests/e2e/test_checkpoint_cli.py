"""Checkpoints through the command line in separate processes: SIGTERM saves and resumes exactly,
a disk that turns read-only mid-run. (A SIGKILL at each moment of a run, then resume: see
tests/benchmarks/test_bench_faults.py and `jaxtrain bench faults`.)"""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from _runs import TRAIN, assert_bit_equal, mount_tmpfs, unmount

from jaxtrain._src.checkpoint import Checkpointer
from jaxtrain.tools import runs
from jaxtrain.tools.cli import main


def _cli(*args, **kwargs):
    """`jaxtrain ARGS` in a child whose first line of output (the header) says that the run started."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = [*(a for a in args if a != "--quiet"), "--verbosity", "summary"]
    return subprocess.Popen([sys.executable, "-m", "jaxtrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kwargs)


def _final_params(run_dir):
    return [np.asarray(x) for x in jax.tree.leaves(runs.load(run_dir, "latest"))]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """The uninterrupted run, in this process: it needs no signal, so no process of its own."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    # No step checkpoints (as the SIGTERM run below): they do not change what it trains, and 56 saves
    # were half of its seconds.
    assert main([*TRAIN, "--checkpoint.every-steps", "0", "--run-dir", str(run_dir)]) == 0
    return run_dir


@pytest.mark.xla_defaults
@pytest.mark.slow
def test_sigterm_saves_and_exits_with_a_resume_hint(tmp_path, reference_run):
    run_dir = tmp_path / "run"
    proc = _cli(*TRAIN, "--run-dir", str(run_dir), "--checkpoint.every-steps", "0")
    proc.stdout.readline()
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    if proc.returncode == 0:
        pytest.skip("training finished before SIGTERM arrived")
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM at step" in err and f"--resume {run_dir}" in err and "Traceback" not in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped by signal" and summary["latest_checkpoint_step"] == summary["steps"]
    assert main([*TRAIN, "--run-dir", str(run_dir), "--resume", str(run_dir)]) == 0  # in this process: no signal
    assert_bit_equal(_final_params(run_dir), _final_params(reference_run))


@pytest.mark.slow
def test_read_only_mid_run_fails_cleanly_in_the_cli(tmp_path):
    mount = tmp_path / "ro"
    if not mount_tmpfs(mount, "64m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        run_dir = mount / "run"
        proc = _cli(*TRAIN, "--run-dir", str(run_dir), "--epochs", "30", "--data.samples", "20500",
                    "--checkpoint.every-steps", "0")
        proc.stdout.readline()
        ckpt_dir, deadline = run_dir / "checkpoints", time.monotonic() + 240
        while not (ckpt_dir.is_dir() and any(p.name.isdigit() for p in ckpt_dir.iterdir())):  # one finished save
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.05)
        # A bind mount made read-only: a plain remount refuses while files are open for writing.
        subprocess.run(["mount", "--bind", str(mount), str(mount)], check=True)
        subprocess.run(["mount", "-o", "remount,ro,bind", str(mount)], check=True)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, err
        # The one-line error ends the output. (A write already in flight when the disk turns
        # read-only fails inside orbax's threads, which may print their own traces first.)
        assert err.splitlines()[-1].startswith("error: cannot write a checkpoint to ")
        assert "Read-only file system" in err.splitlines()[-1]
        steps = Checkpointer(run_dir / "checkpoints", read_only=True).steps()
        assert steps
        runs.load(run_dir, str(steps[-1]))  # the newest complete checkpoint still loads
    finally:
        unmount(mount)
