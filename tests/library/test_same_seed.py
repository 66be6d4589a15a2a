"""Same seed, same numbers on one machine (`choosers.StepForm`, `form_memory`): the form decision does
not follow the machine's load. Forms that time within a few percent keep the loop however a load
comes and goes while they are timed; a measured decision is kept in the compile cache and reused,
unmeasured, by the next run of the program (bit for bit); a changed decision file is ignored with
one note; `step_form` pins the form. The load is simulated: the timed segments run on a clock the
test drives, so nothing here depends on how busy the machine is."""

import json
import random

import numpy as np
import pytest
from conftest import mse, regression_data, silent, small_mlp

from jaxtrain import TrainConfig
from jaxtrain._src import form_memory, loop
from jaxtrain._src.calls import CompiledCalls
from jaxtrain._src.choosers import AutoSteps, StepForm
from jaxtrain._src.program import _form_memory

DATA = regression_data(320)  # 20 steps of 16
AUTO = AutoSteps(short_run_calls=0, probe_lengths=(4, 8))  # the form measured; K=4 (an epoch too short to time K)
ALIKE = {"scan": 1.0e-3, "step": 0.97e-3, "unroll": 0.96e-3}  # seconds per step: the forms within 4%


def decide(per_step: dict[str, float], load) -> str:
    """The chooser's decision when timing #i of the plan takes `per_step` x steps x `load(i)`."""
    form, i = StepForm("auto", AUTO), 0
    while form.measuring:
        probe = form.next_form()
        n = form.segment(probe, 4)
        form.record(probe, n, per_step[probe] * n * load(i))
        i += 1
    return form.form


def test_forms_that_time_alike_keep_the_loop_however_a_load_comes_and_goes():
    # A load (1.3-2x) that starts and ends anywhere in the timings, or slows each timing at random:
    # every timing of a form that wins by the margin must win, so a load can only keep the loop.
    for factor in (1.3, 1.6, 2.0):
        for start in range(8):
            for end in range(start + 1, 9):
                assert decide(ALIKE, lambda i: factor if start <= i < end else 1.0) == "scan", (factor, start, end)
    rng = random.Random(0)
    for _ in range(200):
        assert decide(ALIKE, lambda i: rng.uniform(1.0, 1.4)) == "scan"
    assert decide({"scan": 3e-3, "step": 1e-3, "unroll": 0.5e-3}, lambda i: 1.0) == "unroll"  # clear margins still win


class LoadedClock:
    """The forms' timings as `ALIKE` says, each slowed by `load(i)` (i: the timed segment's index)."""

    def __init__(self, load):
        self.now, self.segments, self.load = 0.0, 0, load

    def dispatch(self, original):
        def timed(calls, form, n, *rest):
            if n:
                self.now += ALIKE[form] * n * self.load(self.segments)
                self.segments += 1
            return original(calls, form, n, *rest)
        return timed


def run(monkeypatch, load=lambda i: 1.0, **config):
    clock = LoadedClock(load)
    monkeypatch.setattr(CompiledCalls, "clock", staticmethod(lambda: clock.now))
    monkeypatch.setattr(CompiledCalls, "_dispatch", clock.dispatch(CompiledCalls._dispatch))
    result = loop.run(small_mlp(), mse, DATA, None, TrainConfig(epochs=1, batch_size=16, **config),
                      verbosity="silent", session=loop.RunOptions(console=silent(), auto_steps=AUTO, plots=False))
    monkeypatch.undo()
    return result


def compiled(result) -> list[str]:
    """What the run compiled (`Compiler.compiles`, in the summary's profile)."""
    return [c["what"] for c in result.summary["profile"]["compiles"]]


def bits(result) -> tuple:
    """Every parameter and every step's loss, as bytes: equal means bit for bit."""
    import jax

    return (tuple(np.asarray(x).tobytes() for x in jax.tree.leaves(result.state.params)),
            tuple(float(r["train_loss"]).hex() for r in result.history))


def test_runs_of_one_seed_compute_bit_for_bit_alike_whatever_the_load(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(form_memory, "memory_dir", lambda: tmp_path)  # a compile cache's folder
    quiet = run(monkeypatch)
    kept, = tmp_path.glob("*.json")  # the measured decision, kept
    assert quiet.summary["step_form"]["decided"] == "measured" and quiet.summary["step_form"]["form"] == "scan"

    # The next run with the cache reuses the decision without timing anything, whatever the load
    # (without a cache, the margins alone keep the loop: the test above).
    monkeypatch.setattr(form_memory, "memory_dir", lambda: tmp_path)
    monkeypatch.setattr(StepForm, "record", lambda *a: pytest.fail("the kept decision was measured again"))
    again = run(monkeypatch, load=lambda i: 5.0)
    form = again.summary["step_form"]
    assert form["decided"] == "reused" and form["form"] == "scan" and form["why"].startswith("reused: measured by ")
    assert form["ms_per_step"] == quiet.summary["step_form"]["ms_per_step"]
    assert bits(again) == bits(quiet)
    # and nothing is compiled to time it: the plain step that the first run timed is not compiled again
    assert "train step" in compiled(quiet) and "train step" not in compiled(again)

    # A changed file is not trusted: one note, and the run measures again (then replaces it).
    record = json.loads(kept.read_text())
    memory = form_memory.FormMemory(tmp_path)
    assert memory.recall(record["key"]) == record["decision"]
    capsys.readouterr()
    for changed in ({**record, "decision": {**record["decision"], "form": "fastest"}},
                    {**record, "key": {**record["key"], "program": "another"}}, "{not json"):
        kept.write_text(changed if isinstance(changed, str) else json.dumps(changed))
        assert memory.recall(record["key"]) is None
        notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
        assert len(notes) == 1 and "measured again" in notes[0] and str(kept) in notes[0], notes
    memory.remember(record["key"], record["decision"])
    assert memory.recall(record["key"]) == record["decision"]


def test_step_form_pins_the_form_and_no_decision_is_read_or_kept(monkeypatch, tmp_path):
    monkeypatch.setattr(form_memory, "memory_dir", lambda: tmp_path)
    assert _form_memory(StepForm("step")) is None and _form_memory(StepForm("scan")) is None
    assert _form_memory(StepForm("auto")).directory == tmp_path
    pinned = StepForm("unroll")
    assert pinned.summary()["decided"] == "set" and pinned.form == "unroll" and not pinned.measuring


def test_decisions_are_kept_beside_the_compile_cache_else_in_the_users_cache_unless_turned_off(monkeypatch, tmp_path):
    monkeypatch.setattr(form_memory, "_compile_cache_dir", lambda: str(tmp_path / "xla"))
    monkeypatch.delenv(form_memory.ENV, raising=False)  # the suite turns it off: its runs share one compile cache
    assert form_memory.memory_dir() == tmp_path / "xla" / "jaxtrain-forms"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    for cache in (None, "gs://bucket/cache"):  # no compile cache, or one not on this machine: the user's cache
        monkeypatch.setattr(form_memory, "_compile_cache_dir", lambda: cache)
        assert form_memory.memory_dir() == tmp_path / "home" / "jaxtrain" / "forms"
    monkeypatch.setenv(form_memory.ENV, str(tmp_path / "mine"))
    assert form_memory.memory_dir() == tmp_path / "mine"
    monkeypatch.setenv(form_memory.ENV, "off")
    assert form_memory.memory_dir() is None
