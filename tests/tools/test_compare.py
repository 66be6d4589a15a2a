"""`jaxtrain compare`: two tiny real runs side by side, and one-line errors for bad input."""

import json

import pytest

from jaxtrain._src.errors import ConfigError
from jaxtrain.tools.cli import main
from jaxtrain.tools.report.compare import compare_runs, flatten

TINY = ["--epochs", "2", "--data.samples", "600", "--data.val-samples", "100", "--model.hidden", "16",
        "--log-every", "5", "--checkpoint.no-enabled", "--no-tensorboard", "--quiet"]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    for name, lr in (("slow", "1e-3"), ("fast", "3e-3")):
        code = main(["train", "mlp-regression", *TINY, "--optim.lr", lr, "--run-dir", str(root / name)])
        assert code == 0
    return root / "slow", root / "fast"


def test_flatten_gives_dotted_keys_and_keeps_lists():
    assert flatten({"a": 1, "optim": {"lr": 0.1, "b": {"c": [1, 2]}}}) == {"a": 1, "optim.lr": 0.1,
                                                                          "optim.b.c": [1, 2]}


def test_compare_lists_the_differing_key_first_then_results(two_runs, tmp_path, capsys):
    out = tmp_path / "both.png"
    assert main(["compare", *map(str, two_runs), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    lines = [line for line in text.splitlines() if "│" in line]
    assert lines[0].split("│")[0].strip() == "optim.lr"  # the only differing key, before any result
    assert "0.001" in lines[0] and "0.003" in lines[0]
    assert not any("run_dir" in line for line in lines)  # differs between any two runs: not compared
    for label in ("final train loss", "best val loss", "final val mae", "samples/s", "compiled memory peak"):
        assert label in text
    assert out.is_file() and out.stat().st_size > 20_000  # two panels of curves, not an empty figure
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_comparison_labels_its_loss_axes_with_plain_numbers_as_the_runs_own_plots(two_runs, tmp_path,
                                                                                     monkeypatch):
    import matplotlib.pyplot as plt

    from jaxtrain.tools.report import compare

    drawn = []  # the figure, kept open instead of written
    monkeypatch.setattr(compare, "save_figure", lambda fig, path, make_parent=False: drawn.append(fig) or path)
    compare.plot_comparison(compare_runs(two_runs), tmp_path / "c.png")
    try:
        drawn[0].canvas.draw()
        labels = [t.get_text() for ax in drawn[0].axes for t in ax.get_yticklabels(which="both") if t.get_text()]
        assert labels and all("$" not in s and float(s) > 0 for s in labels), labels  # 0.06, not 6×10⁻²
    finally:
        plt.close(drawn[0])


def test_comparison_rows_come_from_the_summaries(two_runs):
    comparison = compare_runs(two_runs)
    assert [key for key, _ in comparison.differences] == ["optim.lr"]
    summaries = [json.loads((d / "summary.json").read_text()) for d in two_runs]
    rows = {label: (cells, best) for label, cells, best in comparison.results}
    cells, best = rows["final train loss"]
    losses = [s["final_train_loss"] for s in summaries]
    assert cells == [f"{v:.5g}" for v in losses]
    assert best == losses.index(min(losses))
    assert rows["steps"][0] == [f"{s['steps']:,}" for s in summaries]


def test_how_much_a_run_printed_is_not_a_difference(two_runs, tmp_path):
    loud = tmp_path / "loud"  # the fast run, as if it had run with --verbosity summary and without --quiet
    loud.mkdir()
    config = json.loads((two_runs[1] / "config.json").read_text())
    assert config["quiet"] is True
    config.update(quiet=False, verbosity="summary")
    (loud / "config.json").write_text(json.dumps(config))
    assert [key for key, _ in compare_runs([two_runs[0], loud]).differences] == ["optim.lr"]


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: p, "not a jaxtrain run directory (no config.json)"),
    (lambda p: (p / "config.json").write_text("{oops") and p, "config.json is not valid JSON"),
])
def test_bad_run_directories_are_one_line_errors(two_runs, tmp_path, capsys, make, message):
    bad = make(tmp_path)
    assert main(["compare", str(two_runs[0]), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


def test_no_run_or_a_bad_flag_is_a_usage_error(capsys):
    assert main(["compare"]) == 2
    assert main(["compare", "x", "--bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: usage: jaxtrain compare RUN_DIR... [--out FILE.png]"] * 2
    with pytest.raises(ConfigError, match="no run directory"):
        compare_runs([])


def test_a_run_without_summary_still_compares(two_runs, tmp_path, capsys):
    running = tmp_path / "running"
    running.mkdir()
    (running / "config.json").write_text((two_runs[0] / "config.json").read_text())
    rows = (two_runs[0] / "metrics.jsonl").read_text().splitlines()
    (running / "metrics.jsonl").write_text("\n".join(rows[:3]) + "\n" + rows[3][:20])  # last line cut short
    assert main(["compare", str(two_runs[1]), str(running), "--out", str(tmp_path / "c.png")]) == 0
    assert "no summary.json" in capsys.readouterr().out
