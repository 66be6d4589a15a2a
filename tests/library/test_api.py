"""The public API is explicit and pinned."""

import jaxtrain


def test_public_names_are_pinned_and_sorted():
    assert jaxtrain.__all__ == sorted(jaxtrain.__all__)
    assert set(jaxtrain.__all__) == {
        "AutoSteps", "CheckpointConfig", "CheckpointError", "ConfigError", "DataConfig", "DataError",
        "DistConfig", "EarlyStopping", "EarlyStoppingConfig", "FitResult", "Hook", "JaxtrainError", "LambdaHook",
        "NonFiniteLossError", "OptimConfig", "TensorBoard", "TrainConfig", "TrainState", "TrainingStopped",
        "build_optimizer", "build_schedule", "data", "distributed", "fit", "hooks", "init_state", "load",
        "make_eval_step", "make_evaluate", "make_multi_step", "make_train_step", "models", "sharding", "tune",
    }
    for name in jaxtrain.__all__:
        assert hasattr(jaxtrain, name), name
