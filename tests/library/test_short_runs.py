"""Short runs: what `fit` compiles before its first step, and in which order."""

from conftest import mse, regression_data, silent, small_mlp

from jaxtrain import TrainConfig
from jaxtrain._src import compiling
from jaxtrain._src.loop import RunOptions, run


def test_a_brief_runs_evaluation_compiles_beside_its_first_training_call_not_after_it(monkeypatch):
    submitted = []  # what each program compiled is, in the order the run asked for them, and how
    compile = compiling.Compiler.compile

    def recording(self, fn, *args, **options):
        submitted.append((options.get("what") or getattr(fn, "__name__", "program"), options.get("background")))
        return compile(self, fn, *args, **options)

    monkeypatch.setattr(compiling.Compiler, "compile", recording)
    data, val = regression_data(64), regression_data(32, seed=1)
    result = run(small_mlp(), mse, data, val, TrainConfig(epochs=1, batch_size=16), verbosity="silent",
                 session=RunOptions(console=silent()))
    assert result.summary["step_form"]["form"] == "scan" and "val_loss" in result.history[-1]
    # the scan needs no timing in a run this short: the training call is traced first and compiles in the
    # background; evaluation's program is traced meanwhile (not before it), and compiles next
    assert submitted[:2] == [("train call", True), ("evaluate_sums", True)]


def _blocked(compiler):
    """Occupies `compiler`'s background thread until the returned event is set (once it started)."""
    import threading

    started, go = threading.Event(), threading.Event()
    compiler.beside(lambda: (started.set(), go.wait(60)))
    assert started.wait(60)
    return go


def test_a_program_needed_before_the_background_thread_reached_it_compiles_where_it_is_needed():
    import threading
    from concurrent.futures import wait

    import jax
    import jax.numpy as jnp
    import pytest

    from jaxtrain._src.sharding import make_layout

    x = jax.device_put(jnp.float32(1.0))
    compiler = compiling.Compiler(make_layout())
    go = _blocked(compiler)
    needed = compiler.compile(lambda v: v * 3, x, background=True)
    assert not needed.done()
    assert float(needed(x)) == 3.0  # needed before the background thread reached it: compiled by who needs it
    go.set()
    later = compiler.compile(lambda v: v - 1, x, background=True)
    assert float(later(x)) == 0.0
    compiler.close()

    # a program never started when the compiler closes is not compiled, and its use says so
    other = compiling.Compiler(make_layout())
    go = _blocked(other)
    never = other.compile(lambda v: v + 30, x, background=True)
    closing = threading.Thread(target=other.close)
    closing.start()  # it cancels what has not started, then waits for the busy thread
    assert wait([never._work.future], timeout=60).done
    with pytest.raises(RuntimeError, match="closed before this program was needed"):
        never(x)
    go.set()
    closing.join(60)
    assert not closing.is_alive()
