"""`jaxtrain bench xla-flags` runs in quick mode, each setting in a process that sees exactly its flags (never
how fast: tests do not time the machine); the verdicts are checked on hand-made repetitions, and every flag
the benchmark names must exist in this jaxlib (an unknown XLA flag aborts the process)."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import BENCHMARKS, xla_flags
from jaxtrain._src.errors import ConfigError
from jaxtrain.tools.cli import USAGE
from jaxtrain.tools.cli import main as cli_main


@pytest.mark.slow
def test_quick_run_passes_each_setting_its_own_flags(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")  # the user's: not given to the settings
    out = tmp_path / "xla"
    assert cli_main(["bench", "xla-flags", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "mlp-regression: ms per training step" in printed and "are not passed to the settings' processes" in printed
    results = json.loads((out / "results.json").read_text())
    assert {r["setting"]: r["xla_flags"] for r in results["runs"]} == {
        "baseline": "", "ynn-off": xla_flags.SETTINGS["ynn-off"]}
    rows = {r["setting"]: r for r in results["rows"]}
    assert rows["baseline"]["ratio"] == 1.0 and rows["baseline"]["verdict"] == "baseline"
    assert rows["ynn-off"]["ms_median"] > 0 and rows["ynn-off"]["verdict"] in ("faster", "slower",
                                                                               "no clear difference")
    assert rows["baseline"]["compile_s_median"] > 0 and rows["baseline"]["compile_ratio"] == 1.0
    # The suite sets JAX_COMPILATION_CACHE_DIR for every process it starts (unless told "" to compile
    # everything); the settings' children drop it, so their compile seconds are compiles, not cache loads.
    assert [r["compilation_cache"] for r in results["runs"]] == [None, None]
    assert "compile ratio" in printed


def test_verdicts_need_every_repetition_beyond_the_baselines_spread():
    def runs(base, other):
        return [{"rep": i, "setting": s, "results": {"w": {"ms_per_step": t}}}
                for s, ts in (("baseline", base), ("x", other)) for i, t in enumerate(ts)]

    def row(base, other):
        return [r for r in xla_flags.summarize(runs(base, other), ["baseline", "x"], ["w"]) if r["setting"] == "x"][0]

    assert row([10, 11, 12], [8, 9, 9.5])["verdict"] == "faster"
    assert row([10, 11, 12], [8, 9, 10.5])["verdict"] == "no clear difference"  # overlaps the baseline's range
    assert row([10, 11, 12], [13, 14, 12.5])["verdict"] == "slower"
    r = row([10, 10, 10], [5, 10, 20])
    assert r["ms_median"] == 10 and r["ms_min"] == 5 and r["ms_max"] == 20 and r["paired_ratios"] == [0.5, 1, 2]
    timed = [{"rep": i, "setting": s, "results": {"w": {"ms_per_step": 1.0, "compile_s": c}}}
             for s, cs in (("baseline", [2.0, 4.0, 3.0]), ("x", [1.0, 1.5, 9.0])) for i, c in enumerate(cs)]
    compiled = xla_flags.summarize(timed, ["baseline", "x"], ["w"])[1]
    assert compiled["compile_s_median"] == 1.5 and compiled["compile_ratio"] == 0.5  # medians: 1.5 against 3.0
    failed = xla_flags.summarize([{"rep": 0, "setting": "baseline", "results": {"w": {"ms_per_step": 1.0}}},
                                  {"rep": 0, "setting": "x", "error": "boom"}], ["baseline", "x"], ["w"])
    assert failed[1]["verdict"] == "failed" and failed[1]["error"] == "boom"


@pytest.mark.slow
def test_every_flag_named_exists_in_this_jaxlib():
    flags = " ".join(dict.fromkeys(f for v in xla_flags.SETTINGS.values() for f in v.split()))
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", "import jax; print(jax.numpy.ones(2).sum())"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "2.0", proc.stderr[-2000:]


def test_registered_and_bad_settings_are_one_line_errors():
    assert "xla-flags" in BENCHMARKS and "bench xla-flags" in USAGE
    with pytest.raises(ConfigError, match="unknown setting 'nope'"):
        xla_flags.XlaFlagsBenchConfig(settings="baseline,nope")
    with pytest.raises(ConfigError, match="workloads="):
        xla_flags.XlaFlagsBenchConfig(workloads="resnet")
    assert list(xla_flags.selected_settings(xla_flags.XlaFlagsBenchConfig(settings="extra", flags="--a --b"))) == [
        "baseline", *xla_flags.EXTRA, "custom"]
