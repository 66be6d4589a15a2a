"""Short runs: what `fit` compiles before its first step, and in which order."""

from conftest import mse, regression_data, silent, small_mlp

from jaxtrain import TrainConfig
from jaxtrain._src import compiling
from jaxtrain._src.loop import RunOptions, run


def test_a_brief_runs_evaluation_compiles_beside_its_first_training_call_not_after_it(monkeypatch):
    submitted = []  # what each program compiled is, in the order the run asked for them
    compile = compiling.Compiler.compile

    def recording(self, fn, *args, **options):
        submitted.append(options.get("what") or getattr(fn, "__name__", "program"))
        return compile(self, fn, *args, **options)

    monkeypatch.setattr(compiling.Compiler, "compile", recording)
    data, val = regression_data(64), regression_data(32, seed=1)
    result = run(small_mlp(), mse, data, val, TrainConfig(epochs=1, batch_size=16), verbosity="silent",
                 session=RunOptions(console=silent()))
    assert result.summary["step_form"]["form"] == "scan" and "val_loss" in result.history[-1]
    # the scan needs no timing in a run this short: evaluation's program is asked for first (in the
    # background), so that it compiles while the training call does, instead of after the first call
    assert submitted.index("evaluate_sums") < submitted.index("train call")


def test_background_compiles_start_with_the_first_foreground_compile_then_at_once():
    from concurrent.futures import wait

    import jax
    import jax.numpy as jnp
    import pytest

    from jaxtrain._src.sharding import make_layout

    compiler = compiling.Compiler(make_layout())
    x = jax.device_put(jnp.float32(1.0))
    # asked for before the run's first compile: traced here, then held (never started, so never done)
    # until that compile reaches XLA, so that it does not compile beside the training program's trace
    early = compiler.compile(lambda v: v + 1, x, background=True)
    probed = []
    compiler.beside(lambda: probed.append("probe"))
    assert not wait([early._future], timeout=0.3).done and not early.done() and not probed
    assert float(compiler.compile(lambda v: v * 3, x)(x)) == 3.0  # the first foreground compile releases them
    assert float(early(x)) == 2.0 and probed == ["probe"]
    later = compiler.compile(lambda v: v - 1, x, background=True)  # from then on each starts at once
    assert wait([later._future], timeout=120).done and float(later(x)) == 0.0
    # a held program needed before any foreground compile starts when it is used; one never needed is
    # not compiled, and its use after the compiler closed says so
    other = compiling.Compiler(make_layout())
    needed, unused = (other.compile(lambda v, c=c: v + c, x, background=True) for c in (10, 20))
    assert float(needed(x)) == 11.0
    other2 = compiling.Compiler(make_layout())
    never = other2.compile(lambda v: v + 30, x, background=True)
    other2.close()
    with pytest.raises(RuntimeError, match="closed before this program was needed"):
        never(x)
    assert float(unused(x)) == 21.0  # released with `needed`
