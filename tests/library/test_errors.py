"""Library messages name settings once and render them for the caller: Python (`TrainConfig(batch_size=64)`)
from `jaxtrain.fit`, flags (`--batch-size 64`) under the `jaxtrain` command. No library module spells a flag."""

import dataclasses
import pickle
import re
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

import jaxtrain._src as core
from jaxtrain._src import config as config_module
from jaxtrain._src.config import TrainConfig
from jaxtrain._src.data.generate import check_arguments
from jaxtrain._src.errors import (
    SECTIONS,
    TOP,
    ConfigError,
    JaxtrainError,
    NonFiniteLossError,
    argument,
    render,
    rendering,
    resume_advice,
    setting,
    style,
)
from jaxtrain._src.feeds import epoch_steps
from jaxtrain.tools.cli import main

SRC = Path(core.__file__).parent
FLAG = re.compile(r"--[a-z][a-z0-9._-]*")
# Flag text still allowed, with why: (file relative to _src, exact text).
ALLOWED: set[tuple[str, str]] = set()


def test_no_library_module_spells_a_command_line_flag():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if FLAG.search(line) and not any(rel == f and text in line for f, text in ALLOWED):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "library text names command-line flags (use errors.setting/argument):\n" + "\n".join(found)


def test_every_setting_a_library_message_names_exists():
    """`setting("data.placement", ...)` in any library module names a field of the config class it renders as."""
    names = set()
    for path in SRC.rglob("*.py"):
        names |= set(re.findall(r"""\bsetting\(\s*["']([\w.]+)["']""", path.read_text(encoding="utf-8")))
    assert {"batch_size", "mesh", "data.placement", "epochs", "dist.coordinator"} <= names
    for name in names:
        section, _, field = name.rpartition(".")
        cls = getattr(config_module, SECTIONS[section] if section else TOP)
        assert field in {f.name for f in dataclasses.fields(cls)}, name
    for section, cls_name in SECTIONS.items():
        if section != "dist":  # a recipe's setting, not TrainConfig's
            assert type(getattr(TrainConfig(), section)).__name__ == cls_name


def test_an_error_renders_for_python_and_for_the_command_line():
    with pytest.raises(ConfigError) as e:
        epoch_steps(TrainConfig(batch_size=64), 10)
    assert style() == "python"
    assert str(e.value).endswith("use TrainConfig(batch_size=10) or less")
    assert e.value.for_python() == str(e.value)
    assert e.value.for_cli().endswith("use --batch-size 10 or less")
    assert (e.value.batch_size, e.value.num_samples) == (64, 10)  # the facts, for a caller that acts on them
    with rendering("cli"):
        assert str(e.value) == e.value.for_cli()
    assert style() == "python"
    again = pickle.loads(pickle.dumps(e.value))
    assert str(again) == str(e.value) and again.num_samples == 10

    overwrite = argument("overwrite", True, python='resume="overwrite"')
    text = (f"{setting('data.placement', 'stream')} {setting('data.memory_budget_gb')} {setting('tensorboard', False)} "
            f"{setting('checkpoint.enabled', False)} {setting('steps_per_epoch', placeholder='N')} "
            f"{overwrite} {argument('run_dir')} {argument('out', placeholder='FILE.png')}")
    assert render(text) == ('DataConfig(placement="stream") DataConfig.memory_budget_gb TrainConfig(tensorboard=False) '
                            "CheckpointConfig(enabled=False) TrainConfig(steps_per_epoch=N) "
                            'resume="overwrite" run_dir '

                            "out=FILE.png")
    assert render(text, "cli") == ("--data.placement stream --data.memory-budget-gb --no-tensorboard "
                                   "--checkpoint.no-enabled --steps-per-epoch N --overwrite --run-dir --out FILE.png")
    nan = NonFiniteLossError(7, float("nan"))
    assert 'TrainConfig(on_nan="skip")' in str(nan) and "--on-nan skip" in nan.for_cli()
    assert pickle.loads(pickle.dumps(nan)).step == 7 and nan.exit_code == 3


def test_the_command_line_prints_flags_and_python_gets_arguments(tmp_path, capsys):
    out = tmp_path / "d.h5"
    out.write_bytes(b"")
    with pytest.raises(ConfigError) as e:
        check_arguments("mlp-regression", out, 10, 128, None, "none", 0, False)
    assert "pass force=True to replace it" in str(e.value) and e.value.path == out
    assert main(["data", "generate", "mlp-regression", str(out), "--samples", "10"]) == 2
    assert capsys.readouterr().err == f"error: {out} exists; pass --force to replace it, or choose another file name\n"
    assert style() == "python"  # the command gives the style back when it returns


def test_resume_advice_names_fit_arguments_from_python_and_the_flag_from_the_command_line(tmp_path):
    from jaxtrain._src.config import CheckpointConfig
    from jaxtrain._src.hooks.checkpointing import CheckpointHook
    from jaxtrain._src.loop import TrainingStopped

    run_dir = tmp_path / "run"
    hook = CheckpointHook(run_dir / "checkpoints", CheckpointConfig(), name="mlp-regression")
    import jax
    import optax
    from conftest import small_mlp

    from jaxtrain._src.state import init_state

    state = init_state(small_mlp(), optax.sgd(0.1), jax.random.key(0))[1]
    run = SimpleNamespace(step=0, state=state, feed=SimpleNamespace(arrays=lambda: None))
    hook.on_start(run)
    hook.ckpt.close()
    stopped = TrainingStopped(signal.SIGTERM, 5, run.resume_hint)
    assert str(stopped) == (f'stopped by SIGTERM at step 5; checkpoint saved; resume with: '
                            f'jaxtrain.fit(..., run_dir="{run_dir}", resume=True)')
    assert stopped.for_cli().endswith(f"resume with: jaxtrain train mlp-regression --resume {run_dir}")
    assert stopped.exit_code == 128 + signal.SIGTERM
    assert render(resume_advice("runs/a b"), "cli") == "--resume 'runs/a b'"  # a command the shell takes as is


def test_a_run_directory_holding_a_run_says_how_to_continue_it(tmp_path):
    from jaxtrain._src.run_guard import RunGuard

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError) as e, RunGuard(tmp_path, {}):
        pass
    python, cli = str(e.value), e.value.for_cli()
    assert f'jaxtrain.fit(..., run_dir="{tmp_path}", resume=True)' in python and 'resume="overwrite"' in python
    assert f"continue it with --resume {tmp_path}, choose another --run-dir, or pass --overwrite" in cli
    assert e.value.run_dir == tmp_path
    assert isinstance(e.value, JaxtrainError) and e.value.exit_code == 2
