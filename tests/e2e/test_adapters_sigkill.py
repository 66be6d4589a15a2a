"""SIGKILL in the middle of training on a map-style dataset (a PyTorch Dataset, streamed) and on a
Grain DataLoader (its iterator's saved state), then a resume: the result equals an uninterrupted
run bit for bit."""

import os
import re
import runpy
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("grain")

CHILD = textwrap.dedent("""
    import os, signal, sys
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    import jaxtrain
    from jaxtrain import CheckpointConfig, DataConfig, TrainConfig

    kind, run_dir, kill_at, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 8)).astype(np.float32)
    y = np.tanh(x @ rng.normal(size=(8, 3))).astype(np.float32)

    class Rows:
        def __len__(self):
            return len(x)

        def __getitem__(self, i):
            return {"x": x[i], "y": y[i]}

        def __repr__(self):
            return "Rows(300)"

    if kind == "map":
        import torch

        class TorchRows(torch.utils.data.Dataset):
            def __len__(self):
                return len(x)

            def __getitem__(self, i):
                return {"x": torch.from_numpy(x[i]), "y": torch.from_numpy(y[i])}

        data, extra = TorchRows(), {"data": DataConfig(placement="stream", shuffle_window_mb=1)}
    else:
        import grain

        sampler = grain.samplers.IndexSampler(len(x), shuffle=True, seed=3, num_epochs=1)
        data = grain.DataLoader(data_source=Rows(), sampler=sampler, worker_count=0,
                                operations=[grain.transforms.Batch(20, drop_remainder=True)])
        extra = {"steps_per_epoch": 15}

    def loss(model, batch, key):
        return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}

    def kill(run, k, metrics):
        if kill_at and run.step >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    config = TrainConfig(epochs=2, batch_size=20, steps_per_call=2, tensorboard=False,
                         checkpoint=CheckpointConfig(every_steps=4, keep_last=100, keep_best=0), **extra)
    model = nnx.Linear(8, 3, rngs=nnx.Rngs(0))
    result = jaxtrain.fit(model, loss, data, None, config, run_dir=run_dir, resume=os.path.exists(run_dir),
                          hooks=[jaxtrain.LambdaHook(after_call=kill)], verbosity="silent")
    np.savez(out, *[np.asarray(a) for a in jax.tree.leaves(nnx.state(model, nnx.Param))])
""")


def _script(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return script


def _here(tmp_path, kind, run_dir, out):
    """The uninterrupted reference, run in this process: only the kill and the resume need processes."""
    argv = sys.argv
    sys.argv = [str(_script(tmp_path)), kind, str(run_dir), "0", str(out)]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        sys.argv = argv


def _child(tmp_path, kind, run_dir, kill_at, out):
    script = _script(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run([sys.executable, str(script), kind, str(run_dir), str(kill_at), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.xla_defaults
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["map", "grain"])
def test_sigkill_then_resume_equals_the_uninterrupted_run(tmp_path, kind):
    _here(tmp_path, kind, tmp_path / "full", tmp_path / "full.npz")
    killed = _child(tmp_path, kind, tmp_path / "run", 11, tmp_path / "unused.npz")  # mid-epoch 1 (15 steps)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not (tmp_path / "unused.npz").exists()
    resumed = _child(tmp_path, kind, tmp_path / "run", 0, tmp_path / "resumed.npz")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    if kind == "grain":  # a loader's position comes back from its own state, and a note says so
        assert re.search(r"train_data: resuming step [48] of epoch 1 from the loader's saved state", resumed.stderr)
    a, b = np.load(tmp_path / "full.npz"), np.load(tmp_path / "resumed.npz")
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name])
