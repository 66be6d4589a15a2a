"""`jaxtrain bench scale`: the HLO collective counter on hand-written HLO, and the quick run.

The quick run starts one child process with 4 virtual CPU devices (about 15 s on 2 cores); its
figures are checked for what does not depend on the machine: which meshes ran, bytes per device,
collectives present or absent, and agreement with one device (1e-5, as tests/library/test_sharding.py).
"""

import json

import pytest

from benchmarks import benchmark, scale

# A K=8 call: the scan's body (trip count 8) holds an all-reduce of 1 KiB over 4 devices, a
# reduce-scatter whose result is 256 B per device of 2 (S = 512 B) and an async all-gather of 2 KiB;
# one all-gather of 4 KiB runs after the loop, once per call.
HLO = """HloModule jit_multi_step, is_scheduled=true, num_partitions=4

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add = f32[] add(%x, %y)
}

%body (p: (s32[], f32[256])) -> (s32[], f32[256]) {
  %p = (s32[], f32[256]{0}) parameter(0)
  %g = f32[256]{0} get-tuple-element(%p), index=1
  %all-reduce.1 = f32[256]{0} all-reduce(%g), channel_id=1, replica_groups=[1,4]<=[4], to_apply=%add
  %reduce-scatter.2 = f32[64]{0} reduce-scatter(%g), channel_id=2, replica_groups={{0,1},{2,3}}, to_apply=%add
  %all-gather-start.3 = (f32[128]{0}, f32[512]{0}) all-gather-start(%g), replica_groups=mesh['a'=4,'b'=1] {'a'}
  %all-gather-done.3 = f32[512]{0} all-gather-done(%all-gather-start.3)
  ROOT %t = (s32[], f32[256]{0}) tuple(%i, %all-reduce.1)
}

%cond (p.1: (s32[], f32[256])) -> pred[] {
  %p.1 = (s32[], f32[256]{0}) parameter(0)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (a: f32[256]) -> f32[1024] {
  %a = f32[256]{0} parameter(0)
  %w = (s32[], f32[256]) while(%i), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"8"}}
  %r = f32[256]{0} get-tuple-element(%w), index=1
  ROOT %all-gather.9 = f32[1024]{0} all-gather(%r), channel_id=4, replica_groups={}, dimensions={0}
}
"""


def test_collective_stats_counts_each_execution_at_the_whole_arrays_bytes():
    stats = scale.collective_stats(HLO, devices=4, steps=8)
    kinds = stats["kinds"]
    assert kinds["all-reduce"] == {"count": 1, "bytes": 1024, "sent": 1024 * 2 * 3 / 4}
    assert kinds["reduce-scatter"] == {"count": 1, "bytes": 512, "sent": 512 * 1 / 2}
    # One all-gather per step in the loop (the async pair counted once, at its done) plus one per call.
    assert kinds["all-gather"]["count"] == 1 + 1 / 8
    assert kinds["all-gather"]["bytes"] == 2048 + 4096 / 8
    assert kinds["all-gather"]["sent"] == (2048 + 4096 / 8) * 3 / 4
    assert stats["bytes"] == 1024 + 512 + 2048 + 512 and stats["unknown_trip_counts"] == 0
    assert kinds["all-to-all"]["count"] == kinds["collective-permute"]["count"] == 0
    # Without the trip count the loop is assumed to run `steps` times, and says so.
    unknown = scale.collective_stats(HLO.replace('backend_config={"known_trip_count":{"n":"8"}}', ""), 4, 8)
    assert unknown["bytes"] == stats["bytes"] and unknown["unknown_trip_counts"] == 1


@pytest.mark.slow
def test_scale_benchmark_quick_run(tmp_path, capsys):
    assert benchmark("scale") == (scale.ScaleBenchConfig, scale.main)
    out = tmp_path / "scale.json"
    assert scale.main(scale.ScaleBenchConfig(quick=True, out=str(out))) == 0
    printed = capsys.readouterr().out
    for mesh in scale.MESHES:
        assert f"│ {mesh} " in printed  # the table is printed 160 columns wide when not on a terminal
    assert "Step times are not scaling figures" in printed and "target <= 0.3: met" in printed

    results = json.loads(out.read_text())
    rows = {r["mesh"]: r for r in results["meshes"]}
    assert list(rows) == list(scale.MESHES)
    assert [rows[m]["devices"] for m in scale.MESHES] == [1, 2, 4, 2, 4, 4]
    for r in rows.values():
        assert r["state_bytes"] == r["state_bytes_predicted"]  # the shards hold what the layout's rule says
        assert r["max_param_rel_diff"] <= 1e-5 and r["max_loss_rel_diff"] <= 1e-5, r["mesh"]
        assert r["memory"]["peak"] >= r["state_bytes"] and r["ms_per_step"] > 0
        assert r["collectives"]["unknown_trip_counts"] == 0
    # Data parallelism keeps everything on every device; fsdp=4 keeps about a quarter.
    assert rows["data=4"]["state_bytes"] == rows["data=1"]["state_bytes"]
    ratio = rows["fsdp=4"]["state_bytes"] / rows["data=4"]["state_bytes"]
    assert ratio <= scale.FSDP_TARGET and results["fsdp_over_dp_state_bytes"] == pytest.approx(ratio)
    # One device moves nothing; data parallelism all-reduces the gradients (every parameter) and
    # the step's scalar metrics, once per step.
    assert rows["data=1"]["collectives"]["bytes"] == 0
    all_reduce = rows["data=4"]["collectives"]["kinds"]["all-reduce"]
    assert results["param_bytes"] <= all_reduce["bytes"] <= results["param_bytes"] + 1024
    assert rows["data=4"]["collectives"]["bytes"] == all_reduce["bytes"] > 0
    # FSDP as ZeRO-3: the weights gathered once and the gradients reduced once per step, about 2x
    # data parallelism's bytes; left to propagation, XLA moved activations instead (6.7x on char-gpt).
    fsdp = rows["fsdp=4"]["collectives"]["kinds"]
    assert fsdp["all-gather"]["bytes"] >= 0.9 * results["param_bytes"]
    assert all_reduce["bytes"] < rows["fsdp=4"]["collectives"]["bytes"] <= 2.2 * all_reduce["bytes"]


def test_compile_only_meshes_are_the_fit_step_on_each_mesh():
    # No prototype rows: every compiled mesh is the step fit builds (gather_params/split_grads).
    assert scale.compile_meshes(8) == ("data=1", "data=8", "fsdp=8", "data=2,fsdp=4")
