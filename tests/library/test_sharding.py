"""Meshes: data parallelism and FSDP match one device; data order; resharding resume; bad meshes.

Tolerance: float32 sums reassociate across devices, so losses agree to 1e-5 relative and each
parameter array to 1e-5 relative L2 error (measured: about 1e-6 after 60 Adam steps; the test runs 30).
"""

import dataclasses
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtrain import fit
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.sharding import FSDP_MIN_ELEMENTS, make_layout, parse_mesh, shard_bytes
from jaxtrain.tools.cli import main
from jaxtrain.tools.recipes import get_recipe

MESHES = ("data=4", "data=2,fsdp=2", "fsdp=4")
RTOL = 1e-5


def mlp_config(mesh: str, **changes):
    base = get_recipe("mlp-regression").config
    data = dataclasses.replace(base.data, samples=600, val_samples=100)
    model = dataclasses.replace(base.model, hidden=(128, 128))  # every weight matrix still over FSDP_MIN_ELEMENTS
    settings = dict(epochs=2, steps_per_call=8, log_every=8, mesh=mesh, data=data, model=model, quiet=True,
                    tensorboard=False)
    return dataclasses.replace(base, **{**settings, **changes})


def train(recipe: str, config, run_dir=None, resume=False):
    w = get_recipe(recipe).build(config)
    return fit(w.model, w.loss_fn, w.train, w.val, config, preprocess=w.preprocess, augment=w.augment,
               verbosity="summary", run_dir=run_dir, resume=resume)


def assert_close(result, reference, rtol=RTOL):
    losses = [(r["train_loss"], r["val_loss"]) for r in result.history]
    expected = [(r["train_loss"], r["val_loss"]) for r in reference.history]
    np.testing.assert_allclose(losses, expected, rtol=rtol)
    for got, want in zip(jax.tree.leaves(result.state.params), jax.tree.leaves(reference.state.params)):
        got, want = np.asarray(got), np.asarray(want)
        assert np.linalg.norm(got - want) <= rtol * np.linalg.norm(want)


def test_parse_mesh_and_its_errors():
    assert parse_mesh("auto") is None
    assert parse_mesh("data=2, fsdp=2") == {"data": 2, "fsdp": 2}
    for text, message in (("model=2", "unknown axis 'model'"), ("data=2,data=2", "give each axis once"),
                          ("data", "axis=size pairs"), ("data=0", "size >= 1")):
        with pytest.raises(ConfigError, match=message):
            parse_mesh(text)
    with pytest.raises(ConfigError, match=r'needs 3 devices but there are 1 cpu .*TrainConfig\(mesh="data=1"\)'):
        make_layout("data=3")


def test_bad_meshes_on_the_command_line_exit_2(capsys):
    for mesh, message in (("data=3", "--mesh data=3 needs 3 devices but there are"),
                          ("tensor=1", "unknown axis 'tensor'")):
        assert main(["train", "mlp-regression", "--mesh", mesh, "--epochs", "1", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1


@pytest.mark.xla_defaults
@pytest.mark.slow
@pytest.mark.devices(4)
def test_meshes_train_like_one_device_fsdp_splits_the_state_and_checkpoints_reshard(tmp_path, capsys):
    reference = train("mlp-regression", mlp_config("data=1"))
    results = {mesh: train("mlp-regression", mlp_config(mesh)) for mesh in MESHES}
    for mesh, result in results.items():
        assert result.summary["mesh"].startswith({"data=4": "data=4 × fsdp=1", "data=2,fsdp=2": "data=2 × fsdp=2",
                                                  "fsdp=4": "data=1 × fsdp=4"}[mesh])
        assert_close(result, reference)
    # Per-device bytes of parameters + optimizer state, read from the arrays' shards.
    dp, fsdp = (shard_bytes((results[m].state.params, results[m].state.opt_state)) for m in ("data=4", "fsdp=4"))
    assert dp == shard_bytes((reference.state.params, reference.state.opt_state))  # replicated: all of it
    assert fsdp <= 0.3 * dp
    for leaf in jax.tree.leaves(results["fsdp=4"].state.params):  # the rule: big arrays split, small replicated
        split = any(axis == "fsdp" for axis in leaf.sharding.spec)
        assert split == (leaf.size >= FSDP_MIN_ELEMENTS), (leaf.shape, leaf.sharding.spec)
    # A checkpoint written on 4 devices resumes on 1, on 2 and on fsdp=4 like the 4-device run.
    first = train("mlp-regression", mlp_config("data=4", epochs=1), run_dir=tmp_path / "four")
    for mesh in ("data=1", "data=2", "fsdp=4"):
        run_dir = tmp_path / mesh.replace("=", "")
        shutil.copytree(tmp_path / "four", run_dir)
        resumed = train("mlp-regression", mlp_config(mesh), run_dir=run_dir, resume=True)
        expected_mesh = {"data=1": "data=1 × fsdp=1", "data=2": "data=2 × fsdp=1", "fsdp=4": "data=1 × fsdp=4"}[mesh]
        assert resumed.summary["mesh"].split(" (")[0] == expected_mesh
        assert resumed.history[0] == first.history[0]  # epoch 1 came from the checkpoint, not retrained
        assert_close(resumed, results["data=4"])
    # A batch that does not split over the devices is refused before training.
    assert main(["train", "mlp-regression", "--mesh", "data=4", "--batch-size", "30", "--quiet"]) == 2
    assert "--batch-size 30 does not split over the mesh's 4 devices" in capsys.readouterr().err


@pytest.mark.xla_defaults
@pytest.mark.slow
@pytest.mark.devices(4)
@pytest.mark.skipif(not os.environ.get("JAXTRAIN_DATA_DIR"), reason="needs the offline Tiny Shakespeare file")
def test_char_gpt_on_meshes_matches_one_device():
    """The batch split over `data`, the GPT's large arrays over `fsdp`, and both: each trains like one device."""
    base = get_recipe("char-gpt").presets["seed"]
    data = dataclasses.replace(base.data, limit=20000, eval_batches=2)
    config = dataclasses.replace(base, epochs=2, steps_per_epoch=16, steps_per_call=8, log_every=8, data=data,
                                 tensorboard=False)
    reference = train("char-gpt", dataclasses.replace(config, mesh="data=1"))
    for mesh in MESHES:
        result = train("char-gpt", dataclasses.replace(config, mesh=mesh))
        if "fsdp" in mesh:  # the state is split, not replicated
            assert any(axis == "fsdp" for leaf in jax.tree.leaves(result.state.params) for axis in leaf.sharding.spec)
        assert_close(result, reference)


@pytest.mark.xla_defaults
@pytest.mark.slow
@pytest.mark.devices(4)
def test_every_mesh_and_placement_visits_the_same_batches():
    """A fake step returns a fingerprint of each batch (its ids weighted by position), so equal
    metrics mean equal rows in the same order, step by step."""
    from jaxtrain._src.calls import CompiledCalls
    from jaxtrain._src.choosers import StepsPerCall
    from jaxtrain._src.data import Placement
    from jaxtrain._src.feeds import DeviceFeed, StreamFeed, as_source
    from jaxtrain._src.state import TrainState

    n, B, K = 1000, 32, 5
    data = {"id": np.arange(n, dtype=np.int32), "x": np.ones((n, 3), np.float32)}
    config = mlp_config("auto", batch_size=B, steps_per_call=K)
    state = TrainState(jnp.zeros((), jnp.int32), {}, {}, {}, jax.random.key(0))

    def fingerprint(state, batch):
        return state, {"f": jnp.sum(batch["id"] * (jnp.arange(B) + 1))}

    def visits(mesh: str, kind: str) -> np.ndarray:
        layout = make_layout(mesh)
        if kind == "stream":
            feed = StreamFeed(as_source(data, "d")[0], config, Placement("stream", "test"), layout)
        else:
            feed = DeviceFeed(data, config, Placement("device", "test", split=kind == "split"), jax.random.key(1),
                              layout)
        placed = layout.put(state, layout.state_shardings(state))
        calls = CompiledCalls(feed, fingerprint, placed, StepsPerCall(K, feed.steps_per_epoch), layout)
        feed.setup(calls.compile)
        out = []
        for epoch in (1, 2):
            feed.start_epoch(epoch, 0)
            for _ in range(3):
                placed, metrics = calls(K, placed, feed.next_args(K))
                out.append(np.asarray(metrics["f"]))
        feed.close()
        return np.concatenate(out)

    for kind in ("replicated", "split", "stream"):
        expected = visits("data=1", kind)
        assert len(set(expected.tolist())) == len(expected)  # distinct batches: the check can fail
        for mesh in MESHES:
            np.testing.assert_array_equal(visits(mesh, kind), expected, err_msg=f"{kind} on {mesh}")




@pytest.mark.xla_defaults
@pytest.mark.slow
@pytest.mark.devices(4)
def test_exact_metrics_add_every_devices_rows():
    """F1, top-k and accuracy counts of a batch split over 4 devices (and of a validation tail of 5 rows, which
    each device evaluates whole) come out as one device's over the whole set (test_metrics.py's reference)."""
    import optax
    from flax import nnx
    from test_metrics import Net, _data, _reference, loss_fn

    from jaxtrain import TrainConfig

    train, val = _data(96), _data(53, seed=1)
    model = Net(nnx.Rngs(0))
    config = TrainConfig(epochs=1, batch_size=16, eval_batch_size=16, steps_per_call=6, mesh="data=4")
    record = fit(model, loss_fn, train, val, config, optimizer=optax.sgd(0.0), verbosity="silent").history[-1]
    for prefix, data in (("train_", train), ("val_", val)):
        want = _reference(np.asarray(model(data["x"]), np.float64), data["y"])
        assert max(abs(record[prefix + k] - v) for k, v in want.items()) <= 1e-6, prefix
