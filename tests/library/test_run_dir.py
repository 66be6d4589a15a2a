"""A run directory is never corrupted: one process at a time, no finished run overwritten, honest
resume, a fresh start when there is nothing to resume, stop signals from the first moment, and
what a run prints (verbosity; plain lines in a piped log)."""

import ast
import io
import json
import os
import signal
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import jax
import optax
import pytest
from _runs import log_rows
from conftest import leaves_close, mse, regression_data, silent, small_mlp
from rich.console import Console

import jaxtrain
from jaxtrain import TrainConfig
from jaxtrain._src.checkpoint import Checkpointer
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.loop import RunOptions, TrainingStopped, run
from jaxtrain._src.run_guard import RunGuard
from jaxtrain._src.state import init_state
from jaxtrain.tools.cli import main

DATA = regression_data(160)
CONFIG = TrainConfig(epochs=2, batch_size=16, steps_per_call=5, tensorboard=False)


def _fit(run_dir, config=CONFIG, **kwargs):
    return run(small_mlp(), mse, DATA, None, config, run_dir=run_dir, verbosity="summary", **kwargs,
               session=RunOptions(console=silent()))


def _files(run_dir: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_a_live_run_directory_refuses_a_second_process_and_a_dead_ones_lock_does_not(tmp_path):
    run_dir = tmp_path / "run"
    with RunGuard(run_dir, {"recipe": "fit"}):  # a run that is still training holds the lock
        with pytest.raises(ConfigError) as e:
            _fit(run_dir)
        assert f"is in use by process {os.getpid()}" in _one_line(e)
        with pytest.raises(ConfigError, match="in use"):
            _fit(run_dir, resume=True)
    assert not run_dir.exists()  # the refused runs wrote nothing; the holder made it and left nothing in it
    # A lock file left by a process that died (SIGKILL) holds no lock: the kernel dropped it.
    run_dir.mkdir()
    (run_dir / ".lock").write_text(json.dumps({"pid": 999999, "host": "gone", "since": 0}))
    assert _fit(run_dir).summary["status"] == "completed"


def test_a_directory_holding_a_run_refuses_a_new_one_unless_overwrite(tmp_path):
    run_dir = tmp_path / "run"
    first = _fit(run_dir)
    before = _files(run_dir)
    with pytest.raises(ConfigError) as e:
        _fit(run_dir, config=TrainConfig(epochs=1, batch_size=16, tensorboard=False))
    assert "already holds a run (completed at step 20)" in _one_line(e) and 'resume="overwrite"' in str(e.value)
    assert e.value.run_dir == run_dir and "resume=True" in str(e.value)  # from Python: fit's arguments
    assert _files(run_dir) == before  # nothing written, nothing trained

    second = _fit(run_dir, config=TrainConfig(epochs=1, batch_size=16, steps_per_call=5, tensorboard=False),
                  resume="overwrite")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r.get("kind") == "epoch"] == [1]  # the first run's rows are gone
    assert Checkpointer(run_dir / "checkpoints", read_only=True).steps() == [10]
    assert json.loads((run_dir / "config.json").read_text())["epochs"] == 1
    assert second.summary["steps"] == 10 and first.summary["steps"] == 20


@pytest.mark.xla_defaults
def test_resume_refuses_settings_that_change_the_result_and_allows_more_epochs(tmp_path):
    run_dir = tmp_path / "run"
    _fit(run_dir)
    before = _files(run_dir)
    changed = TrainConfig(epochs=2, batch_size=32, seed=1, steps_per_call=5, tensorboard=False)
    with pytest.raises(ConfigError) as e:
        _fit(run_dir, config=changed, resume=True)
    assert "a resume cannot change batch_size 16 -> 32, seed 0 -> 1" in _one_line(e)
    with pytest.raises(ConfigError) as e:
        _fit(run_dir, config=TrainConfig(epochs=1, batch_size=16, steps_per_call=5, tensorboard=False), resume=True)
    assert "has trained 2 epochs; TrainConfig(epochs=1) is fewer: pass TrainConfig(epochs=2)" in _one_line(e)
    assert (e.value.epochs, e.value.epochs_trained, e.value.run_dir) == (1, 2, run_dir)
    assert _files(run_dir) == before

    more = TrainConfig(epochs=3, batch_size=16, steps_per_call=1, log_every=3, tensorboard=False)
    resumed = _fit(run_dir, config=more, resume=True)  # more epochs, another K and log interval: allowed
    straight = _fit(tmp_path / "straight", config=TrainConfig(epochs=3, batch_size=16, tensorboard=False))
    assert resumed.summary["steps"] == 30
    assert leaves_close(resumed.state.params, straight.state.params) <= 1e-6


@pytest.mark.xla_defaults
def test_resume_with_no_checkpoint_starts_from_the_beginning_and_equals_an_uninterrupted_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    # What a run killed in its first epoch leaves: its config and a few metrics rows, no checkpoint.
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"recipe": "fit", "epochs": 2}))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 3, "loss": 9.0}) + "\n")
    resumed = _fit(run_dir, resume=True)
    assert "has no complete checkpoint to resume yet; starting the run from the beginning" in capsys.readouterr().err
    straight = _fit(tmp_path / "straight")
    assert leaves_close(resumed.state.params, straight.state.params) == 0.0
    assert log_rows(run_dir) == log_rows(tmp_path / "straight")  # the old rows are gone, timings aside

    # No directory at all (killed before it was made): the CLI's --resume starts the run.
    missing = tmp_path / "missing"
    code = main(["train", "mlp-regression", "--data.samples", "300", "--data.val-samples", "100", "--epochs", "1",
                 "--quiet", "--no-tensorboard", "--resume", str(missing)])
    assert code == 0 and json.loads((missing / "summary.json").read_text())["status"] == "completed"


def test_a_resumed_run_keeps_the_best_checkpoint(tmp_path):
    _, state = init_state(small_mlp(), optax.sgd(0.1), jax.random.key(0))
    ckpt = Checkpointer(tmp_path, keep_last=2, keep_best=1)
    for step, loss in [(1, 0.1), (2, 0.5), (3, 0.6)]:
        ckpt.save(step, state, {}, {"val_loss": loss})
        ckpt.wait()
    ckpt.close()
    resumed = Checkpointer(tmp_path, keep_last=2, keep_best=1)  # a new process: scores come from disk
    resumed.save(4, state, {}, {"val_loss": 0.7})
    resumed.wait()
    assert resumed.steps() == [1, 3, 4] and resumed.best_step() == 1
    resumed.close()


def test_sigterm_during_start_up_stops_before_training_and_writes_the_status(tmp_path, monkeypatch):
    import jaxtrain._src.program as program

    real = program.make_feed

    def feed_then_sigterm(*args, **kwargs):  # SIGTERM arrives while the data are placed
        feed = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return feed

    monkeypatch.setattr(program, "make_feed", feed_then_sigterm)
    with pytest.raises(TrainingStopped) as e:
        _fit(tmp_path / "run")
    assert e.value.exit_code == 143 and "before training began" in _one_line(e)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "stopped by signal" and summary["steps"] == 0
    assert signal.getsignal(signal.SIGTERM) is not None  # fit put the previous handler back


@pytest.mark.slow
def test_sigterm_before_fit_ends_the_command_with_one_line(tmp_path):
    # SIGTERM while the recipe builds its data (before fit): one line, exit 143, nothing written.
    script = ("import os, signal, sys\n"
              "import jaxtrain.tools.runs as runs\n"
              "from jaxtrain.tools import cli\n"
              "from jaxtrain.tools.recipes import get_recipe\n"
              "recipe = get_recipe('mlp-regression')\n"
              "build = recipe.build\n"
              "object.__setattr__(recipe, 'build', lambda c: (os.kill(os.getpid(), signal.SIGTERM), build(c))[1])\n"
              "sys.exit(cli.main(sys.argv[1:]))\n")
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", script, "train", "mlp-regression", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143
    assert proc.stderr.strip().splitlines()[-1] == "stopped by SIGTERM before training started; nothing was written"
    assert not run_dir.exists()


def test_plot_that_cannot_be_written_is_one_line_and_out_writes_elsewhere(tmp_path, capsys):
    run_dir = tmp_path / "run"
    _fit(run_dir)
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "no-such-dir" / "c.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write") and "--out" in err and err.count("\n") == 1
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 1000


def _printed(verbosity: str, terminal: bool = False) -> str:
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=terminal)
    config = TrainConfig(epochs=1, batch_size=16, steps_per_call=2, log_every=4, tensorboard=False)
    run(small_mlp(), mse, DATA, None, config, verbosity=verbosity, session=RunOptions(console=console))
    return out.getvalue()


def test_verbosity_levels_and_plain_progress_lines_in_a_piped_log():
    piped = _printed("progress")
    lines = [line for line in piped.splitlines() if line.startswith("  epoch 1/1 step")]
    assert [line.split()[3] for line in lines] == ["4/10", "8/10"]  # one line per log interval
    assert all("loss" in line and "samples/s" in line and "ETA" in line for line in lines)
    assert "━" not in piped and "TRAINING COMPLETE!" in piped  # no bar characters in a file
    summary = _printed("summary")
    assert "Epoch 1/1 Summary" in summary and "  epoch 1/1 step" not in summary
    assert _printed("silent") == ""
    assert "━" in _printed("progress", terminal=True)  # a terminal gets the bar
    with pytest.raises(ConfigError, match="verbosity='loud' must be one of progress, summary, result, silent"):
        _printed("loud")


def test_every_imported_distribution_is_declared():
    # Optional packages (the trackers' mlflow and wandb, the sweep's optuna) are declared as extras
    # and imported only where they are used (test_api checks that `import jaxtrain` loads none).
    declared = {name.split(">")[0].split("<")[0].split("=")[0].split(";")[0].strip().lower().replace("_", "-")
                for name in metadata.requires("jaxtrain")
                if "extra ==" not in name or any(f'extra == "{x}"' in name for x in ("track", "sweep"))}
    src = Path(jaxtrain.__file__).parent
    modules = set()
    for path in src.rglob("*.py"):  # benchmarks/ (torch: the optional `bench` extra) is not in the package
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    providers = metadata.packages_distributions()
    third_party = {m for m in modules if m in providers and m != "jaxtrain"}
    missing = {m: providers[m] for m in third_party
               if not {d.lower().replace("_", "-") for d in providers[m]} & declared}
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    assert {"orbax", "tensorstore", "h5py", "tyro", "matplotlib"} <= third_party
