"""Models as Flax writes them (jaxtrain issue 39): a model holding RNG streams (`nnx.Dropout(rngs=...)`,
`nnx.MultiHeadAttention(dropout_rate=..., rngs=...)`) checkpoints and resumes bit for bit; `fit` trains
in training mode and evaluates in evaluation mode whatever mode the model arrived in, and leaves it
in that mode; class labels outside the model's classes are refused where they enter."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _runs import assert_bit_equal
from conftest import regression_data, silent
from flax import nnx

from jaxtrain import CheckpointConfig, DataError, NonFiniteLossError, TrainConfig
from jaxtrain._src.checkpoint import Checkpointer
from jaxtrain._src.checks import check_fit_inputs
from jaxtrain._src.data import ArraySource
from jaxtrain._src.loop import RunOptions, run
from jaxtrain._src.models import MLP

B = 16


class FlaxNet(nnx.Module):
    """Flax's documented forms, each holding its own RNG stream: attention with dropout on its weights
    and `deterministic` left unset (None, Flax's default), and a Dropout given `rngs`."""

    def __init__(self, rngs: nnx.Rngs, d_in: int = 8, d_out: int = 3):
        self.embed = nnx.Linear(1, 8, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(2, 8, 8, dropout_rate=0.3, decode=False, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(8 * d_in, d_out, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, T) -> (B, d_out)
        h = self.attention(self.embed(x[..., None]))  # (B, T, 8)
        return self.out(self.dropout(h.reshape(h.shape[0], -1)))


def mse(model, batch, key):
    return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}


def _rng_counts(model) -> list[int]:
    return [int(v.get_value()) for _, v in nnx.to_flat_state(nnx.state(model, nnx.RngCount))]


def _host(tree) -> list[np.ndarray]:
    key = jax.dtypes.prng_key
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, key) else x)
            for x in jax.tree.leaves(tree)]


def _run(run_dir, resume=False):
    """Two epochs of 4 steps, a checkpoint every 2 steps, evaluated on the training data after each
    epoch; the model arrives with its dropout switched off (the user's `eval()`) and its attention
    in neither mode."""
    checkpoint = CheckpointConfig(every_steps=2, keep_last=100, keep_best=0)
    config = TrainConfig(epochs=2, batch_size=B, steps_per_call=2, checkpoint=checkpoint)
    data = regression_data(64)
    model = FlaxNet(nnx.Rngs(0))
    model.dropout.eval()
    return run(model, mse, data, data, config, run_dir=run_dir, resume=resume, verbosity="summary",
               session=RunOptions(console=silent(), plots=False))


@pytest.mark.xla_defaults
def test_a_model_holding_rng_streams_trains_in_training_mode_evaluates_in_evaluation_mode_and_resumes_bit_for_bit(
        tmp_path):
    full = _run(tmp_path / "full")
    assert full.summary["status"] == "completed"  # was: "failed: ... PRNGKey dtype cannot be converted"
    # Training mode in training: the attention's and the dropout's streams drew one key a step each
    # (the attention in neither mode failed; the dropout switched off drew none); none drawn in evaluation.
    assert _rng_counts(full.model) == [8, 8]
    model = full.model
    assert model.dropout.deterministic is True and model.attention.deterministic is None  # left as they arrived
    evaluating = nnx.clone(model)
    evaluating.eval()
    direct = float(nnx.jit(mse)(evaluating, regression_data(64), None)[0])  # one program, not a call per op
    np.testing.assert_allclose(full.history[-1]["val_loss"], direct, rtol=1e-5)  # evaluation mode in evaluation

    ckpt = Checkpointer(tmp_path / "full" / "checkpoints", read_only=True)
    assert ckpt.steps() == [2, 4, 6, 8]
    meta = ckpt.read_meta(6)
    for name in ("attention", "dropout"):  # each stream's key (as its raw data) and count saved and checksummed
        assert len([k for k in meta["checksums"] if k.startswith(".model_state") and name in k and "rngs" in k]) == 2
    ckpt.close()

    run = tmp_path / "from-6"  # stopped in the middle of epoch 2
    shutil.copytree(tmp_path / "full", run)
    shutil.rmtree(run / "checkpoints" / "8")
    resumed = _run(run, resume=True)
    assert resumed.summary["status"] == "completed" and resumed.summary["steps"] == 8
    assert _rng_counts(resumed.model) == [8, 8]  # 6 restored with the checkpoint, 2 drawn after it
    assert_bit_equal(_host(resumed.state.params), _host(full.state.params))
    assert_bit_equal(_host(resumed.state.model_state), _host(full.state.model_state))  # key data and counts
    keys = [x for x in jax.tree.leaves(resumed.state.model_state)
            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)]
    assert len(keys) == 2  # typed keys again, of their impl
    assert all(jax.random.key_impl(key) == jax.random.key_impl(jax.random.key(0)) for key in keys)
    assert [r["train_loss"] for r in resumed.history] == [r["train_loss"] for r in full.history]
    assert resumed.history[-1]["val_loss"] == full.history[-1]["val_loss"]


def ce(model, batch, key):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean(), {}


def _classification(labels) -> dict:
    x = np.random.default_rng(0).normal(size=(len(labels), 8)).astype(np.float32)
    return {"x": x, "y": np.asarray(labels, np.int32)}


def _mlp(d_out: int = 3) -> MLP:
    """Shapes only, no initialiser run: `check_fit_inputs` traces the model, never runs it."""
    return nnx.eval_shape(lambda: MLP((8, 16, d_out), rngs=nnx.Rngs(0)))


def test_labels_outside_the_model_classes_are_one_clear_line():
    labels = np.arange(40) % 10  # 0..9 for a model of 3 classes: was "loss became nan at step 1; lower the lr"
    with pytest.raises(DataError) as info:
        run(MLP((8, 16, 3), rngs=nnx.Rngs(0)), ce, _classification(labels), None, TrainConfig(batch_size=B),
            verbosity="silent", session=RunOptions(console=silent()))
    message = str(info.value)
    assert "train_data['y'] holds label 3 at row 3 (labels 0..9), outside 0..2" in message
    assert "3 classes (logits (16, 3) for labels (16,))" in message and "give the model 10 outputs" in message
    assert (info.value.classes, info.value.low, info.value.high, info.value.row) == (3, 0, 9, 3)
    assert "\n" not in message

    negative = np.where(np.arange(40) == 17, -1, np.arange(40) % 3)  # -1 would silently read as class 2
    with pytest.raises(DataError, match=r"holds label -1 at row 17 \(labels -1\.\.2\), outside 0\.\.2") as info:
        check_fit_inputs(_mlp(), ce, _classification(negative), None, B)
    assert info.value.low == -1 and "give the model" not in str(info.value)

    good = _classification(np.arange(40) % 3)
    with pytest.raises(DataError, match=r"val_data\['y'\] holds label 5"):
        check_fit_inputs(_mlp(), ce, good, _classification(np.full(8, 5)), B)
    with pytest.raises(DataError, match=r"holds label 3 at row 3 \(labels 0\.\.7 in its first 16 rows\)"):
        check_fit_inputs(_mlp(), ce, ArraySource(_classification(np.arange(40) % 8)), None, B)
    on_device = {k: jnp.asarray(v) for k, v in _classification(labels).items()}
    with pytest.raises(DataError, match="holds label 3 at row 3"):
        check_fit_inputs(_mlp(), ce, on_device, None, B)


def test_labels_not_used_as_classes_are_not_refused():
    check_fit_inputs(_mlp(), ce, _classification(np.arange(40) % 3), None, B)  # in range

    def shifted(batch):  # labels 1..3 in the data, made 0..2 by the preprocessing: not the data's labels
        return {**batch, "y": batch["y"] - 1}

    check_fit_inputs(_mlp(), ce, _classification(np.arange(40) % 3 + 1), None, B, preprocess=shifted)
    check_fit_inputs(_mlp(), ce, _classification(np.arange(40) % 3), None, B,
                     preprocess=lambda batch: {**batch, "x": batch["x"] * 2})  # labels passed through: checked ok

    counts = {"x": regression_data(40)["x"], "y": (np.arange(40) * 7)[:, None].astype(np.int32)}  # (B, 1) counts

    def count_loss(model, batch, key):
        return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}

    check_fit_inputs(_mlp(1), count_loss, counts, None, B)  # integer regression targets
    check_fit_inputs(_mlp(), mse, regression_data(40), None, B)  # float targets

    V, T = 11, 6  # a language model: logits (B, T, V) for target tokens (B, T), each in 0..V-1

    class TokenModel(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(V, 8, rngs=rngs)
            self.head = nnx.Linear(8, V, rngs=rngs)

        def __call__(self, tokens):  # (B, T) -> (B, T, V)
            return self.head(self.embed(tokens))

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, V, (40, T + 1)).astype(np.int32)
    lm = {"x": tokens[:, :-1], "y": tokens[:, 1:]}
    lm_model = nnx.eval_shape(lambda: TokenModel(nnx.Rngs(0)))
    check_fit_inputs(lm_model, ce, lm, None, B)
    with pytest.raises(DataError, match=r"outside 0\.\.10: the model's outputs have 11 classes \(logits \(16, 6, 11\)"):
        check_fit_inputs(lm_model, ce, {**lm, "y": lm["y"] + 1}, None, B)


def test_a_non_finite_loss_at_step_1_does_not_blame_the_learning_rate():
    first, later = str(NonFiniteLossError(1, float("nan"))), str(NonFiniteLossError(7, float("nan")))
    assert "before any update" in first and "learning rate is not the cause" in first and "0..C-1" in first
    assert "TrainConfig.optim" not in first and "OptimConfig.lr" not in first
    assert "Lower the learning rate (OptimConfig.lr)" in later


def test_missing_labels_stored_as_nan_train_when_allowed():
    """Flax's ogbg_molpcba stores a molecule's missing labels as NaN and masks them in the loss."""
    from jaxtrain import DataConfig, fit

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, (64, 3)).astype(np.float32)
    labels[rng.random((64, 3)) < 0.3] = np.nan
    data = {"x": rng.normal(size=(64, 4)).astype(np.float32), "labels": labels}

    def masked_bce(model, batch, key):
        logits, mask = model(batch["x"]), ~jnp.isnan(batch["labels"])
        y = jnp.where(mask, batch["labels"], 0.0)
        loss = optax.sigmoid_binary_cross_entropy(logits, y)
        return jnp.sum(jnp.where(mask, loss, 0.0)) / jnp.sum(mask), {}

    with pytest.raises(DataError, match=r"contains NaN/Inf, first bad row 0; .*allow_nan=True\) if the loss masks"):
        fit(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), masked_bce, data, config=TrainConfig(epochs=1, batch_size=16),
            verbosity="silent")
    config = TrainConfig(epochs=1, batch_size=16, data=DataConfig(allow_nan=True))
    result = fit(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), masked_bce, data, config=config, verbosity="silent")
    assert np.isfinite(result.final_train_loss)
    data["x"][5, 0] = np.inf  # Inf is still refused
    with pytest.raises(DataError, match=r"train_data\['x'\] contains Inf, first bad row 5"):
        fit(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), masked_bce, data, config=config, verbosity="silent")
    loader = lambda: iter([{k: v[i:i + 16] for k, v in data.items()} for i in range(0, 64, 16)])  # noqa: E731
    data["x"][5, 0] = 0.0
    result = fit(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), masked_bce, loader, config=config, verbosity="silent")
    assert np.isfinite(result.final_train_loss)  # a loader's batches too
