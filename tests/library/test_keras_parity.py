"""What Keras and Lightning users expect of `fit`: a validation split, reduce on plateau, the best
weights restored at the end, and the learning rate of their own optax schedule logged."""

import jax
import numpy as np
import optax
import pytest
from conftest import mse, regression_data, silent, small_mlp
from flax import nnx

from jaxtrain import (
    CheckpointConfig,
    EarlyStoppingConfig,
    LambdaHook,
    Member,
    OptimConfig,
    TrainConfig,
    fit_population,
    log_learning_rate,
)
from jaxtrain._src.data.sources import ArraySource
from jaxtrain._src.data.split import split_validation
from jaxtrain._src.errors import ConfigError, DataError
from jaxtrain._src.loop import RunOptions, run
from jaxtrain._src.optim import learning_rate_fn


def _fit(train, val=None, hooks=(), run_dir=None, resume=False, console=None, **overrides):
    config = TrainConfig(**{"epochs": 1, "batch_size": 16, "log_every": 4, **overrides})
    return run(small_mlp(), mse, train, val, config, hooks=hooks, run_dir=run_dir, resume=resume,
               verbosity="summary", session=RunOptions(console=console or silent(), plots=False))


def _same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def test_val_split_validates_on_the_last_rows_of_arrays_and_row_sources():
    data = regression_data(100)  # val_split 0.2: rows 80..99 validate, as Keras takes them
    explicit = _fit({k: v[:80] for k, v in data.items()}, {k: v[80:] for k, v in data.items()})
    split = _fit(data, val_split=0.2)
    assert split.history[0]["val_loss"] == explicit.history[0]["val_loss"]
    assert split.summary["steps"] == explicit.summary["steps"] == 5  # 80 rows trained, in batches of 16
    assert _same(split.state.params, explicit.state.params)
    train, val = split_validation(ArraySource(data, chunk_rows=16), 0.2)  # a row source: row ranges, nothing read
    assert (len(train), len(val)) == (80, 20)
    assert _same(val.read(0, 20), {k: v[80:] for k, v in data.items()})
    out = {k: np.empty((3, *v.shape[1:]), v.dtype) for k, v in data.items()}
    train.read_into(77, 80, out)
    assert _same(out, {k: v[77:80] for k, v in data.items()})


def test_val_split_refuses_what_cannot_work_in_one_line():
    data = regression_data(40)
    for bad in (1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="val_split"):
            TrainConfig(val_split=bad)
    with pytest.raises(ConfigError, match="val_data is given too"):
        _fit(data, data, val_split=0.1)
    with pytest.raises(ConfigError, match="yields batches rather than rows"):
        _fit(lambda: iter([{k: v[:16] for k, v in data.items()}]), val_split=0.1)
    with pytest.raises(DataError, match="trains on 0"):
        _fit(data, val_split=0.99)


def test_reduce_on_plateau_lowers_the_logged_rate_without_recompiling_and_restore_best_is_bit_exact():
    # mode "max" on a falling val_loss: epoch 1 stays the best, every later epoch is a plateau
    rates, weights = {}, {}
    hook = LambdaHook(on_log=lambda run, row: rates.__setitem__(row["step"], row["lr"]),
                      on_epoch_end=lambda run, record: weights.__setitem__(run.epoch, jax.device_get(run.state.params)))
    optim = OptimConfig(lr=1e-2, plateau_patience=1, plateau_factor=0.5, plateau_mode="max", plateau_min_lr=3e-3)
    console = silent()
    result = _fit(regression_data(128), epochs=4, val_split=0.25, optim=optim, hooks=[hook], console=console,
                  early_stopping=EarlyStoppingConfig(mode="max", restore_best=True))
    printed = console.file.getvalue()
    assert "learning rate 0.01 -> 0.005" in printed and "Restored Weights:     epoch 1" in printed
    # 6 steps an epoch: reduced after epochs 2 and 3 (to the floor 3e-3), not below it after epoch 4
    assert [r.get("lr_reduced_to") for r in result.history] == [None, 5e-3, 3e-3, None]
    assert rates == {4: np.float32(1e-2), 8: np.float32(1e-2), 12: np.float32(1e-2), 16: np.float32(5e-3),
                     20: np.float32(3e-3), 24: np.float32(3e-3)}
    assert [c["what"] for c in result.summary["profile"]["compiles"]].count("train call") == 1
    assert result.summary["restored_epoch"] == 1
    assert _same(nnx.state(result.model, nnx.Param), weights[1])
    assert _same(result.state.params, weights[4]) and not _same(weights[4], weights[1])  # the state stays the last


def test_plateau_and_restore_best_continue_across_a_resume(tmp_path):
    rates, weights = {}, {}
    hook = LambdaHook(on_log=lambda run, row: rates.__setitem__(row["step"], row["lr"]),
                      on_epoch_end=lambda run, record: weights.__setitem__(run.epoch, jax.device_get(run.state.params)))
    optim = OptimConfig(lr=1e-2, plateau_patience=1, plateau_factor=0.5, plateau_mode="max")
    settings = dict(val_split=0.25, optim=optim, early_stopping=EarlyStoppingConfig(mode="max", restore_best=True),
                    checkpoint=CheckpointConfig(best_metric="val_loss", best_mode="max", keep_last=1), log_every=6)
    _fit(regression_data(128), epochs=2, run_dir=tmp_path, hooks=[hook], **settings)  # reduced after epoch 2
    resumed = _fit(regression_data(128), epochs=3, run_dir=tmp_path, resume=True, hooks=[hook], **settings)
    assert rates == {6: np.float32(1e-2), 12: np.float32(1e-2), 18: np.float32(5e-3)}  # the reduced rate came back
    assert [r.get("lr_reduced_to") for r in resumed.history] == [None, 5e-3, 2.5e-3]
    assert resumed.summary["restored_epoch"] == 1  # from its checkpoint: the best epoch came before the resume
    assert _same(nnx.state(resumed.model, nnx.Param), weights[1])


def test_the_rate_of_an_own_optax_schedule_is_logged_through_log_learning_rate():
    schedule = optax.linear_schedule(1e-2, 0.0, 20)
    rates = {}
    hook = LambdaHook(on_log=lambda run, row: rates.__setitem__(row["step"], row.get("lr")))
    own = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule))
    config = TrainConfig(epochs=1, batch_size=16, log_every=2)
    run(small_mlp(), mse, regression_data(64), None, config, optimizer=log_learning_rate(own, schedule),
        hooks=[hook], verbosity="silent")
    assert rates == {s: np.float32(schedule(s - 1)) for s in (2, 4)}  # the rate each row's last update used
    plateau = TrainConfig(optim=OptimConfig(plateau_patience=2))
    with pytest.raises(ConfigError, match="optax.contrib.reduce_on_plateau"):
        run(small_mlp(), mse, regression_data(64), None, plateau, optimizer=own, verbosity="silent")
    with pytest.raises(ConfigError, match="train that run alone"):
        fit_population([Member(small_mlp(), plateau)], mse, regression_data(64), verbosity="silent")
    with pytest.raises(ConfigError, match="plateau_patience does not take"):
        OptimConfig(plateau_patience=2, schedule="exponential", min_lr=1e-6)


def test_the_logged_rate_of_an_injected_rate_includes_reduce_on_plateau_scale():
    params = {"w": jax.numpy.ones((2, 2))}
    tx = optax.chain(optax.inject_hyperparams(optax.adam)(learning_rate=0.1), optax.contrib.reduce_on_plateau())
    lr = learning_rate_fn(tx, params)
    state = tx.init(params)
    state = (state[0], state[1]._replace(scale=jax.numpy.asarray(0.5)))
    assert float(lr(state, 0)) == pytest.approx(0.05)
