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
