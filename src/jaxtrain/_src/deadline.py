"""Runs fitted to a deadline: durations as users write them, and the plan of a run's steps.

`TrainConfig.max_time` gives a run a wall-time budget (Lightning's `max_time`); the `Deadline`
hook (`hooks/deadline.py`) measures the run's time per step, plans how many steps fit before the
deadline (`plan_steps`), and sets that number as the length of the learning-rate schedule, held in
the optimizer state (`optim.with_values(fitted=True)`), so the schedule ends when the time does
without compiling again. This module holds the parts without side effects.
"""

from __future__ import annotations

import math
import re
from typing import Any

from jaxtrain._src.errors import ConfigError, setting

__all__ = ["UNBOUNDED_EPOCHS", "parse_duration", "plan_steps"]

_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")

UNBOUNDED_EPOCHS = 2**31 - 1
"""The epochs a streamed feed reads ahead for a run whose deadline, not `epochs`, ends it."""


def parse_duration(value: Any, name: str) -> float:
    """Seconds of a duration: a number of seconds (`90`, `"90"`, `2.5`) or hours, minutes and
    seconds in that order (`"90s"`, `"10m"`, `"1.5h"`, `"1h30m"`); 0 or "" is none (0.0).

    Raises:
      ConfigError: anything else, in one line naming the setting.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{setting(name, value)} must be a duration: seconds (e.g. 90) or a text such as "
                          "90s, 10m, 1.5h, 1h30m")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = value.strip().lower()
        match = _DURATION.fullmatch(text)
        if text == "":
            seconds = 0.0
        elif re.fullmatch(r"\d+(?:\.\d+)?", text):
            seconds = float(text)
        elif match is not None and any(match.groups()):
            seconds = sum(float(g) * _UNITS[u] for g, u in zip(match.groups(), "hms") if g)
        else:
            raise ConfigError(f"{setting(name, value)} is not a duration: write seconds (e.g. 90) or hours, "
                              "minutes and seconds such as 90s, 10m, 1.5h, 1h30m")
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"{setting(name, value)} must be a finite duration >= 0 (0: none)")
    return seconds


def plan_steps(*, now: float, end: float, reserve: float, done_step: int, queued_step: int,
               seconds_per_step: float) -> int:
    """The last step of a run that must end by `end` (seconds on the clock `now` is read from):
    the steps done so far (`done_step`) and as many more as `seconds_per_step` fit in the time
    left less `reserve` (the final evaluation, checkpoint and run files), and at least the steps
    already queued (`queued_step`: they run whatever the plan)."""
    left = end - now - reserve
    more = math.floor(left / seconds_per_step) if seconds_per_step > 0 and left > 0 else 0
    return max(queued_step, done_step + more)
