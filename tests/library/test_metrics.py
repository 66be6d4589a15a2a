"""Exact epoch metrics from sums and counts (`jaxtrain.metrics`) and `jaxtrain.evaluate`, checked against
plain NumPy over the whole set (tolerance 1e-6: float32 logits, counts exact)."""

import jax
import numpy as np
import optax
import pytest
from conftest import silent
from flax import nnx

import jaxtrain
from jaxtrain import TrainConfig, metrics
from jaxtrain._src.loop import RunOptions, run

C = 3


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(4, C, rngs=rngs)

    def __call__(self, x):
        return self.linear(x)


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return {"x": x, "y": ((x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 1)).astype(np.int32)}


def loss_fn(model, batch, key):
    logits = model(batch["x"])
    y = batch["y"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, {"f1": metrics.F1(average="macro")(logits, y),
                  "f1_pos": metrics.F1()(logits[:, 1] - logits[:, 0], y),  # binary, from one score per row
                  "precision": metrics.Precision(average="macro")(logits, y),
                  "recall": metrics.Recall("macro")(logits, y),
                  "top2": metrics.TopK(2)(logits, y), "accuracy": metrics.Accuracy()(logits, y)}


def _reference(logits, y):
    """The metrics over the whole set, in plain NumPy (sklearn's definitions, zero_division=0)."""
    pred = logits.argmax(-1)
    def f1(p, t):
        tp, fp, fn = np.sum(p & t), np.sum(p & ~t), np.sum(~p & t)
        return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0
    per = [(np.sum((pred == c) & (y == c)), np.sum((pred == c) & (y != c)), np.sum((pred != c) & (y == c)))
           for c in range(C)]
    own = np.take_along_axis(logits, y[:, None], 1)
    return {"f1": np.mean([f1(pred == c, y == c) for c in range(C)]),
            "f1_pos": f1(logits[:, 1] - logits[:, 0] > 0, y == 1),
            "precision": np.mean([tp / (tp + fp) if tp + fp else 0.0 for tp, fp, _ in per]),
            "recall": np.mean([tp / (tp + fn) if tp + fn else 0.0 for tp, _, fn in per]),
            "top2": np.mean(np.sum(logits > own, 1) < 2), "accuracy": np.mean(pred == y)}


def _close(got, want, names):
    for name in names:
        assert abs(got[name] - want[name]) <= 1e-6, (name, got[name], want[name])


def test_epoch_metrics_are_exact_over_the_epoch_and_the_ragged_validation_set():
    train, val = _data(96), _data(53, seed=1)  # validation: 3 batches of 16 and a ragged 5
    model = Net(nnx.Rngs(0))
    config = TrainConfig(epochs=1, batch_size=16, eval_batch_size=16, steps_per_call=6, grad_accum=2)  # 2 micro-batches
    # a learning rate of 0: the model is the same at every step, so the epoch's counts are the whole set's
    record = run(model, loss_fn, train, val, config, optimizer=optax.sgd(0.0), verbosity="summary",
                 session=RunOptions(console=silent())).history[-1]
    names = list(_reference(np.zeros((1, C)), np.zeros(1, int)))
    for prefix, data in (("train_", train), ("val_", val)):
        want = _reference(np.asarray(model(data["x"]), np.float64), data["y"])
        _close({k[len(prefix):]: v for k, v in record.items() if k.startswith(prefix)}, want, names)
    assert 0 < record["val_f1"] < 1 and record["val_f1"] != record["val_accuracy"]


def test_mean_counts_only_the_rows_of_the_mask():
    values, mask = np.arange(10, dtype=np.float32), np.arange(10) < 3
    f = jax.jit(lambda v, m: metrics.Mean()(v, m))
    stat = f(values[:5], mask[:5]).merge(f(values[5:], mask[5:]))  # the second batch: every row masked out
    assert stat.compute() == 1.0  # (0 + 1 + 2) / 3, not the mean of the batch means
    assert metrics.Mean()(values).zero().compute() == 0.0


def test_evaluate_is_exact_over_every_row_and_compiles_once(monkeypatch):
    from jaxtrain._src import evaluate as evaluate_module

    _JITTED: dict = {}  # this test's passes alone (other tests of the process may have left theirs)
    monkeypatch.setattr(evaluate_module, "_JITTED", _JITTED)

    model, data = Net(nnx.Rngs(0)), _data(37)
    extra = lambda m, b: {"top1": metrics.TopK(1)(m(b["x"]), b["y"])}  # noqa: E731 - beside the loss's metrics
    got = jaxtrain.evaluate(model, loss_fn, data, batch_size=16, metrics=extra)  # 2 batches of 16 and a ragged 5
    logits = np.asarray(model(data["x"]), np.float64)
    want = _reference(logits, data["y"])
    _close(got, want, want)
    assert abs(got["loss"] - optax.softmax_cross_entropy_with_integer_labels(logits, data["y"]).mean()) <= 1e-6
    assert got["top1"] == got["accuracy"]
    before = dict(_JITTED)
    model.linear.kernel[...] *= 2.0  # new weights, the same program
    again = jaxtrain.evaluate(model, loss_fn, data, batch_size=16, metrics=extra)
    assert _JITTED == before and all(f._cache_size() == 1 for f in _JITTED.values()) and again != got
    with pytest.raises(jaxtrain.ConfigError, match="batch_size"):
        jaxtrain.evaluate(model, loss_fn, data, batch_size=0)


def test_the_training_sums_of_a_stat_survive_a_resume_through_json():
    import json

    from jaxtrain._src.hooks.metrics import Sums

    scores, labels = np.array([[2.0, 1.0], [-1.0, 3.0], [0.5, -0.5]]), np.array([[1, 0], [1, 1], [0, 0]])
    steps = [jax.device_get(metrics.F1()(s, t)) for s, t in zip(scores, labels)]  # one Stat per step
    stacked = lambda stats: metrics.Stat(stats[0].metric, {p: np.stack([s.parts[p] for s in stats])  # noqa: E731
                                                           for p in stats[0].parts})
    whole = Sums()
    whole.add({"loss": np.zeros(3)}, {"f1": stacked(steps)})
    before = Sums()
    before.add({"loss": np.zeros(2)}, {"f1": stacked(steps[:2])})
    resumed = Sums(**json.loads(json.dumps(before.to_json())))
    resumed.add({"loss": np.array([np.nan])}, {"f1": stacked(steps[2:])})  # a skipped step's counts are left out
    assert resumed.means()["f1"] == 2 * 2 / (2 * 2 + 1 + 1)  # tp 2, fp 1, fn 1 over the first two steps
    assert whole.means()["f1"] == 2 * 2 / (2 * 2 + 2 + 1)  # the third step's false positive counted


def test_macro_averages_the_classes_that_occur_and_a_binary_models_single_logit_is_binary():
    # 3 classes, class 2 neither labelled nor predicted: sklearn's macro F1 averages classes 0 and 1 alone
    logits = np.array([[5, 0, 0], [0, 5, 0], [5, 0, 0], [0, 5, 0]], np.float32)
    labels = np.array([0, 1, 1, 1])
    f1 = metrics.F1(average="macro")
    got = float(f1.compute(jax.device_get(f1(logits, labels).parts)))
    # class 0: tp 1, fp 1, fn 0 -> 2/3; class 1: tp 2, fp 0, fn 1 -> 4/5; mean 0.7333
    assert abs(got - (2 / 3 + 4 / 5) / 2) <= 1e-6
    # a Keras-style binary model's (N, 1) logits: one score a row, thresholded at 0
    single = np.array([[2.0], [-1.0], [3.0], [-2.0]], np.float32)
    truth = np.array([1, 0, 1, 0])
    for metric in (metrics.F1(), metrics.Accuracy()):
        assert float(metric.compute(jax.device_get(metric(single, truth).parts))) == 1.0


def test_evaluate_takes_a_model_that_cannot_be_hashed():
    class Scaled(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(4, 3, rngs=rngs)
            self.cfg = {"scale": 2.0}  # a dict attribute: the model's graph cannot be a cache key

        def __call__(self, x):
            return self.linear(x) * self.cfg["scale"]

    data = _data(10)
    got = jaxtrain.evaluate(Scaled(nnx.Rngs(0)), loss_fn, data, batch_size=4)
    assert np.isfinite(got["loss"])




def test_counts_added_up_on_the_device_do_not_wrap_at_2_31_elements():
    from jaxtrain._src import metrics as metrics_lib

    one = metrics.Accuracy()(np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([1, 1]))  # a batch: 1 correct of 2
    near = metrics.Stat(one.metric, {"correct": np.int32(2**31 - 2), "count": np.int32(2**31 - 1)})  # an epoch so far
    merged = jax.jit(lambda a, b: a.merge(b))(near, one)  # as validation adds its batches on the device
    assert merged.compute() == (2**31 - 1) / (2**31 + 1)
    # validation's batches stacked by lax.map, added up in one call, then a further batch added
    stacked = metrics.Stat(one.metric, {"correct": np.full(3, 2**30, np.int32),
                                        "count": np.full(3, 2**30 + 1, np.int32)})
    sums = jax.jit(lambda s: metrics_lib.add(s, {"accuracy": one}))(jax.jit(metrics_lib.total)({"accuracy": stacked}))
    counts = metrics_lib.host_sums(sums)["accuracy"].parts
    assert (counts["correct"], counts["count"]) == (3 * 2**30 + 1, 3 * (2**30 + 1) + 2)
    assert metrics_lib.compute(sums, 1)["accuracy"] == (3 * 2**30 + 1) / (3 * (2**30 + 1) + 2)


def test_validation_dispatched_batch_by_batch_adds_up_its_stats_as_the_loop_does():
    # the dispatched form donates its sums between the batches: they start as `add` returns them (with carry words)
    train, val = _data(32), _data(53, seed=1)  # validation: 3 batches of 16 and a ragged 5
    model = Net(nnx.Rngs(0))
    config = TrainConfig(epochs=1, batch_size=16, eval_batch_size=16, step_form="step")
    record = run(model, loss_fn, train, val, config, optimizer=optax.sgd(0.0), verbosity="summary",
                 session=RunOptions(console=silent())).history[-1]
    want = _reference(np.asarray(model(val["x"]), np.float64), val["y"])
    _close({k[len("val_"):]: v for k, v in record.items() if k.startswith("val_")}, want, want)
