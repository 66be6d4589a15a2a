"""The loop's own state: where training stands, beside the `TrainState` the compiled calls update.

It is saved as each checkpoint's metadata (JSON) and restored on resume, so a resumed run continues
with the same data order, the same epoch means and the same hooks' state as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxtrain._src.errors import JaxtrainError

FORMAT_VERSION = 2  # 1: jaxtrain 0.1's flat metadata dict (still read; see `from_meta`)


@dataclasses.dataclass
class LoopState:
    """Where a run stands between two compiled calls.

    Attributes:
      epoch: the epoch in progress (1-based).
      position: steps of that epoch already taken.
      steps_per_call: the K in use (0 before it is chosen).
      step_form: the calls' form in use (`choosers.StepForm`; "" before it is chosen): a resumed run
        keeps it, so its steps compute as the uninterrupted run's.
      feed: the feed's state (`Feed.get_state()`: placement, data key or seed).
      train_time_s: training time so far, compilation excluded.
      history: one record per finished epoch.
      hooks: each stateful hook's `state_dict()`, by the hook's name.
    """

    epoch: int = 1
    position: int = 0
    steps_per_call: int = 0
    step_form: str = ""
    feed: dict[str, Any] = dataclasses.field(default_factory=dict)
    train_time_s: float = 0.0
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    hooks: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_meta(self) -> dict[str, Any]:
        """The JSON-ready checkpoint metadata."""
        return {"format": FORMAT_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> "LoopState":
        """Reads checkpoint metadata written by this or an earlier format.

        Raises:
          JaxtrainError: metadata of a newer format, or missing fields.
        """
        version = meta.get("format", 0)
        if version > FORMAT_VERSION:
            raise JaxtrainError(f"checkpoint format {version} is newer than this jaxtrain reads ({FORMAT_VERSION}); "
                                "upgrade jaxtrain")
        try:
            if version == 1:
                return cls._from_v1(meta)
            names = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in meta.items() if k in names})
        except (KeyError, TypeError) as e:
            raise JaxtrainError(f"checkpoint metadata of format {version} lacks {e}; it cannot be resumed") from None

    @classmethod
    def _from_v1(cls, meta: dict[str, Any]) -> "LoopState":
        """Format 1 kept the data key, placement and epoch sums at the top level."""
        sums = meta["epoch_means"]
        return cls(
            epoch=meta["epoch"], position=meta["index_in_epoch"], steps_per_call=meta["steps_per_call"],
            feed={"placement": meta.get("placement", "device"), "data_key": meta["data_key"]},
            train_time_s=meta["train_time_s"], history=meta["history"],
            hooks={"metrics": {"epoch": {"sums": sums["sums"], "counts": sums["counts"], "skipped": sums["skipped"]},
                               "skipped_total": meta["skipped_steps"] - sums["skipped"]}},
        )
