"""Benchmarks of workloads run in quick mode: frameworks (jaxtrain vs PyTorch); data and scan are in
tests/benchmarks/test_bench_data_scan.py.

(Files of their own so that `pytest -n 2 --dist loadfile` spreads the slow quick runs over both
workers.)"""

import dataclasses
import json
import os

import pytest

from jaxtrain.engine import RunOptions, run


def test_frameworks_batch_rows_follow_fits_order():
    import io

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from rich.console import Console

    from benchmarks.frameworks import batch_rows
    from jaxtrain import OptimConfig, TrainConfig
    from jaxtrain._src.models import MLP

    seen = []

    def loss_fn(model, batch, key):  # records the rows (x holds each row's index) in step order
        jax.debug.callback(lambda rows: seen.append(np.asarray(rows)), batch["x"][:, 0].astype(jnp.int32), ordered=True)
        return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}

    n, B, spe, epochs = 50, 4, 5, 2
    data = {"x": np.arange(n, dtype=np.float32)[:, None], "y": np.zeros((n, 1), np.float32)}
    config = TrainConfig(epochs=epochs, batch_size=B, steps_per_epoch=spe, seed=3, optim=OptimConfig(name="sgd"))
    run(MLP((1, 2, 1), rngs=nnx.Rngs(0)), loss_fn, data, None, config, verbosity="summary",
        session=RunOptions(console=Console(file=io.StringIO())))
    np.testing.assert_array_equal(np.stack(seen), batch_rows(3, n, B, spe, epochs))


def test_frameworks_torch_models_mirror_the_jax_models():
    pytest.importorskip("torch")
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from flax import nnx

    from benchmarks import torch_models
    from jaxtrain._src.models import CNN
    from jaxtrain._src.models.gpt import GPT, GPTConfig

    def params_of(model):
        flat = jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))
        return {".".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)): np.asarray(leaf)
                for path, leaf in flat}

    images = np.random.default_rng(0).normal(size=(3, 28, 28, 1)).astype(np.float32)
    tokens = np.random.default_rng(1).integers(0, 65, size=(2, 16))
    config = GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32)
    cases = [(CNN(rngs=nnx.Rngs(0)), torch_models.CNN(), images, images.transpose(0, 3, 1, 2).copy()),  # NCHW
             (GPT(65, config, rngs=nnx.Rngs(0)), torch_models.GPT(65, dataclasses.asdict(config)), tokens, tokens)]
    for jax_model, torch_model, x, torch_x in cases:
        torch_models.load_jax_params(torch_model, params_of(jax_model))
        expected = np.asarray(nnx.jit(lambda m, x: m(x))(jax_model, jnp.asarray(x)))
        with torch.no_grad():
            got = torch_model(torch.from_numpy(torch_x)).numpy()
        assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) <= torch_models.FORWARD_TOLERANCE
    with pytest.raises(ValueError, match="does not fit"):
        torch_models.load_jax_params(torch_models.CNN(), {"dense1.kernel": np.zeros((10, 256), np.float32)})


def test_frameworks_config_rejects_unknown_names():
    from benchmarks.frameworks import FrameworksConfig
    from jaxtrain._src.errors import ConfigError

    with pytest.raises(ConfigError, match="workloads='mnist-cnn,resnet'"):
        FrameworksConfig(workloads="mnist-cnn,resnet")
    with pytest.raises(ConfigError, match="variants"):
        FrameworksConfig(variants="jax")
    with pytest.raises(ConfigError, match="torch_compile_mode='fastest'.*max-autotune"):
        FrameworksConfig(torch_compile_mode="fastest")


def test_frameworks_baseline_is_another_checkouts_jaxtrain_and_is_compared(tmp_path):
    from pathlib import Path

    import jaxtrain
    from benchmarks import frameworks
    from jaxtrain._src.errors import ConfigError

    with pytest.raises(ConfigError, match="holds no jaxtrain package.*git worktree add"):
        frameworks.FrameworksConfig(baseline_src=str(tmp_path))
    src = str(Path(jaxtrain.__file__).parents[1])  # this checkout's src/, as another's would be given
    config = frameworks.FrameworksConfig(workloads="mnist-cnn", variants="jaxtrain,torch-eager", baseline_src=src)
    rows = [{"workload": "mnist-cnn", "variant": v, "median_ms_per_step": ms, "median_peak_rss_mib": rss,
             "vs_torch_eager": 40.0 / ms, "vs_torch_compile": None}
            for v, ms, rss in (("jaxtrain", 36.0, 600.0), (frameworks.BASELINE, 36.0 / 1.01, 1200.0),
                               ("torch-eager", 40.0, 575.0))]
    notes = " | ".join(frameworks._notes([], rows, {}, 300.0, config))
    assert "jaxtrain's median peak RSS is 1.04x PyTorch eager's, 0.50x the baseline's" in notes
    assert f"jaxtrain's median ms/step is 1.010x the baseline's (jaxtrain-baseline: jaxtrain from {src})" in notes


def test_frameworks_baseline_runs_its_own_checkouts_child_before_and_after_benchmarks_left_the_package(tmp_path):
    from benchmarks import frameworks

    before = tmp_path / "before" / "src"  # the benchmark was src/jaxtrain/tools/bench/frameworks.py
    (before / "jaxtrain" / "tools" / "bench").mkdir(parents=True)
    (before / "jaxtrain" / "tools" / "bench" / "frameworks.py").touch()
    assert frameworks._baseline_child(str(before)) == ("jaxtrain.tools.bench.frameworks", str(before))
    after = tmp_path / "after" / "src"  # its own benchmarks/ beside its src/, ahead of this checkout's
    (after / "jaxtrain").mkdir(parents=True)
    assert frameworks._baseline_child(str(after)) == ("benchmarks.frameworks", f"{after.parent}{os.pathsep}{after}")


def test_frameworks_cold_gives_each_compiling_child_a_fresh_empty_cache(tmp_path, monkeypatch):
    import subprocess
    from pathlib import Path

    from benchmarks import child, frameworks

    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/the/users/own")  # would be kept by enable_compile_cache
    seen = []

    def run(command, env, **kwargs):  # the children's environments, as subprocess would get them
        seen.append(env)
        return subprocess.CompletedProcess(command, 0, stdout='{"ok": 1}\n', stderr="")

    monkeypatch.setattr(child.subprocess, "run", run)
    prepared = frameworks.Prepared("mnist-cnn", {}, tmp_path / "spec.json", 6, 3, 4, 1.0, 10, 5)
    config = frameworks.FrameworksConfig(cold=True)
    for variant in ("jaxtrain", "jaxtrain", "torch-compile", "torch-eager"):
        env = frameworks.cold_cache_env(variant, tmp_path) if config.cold else None
        assert frameworks._run_child(prepared, variant, env=env) == {"ok": 1}
    first, second, compiled, eager = seen
    dirs = [first["JAXTRAIN_COMPILE_CACHE"], second["JAXTRAIN_COMPILE_CACHE"], compiled["TORCHINDUCTOR_CACHE_DIR"]]
    assert len(set(dirs)) == 3 and all(Path(d).is_dir() and not any(Path(d).iterdir()) for d in dirs)
    assert "JAX_COMPILATION_CACHE_DIR" not in first and "JAX_COMPILATION_CACHE_DIR" not in second
    assert "JAXTRAIN_COMPILE_CACHE" not in eager and "TORCHINDUCTOR_CACHE_DIR" not in eager  # it compiles nothing
    assert eager["JAX_COMPILATION_CACHE_DIR"] == "/the/users/own"
    # The report says which cache the runs had, and how many programs each jaxtrain run loaded from it.
    assert "compilation cache cold" in frameworks.cache_mode(config)
    assert "the user's" in frameworks.cache_mode(frameworks.FrameworksConfig())
    assert frameworks._from_cache({"dir": dirs[0], "loaded": 0, "written": 22}) == "0 of 22"
    assert frameworks._from_cache({"dir": None, "loaded": 0, "written": 0}) == "off"


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("JAXTRAIN_DATA_DIR"), reason="needs the offline MNIST and Shakespeare files")
def test_frameworks_quick_runs_and_reports_sane_numbers(tmp_path, capsys):
    import math

    from benchmarks import frameworks
    from benchmarks.child import torch_available

    out = tmp_path / "frameworks"
    assert frameworks.main(frameworks.FrameworksConfig(quick=True, out=str(out))) == 0
    payload = json.loads((out / "results.json").read_text())
    runs = {(r["workload"], r["variant"]): r for r in payload["runs"]}

    def check_derived(r, workload):  # every variant's derived figures follow from its measured ones
        setup = payload["workloads"][workload]
        assert r["steps"] == 6 and (r["compile_s"] > 0) == (r["variant"] != "torch-eager")  # eager compiles nothing
        assert r["ms_per_step"] == pytest.approx(r["train_s"] / 6 * 1e3, rel=1e-12)
        assert r["eval_s"] == pytest.approx(sum(i["eval_s"] for i in r["intervals"]), rel=1e-12)
        flops_per_s = setup["flops_per_step"] / (r["ms_per_step"] / 1e3)
        assert r["mfu"] == pytest.approx(flops_per_s / (payload["peak_gflops"] * 1e9), rel=1e-12)
        # No step runs faster than the machine's own measured matmul peak allows (slack for a noisy peak
        # measurement): a timer that misses the steps' execution shows here.
        assert r["mfu"] < 1.5, r
        assert 100 < r["peak_rss_mib"] < 16_384  # MiB of a process that imported JAX or torch (a unit check)
        assert r["final_train_loss"] == r["intervals"][-1]["train_loss"] and math.isfinite(r["final_train_loss"])

    def check_accuracy(r):  # a count of correct images out of the n_val held out
        correct = r["final_val_accuracy"] * payload["workloads"]["mnist-cnn"]["n_val"]
        assert correct == pytest.approx(round(correct), abs=1e-6)

    for workload, classes in (("mnist-cnn", 10), ("char-gpt", 65)):
        r = runs[(workload, "jaxtrain")]
        check_derived(r, workload)
        assert r["train_s"] == pytest.approx(sum(i["train_s"] for i in r["intervals"]), rel=1e-9)
        # Six steps in the first 6% of a 100-step warmup: the validation loss falls a little, from about chance.
        evaluated = [i["val_loss"] for i in r["intervals"] if "val_loss" in i]
        assert r["final_val_loss"] == evaluated[-1] < evaluated[0]
        assert abs(r["final_val_loss"] - math.log(classes)) < 0.5
    check_accuracy(runs[("mnist-cnn", "jaxtrain")])
    assert runs[("mnist-cnn", "jaxtrain")]["final_val_accuracy"] < 0.3  # near chance (0.1) after those 6 steps
    assert runs[("char-gpt", "jaxtrain")]["time_to_target_s"] is None  # 6 steps cannot reach 1.89
    assert "torch-compile skipped: not run with --quick" in " ".join(payload["notes"])
    assert (out / "results.md").read_text().startswith("# jaxtrain vs PyTorch")
    assert (out / "frameworks.png").stat().st_size > 1000
    if not torch_available():
        assert "torch-eager skipped: torch is not installed" in " ".join(payload["notes"])
        return
    for workload in ("mnist-cnn", "char-gpt"):
        ours, eager = runs[(workload, "jaxtrain")], runs[(workload, "torch-eager")]
        assert eager["forward_check"]["passed"] and eager["forward_check"]["max_rel_diff"] <= 1e-4
        check_derived(eager, workload)
        # Same weights, batches, optimizer and learning rates: six steps later the losses still agree.
        assert math.isclose(eager["final_train_loss"], ours["final_train_loss"], rel_tol=1e-3)
        assert math.isclose(eager["final_val_loss"], ours["final_val_loss"], rel_tol=1e-3)
    check_accuracy(runs[("mnist-cnn", "torch-eager")])
    summary = {(s["workload"], s["variant"]): s for s in payload["summary"]}
    eager_ms, ours_ms = (summary[("mnist-cnn", v)]["median_ms_per_step"] for v in ("torch-eager", "jaxtrain"))
    assert summary[("mnist-cnn", "jaxtrain")]["vs_torch_eager"] == pytest.approx(eager_ms / ours_ms, rel=1e-12)
    assert "jaxtrain speedup" in capsys.readouterr().out
