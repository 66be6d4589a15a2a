"""`jaxtrain bench sameseed --quick`: the runs of each arm, their bits compared, the kept decision reused (the
script's runs in-process here: the benchmark's own runs are fresh processes)."""

import json

from benchmarks import BENCHMARKS, sameseed
from jaxtrain._src import form_memory


def test_quick_sameseed_compares_the_runs_bits_and_reuses_the_kept_decision(monkeypatch, tmp_path, capsys):
    assert "sameseed" in BENCHMARKS

    def in_process(target, payload, env=None):  # the arm's compile cache: a folder of its own for the decisions
        assert target == "benchmarks.sameseed" and env["JAXTRAIN_FORM_MEMORY"] == (None if payload["cache"] else "off")
        monkeypatch.setattr(form_memory, "memory_dir", lambda: tmp_path / "forms" if payload["cache"] else None)
        return sameseed.train({**payload, "cache": None})  # the suite's compile cache stays as it is

    monkeypatch.setattr(sameseed, "run_child", in_process)
    out = tmp_path / "sameseed.json"
    assert sameseed.main(sameseed.SameSeedBenchConfig(quick=True, out=str(out))) == 0
    text = capsys.readouterr().out
    assert "kept: 2 runs, bit-identical" in text and "measured: 2 runs, bit-identical" in text
    results = json.loads(out.read_text())
    assert [r["decided"] for r in results["runs"]["kept"]] == ["measured", "reused"]
    assert [r["decided"] for r in results["runs"]["measured"]] == ["measured", "measured"]
    assert results["identical"] == {"kept": True, "measured": True} and results["load"] == 0
