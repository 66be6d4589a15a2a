"""The engine's seams: user hooks, early stopping, TensorBoard, your own optimizer, automatic K
inside fit, streamed validation, any pytree streamed, and argument errors."""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import leaves_close, mse, regression_data, silent, small_mlp

from jaxtrain import DataConfig, EarlyStoppingConfig, OptimConfig, TrainConfig
from jaxtrain._src.choosers import AutoSteps
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.hooks import EarlyStopping, Hook, LambdaHook, TensorBoard
from jaxtrain._src.loop import RunOptions, run


def _config(**overrides):
    return TrainConfig(**{"epochs": 2, "batch_size": 16, "steps_per_call": 3, **overrides})


class Recorder(Hook):
    def __init__(self):
        self.calls, self.rows, self.epochs, self.events = [], [], [], []

    def on_start(self, run):
        self.events.append("start")

    def after_call(self, run, k, metrics):
        self.calls.append((run.step, k, metrics))

    def on_log(self, run, row):
        self.rows.append(row)

    def on_epoch_end(self, run, record):
        self.epochs.append(dict(record))

    def on_end(self, run, summary):
        self.events.append(summary["status"])


def test_user_hook_sees_every_call_and_its_metrics_equal_the_logged_rows():
    recorder = Recorder()
    data = regression_data(160)  # 10 steps per epoch; K=3 gives calls of 3, 3, 3, 1
    result = run(small_mlp(), mse, data, None, _config(log_every=4), hooks=[recorder], verbosity="summary",
                 session=RunOptions(console=silent()))
    assert [k for _, k, _ in recorder.calls] == [3, 3, 3, 1] * 2
    assert [s for s, _, _ in recorder.calls] == [3, 6, 9, 10, 13, 16, 19, 20]
    losses = np.concatenate([np.asarray(m["loss"]) for _, _, m in recorder.calls])  # (20,) every step's loss
    assert losses.shape == (20,)
    # Rows are means over fixed windows of 4 steps, whatever the call boundaries.
    assert [r["step"] for r in recorder.rows] == [4, 8, 12, 16, 20]
    for row in recorder.rows:
        np.testing.assert_allclose(row["loss"], losses[row["step"] - 4 : row["step"]].mean(), rtol=1e-6)
    np.testing.assert_allclose(result.history[0]["train_loss"], losses[:10].mean(), rtol=1e-6)
    assert recorder.epochs[1]["train_loss"] == result.history[1]["train_loss"]
    assert recorder.events == ["start", "completed"]


def test_the_summary_holds_each_hooks_seconds_between_the_calls(tmp_path):
    import time

    class Sleeper(Hook):
        def after_call(self, run, k, metrics):
            time.sleep(0.05)  # inside the training loop: in train_s, not in hook_seconds

        def on_epoch_end(self, run, record):
            time.sleep(0.03)

        def on_end(self, run, summary):  # timed like the other events, and as read-only as they are
            seen.append(type(run).__name__)
            time.sleep(0.02)

    seen = []
    result = run(small_mlp(), mse, regression_data(160), None, _config(), hooks=[Sleeper()],
                 run_dir=tmp_path / "run", verbosity="summary", session=RunOptions(console=silent()))
    profile = json.loads((tmp_path / "run" / "summary.json").read_text())["profile"]
    assert profile["hook_seconds"] == result.summary["profile"]["hook_seconds"]
    seconds = profile["hook_seconds"]
    assert 0.08 <= seconds["Sleeper"] < 0.08 + 0.2  # two epoch ends and the end; eight calls' 0.4 s are not here
    assert seen == ["RunView"]
    assert profile["train_s"] >= 0.4 and {"CheckpointHook", "MetricsHook", "ProfileHook"} <= set(seconds)
    assert list(seconds.values()) == sorted(seconds.values(), reverse=True)


@pytest.mark.xla_defaults
def test_lambda_hook_and_learning_rate_from_the_schedule():
    rows = []
    optim = OptimConfig(lr=0.01, schedule="warmup-cosine", warmup_steps=5, min_lr=0.001)
    run(small_mlp(), mse, regression_data(160), None, _config(log_every=5, optim=optim),
        hooks=[LambdaHook(on_log=lambda run, row: rows.append(row))], verbosity="summary",
        session=RunOptions(console=silent()))
    schedule = optax.warmup_cosine_decay_schedule(0.0, 0.01, 5, 20, 0.001)
    assert [r["step"] for r in rows] == [5, 10, 15, 20]
    for row in rows:  # the rate of the window's last update, step index row["step"] - 1
        np.testing.assert_allclose(row["lr"], float(schedule(row["step"] - 1)), rtol=1e-6)


@pytest.mark.xla_defaults
def test_custom_optax_chain_trains_and_logs_its_injected_learning_rate():
    everything = regression_data(400)
    train, val = {k: v[:320] for k, v in everything.items()}, {k: v[320:] for k, v in everything.items()}
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.inject_hyperparams(optax.sgd)(learning_rate=0.05,
                                                                                          momentum=0.9))
    rows = []
    result = run(small_mlp(), mse, train, val, _config(epochs=4, log_every=10), optimizer=tx,
                 hooks=[LambdaHook(on_log=lambda run, row: rows.append(row))], verbosity="summary",
                 session=RunOptions(console=silent()))
    losses = [r["train_loss"] for r in result.history]
    assert losses[-1] < 0.6 * losses[0]
    assert all(r["lr"] == pytest.approx(0.05) for r in rows)
    # K does not change the result with your own optimizer either.
    again = run(small_mlp(), mse, train, val, _config(epochs=4, steps_per_call=1), optimizer=tx,
                verbosity="summary", session=RunOptions(console=silent()))
    assert leaves_close(again.state.params, result.state.params) <= 1e-6


def test_early_stopping_stops_and_says_so(tmp_path):
    everything = regression_data(300)
    train, val = {k: v[:200] for k, v in everything.items()}, {k: v[200:] for k, v in everything.items()}
    # A learning rate this large makes validation loss stop improving within a few epochs.
    config = _config(epochs=40, optim=OptimConfig(lr=0.3), early_stopping=EarlyStoppingConfig(patience=2))
    console = silent()
    result = run(small_mlp(), mse, train, val, config, run_dir=tmp_path, verbosity="summary",
                 session=RunOptions(console=console))
    val_losses = [r["val_loss"] for r in result.history]
    stopped = len(val_losses)
    assert stopped < 40
    best = int(np.argmin(val_losses))
    assert stopped == best + 3  # two epochs after the best without improvement, then stop
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "stopped early" and "did not improve for 2 epochs" in summary["stop_reason"]
    assert "stopped early: val_loss" in console.file.getvalue()


def test_early_stopping_settings_without_patience_get_a_note_that_it_is_off(capsys):
    data = regression_data(64)
    for stopping, noted in ((EarlyStoppingConfig(metric="val_mae", mode="min"), True), (EarlyStoppingConfig(), False)):
        run(small_mlp(), mse, data, None, _config(epochs=1, early_stopping=stopping), verbosity="silent",
            session=RunOptions(console=silent()))
        err = capsys.readouterr().err
        assert ('note: EarlyStoppingConfig(metric="val_mae"): early stopping is off, so this has no effect; set '
                "EarlyStoppingConfig(patience=N) to stop after N epochs without improvement" in err) == noted, err


def test_early_stopping_hook_with_max_mode_and_min_delta():
    hook = EarlyStopping("val_accuracy", patience=2, mode="max", min_delta=0.01)

    class FakeRun:
        epoch, step, stop_reason = 0, 0, None

    run = FakeRun()
    for epoch, accuracy in enumerate([0.5, 0.6, 0.605, 0.609, 0.7], start=1):
        run.epoch = epoch
        hook.on_epoch_end(run, {"val_accuracy": accuracy, "val_loss": 1.0})
        if run.stop_reason:
            break
    assert run.epoch == 4 and hook.best == 0.6 and hook.best_epoch == 2  # +0.005, +0.009: not > 0.01
    with pytest.raises(ConfigError, match="'val_acc' is not in the epoch record; choose one of: .*val_accuracy"):
        EarlyStopping("val_acc").on_epoch_end(FakeRun(), {"train_loss": 1.0, "val_loss": 1.0, "val_accuracy": 0.5})


def test_tensorboard_event_files_hold_the_logged_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data, val = regression_data(160), regression_data(40, seed=1)
    recorder = Recorder()
    run(small_mlp(), mse, data, val, _config(log_every=5), hooks=[recorder], run_dir=tmp_path, verbosity="summary",
        session=RunOptions(console=silent()))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/mae", "train/lr", "epoch/train_loss", "val/loss", "val/mae",
            "throughput/samples_per_s"} <= tags
    logged = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert [s for s, _ in logged] == [r["step"] for r in recorder.rows]
    np.testing.assert_allclose([v for _, v in logged], [r["loss"] for r in recorder.rows], rtol=1e-6)
    val_logged = [e.value for e in events.Scalars("val/loss")]
    np.testing.assert_allclose(val_logged, [r["val_loss"] for r in recorder.epochs], rtol=1e-6)


def test_tensorboard_without_a_directory_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"TensorBoard is added by the loop itself; set it with "
                                          r"TrainConfig\(tensorboard=True\)"):
        run(small_mlp(), mse, regression_data(64), None, _config(epochs=1), hooks=[TensorBoard()],
            verbosity="summary", session=RunOptions(console=silent()))


@pytest.mark.xla_defaults
def test_automatic_k_inside_fit_with_injected_thresholds():
    data = regression_data(800)  # 50 steps per epoch; probes of 2 and 4 steps, 3 of each
    one = run(small_mlp(), mse, data, None, _config(steps_per_call=1), verbosity="summary",
              session=RunOptions(console=silent()))
    console = silent()
    # The fused loop's K is what is measured here: with step_form="auto" a busy machine can time the plain
    # step faster than the loop, and a run dispatched step by step measures no K (CI saw it once).
    fused = {"steps_per_call": 0, "step_form": "scan"}
    everything = run(small_mlp(), mse, data, None, _config(**fused), verbosity="summary",
                     session=RunOptions(console=console, auto_steps=AutoSteps(probe_lengths=(2, 4), repeats=3,
                                                                                overhead_target=1e-12,
                                                                                short_run_calls=0)))
    # Any measured per-call overhead needs more than an epoch of steps to be 1e-12 of compute: K = the
    # epoch, unless that program saves less over the run than a compile costs (then K_b, as the
    # message says; the rule itself: test_fit). On a busy machine the fit of t(K) can put the overhead
    # at 0: then K_a is within target.
    log = console.file.getvalue()
    match = re.search(r"K=(\d+) steps per compiled call \(measured: [\d.]+ ms per step, ([\d.]+) ms per call", log)
    assert match and int(match.group(1)) == everything.summary["steps_per_call"]
    expected = (4 if "less than its compile" in log else 50) if float(match.group(2)) > 0 else 2
    assert everything.summary["steps_per_call"] == expected
    # Data on the device: the timed calls of K_a=2 ran K_b=4's program, masked; no program of 2 was compiled.
    compiled = [c["k"] for c in everything.summary["profile"]["compiles"] if c.get("what") == "train call"]
    assert compiled[0] == 4 and (2 not in compiled or expected == 2), compiled
    lenient = run(small_mlp(), mse, data, None, _config(**fused), verbosity="summary",
                  session=RunOptions(console=silent(), auto_steps=AutoSteps(probe_lengths=(2, 4), repeats=3,
                                                                             overhead_target=1e9, short_run_calls=0)))
    assert lenient.summary["steps_per_call"] == 2  # any overhead is within target at K_a
    for result in (everything, lenient):
        assert leaves_close(result.state.params, one.state.params) <= 1e-6


@pytest.mark.xla_defaults
def test_any_pytree_streams_and_large_validation_is_evaluated_streamed():
    everything = regression_data(400)
    as_dict = {k: v[:300] for k, v in everything.items()}
    val = {k: v[300:] for k, v in everything.items()}  # 100 rows: 4.4 KiB

    def tuple_mse(model, batch, key):
        x, y = batch
        return mse(model, {"x": x, "y": y}, key)

    budget = DataConfig(placement="stream", memory_budget_gb=1e-9, shuffle_window_mb=1)
    config = _config(epochs=2, eval_batch_size=16, data=budget)  # validation over the tiny budget: streamed
    from_tuple = run(small_mlp(), tuple_mse, (as_dict["x"], as_dict["y"]), (val["x"], val["y"]), config,
                     verbosity="summary", session=RunOptions(console=silent()))
    from_dict = run(small_mlp(), mse, as_dict, val, config, verbosity="summary", session=RunOptions(console=silent()))
    assert leaves_close(from_tuple.state.params, from_dict.state.params) == 0.0
    # The streamed validation loss equals NumPy's on the final parameters (100 = 6 batches of 16 + 4).
    p = jax.tree.map(np.asarray, from_dict.state.params)
    h = np.maximum(val["x"] @ p["layers"][0]["kernel"] + p["layers"][0]["bias"], 0)
    err = h @ p["layers"][1]["kernel"] + p["layers"][1]["bias"] - val["y"]
    np.testing.assert_allclose(from_dict.history[-1]["val_loss"], np.mean(err**2), rtol=1e-5)
    np.testing.assert_allclose(from_tuple.history[-1]["val_loss"], np.mean(err**2), rtol=1e-5)


def test_bad_arguments_are_one_clear_error():
    data = regression_data(64)
    cases = [
        (dict(optimizer="adam"), "optimizer must be an optax.GradientTransformation"),
        (dict(hooks=[lambda run: None]), "hooks must be a list of jaxtrain.Hook"),
        (dict(hooks=Hook()), "hooks must be a list"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            run(small_mlp(), mse, data, None, _config(), verbosity="summary", **kwargs,
                session=RunOptions(console=silent()))
    with pytest.raises(ConfigError, match="model must be a flax.nnx.Module; got function"):
        run(lambda x: x, mse, data, None, _config(), verbosity="summary", session=RunOptions(console=silent()))
    with pytest.raises(ConfigError, match="config must be a jaxtrain.TrainConfig; got NoneType"):
        run(small_mlp(), mse, data, None, None, verbosity="summary", session=RunOptions(console=silent()))
    with pytest.raises(ConfigError, match="early_stopping.patience=-1"):
        EarlyStoppingConfig(patience=-1)


@pytest.mark.xla_defaults
def test_hook_state_survives_a_resume(tmp_path):
    """EarlyStopping's counters are saved in checkpoints: a run resumed mid-way stops where an
    uninterrupted one stops."""
    everything = regression_data(300)
    train, val = {k: v[:200] for k, v in everything.items()}, {k: v[200:] for k, v in everything.items()}
    config = _config(epochs=40, optim=OptimConfig(lr=0.3), early_stopping=EarlyStoppingConfig(patience=2))
    full = run(small_mlp(), mse, train, val, config, run_dir=tmp_path / "full", verbosity="summary",
               session=RunOptions(console=silent()))
    stopped_at = len(full.history)
    short = _config(epochs=stopped_at - 1, optim=OptimConfig(lr=0.3), early_stopping=EarlyStoppingConfig(patience=2))
    run(small_mlp(), mse, train, val, short, run_dir=tmp_path / "part", verbosity="summary",
        session=RunOptions(console=silent()))
    resumed = run(small_mlp(), mse, train, val, config, run_dir=tmp_path / "part", resume=True, verbosity="summary",
                  session=RunOptions(console=silent()))
    assert len(resumed.history) == stopped_at and resumed.summary["status"] == "stopped early"
    assert leaves_close(resumed.state.params, full.state.params) == 0.0


def test_jnp_and_numpy_leaves_train_alike():
    data = regression_data(96)
    as_jnp = {k: jnp.asarray(v) for k, v in data.items()}
    a = run(small_mlp(), mse, data, None, _config(epochs=1), verbosity="summary", session=RunOptions(console=silent()))
    b = run(small_mlp(), mse, as_jnp, None, _config(epochs=1), verbosity="summary",
            session=RunOptions(console=silent()))
    assert leaves_close(a.state.params, b.state.params) == 0.0
