"""Errors a user can cause. Each carries the process exit code the CLI uses for it."""


class JaxtrainError(Exception):
    """Base class: a message meant for the user, shown as one line, no traceback."""

    exit_code: int = 2


class ConfigError(JaxtrainError, ValueError):
    """An invalid configuration value (exit code 2)."""


class DataError(JaxtrainError, ValueError):
    """Data that cannot be used as given (exit code 2)."""


class NonFiniteLossError(JaxtrainError, FloatingPointError):
    """Training produced a NaN or Inf loss (exit code 3)."""

    exit_code = 3

    def __init__(self, step: int, value: float, detail: str = ""):
        self.step = step
        self.value = value
        super().__init__(
            f"loss became {value} at step {step}; training stopped" + (f" ({detail})" if detail else "") + ". "
            "Lower the learning rate (--optim.lr), enable clipping (--optim.clip-norm 1.0), skip such steps "
            "(--on-nan skip) or check the data for NaN/Inf values."
        )
