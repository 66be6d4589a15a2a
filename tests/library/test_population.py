"""`fit_population`: P runs of one data stream as one compiled program, each member equal to its
lone run (the tuple bit for bit, the stacked to 1e-5), each a run directory of its own; a member
that stops or diverges ends alone; members that cannot share a population are one line."""

import dataclasses
import json
import os
import shutil
import signal

import jax
import numpy as np
import pytest
from conftest import leaves_close, mse, regression_data, small_mlp
from flax import nnx

import jaxtrain
from jaxtrain import CheckpointConfig, ConfigError, LambdaHook, Member, OptimConfig, TrainConfig, fit, fit_population
from jaxtrain._src import checkpoint, probes
from jaxtrain._src.memory import process_memory
from jaxtrain._src.optim import without_values
from jaxtrain._src.report.run_dir import read_jsonl
from jaxtrain._src.training import TrainingStopped
from jaxtrain.models import MLP

DATA, VAL = regression_data(320), regression_data(70, seed=1)
LRS = (1e-3, 4e-3, 1e-2)


def config(lr: float, **changes) -> TrainConfig:
    settings = dict(epochs=2, batch_size=32, optim=OptimConfig(name="adam", lr=lr), steps_per_call=4, log_every=4,
                    tensorboard=False)
    return TrainConfig(**{**settings, **changes})


def rows(run_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("elapsed_s", "train_time_s", "eval_time_s", "epoch_time_s",
                                                      "samples_per_s", "input_wait_s", "input_wait")}
            for r in read_jsonl(run_dir / "metrics.jsonl")]


def _counting_transfers(monkeypatch) -> list[int]:
    """Counts the metrics transfers (`jax.device_get` of a list of calls' metrics) from now on."""
    count, device_get = [0], jax.device_get

    def counted(x):
        count[0] += isinstance(x, list)
        return device_get(x)

    monkeypatch.setattr(jax, "device_get", counted)
    return count


@pytest.mark.xla_defaults
def test_tuple_members_equal_their_lone_runs_bit_for_bit_with_run_directories_of_their_own(tmp_path, monkeypatch):
    members = [Member(small_mlp(i), config(lr), run_dir=tmp_path / f"m{i}") for i, lr in enumerate(LRS)]
    transfers = _counting_transfers(monkeypatch)
    compiled, timed = [], []  # the profile's call-overhead probe (K was set, not measured: the probe is needed)
    monkeypatch.setattr(probes, "_overhead_probe", lambda f=probes._overhead_probe: compiled.append(1) or f())
    monkeypatch.setattr(probes, "_time_probe", lambda *a, f=probes._time_probe: timed.append(1) or f(*a))
    results = fit_population(members, mse, DATA, VAL, formulation="tuple", verbosity="silent")
    assert len(compiled) == len(timed) == 1  # one probe compiled and timed for the population, not one per member
    if process_memory() is not None:  # a member's summary has a lone run's memory report (the population's)
        assert all(r.summary["memory"]["peak_rss_bytes"] > 0 for r in results)
    population_transfers, transfers[0] = transfers[0], 0
    for i, lr in enumerate(LRS):
        lone = fit(small_mlp(i), mse, DATA, VAL, config(lr), run_dir=tmp_path / f"lone{i}", verbosity="silent")
        if i == 0:  # every member's metrics come back in one transfer per log interval: a lone run's count
            assert population_transfers == transfers[0] == 6  # 2 epochs of calls of 4, 4 and 2 steps, logged every 4
        got = results[i]
        assert leaves_close(got.state.params, lone.state.params) == 0.0
        assert [r["val_loss"] for r in got.history] == [r["val_loss"] for r in lone.history]
        assert rows(tmp_path / f"m{i}") == rows(tmp_path / f"lone{i}")  # every metrics row, lr included
        summary = json.loads((tmp_path / f"m{i}" / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["population"] == {"members": 3, "formulation": "tuple"}
        assert summary["best_val_loss"] == lone.summary["best_val_loss"]
        assert summary["profile"]["hook_seconds"]["CheckpointHook"] > 0  # each member's own hooks' seconds
        loaded = jaxtrain.load(tmp_path / f"m{i}", checkpoint="latest", model=small_mlp(99))  # its own checkpoint
        assert leaves_close(nnx.state(loaded, nnx.Param), got.state.params) == 0.0
        assert (tmp_path / f"m{i}" / "config.json").is_file()
    # a member's run directory is a lone run's: it resumes alone, to what three epochs alone give
    longer = dataclasses.replace(config(LRS[0]), epochs=3)
    resumed = fit(small_mlp(0), mse, DATA, VAL, longer, run_dir=tmp_path / "m0", resume=True, verbosity="silent")
    alone = fit(small_mlp(0), mse, DATA, VAL, longer, verbosity="silent")
    assert leaves_close(resumed.state.params, alone.state.params) == 0.0 and len(resumed.history) == 3


@pytest.mark.xla_defaults
def test_stacked_members_agree_with_their_lone_runs_to_1e_5(tmp_path, monkeypatch):
    # as on a GPU: arrays on a CPU device count as off the host, so the members' saves take host
    # copies (one transfer each) and CRC-32s, and the lone runs checksum on the device
    monkeypatch.setattr(checkpoint, "is_on_host", lambda x: isinstance(x, (np.ndarray, np.generic)))

    def adamw(lr: float) -> TrainConfig:  # schedule, decay and clipping: every number held in the state
        optim = OptimConfig(name="adamw", lr=lr, schedule="warmup-cosine", warmup_steps=5, weight_decay=lr * 10,
                            clip_norm=1.0 + lr)
        return dataclasses.replace(config(lr), optim=optim)

    members = [Member(small_mlp(i), adamw(lr), run_dir=tmp_path / f"m{i}") for i, lr in enumerate(LRS)]
    results = fit_population(members, mse, DATA, VAL, formulation="stacked", verbosity="silent")
    for i, lr in enumerate(LRS):
        lone = fit(small_mlp(i), mse, DATA, VAL, adamw(lr), run_dir=tmp_path / f"lone{i}", verbosity="silent")
        assert leaves_close(results[i].state.params, lone.state.params) <= 1e-5
        assert results[i].history[-1]["val_loss"] == pytest.approx(lone.history[-1]["val_loss"], rel=1e-5)
        assert results[i].summary["population"]["formulation"] == "stacked"
        logged = [r["lr"] for r in read_jsonl(tmp_path / f"m{i}" / "metrics.jsonl") if r["kind"] == "train"]
        alone = [r["lr"] for r in read_jsonl(tmp_path / f"lone{i}" / "metrics.jsonl") if r["kind"] == "train"]
        assert logged == pytest.approx(alone, rel=1e-6)  # the schedule's rate, from the member's own numbers
        loaded = jaxtrain.load(tmp_path / f"m{i}", checkpoint="latest", model=small_mlp(99))
        assert leaves_close(nnx.state(loaded, nnx.Param), results[i].state.params) == 0.0
        for run, form in ((f"m{i}", "crc32:"), (f"lone{i}", "")):
            saved = checkpoint.Checkpointer(tmp_path / run / "checkpoints", read_only=True)
            sums = saved.read_meta(saved.latest_step())["checksums"]
            assert sums and all(v.startswith("crc32:") == bool(form) for v in sums.values())
    # its checkpoints are a lone run's: it resumes alone, as the lone run resumed (1e-5: stacked)
    longer = dataclasses.replace(adamw(LRS[0]), epochs=3)
    resumed = fit(small_mlp(0), mse, DATA, VAL, longer, run_dir=tmp_path / "m0", resume=True, verbosity="silent")
    alone = fit(small_mlp(0), mse, DATA, VAL, longer, run_dir=tmp_path / "lone0", resume=True, verbosity="silent")
    assert len(resumed.history) == 3 and leaves_close(resumed.state.params, alone.state.params) <= 1e-5
    saved = lambda r: jax.tree.structure(without_values(r.state.opt_state))  # noqa: E731 - as checkpoints hold it
    assert saved(results[0]) == saved(alone)


@pytest.mark.xla_defaults
@pytest.mark.parametrize("formulation, tolerance", [("tuple", 0.0), ("stacked", 1e-5)])
def test_a_member_its_hook_stops_ends_there_and_the_others_train_on(tmp_path, formulation, tolerance):
    # stacked: a member's state is unstacked only when read; the stopped one's survives the next calls
    stop = LambdaHook(on_epoch_end=lambda run, record: run.stop("pruned at epoch 1"))
    nan = config(1e9, checkpoint=CheckpointConfig(enabled=False))  # diverges in the first epoch
    members = [Member(small_mlp(0), config(1e-3), run_dir=tmp_path / "m0"),
               Member(small_mlp(1), config(4e-3), run_dir=tmp_path / "m1", hooks=[stop]),
               Member(small_mlp(2), nan, run_dir=tmp_path / "m2")]
    results = fit_population(members, mse, DATA, VAL, formulation=formulation, verbosity="silent")
    assert [r.summary["status"] for r in results] == ["completed", "stopped early", "stopped: non-finite loss"]
    assert [len(r.history) for r in results] == [2, 1, 0]
    assert results[1].summary["stop_reason"] == "pruned at epoch 1"
    lone = fit(small_mlp(0), mse, DATA, VAL, config(1e-3), verbosity="silent")
    assert leaves_close(results[0].state.params, lone.state.params) <= tolerance  # the others' slots changed nothing
    pruned = fit(small_mlp(1), mse, DATA, VAL, config(4e-3, epochs=1), verbosity="silent")
    assert leaves_close(results[1].state.params, pruned.state.params) <= tolerance  # its state as it stopped
    assert json.loads((tmp_path / "m2" / "summary.json").read_text())["status"] == "stopped: non-finite loss"


def test_members_that_cannot_share_a_population_are_one_line(tmp_path):
    ok = Member(small_mlp(0), config(1e-3))
    for members, message in (
        ([ok, Member(small_mlp(1), config(1e-3, batch_size=16))], "differs from member 0 in batch_size"),
        ([ok, Member(small_mlp(1), config(1e-3, ema=0.9))], "ema"),
        ([Member(small_mlp(0), config(1e-3), run_dir=tmp_path / "a"),
          Member(small_mlp(1), config(2e-3), run_dir=tmp_path / "a")], "share a run directory"),
        ([], "non-empty list"),
        ([ok, Member(small_mlp(1), config(1e-3), joined=-1)], r"member 1: joined=-1 must be the epoch"),
        ([ok, Member(small_mlp(1), config(1e-3), parent=0)], r"member 1: parent=0 is for a member that took"),
        ([ok, Member(small_mlp(1), config(1e-3), joined=1, parent=1)], r"parent=1 must be another member's index"),
    ):
        with pytest.raises(ConfigError, match=message):
            fit_population(members, mse, DATA, VAL, verbosity="silent")
    wide = Member(MLP((8, 32, 3), rngs=nnx.Rngs(0)), config(1e-3))
    with pytest.raises(ConfigError, match="member 1's model differs"):
        fit_population([ok, wide], mse, DATA, VAL, formulation="stacked", verbosity="silent")
    clipped = Member(small_mlp(1), config(1e-3, optim=OptimConfig(lr=2e-3, clip_norm=1.0)))  # one more part
    with pytest.raises(ConfigError, match="member 1's optimizer differs from member 0's in more than its numbers"):
        fit_population([ok, clipped], mse, DATA, VAL, formulation="stacked", verbosity="silent")
    with pytest.raises(ConfigError, match="formulation='bogus'"):
        fit_population([ok], mse, DATA, VAL, formulation="bogus", verbosity="silent")
    # the tuple takes members of other shapes: each runs its own step
    results = fit_population([ok, wide], mse, DATA, VAL, verbosity="silent")
    assert results[1].summary["population"]["formulation"] == "tuple"  # auto, on the CPU
    assert np.isfinite(results[1].best_val_loss)


@pytest.mark.xla_defaults
def test_a_population_stopped_mid_epoch_resumes_to_the_uninterrupted_result_bit_for_bit(tmp_path):
    prune = LambdaHook(on_epoch_end=lambda run, record: run.stop("pruned") if run.epoch == 1 else None)

    def members(root, first_hooks=()):
        return [Member(small_mlp(i), config(lr, epochs=3), run_dir=root / f"m{i}",
                       hooks=[prune] if i == 2 else first_hooks if i == 0 else ()) for i, lr in enumerate(LRS)]

    whole = fit_population(members(tmp_path / "whole"), mse, DATA, VAL, formulation="tuple", verbosity="silent")
    term = LambdaHook(after_call=lambda run, k, m: os.kill(os.getpid(), signal.SIGTERM) if run.step == 14 else None)
    with pytest.raises(TrainingStopped):
        fit_population(members(tmp_path / "cut", [term]), mse, DATA, VAL, formulation="tuple", verbosity="silent")
    steps = lambda i: sorted(int(p.name) for p in (tmp_path / "cut" / f"m{i}" / "checkpoints").iterdir()  # noqa: E731
                             if p.name.isdigit())
    assert steps(0) == steps(1) == [10, 18]  # the epoch's end, and the stop (the signal is seen a call later)
    # killed between the members' saves of step 18: member 1's never reached the disk
    shutil.rmtree(tmp_path / "cut" / "m1" / "checkpoints" / "18")
    resumed = fit_population(members(tmp_path / "cut"), mse, DATA, VAL, formulation="tuple", verbosity="silent",
                             resume=True)
    for got, want, i in zip(resumed, whole, range(3)):
        assert leaves_close(got.state.params, want.state.params) == 0.0
        assert got.summary["status"] == want.summary["status"] and len(got.history) == len(want.history)
        assert rows(tmp_path / "cut" / f"m{i}") == rows(tmp_path / "whole" / f"m{i}")
    assert resumed[2].summary["status"] == "stopped early"  # it had ended: it stays as it ended


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted populations of `test_a_population_killed_...`, each formulation's run once."""
    done = {}

    def whole(formulation: str):
        if formulation not in done:
            root = tmp_path_factory.mktemp(f"whole-{formulation}")
            done[formulation] = root, fit_population(_two(root), mse, DATA, VAL, formulation=formulation,
                                                     verbosity="silent")
        return done[formulation]

    return whole


def _two(root, first_hooks=()) -> list[Member]:
    return [Member(small_mlp(i), config(lr), run_dir=root / f"m{i}", hooks=first_hooks if i == 0 else ())
            for i, lr in enumerate(LRS[:2])]


@pytest.mark.xla_defaults
@pytest.mark.parametrize("formulation", ["tuple", "stacked"])
@pytest.mark.parametrize("killed", ["before", "during", "after"])
def test_a_population_killed_around_its_first_checkpoint_resumes_to_the_uninterrupted_result(
        tmp_path, uninterrupted, killed, formulation):
    """Issue 63: killed before its first checkpoint (no member saved), during it (one member's save
    never reached the disk: no step all hold) or after it, a population resumed with resume=True
    trains to the end and keeps its checkpoints, bit for bit the uninterrupted population of its
    formulation. Before and during, each member starts over with its earlier files moved to previous-1/
    (the checkpoint hooks are made after the move, as `fit` makes its own: made before, every save
    failed and the run was lost)."""
    whole_root, whole = uninterrupted(formulation)
    at = 4 if killed == "before" else 14  # the first save is at step 10, epoch 1's end

    def kill(run, k, metrics):
        if run.step == at:
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        fit_population(_two(tmp_path, [LambdaHook(after_call=kill)]), mse, DATA, VAL, formulation=formulation,
                       verbosity="silent")
    steps = lambda i: sorted(int(p.name) for p in (tmp_path / f"m{i}" / "checkpoints").iterdir()  # noqa: E731
                             if p.name.isdigit())
    assert [steps(i) for i in range(2)] == [[] if killed == "before" else [10]] * 2
    for i in range(2):  # a killed process writes no summary
        (tmp_path / f"m{i}" / "summary.json").unlink()
    if killed == "during":
        shutil.rmtree(tmp_path / "m1" / "checkpoints" / "10")
    resumed = fit_population(_two(tmp_path), mse, DATA, VAL, formulation=formulation, verbosity="silent",
                             resume=True)
    for i, (got, want) in enumerate(zip(resumed, whole)):
        assert got.summary["status"] == "completed" and got.summary["latest_checkpoint_step"] == 20
        assert steps(i) == [10, 20]
        assert leaves_close(got.state.params, want.state.params) == 0.0
        assert rows(tmp_path / f"m{i}") == rows(whole_root / f"m{i}")
        assert (tmp_path / f"m{i}" / "previous-1").is_dir() == (killed != "after")
    if killed == "before":  # resumed once more, every member has finished: each stays as it is, nothing trains
        again = fit_population(_two(tmp_path), mse, DATA, VAL, formulation=formulation, verbosity="silent",
                               resume=True)
        assert [(r.summary["status"], r.summary["steps"], len(r.history)) for r in again] == [("completed", 20, 2)] * 2
        assert all(leaves_close(a.state.params, r.state.params) == 0.0 for a, r in zip(again, resumed))


@pytest.mark.parametrize("step", [10, 20])  # epoch 1's save (seen at the next), the last epoch's
def test_a_member_whose_save_fails_fails_alone(tmp_path, monkeypatch, step):
    """A member's save that cannot be written (its folder's disk full) fails that member, as it
    fails a lone run, and the others train on; the final saves are waited for at the members' run
    ends, so each is written while the other members end their epoch."""
    from jaxtrain._src import checkpoint

    write = checkpoint.Checkpointer._write

    def full_disk_for_m1(self, at, *args):
        if self.directory.parent.name == "m1" and at == step:
            self._fail("No space left on device")
        return write(self, at, *args)

    monkeypatch.setattr(checkpoint.Checkpointer, "_write", full_disk_for_m1)
    members = [Member(small_mlp(i), config(lr), run_dir=tmp_path / f"m{i}") for i, lr in enumerate(LRS[:2])]
    results = fit_population(members, mse, DATA, VAL, formulation="tuple", verbosity="silent")
    assert results[0].summary["status"] == "completed" and results[0].summary["latest_checkpoint_step"] == 20
    failed = json.loads((tmp_path / "m1" / "summary.json").read_text())
    assert failed["status"].startswith("failed: cannot write a checkpoint to ")
    assert "No space left on device" in failed["status"]
    assert failed["latest_checkpoint_step"] == (None if step == 10 else 10)


def test_a_members_metrics_are_a_dict_to_jax_and_come_back_once():
    """What a member's hooks get for a call's metrics: a dict of device arrays (JAX's tree functions
    see a dict, as a lone run's hooks do), fetched for all members in one transfer."""
    import jax.numpy as jnp

    from jaxtrain._src.population import _Transfers

    transfers = _Transfers(lambda: {0, 1})
    first = transfers.add(({"loss": jnp.ones(2)}, {"loss": jnp.zeros(2)}))
    second = transfers.add(({"loss": jnp.full(2, 2.0)}, {"loss": jnp.full(2, 3.0)}))
    assert jax.tree.map(lambda x: x * 2, first[0]) == {"loss": pytest.approx(np.full(2, 2.0))}
    assert jax.block_until_ready(second[1]) is second[1]
    assert second[0].host()["loss"].tolist() == [2.0, 2.0]  # brings both calls of both members
    assert [m.host()["loss"].tolist() for m in (first[0], first[1], second[1])] == [[1, 1], [0, 0], [3, 3]]
    assert transfers._calls == {} and transfers._host == {}


@pytest.mark.parametrize("formulation", ["tuple", "stacked"])
def test_a_call_that_fails_on_the_device_ends_every_member_with_its_error(tmp_path, monkeypatch, formulation):
    # The call after the failing one was already queued and took the population's arrays: members
    # end from states of their own (stacked: a copy per call, unstacked when read), not donated ones.
    from jaxtrain._src.calls import CompiledCalls

    waits, wait = [0], CompiledCalls.wait

    def failing(self, outputs):
        waits[0] += 1
        if waits[0] == 4:
            raise RuntimeError("the device failed")
        return wait(self, outputs)

    monkeypatch.setattr(CompiledCalls, "wait", failing)
    members = [Member(small_mlp(i), config(lr), run_dir=tmp_path / f"m{i}") for i, lr in enumerate(LRS)]
    with pytest.raises(RuntimeError, match="the device failed"):
        fit_population(members, mse, DATA, VAL, formulation=formulation, verbosity="silent")
    for i in range(len(LRS)):
        summary = json.loads((tmp_path / f"m{i}" / "summary.json").read_text())
        assert summary["status"] == "failed: RuntimeError: the device failed"
