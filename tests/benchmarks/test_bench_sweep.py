"""`jaxtrain bench sweep`'s baseline without a sweep: N `jaxtrain train` commands in a shell loop,
drawing their rates as the sweep's random sampler does; and where a measured run's time went."""

import json

import pytest

from benchmarks import sweep as bench


def test_the_shell_loop_is_n_train_commands_over_the_swept_range(tmp_path):
    config = bench.SweepBenchConfig(trials=5)
    commands = bench._commands("mlp-regression", "shell", config, tmp_path)
    assert len(commands) == 5 and all(c[2:5] == ["jaxtrain", "train", "mlp-regression"] for c in commands)
    rates = [float(c[c.index("--optim.lr") + 1]) for c in commands]
    assert len(set(rates)) == 5 and all(1e-4 <= r <= 1e-2 for r in rates)
    assert len({c[c.index("--run-dir") + 1] for c in commands}) == 5
    assert bench._commands("mlp-regression", "shell", config, tmp_path) == commands  # the same draws each round
    (sweep,) = bench._commands("mlp-regression", "population 4", config, tmp_path)
    assert sweep[sweep.index("--population") + 1] == "4"


def test_a_population_s_compile_and_training_count_once_and_its_members_hooks_each(tmp_path):
    def trial(i: int, train_s: float, cached: bool) -> None:
        (tmp_path / f"trial-{i:04d}").mkdir()
        hooks = {"CheckpointHook": 0.5, "RunFilesHook": 0.25, "MetricsHook": 0.125, "_Report": 0.0625, "EvalHook": 1.0}
        profile = {"train_s": train_s, "compiles": [{"what": "train call", "cached": cached}], "hook_seconds": hooks}
        summary = {"compile_time_s": 2.0, "profile": profile}
        (tmp_path / f"trial-{i:04d}" / "summary.json").write_text(json.dumps(summary))

    for i, train_s in enumerate((3.0, 3.0, 1.0, 3.0, 4.0, 4.0)):  # trial 2 was pruned early
        trial(i, train_s, cached=i >= 3)  # two populations of 3
    hooks = {"checkpoints": 3.0, "run files": 2.25, "study": 0.375, "hooks": 6.0}  # six trials' hooks
    assert bench._split(tmp_path, "population 3") == ({"compile": 4.0, "train": 7.0, **hooks}, 1)
    assert bench._split(tmp_path, "sequential") == ({"compile": 12.0, "train": 18.0, **hooks}, 3)


def test_the_parts_name_the_hooks_that_exist():
    from jaxtrain._src.hooks import CheckpointHook, MetricsHook, RunFilesHook, TensorBoard
    from jaxtrain._src.hooks.evaluation import EvalHook
    from jaxtrain._src.hooks.progress import PlotHook
    from jaxtrain.tools.sweep import _Report

    parts = {hook.__name__: bench._part(hook.__name__) for hook in
             (CheckpointHook, RunFilesHook, MetricsHook, TensorBoard, PlotHook, _Report, EvalHook)}
    assert parts == {"CheckpointHook": "checkpoints", "RunFilesHook": "run files", "MetricsHook": "run files",
                     "TensorBoard": "run files", "PlotHook": "run files", "_Report": "study", "EvalHook": "hooks"}


@pytest.mark.slow
def test_sweep_benchmark_quick_runs_both_parts(capsys):
    # workers are tested in tests/tools/test_sweep.py (a benchmark round of them takes 11 s here); populations of 2
    quick = bench.SweepBenchConfig(quick=True, workloads=("mlp-regression",), modes=("sequential", "population"))
    assert bench.main(quick) == 0
    printed = capsys.readouterr().out
    assert "mlp-regression sequential: 2 trials in" in printed and "mlp-regression population 2: 2 trials" in printed
    assert "one trial at a time; target ≥ 2×" in printed and "mlp-regression: sweep best" in printed
    assert bench.main(bench.SweepBenchConfig(quick=True, modes=("parallel",))) == 2
    assert "unknown mode 'parallel'" in capsys.readouterr().err



def test_the_adaptive_arms_share_one_space_and_sampler_and_halving_refills_from_twice_the_trials(tmp_path):
    config = bench.SweepBenchConfig(parts=("adaptive",))
    commands = {arm: bench._adaptive_command("mlp-regression", arm, config, tmp_path) for arm in bench.ADAPTIVE_ARMS}
    value = lambda command, flag: command[command.index(flag) + 1] if flag in command else None  # noqa: E731
    assert {arm: (value(c, "--trials"), value(c, "--population"), value(c, "--scheduler"))
            for arm, c in commands.items()} == {"sequential": ("16", None, None), "population": ("16", "16", None),
                                                 "halving": ("32", "16", "halving"), "pbt": ("16", "16", "pbt")}
    assert len({(value(c, "--space"), value(c, "--sampler"), value(c, "--epochs")) for c in commands.values()}) == 1
