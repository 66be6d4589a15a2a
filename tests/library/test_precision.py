"""Mixed precision (bf16, fp16 with dynamic loss scaling) and gradient accumulation in the train step."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import mse, regression_data, silent, small_mlp
from flax import nnx

from jaxtrain import DataConfig, OptimConfig, TrainConfig
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.loop import RunOptions, run
from jaxtrain._src.models import MLP
from jaxtrain._src.precision import FLOAT32_SHARE_NOTED, LossScaleState, Policy, loss_scaling


def _fit(train, model=None, **overrides):
    config = TrainConfig(**{"epochs": 1, "batch_size": 16, "steps_per_call": 2, "log_every": 1, **overrides})
    return run(model or small_mlp(), mse, train, None, config, verbosity="summary",
               session=RunOptions(console=silent()))


def _max_abs_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


@pytest.mark.xla_defaults
def test_grad_accum_equals_one_batch_of_all_micro_batches():
    """--grad-accum 4 at batch 16 takes the steps of batch 64: parameters within 1e-6 (absolute),
    and the per-step losses (means of the micro-batch means) within 1e-6."""
    data = regression_data(256)
    one = _fit(data, batch_size=64, epochs=2)
    accumulated = _fit(data, batch_size=16, grad_accum=4, epochs=2)
    assert accumulated.summary["steps"] == one.summary["steps"] == 8
    assert _max_abs_diff(accumulated.state.params, one.state.params) <= 1e-6
    assert abs(accumulated.final_train_loss - one.final_train_loss) <= 1e-6
    assert accumulated.history[0]["samples"] == one.history[0]["samples"] == 256
    assert _max_abs_diff(one.state.params, nnx.state(small_mlp(), nnx.Param)) > 1e-3  # it did train


def test_grad_accum_needs_the_memory_of_one_micro_batch():
    """The compiled call's temporaries (activations) follow the micro-batch, not the whole step."""
    data = regression_data(4096)
    wide = lambda: MLP((8, 256, 256, 3), rngs=nnx.Rngs(0))  # noqa: E731
    big = _fit(data, model=wide(), batch_size=2048, steps_per_call=1)  # measured: 10.8 MB of temporaries
    accumulated = _fit(data, model=wide(), batch_size=512, grad_accum=4, steps_per_call=1)  # 3.0 MB
    big_temp, acc_temp = (r.summary["compiled_memory"]["temp_bytes"] for r in (big, accumulated))
    assert acc_temp < 0.5 * big_temp, (acc_temp, big_temp)


@pytest.mark.xla_defaults
def test_loss_scaling_skips_non_finite_updates_and_adapts_the_scale():
    tx = loss_scaling(optax.sgd(1.0), init=8.0, period=2)
    params = {"w": jnp.ones(3)}
    state = tx.init(params)
    finite, bad = {"w": jnp.full(3, 0.5)}, {"w": jnp.array([1.0, jnp.inf, 0.0])}

    updates, state = tx.update(bad, state, params)
    assert isinstance(state, LossScaleState)
    assert float(state.scale) == 4.0 and int(state.skipped) == 1 and int(state.good_steps) == 0
    np.testing.assert_array_equal(updates["w"], np.zeros(3))
    updates, state = tx.update(finite, state, params)
    np.testing.assert_allclose(updates["w"], -0.5 * np.ones(3))
    assert float(state.scale) == 4.0 and int(state.good_steps) == 1
    _, state = tx.update(finite, state, params)  # the period's second good step doubles the scale
    assert float(state.scale) == 8.0 and int(state.good_steps) == 0 and int(state.skipped) == 1


@pytest.mark.xla_defaults
def test_fp16_recovers_from_an_overflow(tmp_path):
    """A loss scale of 2^30 overflows float16 gradients: each such update is skipped and the scale
    halved until the gradients fit; training then continues to a finite, lower loss. The scale and
    the count of skipped updates are logged."""
    data = regression_data(512)
    result = run(small_mlp(), mse, data, None,
                 TrainConfig(epochs=2, batch_size=16, steps_per_call=4, log_every=4, precision="fp16",
                                 loss_scale_init=2.0**30, optim=OptimConfig(lr=1e-2)), verbosity="summary",
                 run_dir=tmp_path / "run", session=RunOptions(console=silent()))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    last = train[-1]
    assert last["scale_skips"] >= 1
    assert last["loss_scale"] < 2.0**30
    assert train[0]["loss_scale"] < 2.0**30  # lowered from the first steps on
    assert np.isfinite(result.final_train_loss)
    assert train[-1]["loss"] < 0.5 * train[0]["loss"]
    skipped = int(result.state.opt_state.skipped)
    assert skipped == last["scale_skips"]
    assert 2.0**30 / 2**skipped <= float(result.state.opt_state.scale) * 2  # halved once per overflow
    assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(result.state.params))
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(result.state.params))


class _Tagger(nnx.Module):
    """Tokens -> tag logits: an embedding, then two dense layers (a Flax model as users write them)."""

    def __init__(self, embed_dtype=None, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(50, 32, dtype=embed_dtype, rngs=rngs)
        self.hidden, self.out = nnx.Linear(32, 64, rngs=rngs), nnx.Linear(64, 5, rngs=rngs)

    def __call__(self, tokens):
        return self.out(jax.nn.relu(self.hidden(self.embed(tokens)))).mean(axis=1)  # (B, 5)


def _tag_loss(model, batch, key):
    logits = model(batch["tokens"]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {}


def test_a_bf16_run_whose_layers_stay_float32_says_so_in_one_note(capsys):
    """nnx.Embed computes in the dtype its table had when built (float32) unless given `dtype`, so
    everything after it runs in float32 under precision="bf16": one note names the share of the
    products that stay float32 and the fix; none with the fix, under fp32, or for the recipes' models."""
    from jaxtrain._src.models import CNN
    from jaxtrain._src.models.gpt import GPT, GPTConfig
    from jaxtrain._src.precision import float32_share

    rng = np.random.default_rng(0)
    data = {"tokens": rng.integers(0, 50, (64, 12)).astype(np.int32), "y": rng.integers(0, 5, 64).astype(np.int32)}
    config = TrainConfig(epochs=1, batch_size=16, steps_per_call=2, precision="bf16")
    for embed_dtype, noted in ((None, True), (jnp.bfloat16, False)):
        run(_Tagger(embed_dtype, rngs=nnx.Rngs(0)), _tag_loss, data, None, config, verbosity="summary",
            session=RunOptions(console=silent()))
        err = capsys.readouterr().err
        assert ("100% of the loss's matrix products (FLOPs) still run in float32" in err) == noted, err
        assert err.count("note:") == noted and ("dtype=jnp.bfloat16" in err) == noted
    run(_Tagger(rngs=nnx.Rngs(0)), _tag_loss, data, None, TrainConfig(**{**config.__dict__, "precision": "fp32"}),
        verbosity="summary", session=RunOptions(console=silent()))
    assert "still run in float32" not in capsys.readouterr().err
    bf16 = Policy("bf16")
    batch = {"x": jax.ShapeDtypeStruct((4, 28, 28, 1), jnp.float32), "y": jax.ShapeDtypeStruct((4,), jnp.int32)}
    cnn_loss = lambda m, b, k: (m(b["x"]).astype(jnp.float32).mean(), {})  # noqa: E731
    assert float32_share(cnn_loss, CNN(rngs=nnx.Rngs(0)), batch, bf16) < 0.01  # only the 10-way head: float32
    gpt = GPT(65, GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32), rngs=nnx.Rngs(0))
    tokens = {"x": jax.ShapeDtypeStruct((4, 16), jnp.int32)}
    share = float32_share(lambda m, b, k: (m(b["x"]).astype(jnp.float32).mean(), {}), gpt, tokens, bf16)
    assert share < FLOAT32_SHARE_NOTED, share  # its float32 logits come from bf16 products, accumulated in float32
    rnn = nnx.Sequential(nnx.RNN(nnx.LSTMCell(8, 32, rngs=nnx.Rngs(0))), lambda h: h[:, -1])  # its carry: float32
    steps = {"x": jax.ShapeDtypeStruct((4, 20, 8), jnp.float32)}
    assert float32_share(lambda m, b, k: (m(b["x"]).mean(), {}), rnn, steps, bf16) > FLOAT32_SHARE_NOTED


@pytest.mark.xla_defaults
def test_bf16_computes_in_bf16_and_keeps_float32_state():
    seen = {}

    def loss(model, batch, key):
        out = model(batch["x"])
        seen["x"], seen["out"] = batch["x"].dtype, out.dtype
        return jnp.mean((out.astype(jnp.float32) - batch["y"]) ** 2), {}

    config = TrainConfig(epochs=3, batch_size=16, steps_per_call=2, precision="bf16", optim=OptimConfig(lr=1e-2))
    data = regression_data(256)
    result = run(small_mlp(), loss, data, None, config, verbosity="summary", session=RunOptions(console=silent()))
    assert seen == {"x": jnp.bfloat16, "out": jnp.bfloat16}
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(result.state.params))
    assert all(p.dtype in (jnp.float32, jnp.int32) for p in jax.tree.leaves(result.state.opt_state))  # Adam count
    fp32 = run(small_mlp(), mse, data, None, TrainConfig(**{**config.__dict__, "precision": "fp32"}),
               verbosity="summary", session=RunOptions(console=silent()))
    assert abs(result.final_train_loss - fp32.final_train_loss) <= 0.05 * fp32.final_train_loss
    assert result.summary["precision"] == "bf16"


def test_bad_precision_and_accumulation_are_one_line_errors():
    with pytest.raises(ConfigError, match="precision='fp8' is not allowed; choose one of fp32, bf16, fp16"):
        TrainConfig(precision="fp8")
    with pytest.raises(ConfigError, match="grad_accum=0 must be an integer >= 1"):
        TrainConfig(grad_accum=0)
    with pytest.raises(ConfigError, match="precision='int8'"):
        Policy("int8")
    with pytest.raises(ConfigError, match="batch_size x grad_accum = 320 is larger than the training set"):
        _fit(regression_data(100), batch_size=32, grad_accum=10)


@pytest.mark.xla_defaults
@pytest.mark.slow
@pytest.mark.devices(2)
def test_precision_and_accumulation_on_a_mesh():
    """On two devices (data parallel and FSDP) accumulation still equals one big batch (1e-6),
    bf16 / fp16 train to within 5% of float32's loss, and remat leaves training unchanged (1e-6)."""
    data = regression_data(256)
    for mesh in ("data=2", "fsdp=2"):
        one = _fit(data, batch_size=32, epochs=2, mesh=mesh)
        accumulated = _fit(data, batch_size=8, grad_accum=4, epochs=2, mesh=mesh)
        assert _max_abs_diff(accumulated.state.params, one.state.params) <= 1e-6, mesh
        for precision in ("bf16", "fp16"):
            low = _fit(data, batch_size=8, grad_accum=4, epochs=2, mesh=mesh, precision=precision)
            assert abs(low.final_train_loss - one.final_train_loss) <= 0.05 * one.final_train_loss, (mesh, precision)
    # rematerialised blocks under FSDP: the same training as without (1e-6)
    from jaxtrain._src.models.gpt import GPT, GPTConfig

    tokens = {"tokens": np.random.default_rng(0).integers(0, 11, (64, 9)).astype(np.int32)}

    def lm(model, batch, key):
        logits = model(batch["tokens"][:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["tokens"][:, 1:]).mean(), {}

    gpt = GPTConfig(block_size=8, n_layer=2, n_head=2, n_embd=16)
    config = TrainConfig(epochs=1, batch_size=8, steps_per_call=4, mesh="fsdp=2", grad_accum=2)
    runs = [run(GPT(11, gpt, remat=remat, rngs=nnx.Rngs(0)), lm, tokens, None, config, verbosity="summary",
                session=RunOptions(console=silent())) for remat in ("none", "blocks")]
    assert _max_abs_diff(runs[0].state.params, runs[1].state.params) <= 1e-6


@pytest.mark.xla_defaults
def test_streamed_accumulation_equals_one_big_batch():
    """From a streamed source, too: the stream hands each step batch_size x grad_accum rows."""
    data = regression_data(256)
    stream = TrainConfig(epochs=2, batch_size=64, steps_per_call=2, data=DataConfig(placement="stream")).data
    one = _fit(data, batch_size=64, data=stream)
    accumulated = _fit(data, batch_size=16, grad_accum=4, data=stream)
    assert _max_abs_diff(accumulated.state.params, one.state.params) <= 1e-6


@pytest.mark.xla_defaults
def test_fp16_loss_scale_is_checkpointed_and_resumed_exactly(tmp_path):
    """The loss scale and the skipped count live in the optimizer state: a run resumed from its
    checkpoint after epoch 1 ends exactly where an uninterrupted one does."""
    data = regression_data(256)
    config = TrainConfig(epochs=2, batch_size=16, steps_per_call=4, precision="fp16", loss_scale_init=2.0**20,
                         loss_scale_period=5, grad_accum=2, tensorboard=False)
    whole = run(small_mlp(), mse, data, None, config, verbosity="summary", run_dir=tmp_path / "a",
                session=RunOptions(console=silent()))
    run(small_mlp(), mse, data, None, TrainConfig(**{**config.__dict__, "epochs": 1}), verbosity="summary",
        run_dir=tmp_path / "b", session=RunOptions(console=silent()))
    resumed = run(small_mlp(), mse, data, None, config, verbosity="summary", run_dir=tmp_path / "b", resume=True,
                  session=RunOptions(console=silent()))
    assert int(whole.state.opt_state.skipped) >= 1  # the scale did change during the run
    without_key = lambda state: state._replace(rng=None)  # noqa: E731
    assert _max_abs_diff(without_key(whole.state), without_key(resumed.state)) == 0.0
