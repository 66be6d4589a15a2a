"""`jaxtrain scan`: every rule finds its planted snippet at the right line and stays silent on the
fixed twin; the case-study loop reports its anti-patterns and the fixed script none; the project's
own recipes, engine and optimised ladder variants report nothing of severity high; the CLI's
formats, exit codes and one-line errors. The code scanned is parsed, never run."""

import json
import runpy
import sys
import textwrap
from pathlib import Path

import pytest

from jaxtrain.tools.cli import main
from jaxtrain.tools.diagnose import RULES, Finding, scan_paths, scan_source
from jaxtrain.tools.diagnose.scan import CHECKS

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "jaxtrain"
CASE_STUDY = ROOT / "examples" / "case_study_loop.py"
FIXED = ROOT / "examples" / "case_study_fixed.py"
CASE_STUDY_RULES = {"unjitted-grad", "per-batch-transfer", "numpy-in-loop", "manual-update", "host-sync"}

HEADER = """\
import functools
import h5py
import jax
import jax.numpy as jnp
import numpy as np
import optax

def loss_fn(params, x, y):
    return jnp.mean((x @ params - y) ** 2)

"""

CNN_MODULE = """
from flax import nnx

class CNN(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(1, 8, (3, 3), rngs=rngs)
        self.head = nnx.Linear(8 * 28 * 28, 10, rngs=rngs)

    def __call__(self, x):
        return self.head(nnx.relu(self.conv(x)).reshape(x.shape[0], -1))

def cnn_loss(model, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()
"""

# rule -> (planted: the line marked `# <-` is the finding's, fixed twin: no finding of that rule)
CASES = {
    "unjitted-grad": ("""
def train(params, batches, lr):
    for x, y in batches:
        grads = jax.grad(loss_fn)(params, x, y)  # <-
        params = params - lr * grads
    return params
""", """
@functools.partial(jax.jit, donate_argnums=0)
def step(params, x, y):
    grads = jax.grad(loss_fn)(params, x, y)
    return params - 0.1 * grads

def train(params, batches):
    for x, y in batches:
        params = step(params, x, y)
    return params
"""),
    "jit-in-loop": ("""
def train(params, batches):
    for x, y in batches:
        params = jax.jit(lambda p, x, y: p - 0.1 * jax.grad(loss_fn)(p, x, y))(params, x, y)  # <-
    return params
""", """
def train(params, batches):
    step = jax.jit(lambda p, x, y: p - 0.1 * jax.grad(loss_fn)(p, x, y), donate_argnums=0)
    for x, y in batches:
        params = step(params, x, y)
    return params
"""),
    "row-loop": ("""
def predict(params, x):
    return jnp.tanh(x @ params)

def loss(params, x, y):
    total = 0.0
    for i in range(len(x)):  # <-
        total += jnp.sum((predict(params, x[i]) - y[i]) ** 2)
    return total / len(x)
""", """
def predict(params, x):
    return jnp.tanh(x @ params)

def loss(params, x, y):
    return jnp.mean(jnp.sum((jax.vmap(predict, in_axes=(None, 0))(params, x) - y) ** 2, -1))
"""),
    "per-batch-transfer": ("""
@functools.partial(jax.jit, donate_argnums=0)
def train_step(params, x, y):
    return params - 0.1 * jax.grad(loss_fn)(params, x, y)

def train(params, batches):
    for batch in batches:
        x = jnp.asarray(batch["x"])  # <-
        params = train_step(params, x, batch["y"])
    return params
""", """
@functools.partial(jax.jit, donate_argnums=0)
def train_step(params, x_all, y_all, rows):
    return params - 0.1 * jax.grad(loss_fn)(params, x_all[rows], y_all[rows])

def train(params, x, y, order):
    x_all, y_all = jnp.asarray(x), jnp.asarray(y)  # once, before the loop
    for rows in order:
        params = train_step(params, x_all, y_all, rows)
    return params
"""),
    "numpy-in-loop": ("""
@functools.partial(jax.jit, donate_argnums=0)
def train_step(params, x, y):
    return params - 0.1 * jax.grad(loss_fn)(params, x, y)

def train(params, batches):
    for x, y in batches:
        x = np.clip(x, -3.0, 3.0)  # <-
        params = train_step(params, x, y)
    return params
""", """
@functools.partial(jax.jit, donate_argnums=0)
def train_step(params, x, y):
    x = jnp.clip(x, -3.0, 3.0)
    return params - 0.1 * jax.grad(loss_fn)(params, x, y)

def train(params, batches):
    for x, y in batches:
        params = train_step(params, x, y)
    return params
"""),
    "host-sync": ("""
@functools.partial(jax.jit, donate_argnums=0)
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return params - 0.1 * grads, loss

def train(params, batches):
    losses = []
    for x, y in batches:
        params, loss = train_step(params, x, y)
        losses.append(loss.item())  # <-
    return params, losses
""", """
@functools.partial(jax.jit, donate_argnums=0)
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return params - 0.1 * grads, loss

def train(params, batches):
    losses = []
    for step, (x, y) in enumerate(batches):
        params, loss = train_step(params, x, y)
        losses.append(loss)
        if step % 100 == 0:
            print(f"step {step} loss {float(loss):.4f}")
    return params, losses
"""),
    "manual-update": ("""
@functools.partial(jax.jit, donate_argnums=0)
def train_step(params, x, y, lr):
    grads = jax.grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)  # <-
""", """
tx = optax.sgd(1e-3)

@functools.partial(jax.jit, donate_argnums=(0, 1))
def train_step(params, opt_state, x, y):
    grads = jax.grad(loss_fn)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
"""),
    "step-loop": ("""
@functools.partial(jax.jit, donate_argnums=0)
def train_step(params, x, y):
    return params - 0.1 * jax.grad(loss_fn)(params, x, y)

def train(params, xs, ys):
    for i in range(len(xs)):
        params = train_step(params, xs[i], ys[i])  # <-
    return params
""", """
@functools.partial(jax.jit, donate_argnums=0)
def train_epoch(params, xs, ys):
    def body(params, batch):
        x, y = batch
        return params - 0.1 * jax.grad(loss_fn)(params, x, y), None
    return jax.lax.scan(body, params, (xs, ys))[0]

def train(params, xs, ys, epochs):
    for _ in range(epochs):
        params = train_epoch(params, xs, ys)
    return params
"""),
    "no-donation": ("""
@jax.jit  # <-
def train_step(params, x, y):
    return params - 0.1 * jax.grad(loss_fn)(params, x, y)
""", """
@functools.partial(jax.jit, donate_argnums=0)
def train_step(params, x, y):
    return params - 0.1 * jax.grad(loss_fn)(params, x, y)
"""),
    "whole-dataset-load": ("""
def load(path):
    with h5py.File(path, "r") as f:
        x = f["features"][:]  # <-
    return x
""", """
from jaxtrain._src.data import HDF5Source

def load(path):
    return HDF5Source(path, {"x": "features", "y": "targets"})
"""),
    "conv-in-scan": (CNN_MODULE + """
def train_step(graphdef, state, x, y):
    model, optimizer = nnx.merge(graphdef, state)
    grads = nnx.grad(cnn_loss)(model, x, y)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer))

@functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
def train_steps(graphdef, state, xs, ys):
    def body(state, batch):
        return train_step(graphdef, state, *batch), None
    return jax.lax.scan(body, state, (xs, ys))[0]  # <-

def make_state():
    model = CNN(nnx.Rngs(0))
    return nnx.split((model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)))
""", CNN_MODULE + """
@nnx.jit(donate_argnums=(0, 1))
def train_step(model, optimizer, x, y):
    grads = nnx.grad(cnn_loss)(model, x, y)
    optimizer.update(model, grads)

def train(batches):
    model = CNN(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    for x, y in batches:
        train_step(model, optimizer, x, y)
"""),
}


def marked_line(source: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if "# <-" in line)


def scan(tmp_path: Path, body: str, name: str = "snippet.py") -> tuple[list[Finding], str]:
    source = HEADER + textwrap.dedent(body)
    path = tmp_path / name
    path.write_text(source)
    return list(scan_paths([path]).findings), source


def test_every_rule_has_a_check_and_a_case():
    assert set(CHECKS) == set(RULES) == set(CASES)
    for rule in RULES.values():
        assert rule.severity in ("high", "medium", "low") and rule.confidence in ("high", "medium", "low")
        assert rule.why and rule.fix and rule.gain and rule.message


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_finds_the_planted_line_and_not_the_fixed_twin(tmp_path, rule):
    planted, fixed = CASES[rule]
    findings, source = scan(tmp_path, planted)
    hits = [f for f in findings if f.rule == rule]
    assert [f.line for f in hits] == [marked_line(source)], findings
    assert hits[0].path == str(tmp_path / "snippet.py") and hits[0].message
    findings, _ = scan(tmp_path, fixed)
    assert not [f for f in findings if f.rule == rule], findings
    assert not [f for f in findings if f.severity != "low"], findings  # the fix raises nothing worse elsewhere


def test_manual_update_is_medium_eager_and_low_under_jit(tmp_path):
    eager = """
def train(params, batches, lr):
    for x, y in batches:
        grads = jax.grad(loss_fn)(params, x, y)
        params = params - lr * grads  # <-
    return params
"""
    findings, source = scan(tmp_path, eager)
    update = [f for f in findings if f.rule == "manual-update"]
    assert [(f.line, f.severity) for f in update] == [(marked_line(source), "medium")]
    findings, _ = scan(tmp_path, CASES["manual-update"][0])
    assert [f.severity for f in findings if f.rule == "manual-update"] == ["low"]


def test_jit_of_a_fixed_function_in_a_loop_is_medium_not_high(tmp_path):
    findings, source = scan(tmp_path, """
def step(params, x, y):
    return params - 0.1 * jax.grad(loss_fn)(params, x, y)

def train(params, batches):
    for x, y in batches:
        params = jax.jit(step)(params, x, y)  # <-
    return params
""")
    hits = [f for f in findings if f.rule == "jit-in-loop"]
    assert [(f.line, f.severity) for f in hits] == [(marked_line(source), "medium")]


def test_a_loop_over_batches_is_not_a_row_loop_but_per_sample_gradients_are(tmp_path):
    findings, _ = scan(tmp_path, CASES["step-loop"][0])
    assert not [f for f in findings if f.rule == "row-loop"], findings
    findings, source = scan(tmp_path, """
def per_example_grads(params, x, y):
    return [jax.grad(loss_fn)(params, x[i], y[i]) for i in range(len(x))]  # <-
""")
    assert [f.line for f in findings if f.rule == "row-loop"] == [marked_line(source)]


def test_a_numpy_load_without_mmap_is_low_and_with_mmap_clean(tmp_path):
    findings, source = scan(tmp_path, 'x = np.load("x.npy")  # <-\ny = np.load("y.npy", mmap_mode="r")\n')
    hits = [f for f in findings if f.rule == "whole-dataset-load"]
    assert [(f.line, f.severity) for f in hits] == [(marked_line(source), "low")]


def test_an_ignore_comment_silences_the_named_rule(tmp_path):
    planted = CASES["host-sync"][0].replace("# <-", "# jaxtrain: ignore[host-sync]")
    findings, _ = scan(tmp_path, planted)
    assert not [f for f in findings if f.rule == "host-sync"]


@pytest.mark.parametrize("body, confidence", [
    ("""
def blur(x, kernel, n):
    def body(i, x):
        return jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME")
    return jax.lax.fori_loop(0, n, body, x)  # <-
""", "high"),
    ("""
from jax import lax as L
from jax.lax import while_loop as repeat

def conv_block(x, kernel):
    return jnp.tanh(L.conv(x, kernel, (1, 1), "SAME"))

def denoise(x, kernel):
    return repeat(lambda c: c[1] < 8, lambda c: (conv_block(c[0], kernel), c[1] + 1), (x, 0))  # <-
""", "high"),
    ("""
import jax.lax as jl
import flax.linen as nn
from flax.training import train_state

class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(features=32, kernel_size=(3, 3))(x))
        return nn.Dense(10)(x.reshape((x.shape[0], -1)))

def train_step(state, batch):
    def loss(params):
        logits = state.apply_fn({"params": params}, batch["image"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
    return state.apply_gradients(grads=jax.grad(loss)(state.params))

@functools.partial(jax.jit, donate_argnums=0)
def train_epoch(state, batches):
    return jl.scan(lambda s, b: (train_step(s, b), None), state, batches)[0]  # <-

def create_state(key):
    cnn = CNN()
    params = cnn.init(key, jnp.ones([1, 28, 28, 1]))["params"]
    return train_state.TrainState.create(apply_fn=cnn.apply, params=params, tx=optax.sgd(0.1))
""", "medium"),
    ("""
import equinox as eqx

class Net(eqx.Module):
    conv: eqx.nn.Conv2d

    def __init__(self, key):
        self.conv = eqx.nn.Conv2d(1, 4, kernel_size=3, key=key)

    def __call__(self, x):
        return self.conv(x).mean()

def loss(net, x):
    return jax.vmap(net)(x).mean()

@eqx.filter_jit
def fit(xs):
    net = Net(jax.random.key(0))
    def body(i, net):
        grads = eqx.filter_grad(loss)(net, xs[i])
        return jax.tree.map(lambda p, g: p - 0.1 * g, net, grads)
    return jax.lax.fori_loop(0, xs.shape[0], body, net, unroll=2)  # <-
""", "medium"),
], ids=["fori_loop-lax-conv", "aliased-while_loop", "linen-apply_fn", "equinox-net"])
def test_conv_in_a_loop_body_is_found(tmp_path, body, confidence):
    findings, source = scan(tmp_path, body)
    hits = [f for f in findings if f.rule == "conv-in-scan"]
    assert [(f.line, f.severity, f.confidence) for f in hits] == [(marked_line(source), "medium", confidence)]
    assert "convolution" in hits[0].message and "9-14x" in hits[0].message


@pytest.mark.parametrize("body", [
    CASES["step-loop"][1],  # a scan over steps with no convolution
    CNN_MODULE + """
@nnx.jit
def train_step(model, optimizer, x, y):
    optimizer.update(model, nnx.grad(cnn_loss)(model, x, y))

def train(batches, n_noise):
    model = CNN(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    key = jax.lax.fori_loop(0, n_noise, lambda i, k: jax.random.fold_in(k, i), jax.random.key(0))
    for x, y in batches:
        train_step(model, optimizer, x, y)
    return jax.lax.scan(lambda total, x: (total + model(x).sum(), None), 0.0, batches, unroll=True)
""",  # a conv model called outside loop bodies; a fully unrolled scan
    CNN_MODULE + """
class MLP(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(784, 10, rngs=rngs)

    def __call__(self, x):
        return self.linear(x)

def fit(xs, ys):
    cnn, mlp = CNN(nnx.Rngs(0)), MLP(nnx.Rngs(1))
    def body(model, xy):
        return model, cnn_loss(model, *xy)
    return jax.lax.scan(body, mlp, (xs, ys))
""",  # two models, only one with convolutions: which one the body runs is a guess
], ids=["scan-without-conv", "conv-model-outside-loops", "conv-and-plain-model"])
def test_no_conv_in_a_loop_body_is_silent(tmp_path, body):
    findings, _ = scan(tmp_path, body)
    assert not [f for f in findings if f.rule == "conv-in-scan"], findings


def test_the_code_is_parsed_not_run(tmp_path):
    findings = scan_source("raise SystemExit('ran')\nimport does_not_exist\n", "x.py")
    assert findings == []


def test_the_case_study_reports_its_anti_patterns_and_the_fixed_script_none():
    found = scan_paths([CASE_STUDY]).findings
    assert {f.rule for f in found} == CASE_STUDY_RULES
    assert {f.rule for f in found if f.severity == "high"} == {"unjitted-grad"}
    assert scan_paths([FIXED]).findings == ()


def test_a_training_loop_passed_to_a_launcher_is_still_checked(tmp_path):
    source = CASE_STUDY.read_text().replace('if __name__ == "__main__":\n    main()',
                                            'if __name__ == "__main__":\n    app.run(main)')
    assert "app.run(main)" in source
    found = scan_source(source, "launched.py")
    assert {f.rule for f in found} == CASE_STUDY_RULES
    assert {f.severity for f in found if f.rule == "manual-update"} == {"medium"}


def test_the_projects_own_code_has_nothing_high():
    engine = sorted((SRC / "_src").glob("*.py"))
    core = [SRC / "_src" / part for part in ("models", "data", "hooks")]
    result = scan_paths([*engine, SRC / "tools" / "recipes", *core])
    assert len(result.files) > 20
    assert [f for f in result.findings if f.severity == "high"] == []


def test_only_the_ladders_original_loop_is_high():
    found = scan_paths([ROOT / "benchmarks" / "ladder_variants.py"]).findings
    high = [f for f in found if f.severity == "high"]
    assert {(f.rule, f.function) for f in high} == {("unjitted-grad", "original")}
    original = {f.rule for f in found if f.function == "original"}
    assert {"unjitted-grad", "per-batch-transfer", "manual-update", "host-sync"} <= original
    fused = [f for f in found if f.function.split(".")[0] in ("plus_fused", "jaxtrain_fit")]
    assert fused == []


def test_cli_text_output_and_fail_on(capsys):
    assert main(["scan", str(CASE_STUDY)]) == 0
    out = capsys.readouterr().out
    assert f"{CASE_STUDY}:" in out and "unjitted-grad" in out and "fix:" in out and "1 high" in out
    assert main(["scan", str(CASE_STUDY), "--fail-on", "high"]) == 1
    assert main(["scan", str(FIXED), "--fail-on", "low"]) == 0
    assert "no findings in 1 file" in capsys.readouterr().out


def test_cli_json(capsys):
    assert main(["scan", str(CASE_STUDY), str(FIXED), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["files"] == [str(CASE_STUDY), str(FIXED)]
    assert report["summary"]["high"] == 1 and report["summary"]["findings"] == len(report["findings"])
    fields = {"path", "line", "col", "rule", "severity", "confidence", "message", "function", "what", "why", "fix",
              "gain"}
    for f in report["findings"]:
        assert set(f) == fields and f["path"] == str(CASE_STUDY) and f["line"] > 0


def test_cli_directory_and_help(tmp_path, capsys):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(HEADER + textwrap.dedent(CASES["jit-in-loop"][0]))
    (tmp_path / "notes.txt").write_text("not python")
    assert main(["scan", str(tmp_path), "--fail-on", "medium"]) == 1
    assert "pkg/train.py" in capsys.readouterr().out
    assert main(["scan", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: jaxtrain scan" in out and all(rule in out for rule in RULES)


@pytest.mark.parametrize("args, expected", [
    (["missing.py"], "missing.py: no such file or directory"),
    (["BAD"], "bad.py:2: not valid Python"),
    ([], "nothing to scan"),
    (["GOOD", "--fail-on", "sometimes"], "--fail-on sometimes"),
    (["GOOD", "--format", "xml"], "--format xml"),
    (["GOOD", "--verbose"], "unknown option --verbose"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, expected):
    (tmp_path / "bad.py").write_text("import jax\ndef f(:\n")
    (tmp_path / "good.py").write_text("x = 1\n")
    paths = {"BAD": str(tmp_path / "bad.py"), "GOOD": str(tmp_path / "good.py"),
             "missing.py": str(tmp_path / "missing.py")}
    assert main(["scan", *[paths.get(a, a) for a in args]]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert len(captured.err.strip().splitlines()) == 1 and captured.err.startswith("error: ")
    assert expected in captured.err


def test_the_case_study_loop_runs(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["case_study_loop.py", "--steps", "2", "--samples", "256"])
    runpy.run_path(str(CASE_STUDY), run_name="__main__")
    assert "2 steps in" in capsys.readouterr().out


def test_the_fixed_script_runs(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(CASE_STUDY.parent))  # it imports the original's data
    monkeypatch.setattr(sys, "argv", ["case_study_fixed.py", "--samples", "256", "--batch-size", "64"])
    runpy.run_path(str(FIXED), run_name="__main__")
    assert "final train loss" in capsys.readouterr().out


# Shapes found in public training scripts (docs/scan_corpus.json); the snippets are written here, not copied.
def _rules_at(source: str) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for f in scan_source(textwrap.dedent(source)):
        if f.severity in ("high", "medium"):
            found.setdefault(f.line, set()).add(f.rule)
    return found


def test_a_step_jitted_in_one_place_and_called_plain_in_a_loop_is_found():
    source = HEADER + """
def sgd_step(w, xb, yb):
    g = jax.grad(loss_fn)(w, xb, yb)
    return w - 0.01 * g

fast_step = jax.jit(sgd_step)

def warmup(w, pairs):
    for xb, yb in pairs:
        w = sgd_step(w, xb, yb)
    return w
"""
    line = source.splitlines().index("    g = jax.grad(loss_fn)(w, xb, yb)") + 1
    assert "unjitted-grad" in _rules_at(source).get(line, set())


def test_numpy_preprocessing_in_a_helper_the_loop_calls_is_found():
    source = HEADER + """
@jax.jit
def update_step(w, xb, yb):
    return w - 0.01 * jax.grad(loss_fn)(w, xb, yb)

def standardise(raw):
    return np.clip(raw, -3.0, 3.0)

def prepare(raw):
    return standardise(raw)

def run(w, stream):
    for raw, yb in stream:
        w = update_step(w, prepare(raw), yb)
    return w
"""
    line = source.splitlines().index("    return np.clip(raw, -3.0, 3.0)") + 1
    assert "numpy-in-loop" in _rules_at(source).get(line, set())


def test_jnp_array_of_each_batch_in_a_batch_generator_is_found():
    source = HEADER + """
@jax.jit
def train_step(w, batch):
    return w - 0.01 * jax.grad(loss_fn)(w, batch["x"], batch["y"])

class Feeder:
    def __init__(self, xs, ys):
        self.xs, self.ys = xs, ys

    def batches(self, n):
        order = np.random.permutation(len(self.xs))
        for start in range(0, len(self.xs), n):
            rows = order[start:start + n]
            yield {"x": jnp.array(self.xs[rows]), "y": jnp.array(self.ys[rows])}

def run(w, feeder):
    for batch in feeder.batches(64):
        w = train_step(w, batch)
    return w
"""
    lines = source.splitlines()
    found = _rules_at(source)
    yield_line = next(i for i, t in enumerate(lines, 1) if t.strip().startswith("yield {"))
    perm_line = next(i for i, t in enumerate(lines, 1) if "np.random.permutation" in t)
    assert "per-batch-transfer" in found.get(yield_line, set())
    assert not found.get(perm_line)  # once per epoch, before the loop that yields


def test_float_of_the_loss_every_step_is_a_host_sync():
    source = HEADER + """
def run(w, pairs):
    history = []
    for xb, yb in pairs:
        value, g = jax.value_and_grad(loss_fn)(w, xb, yb)
        w = w - 0.01 * g
        history.append(float(value))
    return w, history
"""
    line = source.splitlines().index("        history.append(float(value))") + 1
    assert "host-sync" in _rules_at(source).get(line, set())


def test_float_of_the_loss_once_per_epoch_after_a_scanned_epoch_is_not_medium():
    source = HEADER + """
@functools.partial(jax.jit, donate_argnums=0)
def run_epoch(w, xs, ys):
    def body(w, xy):
        value, g = jax.value_and_grad(loss_fn)(w, *xy)
        return w - 0.01 * g, value
    w, values = jax.lax.scan(body, w, (xs, ys))
    return w, values.mean()

def train(w, xs, ys, epochs):
    for epoch in range(epochs):
        w, value = run_epoch(w, xs, ys)
        print(f"epoch {epoch}: {float(value):.4f}")
    return w
"""
    line = next(i for i, t in enumerate(source.splitlines(), 1) if "float(value)" in t)
    assert not _rules_at(source).get(line)




# Issue 61, item 9: the shapes of scripts written elsewhere (benchmarks/scan_variants/ and the public entries of
# docs/scan_corpus.json); a name is on the device or the host where it is read, not wherever it is ever bound.
def _line_of(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


def test_a_batch_rebound_by_its_own_copy_to_the_device_is_a_per_batch_copy():
    source = HEADER + """
@jax.jit
def train_step(w, xb, yb):
    return w - 0.01 * jax.grad(loss_fn)(w, xb, yb)

def run(w, X, Y, n_steps, bs):
    for i in range(n_steps):
        xb = (X[i * bs:(i + 1) * bs] - X.mean(0)) / X.std(0)
        xb = jnp.array(xb)
        w = train_step(w, xb, jnp.array(Y[i * bs:(i + 1) * bs]))
    return w
"""
    found = _rules_at(source)
    assert "per-batch-transfer" in found.get(_line_of(source, "xb = jnp.array(xb)"), set())
    assert "numpy-in-loop" in found.get(_line_of(source, "X.mean(0)"), set())  # host arithmetic, copied after


def test_numpy_of_a_batch_before_its_device_put_is_preprocessing_and_waiting_on_it_is_a_sync():
    source = HEADER + """
@jax.jit
def update(w, batch):
    return w - 0.01 * jax.grad(loss_fn)(w, batch["x"], batch["y"])

def run(w, dataset, num_steps):
    step = 0
    while step < num_steps:
        batch = next(dataset)
        batch = {"x": np.asarray(batch["x"], np.float32) / 255.0, "y": batch["y"]}
        batch = jax.device_put(batch)
        w = update(w, batch)
        w.block_until_ready()
        step += 1
    return w
"""
    found = _rules_at(source)
    assert found.get(_line_of(source, "np.asarray(batch")) == {"numpy-in-loop"}  # host data: not a sync
    assert "per-batch-transfer" in found.get(_line_of(source, "jax.device_put(batch)"), set())
    assert "host-sync" in found.get(_line_of(source, "w.block_until_ready()"), set())


def test_a_helper_the_loop_calls_every_step_that_copies_the_batch_and_returns_a_float_is_found():
    source = HEADER + """
@functools.partial(jax.jit, donate_argnums=0)
def update(w, xb, yb):
    value, g = jax.value_and_grad(loss_fn)(w, xb, yb)
    return w - 0.01 * g, value

def train_one_batch(w, xb, yb):
    xb = jnp.asarray(xb, dtype=jnp.float32)
    w, value = update(w, xb, yb)
    return w, float(value)

def fit(w, batches, epochs):
    for epoch in range(epochs):
        total = 0.0
        for xb, yb in batches():
            w, value = train_one_batch(w, xb, yb)
            total += value
        print(epoch, total)
    return w
"""
    found = _rules_at(source)
    assert "per-batch-transfer" in found.get(_line_of(source, "xb = jnp.asarray(xb"), set())
    assert "host-sync" in found.get(_line_of(source, "return w, float(value)"), set())
    assert not found.get(_line_of(source, "print(epoch, total)"))  # once per epoch, of a host float


def test_a_value_read_before_the_line_that_rebinds_it_in_the_loop_is_the_previous_steps():
    source = HEADER + """
@jax.jit
def train_step(w, xb, yb):
    value, g = jax.value_and_grad(loss_fn)(w, xb, yb)
    return w - 0.01 * g, value

def run(w, pairs):
    value = 0.0
    for xb, yb in pairs:
        print(value)
        w, value = train_step(w, xb, yb)
    return w
"""
    assert "host-sync" in _rules_at(source).get(_line_of(source, "print(value)"), set())


def test_a_logging_helper_given_the_steps_loss_every_step_is_a_host_sync_and_a_batch_cast_is_numpy():
    source = HEADER + """
def log_step(step, value):
    print(f"step {step}: {value:.4f}")

@jax.jit
def train_step(w, xb, yb):
    value, g = jax.value_and_grad(loss_fn)(w, xb, yb)
    return w - 0.01 * g, value

def run(w, loader):
    for step, (x, y) in enumerate(loader):
        w, value = train_step(w, np.float32(x) / 255.0, y)
        log_step(step, value)
    return w
"""
    found = _rules_at(source)
    assert "host-sync" in found.get(_line_of(source, 'print(f"step {step}'), set())  # `value` is the step's loss
    assert "numpy-in-loop" in found.get(_line_of(source, "np.float32(x)"), set())
