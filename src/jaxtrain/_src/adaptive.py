"""Adaptive populations: a population's slot takes a new run without compiling again.

A population's program takes every number of its members' optimizers (learning rate, weight
decay, betas, ...) from their optimizer states (`optim.with_values`), so a slot of the program can
take another configuration's numbers, fresh weights or another member's weights and optimizer
state by changing arrays alone: the compiled program is the same. `fit_population(..., adapt=)`
asks its `adapt` callable at each epoch's end for `Refill`s; each ends the slot's run (if it still
trains) and starts the new one in the slot, a run of its own (its run directory, hooks, records).
Successive halving and Population Based Training are such callables (the sweep's schedulers,
`tools/schedulers.py`).

The states are changed on the host (one device-to-host copy of the slot's source, one copy back):
no XLA program is compiled for it, whatever the shapes (a jitted scatter would compile one per
leaf shape).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np
from flax import nnx

from jaxtrain._src.errors import ConfigError
from jaxtrain._src.optim import ValuesState, optimizer_structure
from jaxtrain._src.state import TrainState

__all__ = ["Adapt", "Refill", "Slot", "check_refill", "is_key", "put_slot", "with_numbers"]


@dataclasses.dataclass(frozen=True)
class Slot:
    """A slot of an adaptive population at an epoch's end, as `adapt` sees it.

    Attributes:
      index: the slot's place in the population (0 to P - 1).
      member: the run that holds it now (a `Member`).
      status: None while it trains; else how its run ended ("stopped early" when pruned, ...).
      history: its run's epoch records (`val_loss`, ...), from the epoch it joined.
      joined: the epoch after which it joined the population (0: from the start).
    """

    index: int
    member: Any
    status: str | None
    history: tuple[dict[str, Any], ...]
    joined: int = 0


@dataclasses.dataclass(frozen=True)
class Refill:
    """A new run for slot `slot`: `member` (its own run directory, config, hooks) trains in it from
    the next epoch, with fresh weights and optimizer state (the population's initial ones, as the
    slot began) when `parent` is None, else with a copy of slot `parent`'s weights and optimizer
    state; either way with the numbers of `member.config.optim`. A run still training in the slot
    ends first, "stopped early" with `reason`."""

    slot: int
    member: Any
    parent: int | None = None
    reason: str = "replaced in its population"


Adapt = Callable[[int, Sequence[Slot]], Sequence[Refill]]
"""`adapt(epoch, slots)`: the refills to make after epoch `epoch` (none: an empty list)."""


def with_numbers(state: TrainState, optim: Any) -> TrainState:
    """`state` with the numbers of its optimizer state (`ValuesState.values`, and the rate of the
    last update) taken from the `OptimConfig` `optim`; host arrays in, host arrays out."""
    is_values = lambda x: isinstance(x, ValuesState)  # noqa: E731

    def renumber(x: Any) -> Any:
        if not is_values(x):
            return x
        values = {name: np.asarray(getattr(optim, name), np.float32) for name in x.values}
        return x._replace(values=values, learning_rate=np.asarray(optim.lr, np.float32))

    return state._replace(opt_state=jax.tree.map(renumber, state.opt_state, is_leaf=is_values))


def put_slot(members: Any, slot: int, state: TrainState, stacked: bool) -> Any:
    """The population's member states `members` (a tuple of `TrainState`s, or one stacked on a
    leading axis) with slot `slot`'s replaced by the host state `state`, placed as the old arrays
    were (the program's shardings: the compiled calls take them as they are)."""
    if not stacked:
        old = members[slot]
        new = jax.tree.map(lambda n, o: o if is_key(o) else jax.device_put(np.asarray(n, o.dtype), o.sharding),
                           state, old)
        return tuple(new if i == slot else m for i, m in enumerate(members))

    def put(o: jax.Array, n: Any) -> jax.Array:
        if is_key(o):  # the step key comes from the seed, which members share: every slot's is the same
            return o
        host = np.array(o)  # a copy of the stacked leaf; its row `slot` replaced
        host[slot] = np.asarray(n, host.dtype)
        return jax.device_put(host, o.sharding)

    return jax.tree.map(put, members, state)


def is_key(x: Any) -> bool:
    """Whether `x` is an array of typed PRNG keys."""
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def check_refill(refill: Refill, slots: int, holder: Any, settings: Callable[[Any], dict[str, Any]]) -> None:
    """Refuses a refill the slot's program cannot take: a slot or parent out of range, a member
    whose model or optimizer differ from the slot's holder (`holder`) in more than their numbers,
    or whose shared settings (`settings(config)`) differ.

    Raises:
      ConfigError: saying which.
    """
    new = refill.member
    where = f"refill of slot {refill.slot}"
    if not isinstance(new, type(holder)):  # the holder is a `Member` (the population's; not imported: a circle)
        raise ConfigError(f"{where}: member must be a jaxtrain.Member; got {type(new).__name__}")
    if not 0 <= refill.slot < slots or (refill.parent is not None and not 0 <= refill.parent < slots):
        raise ConfigError(f"{where} (parent {refill.parent}): slots are 0 to {slots - 1}")
    if new.optimizer is not None:
        raise ConfigError(f"{where}: an adaptive population's members take their optimizer from config.optim "
                          "(its numbers are the program's inputs); give no optimizer")
    if optimizer_structure(new.config.optim) != optimizer_structure(holder.config.optim):
        raise ConfigError(f"{where}: its optimizer differs from the slot's in more than its numbers; change "
                          "only numbers (lr, weight_decay, b1, ...) in an adaptive population")
    differ = sorted(k for k, v in settings(new.config).items() if v != settings(holder.config)[k])
    if differ:
        raise ConfigError(f"{where}: its config differs from the slot's in {', '.join(differ)}; a refill changes "
                          "only the settings a member may set its own way")
    shape = lambda m: (nnx.graphdef(m), jax.tree.map(lambda x: (x.shape, x.dtype), nnx.state(m)))  # noqa: E731
    if shape(new.model) != shape(holder.model):
        raise ConfigError(f"{where}: its model differs from the slot's in structure or shapes; the slot's "
                          "program takes a model like the one it was compiled for")
