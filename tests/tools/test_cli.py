"""The `jaxtrain` command: a smoke run, and one clear line with exit code 2 or 3 for bad input."""

import json
import subprocess
import sys

import numpy as np
import pytest

from jaxtrain._src.loop import RunOptions, run
from jaxtrain.tools.cli import main
from jaxtrain.tools.recipes.mlp_regression import RegressionDataConfig, make_data

TINY = ["--epochs", "1", "--data.samples", "2000", "--data.val-samples", "300", "--quiet"]


def test_train_smoke_prints_summaries_and_writes_the_run_dir(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", "mlp-regression", *TINY, "--verbosity", "summary", "--run-dir", str(run_dir)])  # over --quiet
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Epoch 1/1 Summary" in out
    for label in ("Train Loss:", "Val Loss:", "Epoch Time:", "Elapsed Time:", "TRAINING COMPLETE!",
                  "FINAL RESULTS:", "Best Val Loss:", "TIMING STATISTICS:", "Compile Time:", "Throughput:"):
        assert label in out, label
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock", "checkpoints", "config.json", "curves.png",
                                                        "metrics.jsonl", "model.json", "predict.json",
                                                        "summary.json", "tensorboard"]
    assert [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()] == [str(1700 // 32)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["recipe"] == "mlp-regression" and summary["epochs"] == 1
    assert summary["steps"] == 1700 // 32
    records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    (epoch,) = [r for r in records if r["kind"] == "epoch"]
    assert (summary["final_val_loss"], summary["final_val_mae"]) == (epoch["val_loss"], epoch["val_mae"])
    # One epoch beats predicting zero on the same 300 validation rows (mean y^2 ~0.40; measured ~0.22).
    _, val = make_data(RegressionDataConfig(samples=2000, val_samples=300))
    assert summary["final_val_loss"] < 0.75 * float(np.mean(val["y"].astype(np.float64) ** 2))
    config = json.loads((run_dir / "config.json").read_text())
    assert config["data"]["samples"] == 2000 and config["optim"]["lr"] == 1e-3


def test_default_run_dir_is_under_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "mlp-regression", *TINY, "--epochs", "1"]) == 0, capsys.readouterr().err
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("mlp-regression-") and (run / "summary.json").exists()


@pytest.mark.slow
def test_bad_input_in_a_subprocess_has_no_traceback():
    """The one test through `python -m jaxtrain`: the entry point's exit code and stderr, whole."""
    command = [sys.executable, "-m", "jaxtrain", "train", "mlp-regression", "--optim.lr", "-0.5"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    expected = "error: optim.lr=-0.5 must be a positive number; see `jaxtrain train mlp-regression --help`"
    assert proc.stderr.strip() == expected
    assert "Traceback" not in proc.stderr


def test_nan_loss_exits_3_naming_the_step(tmp_path, capsys):
    code = main(["train", "mlp-regression", *TINY, "--optim.name", "sgd", "--optim.lr", "10", "--run-dir",
                 str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 3 and out == ""  # --quiet: the error alone
    assert "Traceback" not in err
    assert err.startswith("error: loss became") and " at step " in err and err.count("\n") == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "stopped: non-finite loss"


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "no-such-recipe"],
         "error: unknown recipe 'no-such-recipe'; choose one of: alphazero, char-gpt, fashion-mnist-cnn, "
         "hdf5-sequence, mlp-regression, mnist-cnn"),
        (["train"], "error: missing recipe"),
        (["frobnicate"], "error: unknown command 'frobnicate'"),
        (["train", "mlp-regression", "--batch-size", "0"], "error: batch_size=0 must be an integer >= 1"),
        (["train", "mlp-regression", "--epochs", "0"], "error: epochs=0 must be an integer >= 1"),
        (["train", "mlp-regression", "--epochs", "many"], "error: Error parsing --epochs"),
        (["train", "mlp-regression", "--max-time", "10 minutes"], "error: --max-time '10 minutes' is not a duration"),
        (["train", "mlp-regression", "--checkpoint.every", "-1m"], "error: --checkpoint.every -1m is not a duration"),
        (["train", "mlp-regression", "--no-such-flag", "1"], "error: Unrecognized options: --no-such-flag"),
        (["train", "mlp-regression", "--epoch", "1"],  # tyro's guesses, flags alone
         "error: Unrecognized options: --epoch, 1 (did you mean --epochs or --steps-per-epoch?); see "),
        (["train", "mlp-regression", "--optim.name", "lion"],
         "error: invalid choice 'lion' for argument '--optim.name'"),
        (["train", "mlp-regression", "--data.samples", "100", "--data.val-samples", "10", "--batch-size", "500"],
         "error: batch_size=500 is larger than the training set (90 samples)"),
        (["bench", "nope"],
         "error: unknown benchmark 'nope'; choose one of: attention, checkpoint, data, ema, faults, frameworks, "
         "gpu, ladder, overhead, precision, predict, preprocess, profile, progress, remat, sameseed, scale, scan"),
    ],
)
def test_errors_are_one_line_with_exit_code_2(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(message), err
    assert err.count("\n") == 1


def test_bench_without_a_checkout_is_one_line_and_its_usage_still_prints(tmp_path, monkeypatch, capsys):
    # an installed wheel: no benchmarks/ beside the package (the checkout's own was found above: `bench nope`)
    from jaxtrain.tools import cli

    monkeypatch.setattr(cli, "CHECKOUT", tmp_path)
    assert main(["bench", "overhead", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: jaxtrain bench runs from a checkout of the repository: benchmarks/ is not "
                          "installed with the package") and err.count("\n") == 1
    assert main(["bench", "--help"]) == 0
    assert "jaxtrain bench overhead " in capsys.readouterr().out


def test_help_lists_every_field_with_its_default(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "mlp-regression", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--epochs", "--batch-size", "--optim.lr", "--optim.schedule", "--steps-per-call",
                 "--data.placement", "--run-dir", "--quiet", "--model.hidden"):
        assert flag in out, flag
    assert "default: 32" in out


def test_a_recipes_help_lists_the_flags_that_are_not_config_fields(capsys):
    # --preset, --resume and --overwrite are taken out before tyro parses the config, so tyro cannot list them.
    def help_of(*args: str) -> str:
        with pytest.raises(SystemExit) as info:
            main(list(args))
        assert info.value.code == 0
        return capsys.readouterr().out

    out = help_of("train", "char-gpt", "--preset", "seed", "--help")
    assert out.index("char-gpt: a GPT decoder") < out.index("--preset NAME") < out.index("--epochs")
    assert "presets (baby, seed, long)" in out
    assert "--resume [RUN_DIR]" in out and "--overwrite" in out
    out = help_of("train", "mlp-regression", "--help")  # no presets: no --preset line
    assert "--preset" not in out and "--resume [RUN_DIR]" in out
    out = help_of("summary", "char-gpt", "--help")  # not train's: --preset only
    assert "--preset NAME" in out and "--resume" not in out and "--overwrite" not in out


def test_recipes_lists_mlp_regression(capsys):
    assert main(["recipes"]) == 0
    assert "mlp-regression" in capsys.readouterr().out


def test_version_prints_the_packages_version(capsys):
    import jaxtrain
    from jaxtrain.tools.cli import USAGE

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"jaxtrain {jaxtrain.__version__}\n"
    assert "  --version " in USAGE


def test_a_command_without_help_of_its_own_prints_its_usage_lines(capsys):
    from benchmarks import BENCHMARKS
    from jaxtrain.tools.recipes import RECIPES

    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "jaxtrain train RECIPE --resume" in out and "eval" not in out
    assert f"recipes: {', '.join(sorted(RECIPES))} " in out
    assert main(["bench", "-h"]) == 0
    out = capsys.readouterr().out
    assert [name for name in BENCHMARKS if f"jaxtrain bench {name} " not in out] == []
    assert main(["data", "--help"]) == 0
    out = capsys.readouterr().out
    assert "jaxtrain data generate WORKLOAD" in out and "jaxtrain data inspect FILE" in out and "bench" not in out


@pytest.mark.parametrize("args, expected", [
    (["tune", "lr", "--help"], "usage: jaxtrain tune lr RECIPE"),  # not batch-size's help
    (["sample", "--help"], "--temperature FLOAT"),  # the options, without a run directory
    (["predict", "-h"], "--allow-nonfinite"),
    (["doctor", "--help"], "--expect-devices INT"),
])
def test_help_of_commands_with_their_own(args, expected, capsys):
    try:
        code = main(args)
    except SystemExit as e:  # tyro's help
        code = e.code
    assert code == 0
    assert expected in capsys.readouterr().out


def test_what_the_help_writes_down_agrees_with_its_source():
    # `jaxtrain recipes` and `tune --help` print copies, so that they import no JAX.
    from jaxtrain.tools import tune
    from jaxtrain.tools.cli import TUNE_CHECK_SAMPLES, TUNE_MAX_BATCH
    from jaxtrain.tools.recipes import CATALOG, RECIPES

    assert CATALOG == {name: recipe.description for name, recipe in RECIPES.items()}
    assert TUNE_MAX_BATCH == tune.MAX_BATCH and TUNE_CHECK_SAMPLES == tune.CHECK_SAMPLES


def test_plot_command_draws_a_run_and_rejects_other_directories(tmp_path, capsys):
    from conftest import mse, regression_data, silent, small_mlp

    from jaxtrain import TrainConfig

    run_dir = tmp_path / "run"
    config = TrainConfig(epochs=3, batch_size=16, log_every=4, steps_per_call=2)
    run(small_mlp(), mse, regression_data(160), regression_data(40), config, run_dir=run_dir, verbosity="summary",
        session=RunOptions(console=silent()))
    (run_dir / "curves.png").unlink()
    assert main(["plot", str(run_dir)]) == 0
    png = (run_dir / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert main(["plot", str(tmp_path / "nothing")]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("decades", [0.2, 6])
def test_the_loss_plot_labels_its_log_axes_with_plain_numbers_and_keeps_every_text_inside(tmp_path, decades):
    """The margins are fixed (not measured by tight_layout): every label, tick label, title and
    legend must still lie inside the figure, for losses within one decade and over six."""
    import matplotlib

    from jaxtrain._src.report.plots import loss_figure

    rows = []
    for e in range(1, 9):
        loss = 50 * 10 ** (-decades * e / 8)
        rows += [{"kind": "train", "step": 10 * e, "elapsed_s": e, "loss": loss * 1.1},
                 {"kind": "epoch", "epoch": e, "step": 10 * e, "elapsed_s": e, "train_loss": loss,
                  "val_loss": 1.4 * loss, "val_accuracy": 0.5 + 0.01 * e}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fig = loss_figure(tmp_path)
    try:
        fig.canvas.draw()
        renderer, box = fig.canvas.get_renderer(), fig.bbox
        texts = [fig._suptitle]  # what is drawn: ticks inside the axes' limits, labels, titles, legends
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                low, high = sorted(axis.get_view_interval())
                texts += [tick.label1 for tick in axis.get_major_ticks() + axis.get_minor_ticks()
                          if low <= tick.get_loc() <= high] + [axis.label]
            texts += [ax.title, *ax.get_legend().get_texts()]
        texts = [t for t in texts if t.get_visible() and t.get_text()]
        labels = [t.get_text() for ax in fig.axes[:2] for t in ax.get_yticklabels() if t.get_text()]
        assert labels and all("$" not in s and float(s) > 0 for s in labels), labels  # no TeX-like text
        for t in texts:
            extent = t.get_window_extent(renderer)
            assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0 and extent.y1 <= box.y1, \
                (t.get_text(), extent, box)
        for left, right in zip(fig.axes, fig.axes[1:]):  # a panel's y labels clear the panel to its left
            edge = left.get_window_extent(renderer).x1
            assert right.yaxis.get_tightbbox(renderer).x0 > edge
        assert len(texts) > 20  # tick labels, axis labels, legends and titles were all looked at
    finally:
        matplotlib.pyplot.close(fig)


def test_unknown_preset_and_preset_with_resume_are_one_line_errors(capsys):
    assert main(["train", "char-gpt", "--preset", "huge"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: unknown preset 'huge' for char-gpt; presets: baby, seed, long"
    assert main(["train", "mlp-regression", "--preset", "baby"]) == 2
    assert "presets: none" in capsys.readouterr().err


def test_resume_with_another_run_dir_is_one_line_and_records_nothing(tmp_path, capsys):
    """`--resume A --run-dir B` named two directories: refused before anything is read or written
    (it used to resume A and record B in A's config.json)."""
    run_a = tmp_path / "a"
    assert main(["train", "mlp-regression", "--resume", str(run_a), "--run-dir", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --resume {run_a} and --run-dir {tmp_path / 'b'} name two directories")
    assert "\n" not in err and list(tmp_path.iterdir()) == []


def test_sample_on_a_run_that_is_not_a_text_model_is_one_line_error(tmp_path, capsys):
    assert main(["sample", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip() == f"error: run directory {tmp_path / 'nope'} does not exist"


def test_resume_without_a_folder_finds_the_recipes_newest_run_whatever_its_name(tmp_path):
    import os

    from jaxtrain._src.errors import ConfigError
    from jaxtrain.tools.runs import latest_run

    for age, name, recipe in ((3, "mlp-regression-20261128-101500", "mlp-regression"), (2, "wide", "mlp-regression"),
                              (1, "gpt", "char-gpt"), (0, "notes", None)):
        run = tmp_path / name
        run.mkdir()
        if recipe is not None:
            (run / "config.json").write_text(json.dumps({"recipe": recipe, "epochs": 1}))
        os.utime(run, (1e9 - age, 1e9 - age))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{oops")
    assert latest_run("mlp-regression", tmp_path) == tmp_path / "wide"  # named by --run-dir, newer than the default
    assert latest_run("char-gpt", tmp_path) == tmp_path / "gpt"
    with pytest.raises(ConfigError, match="no run of mnist-cnn under"):
        latest_run("mnist-cnn", tmp_path)
