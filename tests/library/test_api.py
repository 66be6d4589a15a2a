"""The public API is explicit and pinned; `import jaxtrain` loads the library alone."""

import subprocess
import sys

import pytest

import jaxtrain

PUBLIC = {
    "CheckpointConfig", "CheckpointError", "ConfigError", "DataConfig", "DataError", "DistConfig",
    "EarlyStoppingConfig", "FitResult", "Hook", "JaxtrainError", "LambdaHook", "Member", "NonFiniteLossError",
    "OptimConfig", "RESUMABLE", "RunView", "TrainConfig", "TrainState", "TrainingStopped", "build_optimizer",
    "build_schedule", "data", "distributed", "enable_compile_cache", "export", "fit", "fit_population", "hooks",
    "limit_free_heap", "load", "load_weights", "models", "predict", "remat", "save_weights",
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
