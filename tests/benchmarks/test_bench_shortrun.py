"""`jaxtrain bench shortrun --quick`: both whole processes run and learn the same thing (not a timing test)."""

import json

import pytest

from benchmarks import BENCHMARKS
from benchmarks.shortrun import ShortRunBenchConfig, main

ACCURACY_TOLERANCE = 0.05  # same data, model and optimizer; only the dropout keys differ between the two


@pytest.mark.slow  # two whole processes
def test_quick_shortrun_runs_both_scripts_to_the_same_accuracy(tmp_path, capsys):
    assert "shortrun" in BENCHMARKS
    out = tmp_path / "shortrun.json"
    assert main(ShortRunBenchConfig(quick=True, out=str(out))) == 0
    text = capsys.readouterr().out
    assert "jaxtrain.fit / hand-written wall time" in text and "target <= 1.1x" in text
    results = json.loads(out.read_text())
    fit_run, = results["runs"]["jaxtrain.fit"]
    hand_run, = results["runs"]["hand-written jit + lax.scan"]
    assert fit_run["accuracy"] > 0.3 and hand_run["accuracy"] > 0.3  # 10 classes: chance is 0.1
    assert abs(fit_run["accuracy"] - hand_run["accuracy"]) <= ACCURACY_TOLERANCE
    assert fit_run["peak_rss_bytes"] > 0 and results["ratio"] > 0
