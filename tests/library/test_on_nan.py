"""on_nan: it may change on resume (the recovery the non-finite-loss message recommends continues a
run checkpointed with on_nan="stop", and the other way round, although `optax.apply_if_finite` gives
the optimizer state another structure); a run that skipped most of its updates says so."""

import numpy as np
import pytest
from conftest import mse, regression_data, silent, small_mlp

from jaxtrain import CheckpointConfig, TrainConfig
from jaxtrain._src.errors import NonFiniteLossError
from jaxtrain._src.loop import RunOptions, run


def _run(run_dir, data, epochs, on_nan, precision="fp32", resume=False):
    config = TrainConfig(epochs=epochs, batch_size=16, steps_per_call=2, on_nan=on_nan, precision=precision,
                         checkpoint=CheckpointConfig(keep_last=10, keep_best=0))
    return run(small_mlp(), mse, data, None, config, run_dir=run_dir, resume=resume, verbosity="summary",
               session=RunOptions(console=silent()))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_run_stopped_by_a_non_finite_loss_resumes_with_skip_and_back(tmp_path, precision):
    clean, bad = regression_data(160), regression_data(160)
    bad["x"][77, 0] = 1e30  # finite, but the loss overflows: one bad step an epoch
    _run(tmp_path, clean, 1, "stop", precision)
    if precision == "fp32":
        with pytest.raises(NonFiniteLossError, match="on-nan skip|on_nan=\"skip\""):
            _run(tmp_path, bad, 2, "stop", precision, resume=True)
    result = _run(tmp_path, bad, 2, "skip", precision, resume=True)  # was: "holds other variables than this model"
    assert result.summary["status"] == "completed" and result.summary["skipped_steps"] >= (precision == "fp32")
    result = _run(tmp_path, clean, 3, "stop", precision, resume=True)  # a checkpoint of skip resumes under stop
    assert result.summary["epochs"] == 3 and np.isfinite(result.summary["final_train_loss"])


def test_a_run_that_skipped_most_updates_says_so(tmp_path, capsys):
    data = regression_data(160)
    data["x"][::2, 0] = 1e30  # every batch has an overflowing row: every update is skipped
    result = _run(tmp_path, data, 1, "skip")
    err = capsys.readouterr().err
    assert result.summary["skipped_steps"] == 10
    assert "10 of 10 updates were skipped" in result.summary["warning"]
    assert err.count("note: 10 of 10 updates were skipped") == 1 and "barely trained" in err

    _run(tmp_path / "clean", regression_data(160), 1, "skip")
    assert "updates were skipped" not in capsys.readouterr().err
