"""`jaxtrain bench shortrun --quick`: both whole processes run and learn the same thing (not a timing test);
the ratio table says what it measures, the target and whether it is met."""

import json

import pytest
from rich.console import Console

from benchmarks import BENCHMARKS
from benchmarks.shortrun import CLASSIFIER, ShortRunBenchConfig, main, print_table, ratio_rows

ACCURACY_TOLERANCE = 0.05  # same data, model and optimizer; only the dropout keys differ between the two


@pytest.mark.slow  # two whole processes
def test_quick_shortrun_runs_both_scripts_to_the_same_accuracy(tmp_path, capsys):
    assert "shortrun" in BENCHMARKS
    out = tmp_path / "shortrun.json"
    assert main(ShortRunBenchConfig(quick=True, conv="", out=str(out))) == 0  # the conv arm: see below
    text = capsys.readouterr().out
    assert f"{CLASSIFIER}: jaxtrain.fit / hand-written wall time" in text and "target <= 1.1x" in text
    results = json.loads(out.read_text())
    fit_run, = results["runs"][CLASSIFIER]["fit"]
    hand_run, = results["runs"][CLASSIFIER]["hand"]
    assert fit_run["accuracy"] > 0.3 and hand_run["accuracy"] > 0.3  # 10 classes: chance is 0.1
    assert abs(fit_run["accuracy"] - hand_run["accuracy"]) <= ACCURACY_TOLERANCE
    assert fit_run["peak_rss_bytes"] > 0 and results["rows"][0]["ratio"] > 0


def test_the_ratio_table_gives_each_workloads_median_ratio_against_the_target():
    run = lambda s: {"wall_s": s, "peak_rss_bytes": 2**20}  # noqa: E731
    runs = {"classifier": {"hand": [run(10), run(11), run(30)], "fit": [run(10.5), run(12), run(11)]},
            "conv": {"hand": [run(4)], "fit": [run(6)]}}
    rows = ratio_rows(runs)
    assert [(r["workload"], r["ratio"], r["met"]) for r in rows] == [("classifier", 1.0, True), ("conv", 1.5, False)]
    assert rows[0]["pairs"] == pytest.approx(1.05) and rows[1]["pairs"] == 1.5  # 10.5/10, 12/11, 11/30: the middle
    console = Console(record=True, width=200)
    print_table(console, runs, rows)
    text = console.export_text()
    assert ("classifier: jaxtrain.fit / hand-written wall time: 1.000x (target <= 1.1x: met; the runs' own ratios: "
            "median 1.050x)") in text
    assert "conv: jaxtrain.fit / hand-written wall time: 1.500x (target <= 1.1x: MISSED;" in text
