"""Errors a user can cause. Each carries the process exit code the CLI uses for it.

A message that tells the user what to change names the setting once, through `setting(...)`,
`argument(...)` or `resume_advice(...)`; each returns a token that the message renders in one of
two styles when it is shown (`str(error)`, `note(...)`):

- "python" (the default): what a caller of `jaxtrain.fit` writes, `TrainConfig(batch_size=64)`,
  `DataConfig(placement="stream")`, `resume="overwrite"`;
- "cli": the `jaxtrain` command's flags, spelled as tyro spells them: `--` and the dotted name with
  dashes for underscores, then the value (`batch_size` 64 becomes the batch-size flag with 64).

This module is the one place that writes flags: library messages hold tokens, never flag text.

The command line switches the style with `rendering("cli")` while it runs; the library never
reads it from the environment. `error.for_python()` and `error.for_cli()` render one way
whatever the style. Facts a caller may act on travel as attributes (`ConfigError(message,
batch_size=64)` sets `error.batch_size`).
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from typing import Any, Iterator, Literal

Style = Literal["python", "cli"]
STYLES = ("python", "cli")
_style: Style = "python"

# The config class of each section of TrainConfig's settings (`data.placement` is DataConfig's
# `placement`); DistConfig is a recipe's `dist`, given to `jaxtrain.distributed.initialize`.
SECTIONS = {"optim": "OptimConfig", "data": "DataConfig", "checkpoint": "CheckpointConfig",
            "early_stopping": "EarlyStoppingConfig", "dist": "DistConfig"}
TOP = "TrainConfig"

_OPEN, _CLOSE = "\u27ea", "\u27eb"  # ⟪ ⟫: a token's brackets, never in a rendered message
_TOKEN = re.compile(f"{_OPEN}(.*?){_CLOSE}", re.S)
_UNSET = object()


def style() -> Style:
    """The style messages render in now."""
    return _style


def set_style(new: Style) -> Style:
    """Makes messages render in `new` ("python" or "cli"); returns the previous style."""
    global _style
    if new not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, not {new!r}")
    previous, _style = _style, new
    return previous


@contextlib.contextmanager
def rendering(new: Style) -> Iterator[None]:
    """Messages render in `new` inside the block (the command line: "cli"), as before after it."""
    previous = set_style(new)
    try:
        yield
    finally:
        set_style(previous)


def _token(kind: str, name: str, value: Any = _UNSET, placeholder: str | None = None, **extra: Any) -> str:
    fields: dict[str, Any] = {"kind": kind, "name": name, **extra}
    if placeholder is not None:
        fields["placeholder"] = placeholder
    elif value is not _UNSET:
        fields["value"] = value
    return _OPEN + json.dumps(fields, separators=(",", ":"), default=str) + _CLOSE


def setting(name: str, value: Any = _UNSET, *, placeholder: str | None = None) -> str:
    """A TrainConfig setting (`"batch_size"`, `"data.placement"`, `"dist.timeout_s"`), with the
    value to give it, a `placeholder` for one (`"N"`), or neither. Renders for Python as
    `TrainConfig(batch_size=64)`, `DataConfig(placement="stream")` or, without a value,
    `DataConfig.memory_budget_gb`; for the command line as the flag and its value."""
    return _token("setting", name, value, placeholder)


def argument(name: str, value: Any = _UNSET, *, placeholder: str | None = None, python: str | None = None) -> str:
    """A keyword argument of the function the caller called (`fit`'s `run_dir`, `plot_run`'s
    `out`), which the command line spells as a flag of the same name. Renders for Python as
    `name=value`, `run_dir` (no value), `out=FILE.png` (a placeholder) or the `python` text when the
    two spell it differently (`overwrite` is `resume="overwrite"` in `fit`); for the command line
    as the flag (alone for True) and its value."""
    extra = {"python": python} if python is not None else {}
    return _token("argument", name, value, placeholder, **extra)


def resume_advice(run_dir: Any, name: str = "") -> str:
    """How to continue the run in `run_dir`: `jaxtrain.fit(..., run_dir="DIR", resume=True)` from
    Python; from the command line the train command of recipe `name` with the resume flag and DIR
    (the flag and DIR alone without a name)."""
    return _token("resume", name, str(run_dir))


def _literal(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")  # tyro's spelling: dots stay, underscores become dashes


def _render_token(fields: dict[str, Any], how: Style) -> str:
    kind, name = fields["kind"], fields["name"]
    has_value = "value" in fields or "placeholder" in fields
    value = fields.get("value")
    if kind == "resume":
        if how == "cli":
            return (f"jaxtrain train {name} " if name else "") + f"{_flag('resume')} {shlex.quote(fields['value'])}"
        return f"jaxtrain.fit(..., run_dir={_literal(value)}, resume=True)"
    if how == "cli":
        flag = _flag(name)
        if not has_value:
            return flag
        if isinstance(value, bool) and "placeholder" not in fields:  # tyro's x / no-x, a.x / a.no-x
            section, _, field = name.rpartition(".")
            return flag if value else _flag(section + "." * bool(section) + "no_" + field)
        text = fields.get("placeholder") or shlex.quote(str(value))
        return f"{flag} {text}"
    text = fields.get("placeholder") or _literal(value)
    if kind == "argument":
        return fields.get("python") or (f"{name}={text}" if has_value else name)
    section, _, field = name.rpartition(".")
    cls = SECTIONS.get(section, TOP) if section else TOP
    return f"{cls}({field}={text})" if has_value else f"{cls}.{field}"


def render(text: str, how: Style | None = None) -> str:
    """`text` with its setting tokens written in style `how` (default: the current style)."""
    how = how or _style
    if _OPEN not in text:
        return text
    return _TOKEN.sub(lambda m: _render_token(json.loads(m.group(1)), how), text)


def _restore(cls: "type[JaxtrainError]", args: tuple, state: dict) -> "JaxtrainError":
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class JaxtrainError(Exception):
    """Base class: a message meant for the user, shown as one line, no traceback.

    `str(error)` renders the message's setting tokens in the current style (Python unless the
    command line runs); keyword arguments become attributes, facts a caller may act on."""

    exit_code: int = 2

    def __init__(self, message: str = "", **facts: Any):
        super().__init__(message)
        self.__dict__.update(facts)

    def __str__(self) -> str:
        return render(super().__str__())

    @property
    def template(self) -> str:
        """The message with its tokens unrendered (to embed in another error's message)."""
        return super().__str__()

    def for_python(self) -> str:
        """The message for a caller of the Python API: `TrainConfig(batch_size=64)`."""
        return render(self.template, "python")

    def for_cli(self) -> str:
        """The message for the `jaxtrain` command: its flags."""
        return render(self.template, "cli")

    def __reduce__(self) -> Any:  # pickles with its facts, whatever the subclass's __init__ takes
        return _restore, (type(self), self.args, dict(self.__dict__))


class ConfigError(JaxtrainError, ValueError):
    """An invalid configuration value (exit code 2)."""


class DataError(JaxtrainError, ValueError):
    """Data that cannot be used as given (exit code 2)."""


class NonFiniteLossError(JaxtrainError, FloatingPointError):
    """Training produced a NaN or Inf loss (exit code 3).

    At step 1 the loss is the initial model's, before any update, so the learning rate cannot be
    the cause: the advice is then about the data and the loss instead."""

    exit_code = 3

    def __init__(self, step: int, value: float, detail: str = ""):
        stopped = f"loss became {value} at step {step}; training stopped" + (f" ({detail})" if detail else "")
        if step == 1:
            advice = ("It is the initial model's loss on the first batch, before any update, so the learning rate "
                      "is not the cause: check the data for NaN/Inf values, that integer class labels lie in "
                      "0..C-1 for a model with C outputs (a label outside them gives NaN), and the loss for "
                      "log(0) or 0/0.")
        else:
            advice = (f"Lower the learning rate ({setting('optim.lr')}), enable clipping "
                      f"({setting('optim.clip_norm', 1.0)}), skip such steps ({setting('on_nan', 'skip')}) or check "
                      "the data for NaN/Inf values.")
        super().__init__(f"{stopped}. {advice}", step=step, value=value)
