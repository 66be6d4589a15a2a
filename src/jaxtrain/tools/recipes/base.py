"""What every recipe shares: its config base class, the workload it builds, its registry entry."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Literal

from jaxtrain import DataError, DistConfig, TrainConfig

if TYPE_CHECKING:  # the configs import no JAX: `jaxtrain train RECIPE --help` reads them alone
    from flax import nnx

    from jaxtrain.engine import Augment, LossFn, Preprocess


@dataclasses.dataclass(frozen=True)
class RecipeConfig(TrainConfig):
    """A recipe's settings: training settings plus where the run's files go."""

    run_dir: str | None = None
    """Directory for config.json, metrics.jsonl, summary.json and checkpoints/; default runs/<recipe>-<timestamp>."""
    quiet: bool = False
    """Shorthand for --verbosity result: the final result (best and final metrics, the run directory)
    and errors, nothing else (a --verbosity given beside it wins)."""
    verbosity: Literal["progress", "summary", "result", "silent"] = "progress"
    """progress: header, a progress bar per epoch (one plain line per log interval when the output is
    not a terminal), summaries; summary: no progress; result: the final result alone; silent: nothing
    on stdout."""
    remat: Literal["none", "blocks", "full"] = "none"
    """Recompute activations in the backward pass instead of keeping them (jax.checkpoint on the
    model's repeated blocks): none; blocks (keep the weight-matmul outputs, recompute the rest); full
    (keep only each block's input)."""
    dist: DistConfig = DistConfig()
    """Many processes: how this process joins the job (not saved with the run: a resumed run may
    use other processes and another --mesh)."""


@dataclasses.dataclass(frozen=True)
class Workload:
    """Everything `fit` needs for one recipe and config."""

    model: nnx.Module
    loss_fn: LossFn
    train: Any
    val: Any
    preprocess: Preprocess | None = None
    augment: Augment | None = None
    tokenizer: Any = None
    """Text recipes: the tokenizer that maps text to the model's token ids and back."""
    hooks: tuple[Any, ...] = ()
    """Hooks the workload needs in its loop (e.g. self-play and evaluation matches)."""
    inputs: str | None = None
    """The field of a batch the model is called on, after `preprocess` (`model(batch[inputs])`):
    what `jaxtrain predict` and `export` feed it; None for a model without such a forward."""
    predict_preprocess: bool = True
    """Whether raw inputs for prediction go through `preprocess` (False where `preprocess` makes the
    model's input from something else, as char-gpt's windows from start positions)."""
    input_sample: tuple[tuple[int, ...], str] | None = None
    """One raw input's shape and dtype for prediction; None: those of the training data's `inputs`."""
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    """JSON-ready facts the model's shape depends on besides the config (sizes read from the data,
    a vocabulary), saved as the run's model.json so that `Recipe.model` rebuilds it without data."""

    def close(self) -> None:
        """Closes the row sources (HDF5 files) the workload opened."""
        for data in (self.train, self.val):
            if hasattr(data, "close"):
                data.close()


def split_rows(opener: Callable[..., Any], where: str, keys: dict[str, str], val_rows: int) -> tuple[Any, Any]:
    """`(train, val)` row sources of the file or folder `where` (`opener(where, keys, start, stop)`,
    an `HDF5Source` or `NpySource`): its last `val_rows` rows validate (val None for 0), the rest train.

    Raises:
      DataError: `where` holds no more rows than --data.val-samples holds out, naming that flag.
    """
    whole = opener(where, keys)
    n = len(whole)
    whole.close()
    if val_rows >= n:
        raise DataError(f"{where} has {n:,} rows and --data.val-samples {val_rows:,} holds "
                        f"{'all of them' if val_rows == n else 'more than that'} out for validation, leaving none to "
                        f"train on; pass --data.val-samples below {n:,} (e.g. {n // 10:,})")
    return opener(where, keys, 0, n - val_rows), (opener(where, keys, n - val_rows) if val_rows else None)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A named workload: its default config and a builder of model, loss and data."""

    name: str
    description: str
    config: RecipeConfig
    build: Callable[[Any], Workload]
    model: Callable[[Any, dict[str, Any]], nnx.Module]
    """`model(config, info)`: the untrained model, from the config and the workload's `info`
    alone (no data is read): what `load` and `sample` restore weights into."""
    presets: dict[str, RecipeConfig] = dataclasses.field(default_factory=dict)
    """Named alternative default configs (`jaxtrain train RECIPE --preset NAME`); `config` is one of them."""
    aliases: dict[str, str] = dataclasses.field(default_factory=dict)
    """Other spellings of flags, e.g. {"--training-batch-size": "--batch-size"}."""
