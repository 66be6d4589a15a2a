"""`jaxtrain bench selfplay` runs in quick mode and reports what it measured (never how fast: tests
do not time the machine)."""

import json
import math

import pytest

from benchmarks import benchmark
from benchmarks.selfplay import VARIANTS, SelfPlayBenchConfig, main
from jaxtrain.tools.cli import USAGE
from jaxtrain.tools.cli import main as cli_main


@pytest.mark.slow
def test_quick_run_prints_every_row_and_writes_json_and_png(tmp_path, capsys):
    out = tmp_path / "selfplay"
    assert main(SelfPlayBenchConfig(quick=True, out=str(out))) == 0
    printed = capsys.readouterr().out
    for label in VARIANTS.values():
        assert label in printed
    assert "n=6, k=3" in printed and "n=14, k=4" in printed and "updates/s" in printed
    assert "not judged" in printed  # quick mode runs other settings than the targets'

    results = json.loads((out / "results.json").read_text())
    rows = results["selfplay"]
    # Quick mode: every variant at n=6; the Python rows only at n=14, timed on a few moves.
    assert [(r["n"], r["variant"]) for r in rows] == [(6, v) for v in VARIANTS] + [
        (14, "python_eager"), (14, "python_jit")]
    for r in rows:
        assert r["ms_per_game"] > 0 and r["games_per_s"] > 0 and r["moves_per_game"] > 0 and r["speedup"] > 0
        assert r["games_per_s"] == pytest.approx(1e3 / r["ms_per_game"], rel=1e-12)
        before = next(b for b in rows if b["n"] == r["n"] and b["variant"] == "python_eager")
        assert r["speedup"] == pytest.approx(before["ms_per_game"] / r["ms_per_game"], rel=1e-12)
        if r["variant"].startswith("python"):
            assert 0 < r["network_share"] <= 1 and r["games_per_call"] == 1
        else:
            assert r["compile_s"] > 0 and r["games_per_call"] == 4 and r["network_share"] is None
        assert r["moves_per_game"] <= {6: 15, 14: 91}[r["n"]]
    assert all("extrapolated" in r["how"] for r in rows if r["n"] == 14)
    [train] = results["training"]
    assert train["batch"] == 32 and train["updates_per_s"] > 0 and train["samples_per_s"] > 0
    assert train["replay_positions"] > 0 and math.isfinite(train["loss"])
    assert all(goal["met"] is None and goal["measured"] > 0 for goal in results["targets"].values())
    assert (out / "selfplay.png").stat().st_size > 1000


def test_registered_and_bad_settings_are_one_line_errors(capsys):
    assert benchmark("selfplay") == (SelfPlayBenchConfig, main)
    assert "bench selfplay [OPTIONS]" in USAGE
    assert cli_main(["bench", "selfplay", "--simulations", "0"]) == 2
    assert "--simulations 0 must be >= 1" in capsys.readouterr().err
