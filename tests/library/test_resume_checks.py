"""Resume checks what it resumes: the run's settings and its training data's fingerprint travel in
each checkpoint, so a deleted config.json lets no setting change, and a resume on other data is
refused (one line naming the file) unless `data.accept_changed` is set, which metrics.jsonl notes."""

import dataclasses
import json

import h5py
import pytest
from conftest import mse, regression_data, silent, small_mlp

from jaxtrain import TrainConfig
from jaxtrain._src.config import DataConfig
from jaxtrain._src.data.sources import HDF5Source
from jaxtrain._src.errors import ConfigError, DataError
from jaxtrain._src.loop import RunOptions, run

CONFIG = TrainConfig(epochs=1, batch_size=16, steps_per_call=5, tensorboard=False)


def _fit(run_dir, data, config=CONFIG, **kwargs):
    return run(small_mlp(), mse, data, None, config, run_dir=run_dir, verbosity="summary", **kwargs,
               session=RunOptions(console=silent()))


def _write_h5(path, seed):
    data = regression_data(160, seed=seed)
    with h5py.File(path, "w") as f:
        f["x"], f["y"] = data["x"], data["y"]


def test_without_config_json_the_checkpoint_s_settings_are_the_reference(tmp_path):
    run_dir = tmp_path / "run"
    _fit(run_dir, regression_data(160))
    (run_dir / "config.json").unlink()
    changed = dataclasses.replace(CONFIG, epochs=2, batch_size=32, optim=dataclasses.replace(CONFIG.optim, lr=0.01))
    with pytest.raises(ConfigError) as e:
        _fit(run_dir, regression_data(160), changed, resume=True)
    assert "a resume cannot change batch_size 16 -> 32, optim.lr 0.001 -> 0.01" in str(e.value)
    assert not (run_dir / "config.json").exists()  # nothing rewritten to claim the new settings
    resumed = _fit(run_dir, regression_data(160), dataclasses.replace(CONFIG, epochs=2), resume=True)
    assert resumed.summary["steps"] == 20


def test_changed_arrays_are_refused(tmp_path):
    run_dir = tmp_path / "run"
    _fit(run_dir, regression_data(160))
    with pytest.raises(DataError) as e:
        _fit(run_dir, regression_data(160, seed=1), dataclasses.replace(CONFIG, epochs=2), resume=True)
    assert len(str(e.value).splitlines()) == 1
    assert "the training data changed since checkpoint step 10 was saved (the training arrays (160 rows): " \
           "other values in the 8 rows sampled)" in str(e.value)


def test_a_regenerated_file_is_refused_unless_accepted_and_then_noted(tmp_path, capsys):
    path, run_dir = tmp_path / "data.h5", tmp_path / "run"
    stream = dataclasses.replace(CONFIG, data=DataConfig(placement="stream"))
    _write_h5(path, seed=0)
    with HDF5Source(path, {"x": "x", "y": "y"}) as source:
        _fit(run_dir, source, stream)
    _write_h5(path, seed=1)  # the same shapes and size, other values
    more = dataclasses.replace(stream, epochs=2)
    with HDF5Source(path, {"x": "x", "y": "y"}) as source, pytest.raises(DataError) as e:
        _fit(run_dir, source, more, resume=True)
    assert len(str(e.value).splitlines()) == 1 and str(path) in str(e.value), e.value
    assert "DataConfig(accept_changed=True)" in str(e.value)
    rows_before = (run_dir / "metrics.jsonl").read_text()

    accept = dataclasses.replace(more, data=DataConfig(placement="stream", accept_changed=True))
    with HDF5Source(path, {"x": "x", "y": "y"}) as source:
        resumed = _fit(run_dir, source, accept, resume=True)
    assert resumed.summary["steps"] == 20
    assert "note: resumed on changed training data" in capsys.readouterr().err
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    noted = [r for r in rows if r.get("kind") == "note"]
    assert len(noted) == 1 and noted[0]["step"] == 10 and str(path) in noted[0]["note"], noted
    assert noted[0]["note"].endswith("as DataConfig(accept_changed=True) allows"), noted  # rendered, no token
    assert rows_before.splitlines()[0] == (run_dir / "metrics.jsonl").read_text().splitlines()[0]

    # the same data again (rewritten with the same contents): no refusal, no note
    _write_h5(path, seed=1)
    with HDF5Source(path, {"x": "x", "y": "y"}) as source:
        _fit(run_dir, source, dataclasses.replace(more, epochs=3), resume=True)
    assert "changed" not in capsys.readouterr().err
