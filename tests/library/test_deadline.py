"""Runs fitted to a deadline (`TrainConfig.max_time`) and checkpoints by wall time
(`CheckpointConfig.every`), on an injected clock: each step costs `STEP_S` seconds on it and
nothing else does, so the runs plan and end without waiting, as a machine under any load would."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import mse, regression_data, silent, small_mlp
from flax import nnx

from jaxtrain import (
    CheckpointConfig,
    ConfigError,
    EarlyStoppingConfig,
    LambdaHook,
    Member,
    OptimConfig,
    TrainConfig,
    fit_population,
)
from jaxtrain._src.hooks import checkpointing, deadline
from jaxtrain._src.loop import RunOptions, run
from jaxtrain._src.optim import build_schedule, build_train_optimizer, fitted_schedule, planned_steps_of

STEP_S = 0.02  # seconds a step takes on the injected clock
OPTIM = OptimConfig(lr=1e-2, min_lr=1e-4, schedule="warmup-cosine", warmup_steps=8)


@pytest.fixture
def fake_clock(monkeypatch):
    """The deadline's and the checkpoints' clock, advanced `STEP_S` a step by a hook of the run."""
    now, queued = [0.0], [0]
    monkeypatch.setattr(deadline, "clock", lambda: now[0])
    monkeypatch.setattr(deadline, "setup_s", lambda run: 0.0)  # the real seconds of setup: none on this clock
    monkeypatch.setattr(checkpointing.CheckpointHook, "clock", staticmethod(lambda: now[0]))

    def tick(run, k, metrics):  # the call before this one has run (the loop waited for it): its steps' time
        now[0] += STEP_S * queued[0]
        queued[0] = k

    return LambdaHook(after_call=tick)


def _fit(tick, run_dir, max_time, resume=False, hooks=(), **overrides):
    rows = []
    config = TrainConfig(**{"epochs": 2, "batch_size": 16, "steps_per_call": 4, "log_every": 1, "optim": OPTIM,
                            "max_time": max_time, **overrides})
    hooks = [tick, LambdaHook(on_log=lambda r, row: rows.append(row)), *hooks]
    result = run(small_mlp(0), mse, regression_data(400), regression_data(48, seed=1), config, hooks=hooks,
                 run_dir=run_dir, resume=resume, verbosity="summary", session=RunOptions(console=silent(), plots=False))
    return result, rows


def test_a_deadline_ends_the_run_before_it_with_the_schedule_at_its_end_and_a_resume_with_more_time_continues(
        fake_clock, tmp_path):
    run_dir = tmp_path / "run"
    first, rows = _fit(fake_clock, run_dir, "8s", checkpoint=CheckpointConfig(every="0.3s", keep_last=100))
    d = first.summary["deadline"]
    assert first.summary["status"] == "completed" and d["stopped_at_deadline"]
    assert d["steps"] == d["planned_steps"] > 2 * 25  # epochs=2 of 25 steps no longer limit it
    assert 8.0 - 1.5 < d["used_s"] <= 8.0  # to the deadline, less the reserve for the end
    assert rows[-1]["step"] == d["steps"] and rows[-1]["lr"] == pytest.approx(OPTIM.min_lr, rel=1e-5)
    assert d["final_lr"] == pytest.approx(OPTIM.min_lr, rel=1e-5)
    assert max(r["lr"] for r in rows) == pytest.approx(OPTIM.lr, rel=0.05)  # the warmup reached the peak
    assert first.history[-1]["step"] == d["steps"] and "val_loss" in first.history[-1]  # evaluated at the end
    # saved by time (0.3 s: 15 steps on the clock, at a call boundary) beside the epoch ends (every 25 steps)
    saved = sorted(int(p.name) for p in Path(run_dir, "checkpoints").iterdir() if p.name.isdigit())
    assert d["steps"] in saved and any(s % 25 for s in saved[:-1])

    again, _ = _fit(fake_clock, run_dir, "8s", resume=True)  # no time left: nothing trained
    assert again.summary["steps"] == d["steps"]

    more, more_rows = _fit(fake_clock, run_dir, "12s", resume=True)
    m = more.summary["deadline"]
    assert more.summary["status"] == "completed" and m["stopped_at_deadline"]
    assert m["steps"] > d["steps"] and 12.0 - 1.5 < m["used_s"] <= 12.0
    assert more_rows[0]["step"] == d["steps"] + 1  # continued where the deadline stopped, mid-epoch
    assert more_rows[-1]["lr"] == pytest.approx(OPTIM.min_lr, rel=1e-5)


def test_durations_are_read_as_users_write_them_and_others_refused_in_one_line():
    for text, seconds in (("90s", 90), ("10m", 600), ("1.5h", 5400), ("1h30m", 5400), (90, 90), ("2.5", 2.5),
                          (0, 0)):
        assert TrainConfig(max_time=text).max_time_s == seconds
    for bad in ("10 minutes", "1m30h", "-5", "h", True, [1]):
        with pytest.raises(ConfigError) as e:
            TrainConfig(max_time=bad)
        assert "\n" not in str(e.value) and "max_time" in str(e.value)
    with pytest.raises(ConfigError, match="every"):
        CheckpointConfig(every="soon")


def test_the_fitted_schedule_is_the_config_s_stretched_to_the_plan_and_runs_without_a_deadline_keep_optax_s():
    nominal = 100
    values = {"lr": jnp.float32(OPTIM.lr), "min_lr": jnp.float32(OPTIM.min_lr)}
    counts = jnp.arange(nominal + 1)
    same = fitted_schedule(OPTIM, nominal, {**values, "planned_steps": jnp.float32(nominal + 1)})
    np.testing.assert_allclose(same(counts), build_schedule(OPTIM, nominal)(counts), rtol=1e-5, atol=1e-9)
    planned = 400
    fitted = fitted_schedule(OPTIM, nominal, {**values, "planned_steps": jnp.float32(planned)})
    assert float(fitted(planned - 1)) == pytest.approx(OPTIM.min_lr, rel=1e-6)  # the last planned step
    assert float(fitted(8 * (planned - 1) / nominal)) == pytest.approx(OPTIM.lr)  # the warmup keeps its share
    params = {"w": jnp.zeros((2, 2))}
    plain = build_train_optimizer(TrainConfig(optim=OPTIM), nominal).init(params)
    assert planned_steps_of(plain) is None  # without a deadline, the optimizer's state and schedule are main's
    timed = build_train_optimizer(TrainConfig(optim=OPTIM, max_time="1m"), nominal).init(params)
    assert float(planned_steps_of(timed)) == nominal
    assert isinstance(build_schedule(OPTIM, nominal), type(optax.warmup_cosine_decay_schedule(0, 1, 1, 2)))


def test_a_population_refuses_a_deadline_in_one_line_and_a_sweep_s_lone_trials_take_it():
    from jaxtrain.tools.sweep import _check_population

    members = [Member(small_mlp(0), TrainConfig(epochs=1, max_time="1m"))]
    with pytest.raises(ConfigError, match="deadline") as e:
        fit_population(members, mse, regression_data(64), verbosity="silent")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="population") as e:  # `jaxtrain sweep --population 4 --max-time 1m`
        _check_population(None, TrainConfig(max_time="1m"), 4)
    assert "\n" not in str(e.value)
    _check_population(None, TrainConfig(max_time="1m"), 1)  # trials one at a time: each has the time


def test_restore_best_after_a_deadline_s_stop_mid_epoch_and_a_resume_takes_the_best_record_s_step(fake_clock, tmp_path):
    # each session's deadline stops it mid-epoch 1 (100 steps an epoch), so epoch 1 names two records and two
    # checkpoints of different weights; mode "max" on a falling val_loss makes the first the best
    weights = {}
    keep = LambdaHook(on_epoch_end=lambda run, record: weights.__setitem__(run.step, jax.device_get(run.state.params)))
    settings = dict(batch_size=4, early_stopping=EarlyStoppingConfig(mode="max", restore_best=True),
                    checkpoint=CheckpointConfig(keep_last=100))
    _fit(fake_clock, tmp_path, "1.5s", hooks=[keep], **settings)
    resumed, _ = _fit(fake_clock, tmp_path, "3s", resume=True, hooks=[keep], **settings)  # 1.5 s more
    best, later = resumed.history
    assert best["epoch"] == later["epoch"] == 1 and best["step"] < later["step"] < 100
    assert best["val_loss"] > later["val_loss"] and resumed.summary["restored_epoch"] == 1
    restored = jax.device_get(nnx.state(resumed.model, nnx.Param))  # from best's checkpoint, not later's
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(weights[best["step"]]),
                                                     strict=True))
