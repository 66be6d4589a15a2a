"""Config validation: one clear message naming the field and what is allowed."""

import pytest

from jaxtrain import ConfigError, DataConfig, OptimConfig, TrainConfig


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: OptimConfig(lr=-1.0), "optim.lr=-1.0 must be a positive number"),
        (lambda: OptimConfig(lr=float("nan")), "optim.lr=nan must be a positive number"),
        (lambda: OptimConfig(name="rmsprop"), "optim.name='rmsprop' is not allowed; choose one of sgd, adam, adamw"),
        (lambda: OptimConfig(momentum=1.5), r"optim.momentum=1.5 must be in \[0, 1\)"),
        (lambda: OptimConfig(lr=0.1, min_lr=0.2), "optim.min_lr=0.2 must not exceed optim.lr=0.1"),
        (lambda: TrainConfig(batch_size=0), "batch_size=0 must be an integer >= 1"),
        (lambda: TrainConfig(epochs=0), "epochs=0 must be an integer >= 1"),
        (lambda: TrainConfig(steps_per_call=-2), "steps_per_call=-2 must be an integer >= 1, or 0 for automatic"),
        (lambda: DataConfig(placement="disk"), "data.placement='disk' is not allowed; choose one of auto, device"),
    ],
)
def test_invalid_values_name_the_field(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_defaults_are_valid_and_frozen():
    config = TrainConfig()
    assert config.optim.name == "adam" and config.batch_size == 32
    with pytest.raises(AttributeError):
        config.epochs = 3  # type: ignore[misc]
