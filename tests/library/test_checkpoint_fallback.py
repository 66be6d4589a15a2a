"""Unreadable checkpoints: the latest and the best fall back to a step that reads, with one note
each; a writer moves the unreadable step aside; an explicit or hopeless read is one line; the
disk-full refusal gives numbers that add up."""

import re
import shutil
import types
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from conftest import small_mlp
from flax import nnx

from jaxtrain import CheckpointError
from jaxtrain._src.checkpoint import Checkpointer, flatten_state
from jaxtrain._src.models import MLP
from jaxtrain._src.state import init_state

STEPS = (10, 20, 30)


def _save_three(directory: Path, val_losses=(0.3, 0.1, 0.2)) -> dict:
    """Checkpoints at steps 10, 20, 30 of three different states; returns `{step: state}`."""
    _, state = init_state(small_mlp(), optax.adam(1e-3), jax.random.key(0))
    states = {step: state._replace(params=jax.tree.map(lambda x, s=step: x + s, state.params)) for step in STEPS}
    ckpt = Checkpointer(directory, keep_last=3, keep_best=1)
    for step, val_loss in zip(STEPS, val_losses, strict=True):
        ckpt.save(step, states[step], {"history": []}, {"val_loss": val_loss})
    ckpt.wait()
    ckpt.close()
    return states


def _assert_same_state(restored, saved) -> None:
    a, b = flatten_state(restored), flatten_state(saved)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]), err_msg=name)


def _truncate_data(step_dir: Path) -> Path:
    """Truncates the step's OCDBT data file to 100 bytes (the database of the finished step: its
    b-tree, holding the small arrays of this model; `ocdbt.process_0/` is what process 0 wrote)."""
    (data,) = step_dir.glob("state/d/*")
    with open(data, "r+b") as f:
        f.truncate(100)
    return data


def test_latest_skips_a_truncated_step_with_one_note(tmp_path, capsys):
    states = _save_three(tmp_path)
    _truncate_data(tmp_path / "30")
    ckpt = Checkpointer(tmp_path, read_only=True)  # the default note: one line on stderr
    restored, meta = ckpt.restore(states[10])
    assert (tmp_path / "30").is_dir() and ckpt.steps() == list(STEPS)  # a reader renames nothing
    ckpt.close()
    _assert_same_state(restored, states[20])
    assert meta["step"] == 20 and ckpt.restored_step == 20
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert re.fullmatch(r"note: checkpoint step 30 is unreadable \(its data file state/d/\w+ is truncated: "
                        r"100 bytes, \d+ needed\); using step 20\n", err), err


@pytest.mark.parametrize("missing", ["state/_METADATA", "_CHECKPOINT_METADATA"])
def test_latest_skips_a_step_missing_a_metadata_file(tmp_path, missing):
    states = _save_three(tmp_path)
    (tmp_path / "30" / missing).unlink()
    notes = []
    ckpt = Checkpointer(tmp_path, read_only=True, note=notes.append)
    restored, _ = ckpt.restore(states[10])
    ckpt.close()
    _assert_same_state(restored, states[20])
    assert notes == [f"checkpoint step 30 is unreadable (its {missing} is missing); using step 20"]


def test_a_writer_moves_the_unreadable_step_aside_and_saves_that_step_again(tmp_path):
    states = _save_three(tmp_path)
    truncated = _truncate_data(tmp_path / "30").relative_to(tmp_path / "30")
    notes = []
    ckpt = Checkpointer(tmp_path, keep_last=2, keep_best=0, note=notes.append)
    restored, _ = ckpt.restore(states[10])
    _assert_same_state(restored, states[20])
    (aside,) = tmp_path.glob("30.unreadable-*")
    assert (aside / truncated).stat().st_size == 100  # moved, not deleted: the data stay for inspection
    assert len(notes) == 1 and f"moved to {tmp_path.name}/{aside.name}; using step 20" in notes[0]
    assert ckpt.steps() == [10, 20]
    for step in (30, 40, 50):  # 30 no longer collides; keeping 2 deletes 10, 20, 30 but not the moved step
        ckpt.save(step, states[30], {"history": []})
        ckpt.wait()
    assert ckpt.steps() == [40, 50]
    ckpt.close()
    again = Checkpointer(tmp_path, keep_last=2, keep_best=0, note=notes.append)  # cleans up at start
    assert again.steps() == [40, 50] and aside.is_dir()
    _assert_same_state(again.restore(states[10])[0], states[30])
    again.close()
    assert len(notes) == 1


def test_best_falls_back_to_the_next_best(tmp_path):
    states = _save_three(tmp_path, val_losses=(0.3, 0.1, 0.2))  # best 20, then 30, then 10
    _truncate_data(tmp_path / "20")
    notes = []
    ckpt = Checkpointer(tmp_path, read_only=True, note=notes.append)
    assert ckpt.best_step() == 20
    _assert_same_state(ckpt.restore(states[10], "best")[0], states[30])
    assert len(notes) == 1 and notes[0].startswith("checkpoint step 20 is unreadable (")
    assert notes[0].endswith("using step 30")
    _, params, model_state = nnx.split(small_mlp(), nnx.Param, ...)
    params, _ = ckpt.restore_model(params, model_state, "best")
    assert ckpt.restored_step == 30
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(states[30].params), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Metadata that cannot be read ranks no step (30 now comes after the ranked 20 and 10).
    (tmp_path / "30" / "_CHECKPOINT_METADATA").write_text('{"custom_metadata": ')
    assert ckpt.best_step() == 20
    _assert_same_state(ckpt.restore(states[20], "best")[0], states[10])
    assert notes[-1].startswith("checkpoint step 20 is unreadable (") and notes[-1].endswith("using step 10")
    ckpt.close()


def test_an_unreadable_step_asked_for_is_a_one_line_error(tmp_path):
    states = _save_three(tmp_path)
    _truncate_data(tmp_path / "30")
    notes = []
    ckpt = Checkpointer(tmp_path, note=notes.append)
    with pytest.raises(CheckpointError) as info:
        ckpt.restore(states[10], 30)
    message = str(info.value)
    assert "\n" not in message and len(message) < 300, message
    assert message.startswith(f"checkpoint step 30 in {tmp_path} is unreadable (its data file ")
    assert message.endswith("other steps: [10, 20]")
    assert notes == [] and (tmp_path / "30").is_dir()  # nothing skipped, nothing moved
    ckpt.close()


def test_no_readable_step_is_a_one_line_error_and_moves_nothing(tmp_path):
    states = _save_three(tmp_path)
    for step in STEPS:
        _truncate_data(tmp_path / str(step))
    notes = []
    ckpt = Checkpointer(tmp_path, note=notes.append)  # a writer: a failed resume leaves the directory as it was
    with pytest.raises(CheckpointError) as info:
        ckpt.restore(states[10])
    ckpt.close()
    message = str(info.value)
    assert "\n" not in message and len(message) < 300, message
    assert re.fullmatch(rf"no checkpoint in {re.escape(str(tmp_path))} can be read \(tried steps \[30, 20, 10\]\); "
                        r"step 30: its data file \S+ is truncated: 100 bytes, \d+ needed", message), message
    assert notes == [] and sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["10", "20", "30"]


def test_the_disk_full_message_adds_up(tmp_path, monkeypatch):
    _, state = init_state(MLP((64, 1024, 64), rngs=nnx.Rngs(0)), optax.adam(1e-3), jax.random.key(0))
    nbytes = sum(x.nbytes for x in flatten_state(state).values())
    ckpt = Checkpointer(tmp_path, keep_last=3, keep_best=0)
    ckpt.save(10, state, {"history": []})
    ckpt.wait()
    free = nbytes + (100 << 10)  # room for the arrays, not for the rest of a checkpoint
    monkeypatch.setattr(shutil, "disk_usage", lambda path: types.SimpleNamespace(total=free, used=0, free=free))
    with pytest.raises(CheckpointError) as info:
        ckpt.save(20, state, {"history": []})
    ckpt.close()
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"cannot write a checkpoint to {tmp_path}: not enough free space")
    assert message.endswith("(the last complete checkpoint is step 10)")
    found = re.search(r"needs about ([\d.]+) MiB of arrays \+ ([\d.]+) MiB of metadata = ([\d.]+) MiB, and "
                      r"([\d.]+) MiB is free", message)
    assert found, message
    arrays, extra, total, shown_free = map(float, found.groups())
    assert arrays >= nbytes / 2**20 and round(arrays + extra, 1) == total and shown_free < total
    assert shown_free <= free / 2**20
