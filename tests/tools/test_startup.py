"""Start-up cost: what `jaxtrain train` imports before training begins (docs/benchmarks.md,
whole-process overhead). Heavy optional libraries load only when used: matplotlib for the final
plot (after training: imported beside the run's calls, it slowed the first epoch's and with them the
first progress readings), tensorboardX without PyTorch, h5py where an HDF5
file is opened."""

import json
import subprocess
import sys

import numpy as np
import pytest

from jaxtrain._src.data.synthetic import regression_rows
from jaxtrain._src.hooks.tensorboard import _summary_writer_class

LAZY = ("matplotlib", "torch", "tensorboardX", "tensorboard", "grain", "orbax", "h5py")

CHECK = """
import json, sys
import jaxtrain, jaxtrain.tools.cli, jaxtrain.tools.runs, jaxtrain.tools.recipes
at_import = sorted(m for m in {lazy!r} if m in sys.modules)
from jaxtrain import LambdaHook, TrainConfig, fit
from jaxtrain._src.models import MLP
from flax import nnx
import numpy as np
import pytest
seen = {{}}
rng = np.random.default_rng(0)
data = {{"x": rng.normal(size=(256, 4)).astype(np.float32), "y": rng.normal(size=(256, 2)).astype(np.float32)}}
def loss(model, batch, key):
    return ((model(batch["x"]) - batch["y"]) ** 2).mean(), {{}}
hook = LambdaHook(on_start=lambda run: seen.update(start=sorted(m for m in {lazy!r} if m in sys.modules)),
                  on_epoch_end=lambda run, record: seen.update(epoch="matplotlib" in sys.modules))
fit(MLP((4, 8, 2), rngs=nnx.Rngs(0)), loss, data, data, TrainConfig(epochs=1, batch_size=32), hooks=[hook],
    run_dir={run_dir!r}, verbosity="silent")
end = sorted(m for m in {lazy!r} if m in sys.modules)
print(json.dumps({{"import": at_import, "start": seen["start"], "epoch": seen["epoch"], "end": end}}))
"""


@pytest.mark.slow
def test_train_path_imports_heavy_libraries_only_when_used(tmp_path):
    # A fresh interpreter: pytest's own process may have loaded any of them for other tests.
    code = CHECK.format(lazy=LAZY, run_dir=str(tmp_path / "run"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["import"] == [], "`import jaxtrain.tools.cli` and the train command's modules load none of them"
    # Orbax is needed by then (the run checkpoints), the rest is not.
    assert seen["start"] in ([], ["orbax"]), "nothing else heavy is loaded before the first training step"
    assert not seen["epoch"], "matplotlib is imported after training, not beside the run's calls"
    # By the end the plot's matplotlib and the TensorBoard writer are loaded, PyTorch never is.
    assert "matplotlib" in seen["end"] and "tensorboardX" in seen["end"] and "torch" not in seen["end"]
    assert (tmp_path / "run" / "curves.png").stat().st_size > 1000
    assert list((tmp_path / "run" / "tensorboard").iterdir())


HELP = [["--help"], ["--version"], ["recipes"], ["train", "--help"], ["eval", "--help"], ["predict", "--help"],
        ["export", "--help"], ["plot", "--help"], ["compare", "--help"], ["doctor", "--help"], ["scan", "--help"],
        ["profile", "--help"], ["sample", "--help"], ["summary", "--help"], ["tune", "--help"],
        ["tune", "lr", "--help"], ["sweep", "--help"], ["bench", "--help"], ["data", "--help"],
        ["data", "generate", "--help"], ["data", "inspect", "--help"]]
# a recipe's settings and a benchmark's: the configs import no JAX (the recipes' functions do, when run)
RECIPE_NAMES = ["mlp-regression", "mnist-cnn", "fashion-mnist-cnn", "char-gpt", "hdf5-sequence", "alphazero"]
HELP += [["train", name, "--help"] for name in RECIPE_NAMES] + [["train", "char-gpt", "--preset", "long", "--help"]]
HELP += [["sweep", "mnist-cnn", "--help"], ["tune", "lr", "char-gpt", "--help"],
         ["tune", "batch-size", "char-gpt", "--help"]]
JAX = ("jax", "jaxlib", "flax", "optax", "orbax")  # some benchmarks' modules load NumPy (about 0.1 s)
HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "numpy", "matplotlib", "h5py", "optuna", "torch")


@pytest.mark.slow
def test_help_version_recipes_and_every_benchmarks_help_import_no_jax():
    # The help answers at once (no JAX: its import alone takes about a second): every command's
    # --help, the recipes' list and --version, one after another in a fresh interpreter; then, in the
    # same interpreter, each benchmark's --help (its module imports JAX where it runs, not when it is loaded).
    from benchmarks import BENCHMARKS

    names = sorted(BENCHMARKS)
    code = f"""
import contextlib, io, json, sys
from jaxtrain.tools import cli
def run(args):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            code = cli.main(args)
        except SystemExit as e:  # tyro's help
            code = e.code
    return [code, len(out.getvalue())]
codes = {{" ".join(args): run(args) for args in {HELP!r}}}
heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
bench = {{name: run(["bench", name, "--help"]) for name in {names!r}}}
print(json.dumps({{"codes": codes, "heavy": heavy, "bench": bench,
                  "bench_heavy": sorted(m for m in {JAX!r} if m in sys.modules)}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {args: c for args, (c, n) in seen["codes"].items() if c != 0 or n < 15} == {}  # each exits 0 with text
    assert seen["heavy"] == []
    assert {name: c for name, (c, n) in seen["bench"].items() if c != 0 or n < 200} == {}
    assert len(seen["bench"]) == 24 and seen["bench_heavy"] == []


# The command's process with `main` stood in for: what the cycle collector holds frozen when the command starts.
ENTRY = """
import gc, json, sys
from jaxtrain.tools import cli
seen = []
def main():
    seen.append({"args": sys.argv[1:], "frozen": gc.get_freeze_count(), "enabled": gc.isenabled(),
                 "jax": "jax" in sys.modules and "flax" in sys.modules and "optax" in sys.modules})
    print(json.dumps(seen), flush=True)  # `train` ends the process at once (os._exit)
    return 0
cli.main = main
for args in (["predict", "--help"], ["recipes"], ["train", "mlp-regression"]):
    sys.argv = ["jaxtrain", *args]
    try:
        cli.entry_point()
    except SystemExit:
        pass
"""


@pytest.mark.slow
def test_a_compiling_command_starts_with_its_imports_frozen_and_help_with_nothing_frozen():
    # A process-wide setting (gc.freeze), so a fresh interpreter: about 230,000 objects of JAX, Flax,
    # Optax and jaxtrain are out of the collector's walks when the command starts, and it still collects.
    proc = subprocess.run([sys.executable, "-c", ENTRY], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    help_, recipes, train = json.loads(proc.stdout.strip().splitlines()[-1])
    for light in (help_, recipes):  # answered without JAX: nothing imported, nothing frozen
        assert light["frozen"] == 0 and light["enabled"] and not light["jax"], light
    assert train["args"] == ["train", "mlp-regression"] and train["jax"] and train["enabled"]
    assert train["frozen"] > 100_000, train
    # ... and a process whose collector was off keeps it off.
    code = ("import gc; from jaxtrain._src.memory import imports_outside_gc; gc.disable()\n"
            "with imports_outside_gc(): import json\nprint(gc.isenabled(), gc.get_freeze_count() > 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "True"]


# The command's process, its heavy import made to fail as Ctrl-C (or a broken install) would make it.
FAILED_IMPORT = """
import sys
class Finder:
    def find_spec(self, name, path=None, target=None):
        if name == "jaxtrain._src.loop":
            raise {error}
sys.meta_path.insert(0, Finder())
sys.argv = ["jaxtrain", "train", "mlp-regression"]
from jaxtrain.tools.cli import entry_point
entry_point()
"""


@pytest.mark.slow
def test_ctrl_c_while_the_command_imports_is_one_line_and_a_closed_pipe_is_quiet():
    run = lambda code, **kw: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,  # noqa: E731
                                            timeout=60, **kw)
    interrupted = run(FAILED_IMPORT.format(error="KeyboardInterrupt"))
    assert (interrupted.returncode, interrupted.stderr) == (130, "interrupted\n")
    broken = run(FAILED_IMPORT.format(error="ImportError('a broken install')"))  # not Ctrl-C: the error as it is
    assert broken.returncode == 1 and "ImportError: a broken install" in broken.stderr
    # `jaxtrain ... | head`: the reader leaves; the command ends as SIGPIPE would end it, without a traceback.
    with subprocess.Popen([sys.executable, "-m", "jaxtrain", "train", "mlp-regression", "--help"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:  # closes its pipes
        proc.stdout.close()
        assert proc.wait(timeout=60) == 141 and proc.stderr.read() == ""


def test_summary_writer_import_leaves_torch_importable(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorboardX.writer", raising=False)
    assert _summary_writer_class().__name__ == "SummaryWriter"
    assert sys.modules.get("torch", "absent") is not None  # not left marked missing


def test_hand_written_script_makes_the_recipes_data():
    # The overhead benchmark's reference script generates the recipe's rows itself (it does not
    # import jaxtrain); they must be the same rows, bit for bit.
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "mlp_regression_script.py"
    spec = importlib.util.spec_from_file_location("mlp_regression_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    x, y = script.make_rows(1234, 9000)  # more than one generation block
    rows = regression_rows(1234, 0, 9000)
    np.testing.assert_array_equal(x, rows["features"])
    np.testing.assert_array_equal(y, rows["targets"])


@pytest.mark.xla_defaults
def test_recipes_built_as_one_program_get_the_eager_weights():
    # `compiled_init` must not change a run: the same weights, bit for bit, as building the
    # model op by op (the reference), for every recipe that uses it.
    import jax
    from flax import nnx

    from jaxtrain._src.models import MLP, Conv2D, SequenceCNN, compiled_init
    from jaxtrain._src.rl.network import PolicyValueMLP

    def assert_same(eager, compiled):
        eager, compiled = nnx.state(eager), nnx.state(compiled)
        assert jax.tree.structure(eager) == jax.tree.structure(compiled)
        for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(compiled)):
            np.testing.assert_array_equal(a, b)

    # As the recipes build them, the seed the program's input (mnist-cnn's CNN is Conv2D and nnx.Linear
    # layers: built whole, eagerly, it takes seconds).
    for seed, build in ((3, lambda rngs: MLP((6, 16, 3), rngs=rngs)), (1, lambda rngs: Conv2D(3, 8, rngs=rngs)),
                        (2, lambda rngs: SequenceCNN(7, 2, embed=4, channels=8, layers=2, kernel=3, rngs=rngs)),
                        (0, lambda rngs: PolicyValueMLP(15, 16, 2, rngs=rngs))):
        assert_same(build(nnx.Rngs(seed)), compiled_init(build, seed))
    # The constructor compiled as it is, its seed a constant of the program.
    constant = lambda: MLP((6, 16, 3), rngs=nnx.Rngs(3))  # noqa: E731
    assert_same(constant(), compiled_init(constant))


def test_models_of_one_shape_share_their_initialiser_whatever_their_seeds():
    import jax
    from flax import nnx

    from jaxtrain._src.compile_cache import cache_totals
    from jaxtrain._src.models import MLP, compiled_init

    if not jax.config.jax_compilation_cache_dir:
        pytest.skip("the persistent compilation cache is off")

    def build(seed, as_input=True):  # a new constructor each time, as each trial of a sweep builds its own
        before = cache_totals()
        if as_input:
            model = compiled_init(lambda rngs: MLP((5, 11, 2), rngs=rngs), seed)
        else:  # the seed inside the constructor: a constant of the program
            model = compiled_init(lambda: MLP((5, 11, 2), rngs=nnx.Rngs(seed)))
        after = cache_totals()
        return nnx.state(model), {kind: after[kind] - before[kind] for kind in after}

    states, counts = zip(*(build(seed) for seed in (21, 22, 23)))
    assert counts[1:] == ({"loaded": 1, "written": 0},) * 2, counts  # one program, loaded from the cache
    assert not np.array_equal(states[1]["layers"][0]["kernel"][...], states[2]["layers"][0]["kernel"][...])
    assert [build(seed, as_input=False)[1] for seed in (24, 25)] == [{"loaded": 0, "written": 1}] * 2
