"""Benchmarks of workloads run in quick mode: frameworks (jaxtrain vs PyTorch), data, scan.

(A file of its own so that `pytest -n 2 --dist loadfile` spreads the slow quick runs over both
workers.)"""

import dataclasses
import json
import os

import pytest


def test_frameworks_batch_rows_follow_fits_order():
    import io

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from rich.console import Console

    from jaxtrain import OptimConfig, TrainConfig, fit
    from jaxtrain.bench.frameworks import batch_rows
    from jaxtrain.models import MLP

    seen = []

    def loss_fn(model, batch, key):  # records the rows (x holds each row's index) in step order
        jax.debug.callback(lambda rows: seen.append(np.asarray(rows)), batch["x"][:, 0].astype(jnp.int32), ordered=True)
        return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}

    n, B, spe, epochs = 50, 4, 5, 2
    data = {"x": np.arange(n, dtype=np.float32)[:, None], "y": np.zeros((n, 1), np.float32)}
    config = TrainConfig(epochs=epochs, batch_size=B, steps_per_epoch=spe, seed=3, optim=OptimConfig(name="sgd"))
    fit(MLP((1, 2, 1), rngs=nnx.Rngs(0)), loss_fn, data, None, config, quiet=True, console=Console(file=io.StringIO()))
    np.testing.assert_array_equal(np.stack(seen), batch_rows(3, n, B, spe, epochs))


def test_frameworks_torch_models_mirror_the_jax_models():
    pytest.importorskip("torch")
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from flax import nnx

    from jaxtrain.bench import torch_models
    from jaxtrain.models import CNN
    from jaxtrain.models.gpt import GPT, GPTConfig

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
    from jaxtrain.bench.frameworks import FrameworksConfig
    from jaxtrain.errors import ConfigError

    with pytest.raises(ConfigError, match="workloads='mnist-cnn,resnet'"):
        FrameworksConfig(workloads="mnist-cnn,resnet")
    with pytest.raises(ConfigError, match="variants"):
        FrameworksConfig(variants="jax")


@pytest.mark.skipif(not os.environ.get("JAXTRAIN_DATA_DIR"), reason="needs the offline MNIST and Shakespeare files")
def test_frameworks_quick_runs_and_reports_sane_numbers(tmp_path, capsys):
    import importlib.util
    import math

    from jaxtrain.bench import frameworks

    out = tmp_path / "frameworks"
    assert frameworks.main(frameworks.FrameworksConfig(quick=True, out=str(out))) == 0
    payload = json.loads((out / "results.json").read_text())
    runs = {(r["workload"], r["variant"]): r for r in payload["runs"]}
    for workload in ("mnist-cnn", "char-gpt"):
        r = runs[(workload, "jaxtrain")]
        assert r["steps"] == 6 and r["train_s"] > 0 and r["ms_per_step"] > 0 and r["compile_s"] > 0
        assert r["eval_s"] > 0 and 0 < r["mfu"] and r["peak_rss_mib"] > 0
        assert math.isfinite(r["final_train_loss"]) and r["final_val_loss"] > 0
    assert 0.0 <= runs[("mnist-cnn", "jaxtrain")]["final_val_accuracy"] <= 1.0
    assert runs[("char-gpt", "jaxtrain")]["time_to_target_s"] is None  # 6 steps cannot reach 1.89
    assert "torch-compile skipped: not run with --quick" in " ".join(payload["notes"])
    assert (out / "results.md").read_text().startswith("# jaxtrain vs PyTorch")
    assert (out / "frameworks.png").stat().st_size > 1000
    if importlib.util.find_spec("torch") is None:
        assert "torch-eager skipped: torch is not installed" in " ".join(payload["notes"])
        return
    for workload in ("mnist-cnn", "char-gpt"):
        ours, eager = runs[(workload, "jaxtrain")], runs[(workload, "torch-eager")]
        assert eager["forward_check"]["passed"] and eager["forward_check"]["max_rel_diff"] <= 1e-4
        assert eager["steps"] == 6 and eager["train_s"] > 0 and eager["eval_s"] > 0 and eager["peak_rss_mib"] > 0
        # Same weights, batches, optimizer and learning rates: six steps later the losses still agree.
        assert math.isclose(eager["final_train_loss"], ours["final_train_loss"], rel_tol=1e-3)
        assert math.isclose(eager["final_val_loss"], ours["final_val_loss"], rel_tol=1e-3)
    assert 0.0 <= runs[("mnist-cnn", "torch-eager")]["final_val_accuracy"] <= 1.0
    summary = {(s["workload"], s["variant"]): s for s in payload["summary"]}
    assert summary[("mnist-cnn", "jaxtrain")]["vs_torch_eager"] > 0
    assert "jaxtrain speedup" in capsys.readouterr().out


def test_data_benchmark_quick(tmp_path, capsys):
    from jaxtrain.bench.data import DataBenchConfig, main

    assert main(DataBenchConfig(quick=True, dir=str(tmp_path))) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["runs"]) == {"device (small file in memory)", "stream (large file)", "stream (small file)"}
    for runs in results["runs"].values():
        assert runs[0]["samples_per_s"] > 0 and runs[0]["peak_rss_mib"] > 0
    assert 0 <= results["runs"]["stream (large file)"][0]["input_wait_fraction"] <= 1
    assert results["generate_rows_per_s"]["large"] > 0 and not list(tmp_path.glob("*.h5"))  # files removed


def test_scan_benchmark_quick(capsys):
    from jaxtrain.bench.scan import ScanBenchConfig, main

    assert main(ScanBenchConfig(quick=True)) == 0
    out = capsys.readouterr().out
    assert "lax.conv" in out and "im2col" in out and "char-gpt" in out and out.count("x │") == 3
