"""The form of a call (`choosers.StepForm`): the scan, programs of unrolled steps and the plain step
train to the same weights (1e-6: XLA fuses a loop body and straight-line code apart), on device
data and streamed, with the user's optimizer and with accumulated micro-batches; evaluation follows
the form; the chooser keeps the scan unless a dispatched form is clearly faster; a resumed run keeps
its form."""

import dataclasses

import jax
import numpy as np
import optax
import pytest
from conftest import leaves_close, mse, regression_data, silent, small_mlp
from flax import nnx

from jaxtrain import ConfigError, DataConfig, TrainConfig, fit
from jaxtrain._src import loop
from jaxtrain._src.choosers import AutoSteps, StepForm
from jaxtrain._src.report.profile_report import profile_lines

pytestmark = pytest.mark.xla_defaults  # every form trains to the scan's weights

DATA, VAL = regression_data(320), regression_data(70, seed=1)  # 20 steps of 16; 4 batches + 6 rows of val


class DropoutMLP(nnx.Module):
    """Dropout drawn from the loss's key: each step's randomness must not depend on the form."""

    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(8, 16, rngs=rngs)  # small_mlp's shapes: its initialisers are compiled already
        self.out = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x, key):
        h = nnx.relu(self.hidden(x))
        keep = jax.random.bernoulli(key, 0.8, h.shape)
        return self.out(np.float32(1 / 0.8) * h * keep)


def dropout_mse(model, batch, key):
    return ((model(batch["x"], key) - batch["y"]) ** 2).mean(), {}


OPTIMIZER = optax.sgd(0.05, momentum=0.9)  # the user's own: each form's programs take it


def run(form: str, model=None, loss=mse, val=VAL, optimizer=None, **changes):
    config = TrainConfig(**{"epochs": 2, "batch_size": 16, "steps_per_call": 6, "step_form": form, **changes})
    return fit(model or small_mlp(), loss, DATA, val, config, optimizer=optimizer, verbosity="silent")


@pytest.fixture(scope="module")
def by_form():
    return {form: run(form, optimizer=OPTIMIZER) for form in ("scan", "unroll", "step")}


def test_every_form_trains_to_the_scans_weights_and_evaluates_alike(by_form):
    scan = by_form["scan"]
    for form in ("unroll", "step"):  # K=6: the unrolled form runs 4 + 1 + 1 (its remainder as plain steps)
        got = by_form[form]
        assert got.summary["step_form"]["form"] == form and got.summary["steps"] == 40
        assert leaves_close(got.state.params, scan.state.params) <= 1e-6
        for a, b in zip(got.history, scan.history):
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6)
            assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-6)  # dispatched batch by batch


def test_a_dispatched_form_compiles_its_programs_once(by_form):
    compiles = [c["what"] for c in by_form["unroll"].summary["profile"]["compiles"]]
    assert compiles.count("train steps, unrolled") == 1 and compiles.count("train step") == 1
    assert "train call" not in compiles  # no scan program when the form is set
    assert [c["what"] for c in by_form["step"].summary["profile"]["compiles"]].count("train step") == 1


def test_per_step_randomness_and_streamed_batches_do_not_depend_on_the_form():
    # No evaluation (weights only), and K=5 for 20 steps: no program for a remainder.
    streamed = dict(val=None, epochs=1, steps_per_call=5, data=DataConfig(placement="stream"))
    scan = run("scan", DropoutMLP(nnx.Rngs(0)), dropout_mse, **streamed)
    step = run("step", DropoutMLP(nnx.Rngs(0)), dropout_mse, **streamed)
    assert step.summary["step_form"]["form"] == "step"
    assert leaves_close(step.state.params, scan.state.params) <= 1e-6


def test_auto_measures_the_forms_and_says_why():
    config = TrainConfig(epochs=1, batch_size=16)  # 20 steps: another compile could not pay
    short = loop.run(small_mlp(), mse, DATA, VAL, config, optimizer=OPTIMIZER, verbosity="silent",
                     session=loop.RunOptions(console=silent()))
    assert short.summary["step_form"]["form"] == "scan" and "too short" in short.summary["step_form"]["why"]
    assert [c["what"] for c in short.summary["profile"]["compiles"]].count("train step") == 0
    # Measured all the same; K=20 as the short run (its program compiled already).
    auto_steps = AutoSteps(short_run_calls=0, probe_lengths=(20, 128))
    result = loop.run(small_mlp(), mse, DATA, VAL, config, optimizer=OPTIMIZER, verbosity="silent",
                      session=loop.RunOptions(console=silent(), auto_steps=auto_steps))
    form = result.summary["step_form"]
    assert form["why"].startswith("measured: ") and set(form["ms_per_step"]) >= {"scan", "step"}
    assert all(t > 0 for t in form["ms_per_step"].values())
    lines = profile_lines(result.summary["profile"])  # `jaxtrain profile` says it too
    assert any(line.startswith("  Form:     ") and "(measured: " in line for line in lines)
    assert leaves_close(result.state.params, short.state.params) <= 1e-6  # the measurement trains nothing


def chooser(**auto) -> StepForm:
    return StepForm("auto", AutoSteps(**auto))


def test_the_chooser_keeps_the_loop_unless_a_dispatched_form_is_clearly_faster():
    fast_loop = chooser()
    for form, seconds in [("step", 4e-3), ("step", 16e-3), ("scan", 2e-3), ("step", 16e-3), ("scan", 2.1e-3)]:
        message = fast_loop.record(form, fast_loop.steps if form != "step" or fast_loop.per_step else 1, seconds)
    assert fast_loop.steps == 5 and fast_loop.form == "scan" and not fast_loop.measuring
    assert "loop 0.4 ms/step" in message and "plain step 3.2 ms/step" in message

    tie = chooser()  # a plain step 20% faster than the loop: within what timings vary by, the loop stays
    for form, seconds in [("step", 1.0), ("step", 1.0), ("scan", 1.25), ("step", 1.0), ("scan", 1.2)]:
        tie.record(form, 1, seconds)
    assert tie.form == "scan"


def test_a_slow_loop_body_is_left_for_the_faster_dispatched_form():
    slow = chooser()
    slow.record("step", 1, 0.1)
    assert slow.steps == 1  # 20 ms of probe is less than a step
    slow.record("step", 1, 0.09)
    assert slow.record("scan", 1, 1.2) is None  # 13x slower and long enough: no second timing
    assert slow.form == "step" and slow.next_form() == "unroll"  # then timed interleaved with the plain step
    slow.record("unroll", 4, 0.28)
    slow.record("step", 1, 0.1)
    message = slow.record("unroll", 4, 0.27)
    assert slow.form == "unroll" and "4 unrolled 67.5 ms/step" in message and "loop 1.2e+03 ms/step" in message
    close = chooser()  # unrolled programs hold more temporaries: kept only when clearly faster
    for form, n, seconds in [("step", 1, 0.1), ("step", 1, 0.1), ("scan", 1, 1.0), ("unroll", 4, 0.34),
                             ("step", 1, 0.1), ("unroll", 4, 0.3)]:
        close.record(form, n, seconds)
    assert close.form == "step" and close.dispatched


def test_a_form_set_is_used_as_is_and_a_wrong_one_is_one_line():
    assert not StepForm("unroll").measuring and StepForm("unroll").dispatched and StepForm("step").why == "set"
    assert not StepForm("scan").dispatched
    with pytest.raises(ConfigError, match="step_form='loop' must be one of auto, scan, unroll, step"):
        TrainConfig(step_form="loop")


def test_a_resumed_run_keeps_the_form_it_began_with(tmp_path, by_form):
    config = TrainConfig(epochs=1, batch_size=16, steps_per_call=6, step_form="step")
    session = loop.RunOptions(console=silent(), plots=False)  # no loss curves: drawing them is most of the time here
    loop.run(small_mlp(), mse, DATA, VAL, config, optimizer=OPTIMIZER, run_dir=tmp_path / "run", verbosity="silent",
             session=session)
    longer = dataclasses.replace(config, epochs=2, step_form="auto")  # auto: the form the run measured
    resumed = loop.run(small_mlp(), mse, DATA, VAL, longer, optimizer=OPTIMIZER, run_dir=tmp_path / "run", resume=True,
                       verbosity="silent", session=session)
    assert resumed.summary["step_form"]["form"] == "step" and not resumed.summary["step_form"]["ms_per_step"]
    assert resumed.summary["step_form"]["why"] == "the form the run began with"  # not "set": this config says auto
    assert leaves_close(resumed.state.params, by_form["step"].state.params) == 0.0  # as the run never stopped


def test_accumulation_in_a_dispatched_form(by_form):
    # 2 micro-batches of 8 a step: the 16 samples a step of the runs above, the same weights (K=4:
    # 4 steps unrolled a call, no remainder to compile a plain step for).
    unroll = run("unroll", val=None, optimizer=OPTIMIZER, batch_size=8, grad_accum=2, steps_per_call=4)
    assert unroll.summary["step_form"]["form"] == "unroll" and unroll.summary["steps"] == 40
    assert leaves_close(unroll.state.params, by_form["scan"].state.params) <= 1e-6
    assert unroll.summary["model"]["flops_per_step"] == pytest.approx(
        by_form["unroll"].summary["model"]["flops_per_step"], rel=0.25)  # not 2x: accumulation counted


def test_the_ops_a_loop_body_makes_slow_are_named():
    from jaxtrain._src.slow_ops import loop_slow_ops

    conv = nnx.eval_shape(lambda: nnx.Conv(1, 4, (3, 3), rngs=nnx.Rngs(0)))  # shapes only: the ops are traced
    graphdef, params = nnx.split(conv)

    def loss(params, x):
        y = nnx.merge(graphdef, params)(x)  # (B, 8, 8, 4)
        return nnx.max_pool(y, (2, 2), strides=(2, 2)).sum()

    x = jax.ShapeDtypeStruct((2, 8, 8, 1), np.float32)
    ops = loop_slow_ops(jax.grad(loss), params, x)  # the forward pass and the kernel's gradient
    assert ops.startswith("2 convolutions") and "1 max-pool gradients" in ops
    assert loop_slow_ops(lambda x: x * 2, x) is None
    slow = StepForm("auto")
    for form, n, seconds in [("step", 1, 0.1), ("step", 1, 0.1), ("scan", 1, 1.0), ("unroll", 4, 0.3),
                             ("step", 1, 0.1), ("unroll", 4, 0.3)]:
        slow.record(form, n, seconds)
    assert slow.loop_slower and "the step holds 2 convolutions" in slow.blame(ops)
    assert "the step holds" in slow.summary()["why"]


def test_a_dispatched_run_works_out_its_programs_argument_shapes_once_not_at_every_step(monkeypatch):
    from jaxtrain._src.feeds import DeviceFeed

    asked = []
    original = DeviceFeed.abstract_args
    monkeypatch.setattr(DeviceFeed, "abstract_args", lambda self, k: asked.append(k) or original(self, k))
    config = TrainConfig(epochs=2, batch_size=16, steps_per_call=6, step_form="step")
    result = loop.run(small_mlp(), mse, DATA, None, config, optimizer=OPTIMIZER, verbosity="silent",
                      session=loop.RunOptions(console=silent(), plots=False))
    assert result.summary["step_form"]["form"] == "step" and result.summary["steps"] > 20
    assert len(asked) < 10, asked  # building the programs asks a few times; each step's dispatch asked before


def test_the_run_calibrates_on_its_first_calls_then_dispatches_them_untimed(monkeypatch):
    from types import SimpleNamespace

    from jaxtrain._src.calls import CompiledCalls

    seen, calibrate = [], CompiledCalls.calibrate  # what was still being chosen as each call came in
    monkeypatch.setattr(CompiledCalls, "calibrate", lambda self, k, *rest: seen.append(
        (k, self.form.measuring, self.chooser.measuring)) or calibrate(self, k, *rest))
    auto_steps = AutoSteps(short_run_calls=0, probe_lengths=(2, 4), repeats=1)  # 20 steps: K timed at 2 and 4
    result = loop.run(small_mlp(), mse, DATA, None, TrainConfig(epochs=1, batch_size=16), optimizer=OPTIMIZER,
                     verbosity="silent", session=loop.RunOptions(console=silent(), auto_steps=auto_steps, plots=False))
    form = result.summary["step_form"]["form"]
    assert seen[0] == (2, True, True)  # the first call: the form timed on a copy of the state, then K's first timing
    assert seen[1:] == ([(4, False, True)] if form == "scan" else [])  # a dispatched form has no K to time
    assert result.summary["steps"] == 20  # the timed calls trained: none twice, none lost
    with pytest.raises(RuntimeError, match="goes through `calibrate`"):  # no call skips the calibration
        CompiledCalls.__call__(SimpleNamespace(form=StepForm("auto")), 1, None, ())
