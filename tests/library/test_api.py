"""The public API is explicit and pinned; `import jaxtrain` loads the library alone."""

import subprocess
import sys

import pytest

import jaxtrain

PUBLIC = {
    "CheckpointConfig", "CheckpointError", "ConfigError", "DataConfig", "DataError", "DistConfig",
    "EarlyStoppingConfig", "FitResult", "Hook", "JaxtrainError", "LambdaHook", "Member", "NonFiniteLossError",
    "OptimConfig", "RESUMABLE", "Refill", "RunView", "Slot", "TrainConfig", "TrainState", "TrainingStopped",
    "build_optimizer", "build_schedule", "data", "distributed", "enable_compile_cache", "evaluate", "export", "fit",
    "fit_population", "hooks", "limit_free_heap", "load", "load_weights", "log_learning_rate", "metrics", "models",
    "predict", "remat", "save_weights",
}
ENGINE = {
    "Augment", "COMPILE_CACHE_ENV", "Checkpointer", "Forward", "GenerateResult", "Layout", "LossFn", "MAX_SEED",
    "PER_MEMBER", "Preprocess", "ProfileBudgetReached", "Program", "Run", "RunGuard", "RunHook", "RunOptions",
    "WORKLOADS", "abstract_batch", "argument", "atomic_write", "attention_path", "budget_bytes", "build_program",
    "check_export_directory", "check_export_platforms", "check_generate_arguments", "check_path_length",
    "check_target", "checkpoint_steps", "command_cache_dir", "compiled_memory", "cudnn_attention",
    "device_description", "epoch_steps", "evaluate_state", "flat_dict", "format_bytes", "from_dict", "from_spec",
    "hdf5_reason", "heads_major_attention", "imports_outside_gc", "load_with_step", "lock_directory",
    "log_scale_with_plain_labels", "loop_body_counted_once", "make_evaluate", "make_layout", "matmul_rate",
    "measure_matmul_rate", "memory_lines", "missing_package", "model_summary", "optimizer_structure", "plot_run",
    "predict_batches", "profile_lines", "read_config", "record_matmul_rate", "refuse_links", "refuse_same_file",
    "regression_rows", "release_compiled_programs", "remove_partials", "rendering", "require", "rows_text", "run",
    "sample_gpt", "save_figure", "setting", "solver_player", "standard_matmul_size", "summary_lines", "to_dict",
    "to_spec", "write_text",
}


def test_public_names_are_pinned_and_sorted():
    assert jaxtrain.__all__ == sorted(jaxtrain.__all__)
    assert set(jaxtrain.__all__) == PUBLIC
    for name in jaxtrain.__all__:
        assert hasattr(jaxtrain, name), name


def test_each_name_loads_from_the_module_type_checkers_are_shown():
    # `import jaxtrain` is lazy: `_HOMES` says where each name comes from at run time, the
    # `if TYPE_CHECKING:` imports say it to type checkers and readers; they must not drift apart.
    import ast
    from pathlib import Path

    tree = ast.parse(Path(jaxtrain.__file__).read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING"]
    shown = {alias.name: node.module for node in block.body for alias in node.names}
    assert shown == {**jaxtrain._HOMES, **{m: "jaxtrain" for m in jaxtrain._MODULES}}
    assert set(jaxtrain.__all__) <= set(dir(jaxtrain))


def test_fit_takes_at_most_twelve_parameters():
    import inspect

    assert len(inspect.signature(jaxtrain.fit).parameters) <= 12


@pytest.mark.slow  # a fresh process
def test_import_jaxtrain_loads_no_tool_and_no_heavy_optional_library():
    code = ("import sys, jaxtrain\n"
            "print('\\n'.join(sorted(m for m in sys.modules if m.startswith(('jaxtrain.tools', 'torch', 'mctx', "
            "'matplotlib', 'optuna', 'mlflow', 'wandb', 'grain', 'datasets', 'h5py', 'jaxtrain._src.rl')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == []


def test_engine_names_are_pinned_sorted_and_load_from_the_modules_type_checkers_are_shown():
    # `jaxtrain.engine` is lazy like `jaxtrain`: `_HOMES` (name -> its module and its name there) and
    # the `if TYPE_CHECKING:` imports must say the same, renames (`ENV as COMPILE_CACHE_ENV`) included.
    import ast
    from pathlib import Path

    import jaxtrain.engine as engine

    assert engine.__all__ == sorted(engine.__all__)
    assert set(engine.__all__) == ENGINE == set(engine._HOMES)
    tree = ast.parse(Path(engine.__file__).read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING"]
    shown = {alias.asname or alias.name: (node.module, alias.name) for node in block.body for alias in node.names}
    assert shown == engine._HOMES
    assert set(engine.__all__) <= set(dir(engine))
    assert not set(engine.__all__) & set(jaxtrain.__all__), "a public name has one home: the face"
    with pytest.raises(AttributeError, match="no attribute 'fit'"):
        engine.fit  # noqa: B018


@pytest.mark.slow  # a fresh process
def test_import_engine_loads_no_jax_until_a_name_is_used():
    code = ("import sys, jaxtrain.engine as engine\n"
            "print(sorted(m for m in sys.modules if m.startswith(('jax.', 'flax', 'optax', 'jaxtrain.tools')) "
            "or m == 'jax'))\n"
            "engine.make_layout\n"
            "print('jax' in sys.modules, 'jaxtrain._src.sharding' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:2] == ["[]", "True True"]
