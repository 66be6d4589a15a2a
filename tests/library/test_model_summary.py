"""The model summary (run header, summary.json, `jaxtrain summary RECIPE`): module paths, types,
output shapes, parameter counts and bytes, other state, and FLOPs per step."""

import json

import jax
import jax.numpy as jnp
import numpy as np
from conftest import mse, regression_data, silent
from flax import nnx

import jaxtrain
from jaxtrain._src.loop import RunOptions, run
from jaxtrain._src.report.model_summary import model_summary, summary_lines
from jaxtrain.models import MLP


class Normed(nnx.Module):
    def __init__(self):
        self.linear = nnx.Linear(6, 4, rngs=nnx.Rngs(0))
        self.norm = nnx.BatchNorm(4, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return self.norm(self.linear(x))


def test_counts_shapes_and_call_order_by_hand():
    model = MLP((8, 16, 3), rngs=nnx.Rngs(0))
    x = jax.ShapeDtypeStruct((5, 8), jnp.float32)
    summary = model_summary(model, lambda m, x: m(x), x)
    rows = {r["path"]: r for r in summary["modules"]}
    assert [r["path"] for r in summary["modules"]][:3] == ["(model)", "layers.0", "layers.1"]  # call order
    assert rows["layers.0"]["params"] == 8 * 16 + 16 and rows["layers.1"]["params"] == 16 * 3 + 3
    assert rows["layers.0"]["output"] == "(5, 16)" and rows["(model)"]["output"] == "(5, 3)"
    assert summary["params"] == 8 * 16 + 16 + 16 * 3 + 3 and summary["param_bytes"] == 4 * summary["params"]
    assert summary["state"] == 0
    assert nnx.Linear.__call__.__qualname__ == "Linear.__call__"  # the recording wrapper is gone


def test_batch_statistics_count_as_state_not_parameters():
    summary = model_summary(Normed(), lambda m, x: m(x), jax.ShapeDtypeStruct((2, 6), jnp.float32))
    norm = next(r for r in summary["modules"] if r["path"] == "norm")
    assert norm["params"] == 4 + 4 and norm["state"] == 4 + 4  # scale, bias; mean, var
    assert summary["params"] == 6 * 4 + 4 + 8 and summary["state"] == 8
    lines = summary_lines(summary, flops=2.5e9)
    assert any("norm" in line and "BatchNorm" in line and "(2, 4)" in line for line in lines)
    assert lines[-1].endswith("2.500 GFLOP (XLA cost analysis of the compiled call)")


def test_a_model_the_trace_cannot_run_still_gets_its_parameters_counted():
    def broken(m, x):
        raise RuntimeError("no")

    summary = model_summary(MLP((4, 2), rngs=nnx.Rngs(0)), broken, jax.ShapeDtypeStruct((1, 4), jnp.float32))
    assert summary["params"] == 10 and all(r["output"] is None for r in summary["modules"])


def test_fit_prints_the_summary_in_its_header_and_writes_it_with_flops(tmp_path):
    console = silent()
    data = regression_data(256, d_in=32, d_out=8)
    model = MLP((32, 64, 8), rngs=nnx.Rngs(0))
    config = jaxtrain.TrainConfig(epochs=1, batch_size=32)
    run(model, mse, data, None, config, run_dir=tmp_path / "run", session=RunOptions(console=console))
    header = console.file.getvalue()
    assert "  model:" in header and "layers.0  Linear  (32, 64)" in header
    model_info = json.loads((tmp_path / "run" / "summary.json").read_text())["model"]
    assert model_info["params"] == 32 * 64 + 64 + 64 * 8 + 8
    # A training step's matmuls: forward 2·B·W, weight gradients 2·B·W, input gradients 2·B·W of
    # every layer but the first (the data need none); then elementwise work (activations, Adam).
    matmuls = 4 * 32 * (32 * 64 + 64 * 8) + 2 * 32 * (64 * 8)
    assert matmuls <= model_info["flops_per_step"] <= 1.2 * matmuls


def test_summary_command_lists_every_module(capsys):
    from jaxtrain.tools.cli import main

    assert main(["summary", "mlp-regression", "--batch-size", "64", "--data.samples", "600",
                 "--data.val-samples", "100", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["params"] == sum(a * b + b for a, b in zip((128, 512, 512), (512, 512, 64)))
    matmuls = 4 * 64 * (128 * 512 + 512 * 512 + 512 * 64) + 2 * 64 * (512 * 512 + 512 * 64)
    assert matmuls <= summary["flops_per_step"] <= 1.1 * matmuls
    assert [r["output"] for r in summary["modules"] if r["path"].startswith("layers.")] == [
        "(64, 512)", "(64, 512)", "(64, 64)"]
    assert main(["summary", "mlp-regression", "--data.samples", "600", "--data.val-samples", "100"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mlp-regression: a training batch of 32") and "FLOPs per training step" in out
    np.testing.assert_equal(main(["summary"]), 2)
