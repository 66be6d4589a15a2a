"""fit() on streamed data: HDF5 equals in-memory with the same order, K does not change results,
auto placement streams over the budget, input wait is reported, and resume is bit-exact."""

import shutil

import h5py
import jax
import numpy as np
import pytest
from conftest import mse, regression_data, silent, small_mlp

from jaxtrain import CheckpointConfig, DataConfig, TrainConfig
from jaxtrain._src.checkpoint import Checkpointer
from jaxtrain._src.data.sources import ArraySource, HDF5Source
from jaxtrain._src.loop import RunOptions, run

pytestmark = pytest.mark.xla_defaults  # streamed runs equal in-memory ones; streamed resume is bit-exact

CHUNK = 16  # rows per HDF5 chunk; 301 rows: not a multiple of the chunk or the batch (16)


def _params(result) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(result.state.params)]


def _write(path, data):
    with h5py.File(path, "w") as f:
        for name, array in data.items():
            f.create_dataset(name, data=array, chunks=(CHUNK, *array.shape[1:]))
    return path


def _fit(train, run_dir=None, resume=False, **overrides):
    data = DataConfig(placement="stream", shuffle_window_mb=1)
    config = TrainConfig(**{"epochs": 3, "batch_size": 16, "steps_per_call": 3, "data": data, **overrides})
    return run(small_mlp(), mse, train, regression_data(40, seed=1), config, run_dir=run_dir, resume=resume,
               verbosity="summary", session=RunOptions(console=silent()))


def test_hdf5_stream_equals_in_memory_stream_and_does_not_depend_on_k(tmp_path):
    data = regression_data(301)
    path = _write(tmp_path / "d.h5", data)
    from_file = _fit(HDF5Source(path, {"x": "x", "y": "y"}))
    in_memory = _fit(ArraySource(data, chunk_rows=CHUNK))
    other_k = _fit(ArraySource(data, chunk_rows=CHUNK), steps_per_call=7)
    for a, b, c in zip(_params(from_file), _params(in_memory), _params(other_k), strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-6, atol=1e-7)  # same steps; XLA may fuse a 3- and 7-step scan apart
    assert [r["train_loss"] for r in from_file.history] == [r["train_loss"] for r in in_memory.history]
    assert from_file.summary["steps"] == 3 * 18
    assert from_file.history[-1]["train_loss"] < from_file.history[0]["train_loss"]
    for record in from_file.history:
        assert 0.0 <= record["input_wait_fraction"] <= 1.0 and record["input_wait_s"] >= 0.0


def test_auto_placement_streams_over_the_budget_and_says_so():
    console = silent()
    config = TrainConfig(epochs=1, batch_size=10, data=DataConfig(memory_budget_gb=1e-6))
    result = run(small_mlp(), mse, regression_data(100), None, config, verbosity="summary",
                 session=RunOptions(console=console))
    header = console.file.getvalue()
    assert "training data streamed" in header and "over the 0 MiB device budget" in header
    assert "input_wait_fraction" in result.history[0]
    on_device = run(small_mlp(), mse, regression_data(100), None, TrainConfig(epochs=1, batch_size=10),
                    verbosity="summary", session=RunOptions(console=(c := silent())))
    assert "on the device (0.0 MiB, within the" in c.file.getvalue() and "input_wait_s" not in on_device.history[0]


def test_streamed_resume_from_mid_epoch_checkpoints_is_bit_exact(tmp_path):
    data = regression_data(301)
    path = _write(tmp_path / "d.h5", data)
    source = lambda: HDF5Source(path, {"x": "x", "y": "y"})  # noqa: E731
    ckpt = CheckpointConfig(every_steps=7, keep_last=100, keep_best=0)
    reference = _fit(source(), tmp_path / "full", checkpoint=ckpt)
    steps = Checkpointer(tmp_path / "full" / "checkpoints").steps()
    mid_epoch = [s for s in steps if s % 18]
    assert len(mid_epoch) >= 3  # one in every epoch
    for step in mid_epoch:
        run = tmp_path / f"from-{step}"
        shutil.copytree(tmp_path / "full", run)
        for later in (p for p in (run / "checkpoints").iterdir() if p.name.isdigit() and int(p.name) > step):
            shutil.rmtree(later)
        resumed = _fit(source(), run, resume=True, checkpoint=ckpt)
        for a, b in zip(_params(resumed), _params(reference), strict=True):
            np.testing.assert_array_equal(a, b)
        assert resumed.history[-1]["val_loss"] == reference.history[-1]["val_loss"]
