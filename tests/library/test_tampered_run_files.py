"""Run files that were changed or replaced by hand (a JSON list for config.json or summary.json, a FIFO
for .lock, a dangling previous-1 link) are one line each, or are stepped around: never a traceback, never
a read that hangs, nothing lost (issue 63's probe)."""

import json
import os
import shutil

import pytest
from conftest import mse, regression_data, small_mlp

import jaxtrain
from jaxtrain import ConfigError, TrainConfig

DATA = regression_data(64)
CONFIG = TrainConfig(epochs=1, batch_size=16, steps_per_call=2, tensorboard=False)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    jaxtrain.fit(small_mlp(), mse, DATA, config=CONFIG, run_dir=run_dir, verbosity="silent")
    return run_dir


@pytest.fixture
def run(finished, tmp_path):
    return shutil.copytree(finished, tmp_path / "run")


def _fit(run_dir, **kwargs):
    return jaxtrain.fit(small_mlp(), mse, DATA, config=CONFIG, run_dir=run_dir, verbosity="silent", **kwargs)


def _one_line(e: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_config_that_is_a_json_list_is_one_line_for_load(run):
    (run / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError) as e:
        jaxtrain.load(run, small_mlp())
    assert f"{run / 'config.json'} holds a JSON list, not the object jaxtrain wrote" in _one_line(e)


@pytest.mark.parametrize("resume", [False, True])
def test_a_summary_that_is_a_json_list_is_one_line_or_not_read_as_finished(run, resume):
    (run / "summary.json").write_text('["completed"]')
    if not resume:  # what the directory holds is described from its summary: that one cannot be read
        with pytest.raises(ConfigError) as e:
            _fit(run)
        assert f"{run / 'summary.json'} holds a JSON list" in _one_line(e)
        return
    result = _fit(run, resume=True)  # nothing says the run finished: it continues from its checkpoint
    assert result.summary["status"] == "completed"
    assert isinstance(json.loads((run / "summary.json").read_text()), dict)


def test_a_lock_that_is_a_fifo_is_one_line_and_does_not_hang(run):
    (run / ".lock").unlink(missing_ok=True)
    os.mkfifo(run / ".lock")
    with pytest.raises(ConfigError) as e:
        _fit(run, resume=True)
    assert f"{run / '.lock'} is not a file; remove it" in _one_line(e)


def test_a_dangling_previous_link_is_stepped_around_when_files_move_aside(run):
    shutil.rmtree(run / "checkpoints")  # an unfinished run with nothing to resume: its files move aside
    (run / "summary.json").unlink()
    (run / "previous-1").symlink_to(run / "nowhere")
    _fit(run, resume=True)
    assert (run / "previous-1").is_symlink() and not (run / "previous-1").exists()  # left as it was
    assert (run / "previous-2" / "config.json").is_file() and (run / "summary.json").is_file()
