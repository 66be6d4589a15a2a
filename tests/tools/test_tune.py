"""The batch-size finder (`jaxtrain.tools.tune.batch_size`, `jaxtrain tune batch-size`): its memory search
against a cap, its trial runs, the learning-rate scaling, the command line."""

import dataclasses
import io
import math
import types

import jax
import numpy as np
import pytest
from rich.console import Console

from jaxtrain import fit
from jaxtrain._src.models.gpt import GPTConfig
from jaxtrain._src.sharding import make_layout
from jaxtrain.tools import cli, tune
from jaxtrain.tools.recipes import get_recipe
from jaxtrain.tools.report.tune import plot_batch_size, print_batch_size

GiB = 2**30
FAST = dict(seconds=0.05, refine_steps=1, check_samples=0)  # ~17 ms per timed call; one bisection step; no check
MLP_FLAGS = ["--data.samples", "600", "--data.val-samples", "88", "--data.features", "8", "--data.targets", "4",
             "--data.teacher-width", "8", "--model.hidden", "256"]


@pytest.fixture(scope="module")
def mlp_regression():
    """mlp-regression at 8 features → 256 → 4 (activations, not parameters, dominate a step's memory):
    (recipe, config, workload)."""
    recipe = get_recipe("mlp-regression")
    config = cli.parse_config(type(recipe.config), recipe.config, MLP_FLAGS, "test")
    workload = recipe.build(config)
    yield recipe, config, workload
    workload.close()


@pytest.fixture(scope="module")
def char_gpt():
    recipe = get_recipe("char-gpt")
    c = recipe.config
    config = dataclasses.replace(c, data=dataclasses.replace(c.data, limit=4000, eval_batches=2),
                                 model=GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32))
    workload = recipe.build(config)
    yield recipe, config, workload
    workload.close()


def cap_between(workload, config, small: int, large: int) -> float:
    """A cap in GiB halfway between a step's compiled memory at batch `small` and at batch `large`."""
    low, high = (m["peak_bytes"] for m in tune.step_memory(workload, config, [small, large]))
    assert low < high, "the step's memory must grow with the batch for this test"
    return (low + high) / 2 / GiB


def check_found(result: tune.BatchSizeResult, cap_gb: float, power: int) -> None:
    """The largest batch fits the cap, the next power of two does not, and it trained."""
    cap = int(cap_gb * GiB)
    assert result.cap_bytes == cap
    assert power <= result.largest < 2 * power
    assert result.row(result.largest).memory["peak_bytes"] <= cap
    above = result.row(2 * power)
    assert above.memory["peak_bytes"] > cap and not above.fits and not above.trained
    largest = result.row(result.largest)
    assert largest.trained and largest.failure == "" and math.isfinite(largest.final_loss)
    assert largest.call_memory["peak_bytes"] > 0  # fit's compiled call, data included


def test_mlp_regression_largest_batch_fits_the_cap_and_trains(mlp_regression, tmp_path):
    recipe, config, workload = mlp_regression
    cap_gb = cap_between(workload, config, 4, 8)
    result = tune.batch_size(workload, config, cap_gb, name=recipe.name, **FAST)
    check_found(result, cap_gb, 4)
    assert result.stopped_by == "the cap"
    assert [r.batch_size for r in result.rows if r.trained][:3] == [1, 2, 4]  # every power of two timed
    assert result.best in [r.batch_size for r in result.rows if r.trained]
    assert result.state_bytes > 0 and result.data_bytes > 0  # train + validation arrays, outside the cap

    # independently of the finder: a fresh model trains at the found batch with a finite loss
    out = fit(recipe.model(config, workload.info), workload.loss_fn, workload.train, None,
              dataclasses.replace(config, batch_size=result.largest, epochs=1, steps_per_epoch=2),
              preprocess=workload.preprocess, verbosity="silent")
    assert np.isfinite(out.final_train_loss)

    path = plot_batch_size(result, tmp_path / "sub" / "batch.png")
    assert path.is_file() and path.read_bytes()[:4] == b"\x89PNG"
    console = Console(file=io.StringIO(), width=160)
    print_batch_size(result, console, "jaxtrain train mlp-regression")
    text = console.file.getvalue()
    assert result.check is None and "recommended:" not in text  # nothing checked its training: no recommendation
    assert f"unchecked (no check ran): the fastest batch at the scaled rate would be {result.flags(result.best)}" \
        in text
    assert "square-root scaling rule for Adam" in text


def test_char_gpt_largest_batch_fits_the_cap_and_trains(char_gpt):
    recipe, config, workload = char_gpt
    cap_gb = cap_between(workload, config, 2, 4)
    result = tune.batch_size(workload, config, cap_gb, seconds=0.05, refine_steps=0, throughput=False, check_samples=0)
    check_found(result, cap_gb, 2)
    assert result.largest == 2  # no bisection
    assert [r.batch_size for r in result.rows if r.trained] == [result.largest]  # the trial alone
    assert result.optimizer == "adamw"
    # char-gpt counts its epochs, warmup and decay in steps: the same samples at a larger batch
    assert set(result.step_settings) == {"--steps-per-epoch", "--optim.warmup-steps", "--optim.decay-steps"}


def test_cpu_compile_without_llvm_optimisation_reports_the_same_memory(mlp_regression):
    _, config, workload = mlp_regression
    memory = tune._StepMemory(workload, config, make_layout(config.mesh))
    assert memory._options == {"xla_backend_optimization_level": 0}  # on this CPU
    fast = memory(64)
    memory._options = None
    assert memory(64) == fast


@pytest.mark.parametrize("throughput", [True, False])
def test_a_trial_out_of_memory_steps_down(mlp_regression, monkeypatch, throughput):
    """XLA:CPU does not run out of memory here: a stand-in for `fit` raises XLA's error from batch 4 up."""
    _, config, workload = mlp_regression
    tried = []

    def fit_or_oom(model, loss_fn, train, val, config, *, hooks, **kwargs):  # jaxtrain.engine.run's signature
        tried.append(config.batch_size)
        if config.batch_size >= 4:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.0GiB")
        timer, = hooks
        timer.on_epoch_start(None)
        for _ in range(3):
            timer.after_call(None, config.steps_per_call, {})
        timer.on_epoch_end(None, {})
        return types.SimpleNamespace(summary={"final_train_loss": 0.5, "compiled_memory": None})

    monkeypatch.setattr(tune, "run", fit_or_oom)
    result = tune.batch_size(workload, config, 1.0, max_batch=8, throughput=throughput, check_samples=0)
    assert result.largest == 2 and result.stopped_by == "max_batch=8"
    assert result.row(4).failure == "out of memory" and result.row(4).fits  # it fit the cap, not the device
    tried = list(dict.fromkeys(tried))  # a call too short to time is run again, longer
    if throughput:  # ascending: 4 ran out of memory, so 8 was not tried
        assert tried == [1, 2, 4] and result.row(8).failure.startswith("not tried")
    else:  # the largest first, then a power of two less each time
        assert tried == [8, 4, 2] and result.row(8).failure == "out of memory" and not result.row(1).trained


def test_call_timer_leaves_out_the_first_call_of_each_epoch(monkeypatch):
    clock = iter([0.0, 5.0, 6.0, 7.5, 9.0,  # epoch 1: calls 1..4 announced, then its end
                  20.0, 30.0, 31.0])      # epoch 2: calls 1, 2 announced, then its end
    monkeypatch.setattr(tune.time, "perf_counter", lambda: next(clock))
    timer = tune._CallTimer()
    for calls in (4, 2):
        timer.on_epoch_start(None)
        for k in range(1, calls + 1):
            timer.after_call(None, 10 * k, {})
        timer.on_epoch_end(None, {})
    # call j ends when call j + 1 is announced (the loop waits for it first); call 1 waited for the epoch before
    assert timer.calls == [(20, 1.0), (30, 1.5), (40, 1.5), (20, 1.0)]


def test_learning_rate_scaling_rules():
    assert tune.scale_learning_rate(0.1, 32, 256, "sgd") == (pytest.approx(0.8), "linear scaling rule for SGD "
                                                                                 "(Goyal et al. 2017)")
    lr, rule = tune.scale_learning_rate(1e-3, 32, 256, "adam")
    assert lr == pytest.approx(1e-3 * math.sqrt(8)) and rule.startswith("square-root")
    assert tune.scale_learning_rate(1e-3, 12, 48, "adamw")[0] == pytest.approx(2e-3)
    assert tune.format_lr(2.8284e-3) == "2.8e-3" and tune.format_lr(0.1) == "1.0e-1"


@pytest.mark.parametrize("cap, message", [
    ("0.000001", "is too small for batch 1: a training step of mlp-regression needs"),
    ("0", "must be a positive number"),
])
def test_cli_bad_cap_is_one_line_and_exit_code_2(capsys, cap, message):
    code = cli.main(["tune", "batch-size", "mlp-regression", *MLP_FLAGS, "--max-memory-gb", cap])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_cli_unknown_recipe_or_command_is_exit_code_2(capsys):
    assert cli.main(["tune", "batch-size", "nope"]) == 2
    assert cli.main(["tune", "learning-rate", "mlp-regression"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and "unknown recipe 'nope'" in errors[0] and "unknown tune command" in errors[1]


def test_lr_range_reads_the_steepest_descent_and_the_lowest_loss_of_a_known_curve():
    lrs = list(np.geomspace(1e-6, 10.0, 100))
    # falls fastest (against log lr) at 1e-3, bottoms out near 0.1, then diverges
    losses = [1.0 - 0.8 / (1 + (1e-3 / lr) ** 2) + (30 * lr if lr > 0.3 else 0.0) for lr in lrs]
    result = tune.analyse_lr_range(lrs, losses)
    assert 1e-3 / 2 < result.steepest < 1e-3 * 3  # the smoothing lags the raw curve by a few steps
    assert result.end < 100 and lrs[result.end] > 0.3  # the divergence is cut off
    assert result.min_loss_lr > result.steepest
    assert result.suggestion == pytest.approx(result.min_loss_lr / 10)
    assert 0.05 < result.min_loss_lr < 0.3  # the bottom near 0.1, before the divergence
    with pytest.raises(tune.ConfigError, match="diverged after 5 steps"):
        tune.analyse_lr_range(lrs, losses[:5] + [float("nan")] * 95)


def test_cli_lr_range_refuses_too_few_steps(capsys):
    # (the command's table, plot, check and suggestion: tests/tools/test_printed_commands.py)
    assert cli.main(["tune", "lr", "mlp-regression", *MLP_FLAGS, "--steps", "5"]) == 2
    assert "needs at least 20 steps" in capsys.readouterr().err


class FakeRuns:
    """Stands in for `tune._ShortRun`: each (batch, lr) reaches the loss `table` gives it."""

    def __init__(self, table):
        self.table, self.calls = table, []
        self.config = types.SimpleNamespace(batch_size=32)
        self.metric, self.samples, self.capped = "val_loss", 1000, ""

    def __call__(self, batch, lr, rate):
        self.calls.append((batch, round(lr, 6)))
        return tune.RateTrial(batch, lr, rate, self.table(batch, lr), 2 * max(1, 500 // batch) * batch)


def checked(table, candidates):
    result = tune.BatchSizeResult(name="m", device="cpu", cap_bytes=1, cap_source="", state_bytes=1, data_bytes=0,
                                  stopped_by="the cap", rows=(), largest=candidates[0], best=candidates[0],
                                  base_batch=32, base_lr=1e-3, optimizer="adam")
    runs = FakeRuns(table)
    check = tune._check(result, runs, candidates, lambda line: None)
    return dataclasses.replace(result, check=check), runs.calls


def test_check_keeps_the_scaled_rate_only_where_it_trained_as_well():
    # the case: the scaled rate (8e-3 at 2048) is stuck; halfway (2.8e-3) beats the config's rate
    result, calls = checked(lambda b, lr: 0.40 if lr > 5e-3 else 0.050 if lr > 2e-3 else 0.054, [2048])
    assert result.check.batch_size == 2048 and result.recommended == "--batch-size 2048 --optim.lr 2.8e-3"
    assert calls == [(32, 0.001), (2048, 0.008), (2048, 0.001), (2048, 0.002828)]
    assert "the scaled rate 8.0e-3 reached val_loss 0.4 against 0.05 at 2.8e-3 (halfway)" in result.check.reason
    # the scaled rate as good as the config's: kept, and halfway is not run
    result, calls = checked(lambda b, lr: 0.049 if lr > 5e-3 else 0.052, [2048])
    assert result.recommended == result.flags(2048) == "--batch-size 2048 --optim.lr 8.0e-3" and len(calls) == 3


def test_check_steps_down_to_the_largest_batch_that_holds_or_keeps_the_config():
    # within 1.1x of the config's 0.05 from batch 256 down (2048 and 512 are over)
    result, calls = checked(lambda b, lr: 0.05 if b <= 256 else 0.2, [2048, 1024, 512, 256, 128, 64])
    assert result.check.batch_size == 256 and result.recommended == "--batch-size 256 --optim.lr 2.8e-3"
    assert sorted({b for b, _ in calls}) == [32, 256, 512, 1024, 2048]  # bisection: 128 and 64 are not run
    assert result.check.reason.startswith("batch 2,048 reached val_loss 0.2 at best, over 1.1x the config's 0.05; ")
    result, _ = checked(lambda b, lr: 0.05 if b == 32 else math.inf, [2048, 1024])
    assert result.check.batch_size is None and result.recommended is None
    console = Console(file=io.StringIO(), width=200)
    print_batch_size(dataclasses.replace(result, rows=(tune.BatchTrial(2048, {"peak_bytes": 1, "temp_bytes": 0}, True,
                                                                       1.0, 1.0),)), console)
    text = console.file.getvalue()
    assert "recommended: no change (keep the config's batch and learning rate)" in text
    assert "why: batch 2,048 reached val_loss inf at best" in text and "not finite" in text


def test_check_records_the_samples_each_run_trained_and_says_its_cap(mlp_regression):
    _, config, workload = mlp_regression
    n_train = 600 - 88
    runner = tune._ShortRun(workload, config, "m", n_train, 1000)  # over the epoch: capped, and said
    assert (runner.samples, runner.capped) == (512, "1,000 samples asked, capped at one epoch of the training set "
                                                    "(512 samples)")
    trial = runner(24, 1e-3, "config")  # two epochs of the whole steps of 24 within 256 each: 10
    assert trial.samples == 2 * 10 * 24 and math.isfinite(trial.loss)
    check = tune.RateCheck(runner.samples, runner.metric, (trial,), None, 1e-3, "r", runner.capped)
    console = Console(file=io.StringIO(), width=200)
    print_batch_size(tune.BatchSizeResult(
        name="m", device="cpu", cap_bytes=1, cap_source="", state_bytes=1, data_bytes=0, stopped_by="the cap",
        rows=(tune.BatchTrial(24, {"peak_bytes": 1, "temp_bytes": 0}, True, 1.0, 1.0),), largest=24, best=24,
        base_batch=24, base_lr=1e-3, optimizer="adam", check=check), console)
    text = console.file.getvalue()
    assert "check: 512 training samples asked per run" in text and f"check: {runner.capped}\n" in text
    assert "config               480 samples" in text
