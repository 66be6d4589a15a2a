"""Nothing lost, nothing silently wrong: a finished run stays finished (a resume trains, compiles and
rewrites nothing; with no checkpoint it never deletes run files), and run files are written like a
database writes its log (epoch rows synced before the epoch's checkpoint, torn lines dropped on read,
no write through a symbolic link, every write error one line with the summary saying "failed"; TensorBoard,
a side channel, is turned off with one note instead)."""

import errno
import json
import logging
import os
from pathlib import Path

import pytest
from conftest import mse, regression_data, silent, small_mlp

from jaxtrain import CheckpointConfig, EarlyStoppingConfig, LambdaHook, TrainConfig
from jaxtrain._src import moments
from jaxtrain._src.checkpoint import Checkpointer
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.loop import RunOptions, run
from jaxtrain._src.report.run_dir import RunDir, read_jsonl

DATA = regression_data(64)
CONFIG = TrainConfig(epochs=2, batch_size=16, steps_per_call=2, tensorboard=False)


def _fit(run_dir, config=CONFIG, **kwargs):
    return run(small_mlp(), mse, DATA, None, config, run_dir=run_dir, verbosity="summary", **kwargs,
               session=RunOptions(console=silent()))


def _files(run_dir: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}


def _lowered(fn):
    """What `fn()` returns, and the programs it lowered (compiled)."""
    seen = []
    stop = moments.listen(lambda name, facts: seen.append(facts.get("what")) if name == "lowered" else None)
    try:
        return fn(), seen
    finally:
        stop()


def _one_line(e: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(e.value)
    return str(e.value)


def test_resuming_a_completed_run_trains_compiles_and_rewrites_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    first = _fit(run_dir)
    before = _files(run_dir)
    assert "profile" in json.loads((run_dir / "summary.json").read_text())
    capsys.readouterr()
    again, lowered = _lowered(lambda: _fit(run_dir, resume=True))
    assert lowered == [] and _files(run_dir) == before  # the summary keeps its profile and its time
    assert again.summary == json.loads((run_dir / "summary.json").read_text())
    assert again.summary["steps"] == first.summary["steps"] == 8 and len(again.history) == 2
    assert capsys.readouterr().err.count("note:") == 1


def test_resuming_an_early_stopped_run_trains_nothing_every_time(tmp_path, capsys):
    """A requeue loop resuming a run that stopped early no longer trains one more epoch each time."""
    run_dir = tmp_path / "run"
    stopping = EarlyStoppingConfig(patience=1, metric="train_loss", min_delta=1e9)  # stops after epoch 2
    config = TrainConfig(epochs=5, batch_size=16, steps_per_call=2, tensorboard=False, early_stopping=stopping)
    first = _fit(run_dir, config=config)
    assert first.summary["status"] == "stopped early" and first.summary["steps"] == 8
    before = _files(run_dir)
    capsys.readouterr()
    for _ in range(2):
        again, lowered = _lowered(lambda: _fit(run_dir, config=config, resume=True))
        assert lowered == [] and _files(run_dir) == before and again.summary["steps"] == 8
    err = capsys.readouterr().err
    assert err.count("note:") == 2 and "stopped early at step 8" in err and "nothing to train" in err
    # Without config.json the checkpoint's settings are the reference: still nothing to train.
    (run_dir / "config.json").unlink()
    again = _fit(run_dir, config=config, resume=True)
    assert again.summary["steps"] == 8 and "stopped early at step 8" in capsys.readouterr().err
    # Other early-stopping settings continue the run.
    more = TrainConfig(epochs=3, batch_size=16, steps_per_call=2, tensorboard=False)
    assert _fit(run_dir, config=more, resume=True).summary["steps"] == 12


@pytest.mark.xla_defaults
def test_a_run_stopped_by_a_hook_resumes_to_the_uninterrupted_result():
    """A time budget (a hook's `run.stop`) splits a run over several jobs: the resume trains on, where a
    run early stopping stopped has nothing to train (the test above)."""
    import tempfile

    from conftest import leaves_close

    config = TrainConfig(epochs=3, batch_size=16, steps_per_call=2, tensorboard=False)
    budget = LambdaHook(on_epoch_end=lambda run, record: run.stop("time budget") if run.epoch == 1 else None)
    with tempfile.TemporaryDirectory() as tmp:
        full = _fit(Path(tmp) / "full", config=config)
        stopped = _fit(Path(tmp) / "split", config=config, hooks=[budget])
        assert stopped.summary["status"] == "stopped early" and stopped.summary["stop_reason"] == "time budget"
        resumed = _fit(Path(tmp) / "split", config=config, resume=True)
    assert resumed.summary["status"] == "completed" and len(resumed.history) == 3
    assert [r["train_loss"] for r in resumed.history] == [r["train_loss"] for r in full.history]
    assert leaves_close(resumed.state.params, full.state.params) == 0.0


@pytest.mark.parametrize("damage", ["checkpoints off", "checkpoints is a file"])
def test_a_resume_with_no_checkpoint_never_destroys_a_finished_run(tmp_path, damage):
    run_dir = tmp_path / "run"
    config = CONFIG
    if damage == "checkpoints off":
        config = TrainConfig(epochs=2, batch_size=16, steps_per_call=2, tensorboard=True,
                             checkpoint=CheckpointConfig(enabled=False))
    _fit(run_dir, config=config)
    if damage == "checkpoints is a file":
        Checkpointer(run_dir / "checkpoints").close()
        os.rename(run_dir / "checkpoints", tmp_path / "gone")
        (run_dir / "checkpoints").write_text("not a directory")
    before = _files(run_dir)
    with pytest.raises(ConfigError) as e:
        _fit(run_dir, config=config, resume=True)
    assert "holds a finished run (completed at step 8) but no checkpoint to resume from" in _one_line(e)
    assert e.value.exit_code == 2 and _files(run_dir) == before


def test_a_resume_with_no_checkpoint_moves_an_unfinished_runs_files_aside(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"recipe": "fit", "epochs": 2}))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 3, "loss": 9.0}) + "\n")
    old = _files(run_dir)
    assert _fit(run_dir, resume=True).summary["status"] == "completed"
    assert f"the earlier files are in {run_dir / 'previous-1'}" in capsys.readouterr().err
    assert {p.name: b for p, b in old.items()} == {p.name: b for p, b in _files(run_dir / "previous-1").items()}


@pytest.mark.parametrize("bad", ['{"kind": "train", "st', "[1, 2]"])
def test_a_torn_or_malformed_metrics_line_is_dropped_with_a_note(tmp_path, capsys, bad):
    """A full disk tore the last row: the resume drops it (one note) instead of a JSONDecodeError."""
    run_dir = tmp_path / "run"
    _fit(run_dir)
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(bad + ("\n" if bad.startswith("[") else ""))
    capsys.readouterr()
    more = TrainConfig(epochs=3, batch_size=16, steps_per_call=2, tensorboard=False)
    assert _fit(run_dir, config=more, resume=True).summary["steps"] == 12
    assert "not a whole JSON object" in capsys.readouterr().err
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["epoch"] for r in rows if r.get("kind") == "epoch"] == [1, 2, 3]
    assert all(json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())


def test_the_epoch_row_is_on_disk_before_the_epochs_checkpoint_starts(tmp_path):
    """A second Ctrl-C at an epoch end can no longer leave a checkpoint whose epoch row was never written."""
    run_dir = tmp_path / "run"
    seen = []

    def at(name, facts):
        if name == "checkpoint saved" and facts["kind"] == "epoch":
            rows = read_jsonl(run_dir / "metrics.jsonl")
            seen.append(any(r.get("kind") == "epoch" and r["step"] == facts["step"] for r in rows))

    stop = moments.listen(at)
    try:
        _fit(run_dir)
    finally:
        stop()
    assert seen == [True, True]


@pytest.mark.parametrize("name", ["metrics.jsonl", "predict.json", ".lock", "tensorboard"])
def test_a_run_directory_whose_files_are_links_is_refused(tmp_path, name):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / name).symlink_to(victim)
    with pytest.raises(ConfigError) as e:
        _fit(run_dir, config=TrainConfig(epochs=1, batch_size=16, tensorboard=True))
    assert f"{run_dir / name} is a symbolic link" in _one_line(e)
    assert victim.read_text() == "precious\n" and sorted(p.name for p in run_dir.iterdir()) == sorted({".lock", name})


@pytest.mark.parametrize("where, why", [("", "it is a file, not a folder"), ("run", "a folder on its path is a file")])
def test_a_run_directory_that_is_a_file_is_refused_in_words(tmp_path, where, why):
    file = tmp_path / "notes.txt"
    file.write_text("precious\n")
    with pytest.raises(ConfigError) as e:
        _fit(file / where if where else file)
    assert _one_line(e) == f"cannot use run directory {file / where if where else file}: {why}; choose another run_dir"
    assert file.read_text() == "precious\n"


def test_a_link_made_during_a_run_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    writer = RunDir(tmp_path / "run")
    (tmp_path / "run" / ".summary.json.tmp").symlink_to(victim)  # the temporary name of earlier versions
    (tmp_path / "run" / ".write-test").symlink_to(victim)
    writer.write_json("summary.json", {"status": "completed"})  # its temporary file has a fresh name
    RunDir(tmp_path / "run").close()  # so has the write test's
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == {"status": "completed"}
    (tmp_path / "run" / "summary.json").unlink()
    (tmp_path / "run" / "summary.json").symlink_to(victim)
    with pytest.raises(ConfigError, match="summary.json is a symbolic link"):
        writer.write_json("summary.json", {"status": "completed"})
    writer.close()
    assert victim.read_text() == "precious\n"
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.endswith(".partial")]


def test_a_full_disk_under_tensorboard_turns_it_off_with_one_note_and_the_run_goes_on(tmp_path, monkeypatch,
                                                                                        capsys):
    from tensorboardX import SummaryWriter

    def full(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SummaryWriter, "flush", full)  # at the first epoch's end
    run_dir = tmp_path / "run"
    result = _fit(run_dir, config=TrainConfig(epochs=2, batch_size=16, steps_per_call=2, tensorboard=True))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("note: TensorBoard failed at step 4 (OSError: [Errno 28] No space "
                                               "left on device); it is off for the rest of this run"), err
    assert result.summary["status"] == "completed" and len(result.history) == 2
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert Checkpointer(run_dir / "checkpoints", read_only=True).steps()[-1] == 8


def test_a_full_disk_under_metrics_is_one_line_and_a_failed_summary(tmp_path, monkeypatch):
    import jaxtrain._src.report.run_dir as run_dir_module

    real, calls = os.fsync, []

    def fsync(fd):  # after config.json the disk fills at the first epoch row; the summary finds room again
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(run_dir_module.os, "fsync", fsync)
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as e:
        _fit(run_dir)
    assert f"cannot write {run_dir / 'metrics.jsonl'}: No space left on device" in _one_line(e)
    assert json.loads((run_dir / "summary.json").read_text())["status"].startswith("failed: cannot write")


def test_a_hook_that_raises_fails_the_run(tmp_path):
    def boom(run, record):
        raise ValueError("my hook broke")

    with pytest.raises(ValueError):
        _fit(tmp_path / "run", hooks=[LambdaHook(on_epoch_end=boom)])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed: ValueError: my hook broke"


def test_a_silent_run_with_checkpoints_says_nothing_and_resumes_saying_nothing(tmp_path, capfd, caplog):
    """`verbosity="silent"`: no line of jaxtrain's, Orbax's, absl's or tensorstore's reaches the
    terminal while the run saves checkpoints every few steps, nor when it resumes from them (nor
    a log record, which pytest's handler takes before it would reach stderr)."""
    from jaxtrain import fit

    caplog.set_level(logging.INFO)
    config = TrainConfig(epochs=2, batch_size=32, checkpoint=CheckpointConfig(every_steps=3))
    capfd.readouterr()
    first = fit(small_mlp(0), mse, regression_data(192), regression_data(64, seed=1), config,
                run_dir=tmp_path / "run", verbosity="silent")
    longer = TrainConfig(epochs=3, batch_size=32, checkpoint=CheckpointConfig(every_steps=3))
    again = fit(small_mlp(0), mse, regression_data(192), regression_data(64, seed=1), longer,
                run_dir=tmp_path / "run", resume=True, verbosity="silent")
    assert (first.summary["status"], again.summary["status"], len(again.history)) == ("completed", "completed", 3)
    saved = Checkpointer(tmp_path / "run" / "checkpoints", read_only=True)
    assert saved.steps()  # it did save
    saved.close()
    # without validation data its checkpoints go unscored (Orbax warned of it at every save)
    fit(small_mlp(0), mse, regression_data(192), None, config, run_dir=tmp_path / "no-val", verbosity="silent")
    assert capfd.readouterr() == ("", "")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_best_metric_the_epoch_record_lacks_is_refused_after_the_first_evaluation(tmp_path):
    """A typo in the metric that ranks checkpoints would leave "best" meaningless: the first epoch with
    an evaluation says so in one line (as early stopping's metric is checked), and the run starts again."""
    data = regression_data(96)
    config = TrainConfig(epochs=2, batch_size=16, tensorboard=False,
                         checkpoint=CheckpointConfig(best_metric="val_accuracy", best_mode="max"))
    with pytest.raises(ConfigError, match=r"CheckpointConfig\(best_metric=\"val_accuracy\"\) is not in the epoch "
                                          r"record, so no checkpoint could be ranked; choose one of: train_loss, "
                                          r".*val_loss, val_mae, and start the run again"):
        run(small_mlp(), mse, data, data, config, run_dir=tmp_path / "run", verbosity="silent",
            session=RunOptions(console=silent()))
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"].startswith("failed")
    fixed = TrainConfig(epochs=2, batch_size=16, tensorboard=False, checkpoint=CheckpointConfig(best_metric="val_mae"))
    again = run(small_mlp(), mse, data, data, fixed, run_dir=tmp_path / "run", resume="overwrite",
                verbosity="silent", session=RunOptions(console=silent()))
    assert again.summary["status"] == "completed" and again.summary["steps"] == 12
