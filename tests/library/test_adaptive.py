"""`fit_population(adapt=...)`: a slot takes a new run at an epoch's end (fresh weights, or a copy of
another slot's weights and optimizer state, with its own numbers) without compiling anything; each
run is a run directory of its own; what a slot cannot take is one line."""

import dataclasses
import json

import jax
import pytest
from conftest import leaves_close, mse, regression_data, small_mlp
from flax import nnx
from jax._src import monitoring  # the public module registers listeners but cannot remove them

from jaxtrain import ConfigError, Member, OptimConfig, Refill, TrainConfig, fit_population
from jaxtrain._src.adaptive import check_refill
from jaxtrain._src.population import shared_settings
from jaxtrain.models import MLP

DATA, VAL = regression_data(160), regression_data(40, seed=1)
COMPILED = "/jax/core/compile/backend_compile_duration"  # JAX's event for every XLA program compiled


def config(lr: float, **changes) -> TrainConfig:
    settings = dict(epochs=3, batch_size=32, optim=OptimConfig(name="adam", lr=lr), steps_per_call=5, log_every=5,
                    tensorboard=False)
    return TrainConfig(**{**settings, **changes})


@pytest.fixture
def compiles():
    """XLA programs compiled in this process from now on (JAX's monitoring events)."""
    count = [0]

    def listen(event, seconds, **kwargs):
        count[0] += event == COMPILED

    jax.monitoring.register_event_duration_secs_listener(listen)
    yield count
    monitoring.unregister_event_duration_listener(listen)


@pytest.mark.parametrize("formulation, tolerance", [("tuple", 0.0), ("stacked", 1e-5)])
def test_a_slot_takes_a_fresh_run_and_a_copy_of_another_without_compiling_again(tmp_path, compiles, formulation,
                                                                                  tolerance):
    at_refill, seen = [], []

    def adapt(epoch, slots):
        seen.append([(s.index, s.status, len(s.history), s.joined) for s in slots])
        if epoch != 1:
            at_refill.append(compiles[0])
            return []
        at_refill.append(compiles[0])
        fresh = Member(small_mlp(5), config(2e-2), run_dir=tmp_path / "fresh")  # its weights: the slot's initial
        copy = Member(small_mlp(6), config(1e-3), run_dir=tmp_path / "copy")  # slot 0's state and numbers
        return [Refill(1, fresh), Refill(2, copy, parent=0, reason="exploited")]

    members = [Member(small_mlp(0), config(lr), run_dir=tmp_path / f"m{i}") for i, lr in enumerate((1e-3, 4e-3, 1e-2))]
    results = fit_population(members, mse, DATA, VAL, formulation=formulation, verbosity="silent", adapt=adapt)
    assert at_refill[0] > 0 and compiles[0] == at_refill[0]  # from the refill on, not one program compiled
    assert seen[0] == [(0, None, 1, 0), (1, None, 1, 0), (2, None, 1, 0)]
    assert seen[1] == [(0, None, 2, 0), (1, None, 1, 1), (2, None, 1, 1)]  # the new runs, joined after epoch 1
    assert [r.run_dir.name for r in results] == ["m0", "m1", "m2", "fresh", "copy"]
    assert [r.summary["status"] for r in results] == ["completed", "stopped early", "stopped early", "completed",
                                                      "completed"]
    assert results[2].summary["stop_reason"] == "exploited" and [len(r.history) for r in results] == [3, 1, 1, 2, 2]
    # the copy took slot 0's weights and optimizer state with slot 0's numbers: it goes on as slot 0 does
    assert [r["val_loss"] for r in results[4].history] == pytest.approx(
        [r["val_loss"] for r in results[0].history[1:]], rel=tolerance, abs=0)
    assert leaves_close(results[4].state.params, results[0].state.params) <= tolerance
    # the fresh run started from the population's initial weights with its own numbers: not slot 1's
    assert results[3].history[0]["val_loss"] != results[1].history[0]["val_loss"]
    summary = json.loads((tmp_path / "copy" / "summary.json").read_text())
    assert summary["population"] == {"members": 3, "formulation": formulation, "slot": 2, "joined_epoch": 1,
                                     "parent": str(tmp_path / "m0")}
    assert (tmp_path / "fresh" / "config.json").is_file() and (tmp_path / "fresh" / "checkpoints").is_dir()


def test_what_a_slot_cannot_take_is_one_line(tmp_path):
    holder = Member(small_mlp(0), config(1e-3))
    wider = Member(MLP((8, 32, 3), rngs=nnx.Rngs(0)), config(1e-3))
    sgd = Member(small_mlp(0), dataclasses.replace(config(1e-3), optim=OptimConfig(name="sgd", lr=1e-3)))
    longer = Member(small_mlp(0), config(1e-3, epochs=5))
    for refill, message in ((Refill(1, wider), "its model differs from the slot's in structure or shapes"),
                            (Refill(1, sgd), "its optimizer differs from the slot's in more than its numbers"),
                            (Refill(1, longer), "its config differs from the slot's in epochs"),
                            (Refill(5, holder), "slots are 0 to 1")):
        with pytest.raises(ConfigError, match=message):
            check_refill(refill, 2, holder, shared_settings)
