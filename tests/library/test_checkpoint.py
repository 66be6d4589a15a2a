"""Checkpoints: exact resume from any checkpoint, kills at random moments, graceful stop, NaN
guard, storage faults, eval/load, and bad --resume input."""

import dataclasses
import json
import shutil

import jax
import numpy as np
import optax
import pytest
from _runs import TRAIN, assert_bit_equal, log_rows, mount_tmpfs, unmount
from conftest import mse, regression_data, silent, small_mlp

import jaxtrain
from jaxtrain import CheckpointConfig, CheckpointError, NonFiniteLossError, TrainConfig
from jaxtrain._src.checkpoint import Checkpointer, flatten_state, unflatten_state
from jaxtrain._src.feeds import epoch_permutation
from jaxtrain._src.loop import RunOptions, run
from jaxtrain._src.state import init_state
from jaxtrain.tools import runs


def _params(state) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def _config(**overrides):
    checkpoint = CheckpointConfig(every_steps=5, keep_last=100, keep_best=0)
    return TrainConfig(**{"epochs": 3, "batch_size": 16, "steps_per_call": 2, "checkpoint": checkpoint, **overrides})


def _run(run_dir, resume=False, data=None, **overrides):
    data = data or regression_data(400)  # 25 steps per epoch, calls of 2 steps: saves mid-epoch and at ends
    val = regression_data(40, seed=1)
    return run(small_mlp(), mse, data, val, _config(**overrides), run_dir=run_dir, resume=resume,
               verbosity="summary", session=RunOptions(console=silent()))


@pytest.mark.xla_defaults
def test_state_round_trip_and_shape_check():
    tx = optax.adam(1e-3)
    _, state = init_state(small_mlp(), tx, jax.random.key(3))
    back = unflatten_state(state, flatten_state(state))
    assert jax.tree.structure(back) == jax.tree.structure(state)
    np.testing.assert_array_equal(jax.random.key_data(back.rng), jax.random.key_data(state.rng))
    _, other = init_state(small_mlp(d_out=4), tx, jax.random.key(3))
    with pytest.raises(CheckpointError, match="has shape"):
        unflatten_state(other, flatten_state(state))


@pytest.mark.xla_defaults
def test_resume_from_every_checkpoint_is_bit_exact(tmp_path):
    reference = _run(tmp_path / "full")
    ckpt_dir = tmp_path / "full" / "checkpoints"
    steps = Checkpointer(ckpt_dir).steps()
    assert steps[-1] == 75 and len(steps) >= 12 and 25 in steps and 50 in steps
    tested = steps[:-1:3] + [25, 50]  # every third checkpoint (mid-epoch ones) and both epoch ends
    assert any(s % 25 for s in tested)
    for step in sorted(set(tested)):
        run = tmp_path / f"from-{step}"
        shutil.copytree(tmp_path / "full", run)
        for later in (p for p in (run / "checkpoints").iterdir() if p.name.isdigit() and int(p.name) > step):
            shutil.rmtree(later)
        resumed = _run(run, resume=True)
        assert_bit_equal(_params(resumed.state), _params(reference.state))
        assert resumed.summary["steps"] == 75
        assert [r["epoch"] for r in resumed.history] == [1, 2, 3]
        np.testing.assert_allclose([r["train_loss"] for r in resumed.history],
                                   [r["train_loss"] for r in reference.history], rtol=1e-6)
        assert resumed.history[-1]["val_loss"] == reference.history[-1]["val_loss"]
        assert log_rows(run) == log_rows(tmp_path / "full")


@pytest.mark.xla_defaults
def test_format_1_checkpoints_still_resume(tmp_path):
    """A checkpoint written by jaxtrain 0.1 (flat metadata, format 1) resumes to the same result."""
    reference = _run(tmp_path / "full", log_every=1000)
    run = tmp_path / "old"
    shutil.copytree(tmp_path / "full", run)
    step = next(s for s in Checkpointer(run / "checkpoints").steps() if s > 25 and s % 25)  # mid-epoch 2
    for later in (p for p in (run / "checkpoints").iterdir() if p.name.isdigit() and int(p.name) > step):
        shutil.rmtree(later)
    meta_file = run / "checkpoints" / str(step) / "_CHECKPOINT_METADATA"
    stored = json.loads(meta_file.read_text())
    new = stored["custom_metadata"]
    metrics = new["hooks"]["metrics"]["epoch"]
    stored["custom_metadata"] = {  # the 0.1 layout of the same checkpoint
        "format": 1, "step": step, "metrics": {}, "epoch": new["epoch"], "index_in_epoch": new["position"],
        "steps_per_call": new["steps_per_call"], "placement": "device", "data_key": new["feed"]["data_key"],
        "history": new["history"], "epoch_means": metrics, "train_time_s": new["train_time_s"],
        "skipped_steps": metrics["skipped"],
    }
    meta_file.write_text(json.dumps(stored))
    resumed = _run(run, resume=True, log_every=1000)
    assert_bit_equal(_params(resumed.state), _params(reference.state))
    np.testing.assert_allclose([r["train_loss"] for r in resumed.history],
                               [r["train_loss"] for r in reference.history], rtol=1e-6)


def test_keeps_the_last_k_and_the_best(tmp_path):
    state = _template()
    ckpt = Checkpointer(tmp_path, keep_last=2, keep_best=1, best_metric="val_loss")
    for step, val_loss in enumerate([0.5, 0.1, 0.3, 0.4, 0.6], start=1):
        ckpt.save(step, state, {}, {"val_loss": val_loss})
    ckpt.wait()
    assert ckpt.steps() == [2, 4, 5] and ckpt.best_step() == 2 and ckpt.latest_step() == 5
    ckpt.close()
    highest = Checkpointer(tmp_path / "max", keep_last=1, keep_best=1, best_metric="val_accuracy", best_mode="max")
    for step, accuracy in enumerate([0.5, 0.9, 0.7], start=1):
        highest.save(step, state, {}, {"val_accuracy": accuracy})
    highest.wait()
    assert highest.steps() == [2, 3] and highest.best_step() == 2
    highest.close()


def test_nan_never_reaches_a_checkpoint(tmp_path):
    data = regression_data(400)
    data["x"][123, 0] = 1e30  # finite, but its loss overflows
    B = 16
    perm = np.asarray(epoch_permutation(jax.random.split(jax.random.key(0))[1], 1, 400))
    bad_step = int(np.flatnonzero(perm == 123)[0]) // B + 1
    with pytest.raises(NonFiniteLossError) as info:
        _run(tmp_path, data=data)
    assert info.value.step == bad_step
    steps = Checkpointer(tmp_path / "checkpoints").steps()
    assert all(s < bad_step for s in steps)
    message = str(info.value)
    assert (f"the last good checkpoint is step {steps[-1]}" in message) if steps else ("no checkpoint" in message)
    for step in steps:
        state, _ = Checkpointer(tmp_path / "checkpoints").restore(_template(), step)
        assert all(np.isfinite(x).all() for x in _params(state))


def _template():
    return init_state(small_mlp(), jaxtrain.build_optimizer(jaxtrain.OptimConfig(), 75), jax.random.key(0))[1]


def test_on_nan_skip_counts_and_skips_those_updates(tmp_path):
    data = regression_data(400)
    data["x"][123, 0] = 1e30  # overflows the loss: one bad row: one bad step per epoch
    console = silent()
    result = run(small_mlp(), mse, data, regression_data(40, seed=1), _config(on_nan="skip"), run_dir=tmp_path,
                 verbosity="summary", session=RunOptions(console=console))
    assert "Skipped Steps:  1 (non-finite" in console.file.getvalue()
    assert result.summary["skipped_steps"] == 3 and result.summary["status"] == "completed"
    assert [r["skipped_steps"] for r in result.history] == [1, 1, 1]
    assert all(np.isfinite(x).all() for x in _params(result.state))
    assert np.isfinite(result.summary["final_train_loss"])


def test_full_disk_gives_one_clear_error_and_keeps_earlier_checkpoints(tmp_path):
    mount = tmp_path / "small"
    if not mount_tmpfs(mount, "4m"):
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        # Checkpoints of 1.4 MB (115k parameters and two Adam moments) fill a 4 MB disk by the third save.
        data = {"x": np.random.default_rng(0).normal(size=(2000, 128)).astype(np.float32),
                "y": np.zeros((2000, 64), np.float32)}
        from flax import nnx

        from jaxtrain._src.models import MLP

        config = TrainConfig(epochs=20, batch_size=100, checkpoint=CheckpointConfig(keep_last=100, keep_best=0))
        with pytest.raises(CheckpointError, match="cannot write a checkpoint to .*the last complete checkpoint is"):
            run(MLP((128, 256, 256, 64), rngs=nnx.Rngs(0)), mse, data, None, config, run_dir=mount / "run",
                verbosity="summary", session=RunOptions(console=silent()))
        ckpt = Checkpointer(mount / "run" / "checkpoints", read_only=True)
        assert ckpt.steps(), "no checkpoint fitted at all"
        tx = jaxtrain.build_optimizer(jaxtrain.OptimConfig(), 400)
        template = init_state(MLP((128, 256, 256, 64), rngs=nnx.Rngs(0)), tx, jax.random.key(0))[1]
        for step in ckpt.steps():  # every listed checkpoint is complete and readable
            ckpt.restore(template, step)
    finally:
        unmount(mount)


@pytest.mark.xla_defaults
def test_eval_and_load(tmp_path, capsys):
    from jaxtrain.tools.cli import main  # in-process: nothing here needs a separate process

    run_dir = tmp_path / "run"
    assert main(["train", "mlp-regression", "--data.samples", "2000", "--data.val-samples", "300", "--epochs", "2",
                 "--quiet", "--run-dir", str(run_dir)]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--checkpoint", "latest"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["step"] == summary["steps"]
    np.testing.assert_allclose(evaluated["val_loss"], summary["final_val_loss"], rtol=1e-6)
    best = runs.load(run_dir)  # best by val_loss: the only checkpoint kept by keep_best
    best_epoch = summary["best_epoch"]
    x = np.random.default_rng(0).normal(size=(4, 128)).astype(np.float32)
    latest = runs.load(run_dir, "latest")
    assert (np.asarray(best(x)) == np.asarray(latest(x))).all() == (best_epoch == 2)


def test_bad_resume_input_is_one_line_exit_2_and_overwrites_nothing(tmp_path, capsys):
    from jaxtrain.tools.cli import main

    run_dir = tmp_path / "run"
    assert main([*TRAIN, "--epochs", "1", "--run-dir", str(run_dir)]) == 0
    # The lock file names its last holder, so it changes; nothing else may.
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}

    cases = [(["--resume", str(run_dir), "--model.hidden", "32", "32"], "a resume cannot change model.hidden")]
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"recipe": "char-gpt"}))
    cases.append((["--resume", str(other)], "is a run of recipe 'char-gpt', not 'mlp-regression'"))
    capsys.readouterr()
    for extra, message in cases:
        assert main(["train", "mlp-regression", *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and message in err and err.count("\n") == 1, err

    newer = tmp_path / "newer"
    shutil.copytree(run_dir, newer)
    latest = max(p for p in (newer / "checkpoints").iterdir() if p.name.isdigit())
    meta_file = latest / "_CHECKPOINT_METADATA"
    meta = json.loads(meta_file.read_text())
    meta["custom_metadata"]["format"] = 99
    meta_file.write_text(json.dumps(meta))
    assert main(["train", "mlp-regression", "--resume", str(newer)]) == 2

    after = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before


@pytest.mark.xla_defaults
def test_load_a_python_fit_run_with_a_template(tmp_path):
    from flax import nnx

    from jaxtrain._src.models import MLP

    result = _run(tmp_path / "py", epochs=1)
    template = nnx.eval_shape(lambda: MLP((8, 16, 3), rngs=nnx.Rngs(123)))  # no weights allocated
    loaded = jaxtrain.load(tmp_path / "py", "latest", model=template)
    assert_bit_equal([np.asarray(x) for x in jax.tree.leaves(nnx.state(loaded, nnx.Param))],
                      _params(result.state))
    x = regression_data(5, seed=9)["x"]
    np.testing.assert_allclose(loaded(x), result.model(x), rtol=1e-6)
    with pytest.raises(jaxtrain.ConfigError, match="load needs model="):
        jaxtrain.load(tmp_path / "py")
    with pytest.raises(CheckpointError, match="has shape"):
        jaxtrain.load(tmp_path / "py", model=nnx.eval_shape(lambda: MLP((8, 32, 3), rngs=nnx.Rngs(0))))


@pytest.mark.xla_defaults
def test_load_reads_no_data(tmp_path, monkeypatch):
    """Recipe runs restore weights into `Recipe.model(config, model.json)`: building the workload
    (which reads the datasets) is not needed, so here it is made to fail."""
    from jaxtrain.tools.recipes import get_recipe

    recipe = get_recipe("mlp-regression")
    config = dataclasses.replace(recipe.config, epochs=1, quiet=True, data=dataclasses.replace(
        recipe.config.data, samples=600, val_samples=100))
    result = runs.train(recipe, config, tmp_path / "run", console=silent())
    info = json.loads((tmp_path / "run" / "model.json").read_text())
    assert info == {"recipe": "mlp-regression", "features": 128, "targets": 64}

    def no_data(config):
        raise AssertionError("the datasets were built")

    from jaxtrain.tools.recipes import RECIPES

    monkeypatch.setitem(RECIPES, "mlp-regression", dataclasses.replace(recipe, build=no_data))
    loaded = runs.load(tmp_path / "run", "latest")
    assert_bit_equal([np.asarray(x) for x in jax.tree.leaves(nnx_params(loaded))], _params(result.state))


def nnx_params(model):
    from flax import nnx

    return nnx.state(model, nnx.Param)
