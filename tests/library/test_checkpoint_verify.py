"""Checkpoints verify what they restore: each array's checksum is saved with it, and a step whose
values differ from them on reading (a flipped bit) is skipped like an unreadable one, with one note."""

import re
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from conftest import small_mlp

from jaxtrain._src.checkpoint import Checkpointer, checksums, flatten_state
from jaxtrain._src.state import init_state

STEPS = (10, 20)


def _save_two(directory: Path) -> dict:
    _, state = init_state(small_mlp(d_in=64), optax.adam(1e-3), jax.random.key(0))  # values past OCDBT's inline size
    states = {step: state._replace(params=jax.tree.map(lambda x, s=step: x + s, state.params)) for step in STEPS}
    ckpt = Checkpointer(directory, keep_last=3, keep_best=0)
    for step in STEPS:
        ckpt.save(step, states[step], {"history": []})
    ckpt.wait()
    ckpt.close()
    return states


def _flip_a_bit(step_dir: Path) -> None:
    """Flips one bit in the middle of the step's largest data file: an array's stored values (which
    carry no checksum of their own, unlike OCDBT's b-tree nodes), as in the issue's reproduction."""
    data = max(step_dir.glob("state/**/d/*"), key=lambda p: p.stat().st_size)
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 1
    data.write_bytes(bytes(raw))


def _same(a, b) -> bool:
    fa, fb = flatten_state(a), flatten_state(b)
    return all(np.array_equal(np.asarray(fa[k]), np.asarray(fb[k])) for k in fa)


@pytest.mark.parametrize("on_host", [True, False], ids=["crc32 on the host", "program on the device"])
def test_checksums_see_one_flipped_bit_in_any_dtype(on_host):
    arrays = {"f32": np.linspace(-1, 1, 300, dtype=np.float32).reshape(10, 30),
              "bf16": jax.numpy.ones((7, 5), jax.numpy.bfloat16), "i32": np.arange(12, dtype=np.int32),
              "u8": np.arange(9, dtype=np.uint8), "bool": np.array([True, False, True]), "scalar": np.int32(3)}
    before = checksums(arrays, on_host=on_host)
    for name, x in arrays.items():
        raw = np.array(x).reshape(-1).view(np.uint8).copy() if name != "bf16" else None
        if raw is None:
            flipped = jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(x, np.uint16).at[3, 2].add(1),
                                                   jax.numpy.bfloat16)
        elif name == "bool":
            flipped = ~x
        else:
            raw.reshape(-1)[-1] ^= 0x10
            flipped = raw.view(np.asarray(x).dtype).reshape(np.shape(x))
        after = checksums({**arrays, name: flipped}, on_host=on_host)
        assert after[name] != before[name], name
        assert {k: v for k, v in after.items() if k != name} == {k: v for k, v in before.items() if k != name}
    swapped = checksums({"f32": arrays["f32"][::-1]}, on_host=on_host)  # the same values at other positions
    assert swapped["f32"] != before["f32"]


NOTE = (r"checkpoint step 20 is unreadable \(array \S+( and \d+ other arrays?)? read other values than were "
        r"saved \(checksum mismatch\): its data files are corrupt\); ")


def test_a_bit_flipped_step_is_skipped_with_one_note(tmp_path):
    states = _save_two(tmp_path)
    _flip_a_bit(tmp_path / "20")
    notes = []
    ckpt = Checkpointer(tmp_path, read_only=True, note=notes.append)
    restored, meta = ckpt.restore(states[10])
    ckpt.close()
    assert meta["step"] == 10 and _same(restored, states[10])
    assert len(notes) == 1 and re.fullmatch(NOTE + "using step 10", notes[0]), notes


def test_a_writer_moves_the_bit_flipped_step_aside_and_load_skips_it(tmp_path):
    states = _save_two(tmp_path)
    _flip_a_bit(tmp_path / "20")
    notes = []
    ckpt = Checkpointer(tmp_path, note=notes.append)
    params, _ = ckpt.restore_model(states[10].params, states[10].model_state)  # as `jaxtrain.load` reads
    assert ckpt.restored_step == 10
    ckpt.restore(states[10])
    ckpt.close()
    assert re.fullmatch(NOTE + r"moved to \S+/20\.unreadable-\d+; using step 10", notes[0]), notes
    assert len(notes) == 1  # the second read no longer sees step 20
    assert [p.name for p in tmp_path.glob("20.unreadable-*")]


def test_a_step_without_checksums_reads_unchecked(tmp_path):
    """Checkpoints written before checksums existed restore as before."""
    import json

    states = _save_two(tmp_path)
    path = tmp_path / "20" / "_CHECKPOINT_METADATA"
    stored = json.loads(path.read_text())
    assert set(stored["custom_metadata"].pop("checksums")) == set(flatten_state(states[20]))
    path.write_text(json.dumps(stored))
    ckpt = Checkpointer(tmp_path, read_only=True)
    restored, meta = ckpt.restore(states[10])
    ckpt.close()
    assert meta["step"] == 20 and _same(restored, states[20])
