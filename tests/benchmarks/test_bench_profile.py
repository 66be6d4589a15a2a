"""`jaxtrain bench profile` runs in quick mode and reports per-op times by category (never how fast:
tests do not time the machine); its parts are checked on hand-made inputs: the trace arithmetic, the
HLO classifier, the torch op categories, and the PyTorch side's skip notes."""

import json

import jax
import jax.numpy as jnp
import pytest

from benchmarks import benchmark
from benchmarks import profile as bench_profile
from benchmarks.profile import HloOp, ProfileBenchConfig, hlo_ops, jax_op_rows, torch_category
from jaxtrain.tools.cli import USAGE
from jaxtrain.tools.cli import main as cli_main


@pytest.mark.slow
def test_quick_run_prints_the_op_table_and_writes_results(tmp_path, capsys):
    out = tmp_path / "profile"
    assert cli_main(["bench", "profile", "--workload", "mlp-regression", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "jaxtrain mlp-regression: per HLO op, ms per training step" in printed
    assert "ms per training step by category" in printed
    assert "PyTorch side skipped: torch_models has no port of mlp-regression" in printed  # one line, no torch run

    results = json.loads((out / "results.json").read_text())
    jx = results["jax"]
    assert jx["source"] == "trace" and jx["module"] and jx["totals"]["steps"] == 2  # one traced call of K=2
    rows = jx["rows"]
    categories = {r["category"] for r in rows}
    assert {"matmul", "optimizer", "runtime gaps"} <= categories <= set(bench_profile.CATEGORIES)
    assert all(r["ms_per_step"] >= 0 and r["count_per_step"] >= 0 for r in rows)
    matmuls = [r for r in rows if r["category"] == "matmul"]
    assert matmuls and all(r["ms_per_step"] > 0 for r in matmuls)  # the MLP's dots, forward and backward
    assert sum(r["count_per_step"] for r in matmuls) >= 3  # at least one per layer
    for name in ("matmul", "optimizer"):
        assert any(line.split("│")[2].strip() == name for line in printed.splitlines() if line.count("│") > 3)
    comparison = results["comparison"]["none"]
    assert [c["category"] for c in comparison] == [c for c in bench_profile.CATEGORIES if c in
                                                   {c["category"] for c in comparison}]
    assert sum(c["jax_ms"] for c in comparison) == pytest.approx(sum(r["ms_per_step"] for r in rows), rel=1e-9)
    assert all(c["torch_ms"] is None for c in comparison) and results["torch"] == {}
    assert (out / "profile.png").stat().st_size > 1000
    assert list((out / "jax-trace").glob("plugins/profile/*/*.trace.json.gz"))


def test_trace_arithmetic_on_hand_made_events():
    ops = {"while.1": HloOp("while", "control/scalar", "", False), "dot.1": HloOp("dot", "matmul", "dot", False),
           "add.1": HloOp("add", "elementwise", "add", False)}

    def event(op, ts, dur, run="1"):
        return {"ph": "X", "name": op, "ts": ts, "dur": dur,
                "args": {"hlo_module": "jit_call", "hlo_op": op, "run_id": run}}

    def end(op, ts):  # an asynchronous thunk's completion
        return {"ph": "X", "name": f"end: {op}", "ts": ts, "dur": 0.0, "args": {}}

    # one call of K=2 steps: the loop (asynchronous) spans 0..100 µs; dots (asynchronous: their events end
    # at 20 and 60) run 10..40 and 50..80; adds 35..45 (beside a dot) and 85..90, no end events; a different
    # module's event is ignored
    events = [event("while.1", 0, 3), event("dot.1", 10, 10), end("dot.1", 40), event("dot.1", 50, 10),
              end("dot.1", 80), event("add.1", 35, 10), event("add.1", 85, 5), end("while.1", 100),
              {"ph": "X", "name": "x", "ts": 0, "dur": 1e6, "args": {"hlo_module": "other", "hlo_op": "x",
                                                                    "run_id": "2"}}]
    rows, totals = jax_op_rows(events, "jit_call", ops, steps_per_call=2)
    by = {r["op"]: r for r in rows}
    assert set(by) == {"dot.1", "add.1", "(runtime gaps)"}  # the while is not a row
    assert by["dot.1"]["op_ms_per_step"] == pytest.approx(0.030) and by["dot.1"]["count_per_step"] == 1
    assert by["add.1"]["op_ms_per_step"] == pytest.approx(0.0075)
    # wall shares: 35..40 ran a dot and an add, 2.5 µs to each
    assert by["dot.1"]["ms_per_step"] == pytest.approx((27.5 + 30) / 2 / 1e3)
    assert by["add.1"]["ms_per_step"] == pytest.approx((7.5 + 5) / 2 / 1e3)
    busy = (45 - 10) + (80 - 50) + (90 - 85)  # µs covered by some op: 70
    assert sum(r["ms_per_step"] for r in rows) == pytest.approx(totals["span_ms_per_step"])
    assert totals["busy_ms_per_step"] == pytest.approx(busy / 2 / 1e3)
    assert by["(runtime gaps)"]["ms_per_step"] == pytest.approx((100 - busy) / 2 / 1e3)
    assert totals["overlap_ms_per_step"] == pytest.approx(5 / 2 / 1e3)  # add 35..40 ran beside the dot
    assert totals["calls"] == 1 and totals["steps"] == 2 and totals["span_ms_per_step"] == pytest.approx(0.05)


def test_hlo_classifier_on_a_compiled_program():
    def fn(w, x, i):
        y = jnp.take(x, i, axis=0) @ w  # gather, then a dot
        return jnp.tanh(y).sum(axis=1), y.T * 2.0

    x, w, i = jnp.ones((16, 32)), jnp.ones((32, 8)), jnp.arange(4)
    module, ops = hlo_ops(jax.jit(fn).lower(w, x, i).compile().as_text())
    assert module.startswith("jit_fn")
    categories = {op.category for op in ops.values()}
    assert {"matmul", "gather/scatter"} <= categories, ops
    assert all(op.category in bench_profile.CATEGORIES for op in ops.values())
    dots = [op for op in ops.values() if op.category == "matmul"]
    assert any("dot_general" in op.source and "test_bench_profile.py" in op.source for op in dots)


def test_torch_ops_are_grouped_into_the_same_categories():
    cases = {("aten::mm", ()): "matmul", ("aten::addmm", ()): "matmul", ("aten::convolution_backward", ()):
             "convolution", ("aten::native_layer_norm", ()): "reduce", ("aten::gelu_backward", ()): "elementwise",
             ("aten::embedding_dense_backward", ()): "gather/scatter", ("aten::transpose", ()): "copy/transpose",
             ("aten::_fused_adamw_", ()): "optimizer", ("aten::mul_", (bench_profile.OPTIMIZER_SCOPE,)): "optimizer",
             ("aten::fill_", ("aten::_scaled_dot_product_flash_attention_for_cpu",)): "attention",
             ("autograd::engine::evaluate_function: MmBackward0", ()): "runtime gaps"}
    for (name, ancestors), category in cases.items():
        assert torch_category(name, list(ancestors)) == category, name


def test_torch_side_is_skipped_with_one_line_when_absent(monkeypatch):
    monkeypatch.setattr(bench_profile, "torch_available", lambda: False)
    results, notes = bench_profile._torch_runs(ProfileBenchConfig(workload="mnist-cnn"), console=None)
    assert results == {} and len(notes) == 1 and notes[0].startswith("PyTorch side skipped: torch is not installed")
    results, notes = bench_profile._torch_runs(ProfileBenchConfig(workload="mnist-cnn", torch=False), console=None)
    assert results == {} and notes == ["PyTorch side not run (--no-torch)"]


def test_registered_and_bad_settings_are_one_line_errors(capsys):
    assert benchmark("profile") == (ProfileBenchConfig, bench_profile.main)
    assert "bench profile --workload char-gpt|mnist-cnn|mlp-regression" in USAGE
    assert cli_main(["bench", "profile", "--steps", "3", "--steps-per-call", "2"]) == 2
    assert "steps=3 must be a multiple of steps_per_call=2" in capsys.readouterr().err
    assert cli_main(["bench", "profile", "--warmup", "1"]) == 2
    assert "warmup=1 must be an integer >= 2" in capsys.readouterr().err
