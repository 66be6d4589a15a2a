"""What every recipe shares: its config base class and its registry entry."""

from __future__ import annotations

import dataclasses
from typing import Callable

from jaxtrain.config import TrainConfig
from jaxtrain.loop import FitResult


@dataclasses.dataclass(frozen=True)
class RecipeConfig(TrainConfig):
    """A recipe's settings: training settings plus where the run's files go."""

    run_dir: str | None = None
    """Directory for config.json, metrics.jsonl and summary.json; default runs/<recipe>-<timestamp>."""
    quiet: bool = False
    """No progress bar (summary blocks are still printed): for scripts and CI logs."""


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A named workload: default config and a function that trains it."""

    name: str
    description: str
    config: RecipeConfig
    run: Callable[[RecipeConfig, str], FitResult]  # (config, run_dir) -> result
