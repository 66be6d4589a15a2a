"""A data file that changes under a running training stops it: `HDF5Source.read` raises a one-line
DataError once the file was truncated, rewritten, replaced, touched or deleted, no row read after
the change reaches training, and the newest checkpoint stays the last one trained on unchanged data."""

import json
import os
import threading
from unittest import mock

import h5py
import numpy as np
import pytest
from conftest import mse, regression_data, silent, small_mlp

from jaxtrain import CheckpointConfig, DataConfig, TrainConfig
from jaxtrain._src.checkpoint import Checkpointer
from jaxtrain._src.data.generate import generate_dataset
from jaxtrain._src.data.sources import HDF5Source
from jaxtrain._src.errors import DataError
from jaxtrain._src.hooks import LambdaHook, RunHook
from jaxtrain._src.loop import RunOptions, run
from jaxtrain.tools.cli import main

KEYS = {"x": "x", "y": "y"}
AN_HOUR_AGO_NS = 3600 * 10**9


def _write(path, data, chunks=None):
    with h5py.File(path, "w") as f:
        for name, array in data.items():
            f.create_dataset(name, data=array, chunks=chunks and (chunks, *array.shape[1:]))
    return path


def _aged(path):
    """Sets the file's mtime an hour back, so a rewrite within the filesystem's clock tick still moves it."""
    t = os.stat(path).st_mtime_ns - AN_HOUR_AGO_NS
    os.utime(path, ns=(t, t))
    return path


def _truncate(path, tmp_path):
    os.truncate(path, os.path.getsize(path) - 1000)


def _rewrite_in_place(path, tmp_path):
    other = _write(tmp_path / "other.h5", regression_data(500, seed=9))  # same layout, other values
    with open(path, "r+b") as f:
        f.write(other.read_bytes())


def _replace(path, tmp_path):
    copy = tmp_path / "copy.h5"
    copy.write_bytes(path.read_bytes())  # identical bytes: a different file all the same
    os.replace(copy, path)


def _touch(path, tmp_path):
    os.utime(path)


def _delete(path, tmp_path):
    path.unlink()


CHANGES = {  # change -> what the message says
    "truncated": (_truncate, "size {size:,} -> {smaller:,} bytes"),
    "rewritten in place": (_rewrite_in_place, "modified at "),
    "replaced": (_replace, "replaced by another file"),
    "touched": (_touch, "modified at "),
    "deleted": (_delete, "deleted"),
}


@pytest.mark.parametrize("chunks", [None, 50], ids=["contiguous", "chunked"])
@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_file_stops_reading_with_one_line_naming_the_change(tmp_path, change, chunks):
    path = _aged(_write(tmp_path / "d.h5", regression_data(500), chunks))
    size = os.path.getsize(path)
    source = HDF5Source(path, KEYS)
    first = source.read(0, 100)
    np.testing.assert_array_equal(source.read(0, 100)["x"], first["x"])  # unchanged: reads as before
    do, expected = CHANGES[change]
    do(path, tmp_path)
    for _ in range(2):  # and it stays an error
        with pytest.raises(DataError) as e:
            source.read(400, 500)
        message = str(e.value)
        assert message.startswith(f"{path} changed while it was being read (")
        assert expected.format(size=size, smaller=size - 1000) in message
        assert message.endswith("a dataset must not change during a run; restore it or start a new run on the new file")
        assert "\n" not in message
    source.close()


def test_a_change_during_a_read_is_caught_by_that_read(tmp_path, monkeypatch):
    path = _aged(_write(tmp_path / "d.h5", regression_data(500)))
    source = HDF5Source(path, KEYS)
    original = h5py.Dataset.read_direct

    def read_then_rewrite(self, *args, **kwargs):  # the rows come out, then the file changes
        original(self, *args, **kwargs)
        _rewrite_in_place(path, tmp_path)

    monkeypatch.setattr(h5py.Dataset, "read_direct", read_then_rewrite)
    with pytest.raises(DataError, match="changed while it was being read"):
        source.read(0, 100)


def test_a_file_changed_during_fit_stops_it_before_training_on_changed_rows(tmp_path):
    """The change comes in the middle of epoch 1. Each epoch's rows are read whole (one shuffle
    window), ahead of training (the reader runs on into the next epoch): the epochs read before the
    change train to the end, and the first read after it raises, so no step and no checkpoint ever
    sees changed rows."""
    path = _aged(_write(tmp_path / "d.h5", regression_data(320), chunks=16))
    # window_reads: per read of the whole file, True when the change came before the read ended (a read
    # in flight when the file changes sees it: the source checks the file after reading)
    changed_at, window_reads = [], []
    original = HDF5Source.read_into  # what the stream reads a window with (and `read` too)

    def read_into(self, start, stop, out):
        try:
            return original(self, start, stop, out)
        finally:
            if (start, stop) == (0, 320):
                window_reads.append(bool(changed_at))

    class RewriteMidEpoch(RunHook):  # sees the loop's position in the epoch
        def after_call(self, run, k, metrics):
            if run.loop.position == 4 and not changed_at:
                _rewrite_in_place(path, tmp_path)  # other.h5 has 500 rows: a larger file, other values
                changed_at.append(run.step)

    config = TrainConfig(epochs=3, batch_size=16, steps_per_call=2, data=DataConfig(placement="stream", prefetch=1),
                         checkpoint=CheckpointConfig(every_steps=4, keep_last=100, keep_best=0))
    with pytest.raises(DataError, match=r"changed while it was being read \(size [\d,]+ -> [\d,]+ bytes; modified"), \
            mock.patch.object(HDF5Source, "read_into", read_into):
        run(small_mlp(), mse, HDF5Source(path, KEYS), regression_data(40, seed=1), config,
            hooks=[RewriteMidEpoch()], run_dir=tmp_path / "run", verbosity="summary",
            session=RunOptions(console=silent()))
    assert changed_at == [4]
    read_before = window_reads.index(True)  # epochs whose rows were read whole before the change (1 or 2)
    assert read_before >= 1 and window_reads[read_before:] == [True]  # one read after it: it raised
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"].startswith(f"failed: {path} changed while it was being read")
    assert summary["steps"] == 20 * read_before  # exactly the epochs read before the change
    steps = Checkpointer(tmp_path / "run" / "checkpoints").steps()
    assert steps == list(range(4, 20 * read_before + 1, 4))  # all trained on rows read before the change


def test_a_changed_validation_file_stops_streamed_evaluation(tmp_path):
    path = _aged(_write(tmp_path / "val.h5", regression_data(320), chunks=16))
    truncate = LambdaHook(after_call=lambda run, k, metrics: _truncate(path, tmp_path) if run.step == 4 else None)
    config = TrainConfig(epochs=1, batch_size=16, steps_per_call=2,
                         data=DataConfig(placement="stream", memory_budget_gb=1e-6))  # validation is streamed too
    with pytest.raises(DataError, match=r"val\.h5 changed while it was being read \(size [\d,]+ -> [\d,]+ bytes"):
        run(small_mlp(), mse, regression_data(160), HDF5Source(path, KEYS), config, hooks=[truncate],
            verbosity="summary", session=RunOptions(console=silent()))


def test_cli_run_whose_file_is_replaced_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    path, newer = tmp_path / "tr.h5", tmp_path / "newer.h5"
    generate_dataset("mlp-regression", path, 1200, chunk_rows=64)
    generate_dataset("mlp-regression", newer, 1200, chunk_rows=64, seed=1)
    reads, original = [], HDF5Source.read_into  # what the stream reads its blocks with (and `read` too)

    def replace_before_the_second_block(self, start, stop, out):  # `mv newer.h5 tr.h5` while training runs
        if threading.current_thread() is not threading.main_thread():
            reads.append((start, stop))
            if len(reads) == 2:
                os.replace(newer, path)
        return original(self, start, stop, out)

    monkeypatch.setattr(HDF5Source, "read_into", replace_before_the_second_block)
    code = main(["train", "mlp-regression", "--data.path", str(path), "--data.val-samples", "200",
                 "--data.placement", "stream", "--data.shuffle-window-mb", "1", "--epochs", "3", "--quiet",
                 "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"error: {path} changed while it was being read (replaced by another file") and err.count(
        "\n") == 1, err
    assert "Traceback" not in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed: " + err.removeprefix("error: ").strip()
    assert summary["epochs"] == 1  # epoch 2's first block was read from the new file and never used
