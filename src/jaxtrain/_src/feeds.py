"""Feeds: where a compiled call's batches come from.

A feed hands the loop, per compiled call of K steps, the arguments of that call besides the train
state, and builds the call's function around the pure train step:

- `DeviceFeed`: the whole training set on the device; a permutation per epoch drawn on the host
  (`epoch_permutation`) and put there; each step gathers its batch inside the compiled call. No host
  work per step. On a mesh of several devices the set is replicated on each when it fits the
  per-device budget, else its rows are split over the devices (each step then gathers its batch with
  one all-reduce of B rows).
- `StreamFeed`: rows read from a source (HDF5 file, arrays) by a background thread in a shuffled
  block order, stacked K batches at a time and placed on the device ahead of the running call.
  It measures how long the device waited for input. On a mesh, each process reads only its slice
  of every global batch and each device receives its share of the rows.

Feeds are checkpointable like Grain's iterators: `get_state()` is a JSON-ready dict of what,
besides the loop's epoch and position, fixes the data order, and `set_state()` takes it back.
`make_feed` holds the placement decision (device-resident when the data fit the memory budget).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain._src import data as data_lib
from jaxtrain._src.config import TrainConfig
from jaxtrain._src.data.adapters import BatchStream, adapt
from jaxtrain._src.data.arrays import Placement, bytes_used_in_place
from jaxtrain._src.data.fingerprint import fingerprint
from jaxtrain._src.data.sources import ArraySource
from jaxtrain._src.data.split import split_validation
from jaxtrain._src.data.stream import EPOCH_END, BackgroundIterator, DevicePrefetcher, StreamLoader
from jaxtrain._src.deadline import UNBOUNDED_EPOCHS
from jaxtrain._src.errors import ConfigError, DataError, setting
from jaxtrain._src.report.notes import note
from jaxtrain._src.sharding import Layout
from jaxtrain._src.step import StepAt, make_gather_step, make_stacked_step

Compile = Callable[..., Callable]  # CompiledCalls.compile: (fn, *args, donate=False, background=False) -> executable


class Feed(Protocol):
    """Where a run's training batches come from (see the module docstring)."""

    placement: Placement
    num_samples: int  # rows of the training set
    steps_per_epoch: int
    dropped: int  # samples a full pass leaves out (the last partial batch)
    device_bytes: int  # device memory the feed holds for the whole run
    timing: dict[str, float]  # cumulative seconds of the run's input work (optional; see `hooks.profile`)
    fingerprint: dict[str, Any] | None  # of the training data (`data.fingerprint`); None: data made in the run

    def setup(self, compile: Compile, start: tuple[int, int] = (1, 0)) -> None:
        """Places what must live on the device and compiles helpers (compile time is counted); a
        feed that reads ahead may start reading at `start` (epoch, step), where training will begin."""

    def make_step(self, train_step: Callable) -> StepAt:
        """`step_at(state, *args, i)`: step i of a call whose arguments are `next_args(k)`."""

    def abstract_args(self, k: int) -> tuple[Any, ...]: ...

    def start_epoch(self, epoch: int, position: int) -> None:
        """Positions the feed at step `position` (0-based) of epoch `epoch` (1-based)."""

    def next_args(self, k: int, previous: Any = None) -> tuple[Any, ...]:
        """The arguments of the next call of k steps. `previous` holds outputs of the call still
        running, if any: a feed that measures input wait waits for it first."""

    def epoch_stats(self, train_s: float) -> dict[str, float]:
        """Figures of the epoch for its record (e.g. input wait)."""

    def describe(self) -> str: ...

    def get_state(self) -> dict[str, Any]: ...

    def arrays(self) -> Any:
        """Arrays a checkpoint must hold besides the train state: data the feed makes during the
        run (a replay buffer), as a pytree; None for a feed whose data come from outside."""

    def set_state(self, state: dict[str, Any], arrays: Any = None) -> None:
        """Takes back `get_state()` and, for a feed that has them, `arrays()` of a checkpoint."""

    def close(self) -> None: ...


def epoch_steps(config: TrainConfig, n_train: int) -> tuple[int, int]:
    """(steps per epoch, samples of the last partial batch that a full pass drops) for `n_train` samples.

    Raises:
      ConfigError: the batch, or steps_per_epoch batches, need more samples than there are.
    """
    B = config.samples_per_step  # batch_size x grad_accum
    if B > n_train:
        what = f"batch_size={B}" if config.grad_accum == 1 else f"batch_size x grad_accum = {B}"
        raise ConfigError(f"{what} is larger than the training set ({n_train} samples); use "
                          f"{setting('batch_size', max(1, n_train // config.grad_accum))} or less",
                          batch_size=config.batch_size, grad_accum=config.grad_accum, num_samples=n_train)
    if config.steps_per_epoch:
        if config.steps_per_epoch * B > n_train:
            raise ConfigError(
                f"steps_per_epoch={config.steps_per_epoch} batches of {B} need {config.steps_per_epoch * B:,} "
                f"samples but the training set has {n_train:,}; use {setting('steps_per_epoch', n_train // B)} or less",
                steps_per_epoch=config.steps_per_epoch, batch_size=B, num_samples=n_train,
            )
        return config.steps_per_epoch, 0  # a sample of the set, not a pass: nothing is "dropped"
    return divmod(n_train, B)


def epoch_permutation(key: jax.Array, epoch: int, n: int) -> np.ndarray:
    """The order in which epoch `epoch` visits the `n` training samples, int32 (n,): drawn by NumPy's
    generator seeded with the data key's words and the epoch, so it is the same in every process and
    on every platform. Drawn on the host, not by a device program: compiling one (a sort keyed by
    threefry bits) cost 0.3-0.4 s of CPU at every start, more than a short run's own host work, and
    on a CPU it ran 0.6 s per epoch of a million rows, which NumPy draws in 0.03 s."""
    words = np.asarray(jax.random.key_data(key)).ravel().tolist()
    return np.random.default_rng([*words, int(epoch)]).permutation(n).astype(np.int32)


class DeviceFeed:
    """The training set held on the device(s); batches gathered inside the compiled call."""

    fingerprint: dict[str, Any] | None = None  # set by make_feed (Feed)

    def __init__(self, data: Any, config: TrainConfig, placement: Placement, data_key: jax.Array, layout: Layout):
        self.placement, self._host, self._layout = placement, data, layout
        self.num_samples = data_lib.num_samples(data, "train_data")
        self.steps_per_epoch, self.dropped = epoch_steps(config, self.num_samples)
        self.device_bytes = data_lib.nbytes(data) // (layout.num_devices if placement.split else 1)
        self.in_place_bytes = 0  # of those, the host arrays themselves (a CPU device, aligned arrays)
        self._B, self._key = config.samples_per_step, data_key
        self._data: Any = None  # the device copy: made in setup
        self._perm: jax.Array | None = None  # the epoch's order, on the device
        self._position = 0
        self.timing = {"setup_copy_s": 0.0}  # placing the training set on the device, once

    def setup(self, compile: Compile, start: tuple[int, int] = (1, 0)) -> None:
        t0 = time.perf_counter()
        layout, host = self._layout, jax.tree.map(np.asarray, self._host)
        if self.placement.split:  # rows split over the devices: pad to a multiple (never indexed)
            pad = -self.num_samples % layout.num_devices
            host = jax.tree.map(lambda x: np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)]), host)
        sharding = layout.batch if self.placement.split else layout.replicated
        self._data = jax.block_until_ready(layout.put(host, jax.tree.map(lambda _: sharding, host)))
        self.timing["setup_copy_s"] = time.perf_counter() - t0
        self.in_place_bytes = bytes_used_in_place(host, self._data)  # no second copy of these
        self._host = None  # the device copy is the one used from here

    def make_step(self, train_step: Callable) -> StepAt:
        return make_gather_step(train_step, self._B, constrain=self._layout.constrain_batch)

    def abstract_args(self, k: int) -> tuple[Any, ...]:
        replicated = self._layout.replicated
        return (self._data, jax.ShapeDtypeStruct((self.num_samples,), jnp.int32, sharding=replicated),
                jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated))

    def start_epoch(self, epoch: int, position: int) -> None:
        order = epoch_permutation(self._key, epoch, self.num_samples)  # the key stays on the host
        self._perm, self._position = self._layout.put(order, self._layout.replicated), position

    def next_args(self, k: int, previous: Any = None) -> tuple[Any, ...]:
        args = (self._data, self._perm, np.int32(self._position))
        self._position += k
        return args

    def epoch_stats(self, train_s: float) -> dict[str, float]:
        return {}

    def describe(self) -> str:
        return f"on the device ({self.placement.reason})"

    def get_state(self) -> dict[str, Any]:
        return {"placement": "device", "data_key": np.asarray(jax.random.key_data(self._key)).tolist()}

    def arrays(self) -> None:
        return None

    def set_state(self, state: dict[str, Any], arrays: Any = None) -> None:
        if "data_key" in state:
            self._key = jax.random.wrap_key_data(jnp.asarray(state["data_key"], jnp.uint32))

    def close(self) -> None:
        pass


class StreamFeed:
    """Training batches streamed from a row source: a reader thread shuffles blocks and rows
    (`StreamLoader`), a transfer thread stacks K batches and puts them on the device
    (`DevicePrefetcher`), up to `config.data.prefetch` calls ahead."""

    fingerprint: dict[str, Any] | None = None  # set by make_feed (Feed)

    def __init__(self, source: Any, config: TrainConfig, placement: Placement, layout: Layout, treedef: Any = None):
        self._streaming(config, layout, treedef, {n: (v.shape[1:], v.dtype) for n, v in source.read(0, 1).items()})
        self.placement, self._source = placement, source
        self.num_samples = len(source)
        self.steps_per_epoch, self.dropped = epoch_steps(config, self.num_samples)
        self._seed = config.seed
        self._loader = StreamLoader(source, self._B, seed=config.seed, queue_depth=max(16, 2 * self._prefetch),
                                    window_bytes=config.data.shuffle_window_mb << 20,
                                    share=(jax.process_index(), jax.process_count()))

    def _streaming(self, config: TrainConfig, layout: Layout, treedef: Any, spec: dict[str, tuple]) -> None:
        """What every streamed feed holds: batch `spec` (name -> (row shape, dtype)), the position,
        the running prefetcher and the input timings."""
        self._layout, self._treedef, self._spec = layout, treedef, spec
        self._B, self._prefetch = config.samples_per_step, config.data.prefetch
        self._epochs = UNBOUNDED_EPOCHS if config.max_time_s else config.epochs  # a deadline ends the run
        self.device_bytes = 0
        self._epoch, self._position = 1, 0
        self._prefetcher: DevicePrefetcher | None = None
        self._next: tuple[int, int] | None = None  # (epoch, step) the running prefetcher delivers next
        self._host: Any = None  # host batches started by `setup`, before the prefetcher takes them
        self._wait_s = 0.0
        # input_wait_s: the loop waited for batches; device_wait_s: it waited for the running call;
        # background_copy_s: the transfer thread's host-to-device copies (overlapped with computing)
        self.timing = {"input_wait_s": 0.0, "device_wait_s": 0.0, "background_copy_s": 0.0}

    def setup(self, compile: Compile, start: tuple[int, int] = (1, 0)) -> None:
        """Starts reading at `start` while the training call compiles."""
        self._host, self._next = self._host_batches(*start), start

    def make_step(self, train_step: Callable) -> StepAt:
        treedef, names = self._treedef, list(self._spec)
        if treedef is None:
            return make_stacked_step(train_step)
        step_at = make_stacked_step(lambda state, batch: train_step(state, jax.tree.unflatten(treedef, batch)))
        return lambda state, batches, i: step_at(state, [batches[n] for n in names], i)

    def abstract_args(self, k: int) -> tuple[Any, ...]:
        sharding = self._layout.stacked_batches
        return ({n: jax.ShapeDtypeStruct((k, self._B, *shape), dtype, sharding=sharding)
                 for n, (shape, dtype) in self._spec.items()},)

    def _place(self, host: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """K stacked batches of this process's rows → global arrays, each device its share."""
        t0, sharding = time.perf_counter(), self._layout.stacked_batches
        placed = {n: jax.make_array_from_process_local_data(sharding, x) for n, x in host.items()}
        jax.block_until_ready(placed)  # the transfer thread waits for it next anyway
        self.timing["background_copy_s"] += time.perf_counter() - t0  # in the transfer thread
        return placed

    def start_epoch(self, epoch: int, position: int) -> None:
        if self._next != (epoch, position):  # the stream runs on across epochs; else it starts here
            self.close()
        self._epoch, self._position, self._wait_s = epoch, position, 0.0

    def next_args(self, k: int, previous: Any = None) -> tuple[Any, ...]:
        if previous is not None:  # from here the device is idle: waiting for batches is input-bound time
            t0 = time.perf_counter()
            jax.block_until_ready(previous)
            self.timing["device_wait_s"] += time.perf_counter() - t0
        if self._prefetcher is None:  # one transfer per call of k batches, `prefetch` calls ahead
            batches = self._host if self._host is not None else self._host_batches(self._epoch, self._position)
            self._host = None
            self._prefetcher = DevicePrefetcher(batches, depth=self._prefetch * k, group=k, device=self._place)
        t0 = time.perf_counter()
        stacked = self._prefetcher.next_batches(k)
        self._wait_s += time.perf_counter() - t0
        self.timing["input_wait_s"] += time.perf_counter() - t0
        self._position += k
        done = self._position == self.steps_per_epoch
        self._next = (self._epoch + 1, 0) if done else (self._epoch, self._position)
        return (stacked,)

    def _host_batches(self, epoch: int, position: int) -> Any:
        """Host batches {name: (B, ...)} from step `position` of `epoch` on, through the last epoch,
        `steps_per_epoch` an epoch, read ahead in a thread."""
        return self._loader.iter_epochs(epoch, position, self._epochs, self.steps_per_epoch)

    def epoch_stats(self, train_s: float) -> dict[str, float]:
        return {"input_wait_s": self._wait_s, "input_wait_fraction": self._wait_s / max(train_s, 1e-9)}

    def describe(self) -> str:
        return (f"streamed ({self.placement.reason}; shuffle window {self._loader.window_nbytes / 1024**2:,.0f} MiB, "
                f"batches of up to {self._prefetch} calls read ahead onto the device)")

    def get_state(self) -> dict[str, Any]:
        return {"placement": "stream", "seed": self._seed}

    def arrays(self) -> None:
        return None

    def set_state(self, state: dict[str, Any], arrays: Any = None) -> None:
        pass  # the order is a function of (seed, epoch); the seed comes from the config

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()  # and the host batches it reads
            self._prefetcher = None
        if self._host is not None:
            self._host.close()
            self._host = None
        self._next = None


class IterFeed(StreamFeed):
    """Training batches from an iterable of batches (`data.adapters.BatchStream`: a DataLoader, a
    generator, ...), in the loader's own order: a thread iterates it (grad_accum batches to a
    step), the transfer thread stacks K steps and puts them on the device, as `StreamFeed` does.

    Steps per epoch: `config.steps_per_epoch`, else the loader's `len()` (a torch DataLoader's full
    batches exactly), else one counting pass over the loader before training. A short last batch
    is dropped, or with `data.last_batch="pad"` filled with its own first rows; either way the
    compiled call keeps one shape. Resume: from the iterator's saved state when it has one
    (Grain's `get_state`/`set_state`), else (or where Grain refuses it for a source whose repr() is
    a memory address) by skipping the batches already trained on. The data's fingerprint is taken
    through the loader's map-style dataset (`data.fingerprint`).
    """

    def __init__(self, stream: Any, config: TrainConfig, layout: Layout):
        self._streaming(config, layout, stream.treedef, {n: (stream.shapes[n], stream.dtypes[n]) for n in stream.names})
        self._stream, self._accum = stream, config.grad_accum
        self._pad = config.data.last_batch == "pad"
        B, self._rows = stream.batch_size, stream.batch_size * config.grad_accum
        full, last = self._epoch_batches(config)
        batches = full + (1 if last and self._pad else 0)  # batches an epoch trains on
        if config.steps_per_epoch:
            self.steps_per_epoch = config.steps_per_epoch
            self.dropped = 0
        else:
            self.steps_per_epoch = batches // self._accum
            used = self.steps_per_epoch * self._accum  # batches; a padded last one holds `last` samples
            self.dropped = full * B + last - min(used, full) * B - (last if used > full else 0)
            if self.steps_per_epoch == 0:
                raise ConfigError(f"{stream.name} has {batches} batches an epoch, fewer than one step of "
                                  f"grad_accum={self._accum}; use {setting('grad_accum', max(1, batches))} or less",
                                  grad_accum=config.grad_accum)
        self.num_samples = self.steps_per_epoch * self._rows
        self.placement = Placement("loader", f"batches of {B} from {type(stream.data).__name__}, in its order")
        self._last, self._started = last, False
        self._saved: dict[str, Any] | None = None  # the state set_state gave, until the first epoch starts
        self.fingerprint = fingerprint(stream)  # through the loader's dataset; "unchecked" where it has none
        # ((epoch, step), the iterator's state after it), appended by the reader, dropped once trained past
        self._states: collections.deque = collections.deque()

    def _epoch_batches(self, config: TrainConfig) -> tuple[int, int]:
        """(full batches, rows of a short last one or 0) of one epoch."""
        stream = self._stream
        if config.steps_per_epoch:
            return config.steps_per_epoch * self._accum, 0
        if stream.num_full is not None:
            return stream.num_full, stream.last_rows
        if stream.num_batches is not None:
            return stream.num_batches, 0  # a short last batch is found at the end of the epoch
        if stream.once:
            raise ConfigError(f"{stream.name} is a one-shot iterator (a generator) without a length: give "
                              f"{setting('steps_per_epoch', placeholder='N')}, or pass an iterable or a callable "
                              "that returns a fresh iterator each epoch (e.g. lambda: batches())")
        t0, full, last = time.perf_counter(), 0, 0
        for batch, _ in stream.batches(1):
            rows = len(next(iter(batch.values())))
            full, last = (full + 1, 0) if rows == stream.batch_size else (full, rows)
        note(f"{stream.name} has no len(): counted {full + (last > 0):,} batches of an epoch in one pass "
                   f"({time.perf_counter() - t0:.1f} s); {setting('steps_per_epoch', full // self._accum)} skips it")
        return full, last

    def _host_batches(self, epoch: int, position: int) -> Any:
        stream, accum, rows, steps = self._stream, self._accum, self._rows, self.steps_per_epoch
        skip, state = position * accum, None
        if self._saved is not None and self._saved.get("epoch") == epoch and self._saved.get("position") == position:
            state = self._saved.get("iter_state")
        if position and self._saved is not None:  # a resume: say how the loader's position comes back
            refused = stream.refused(epoch, state) if state is not None else None
            state = None if refused else state
            how = ("from the loader's saved state" if state is not None else
                   f"by skipping the {position * accum:,} batches of epoch {epoch} already trained on")
            why = None if state is not None else stream.reproducible()
            exact = "" if why is None else f"; not exact: {why}"
            note(f"{stream.name}: resuming step {position:,} of epoch {epoch} {how}{exact}"
                 + (f" (the loader refused its saved state: {refused})" if refused else ""))
        if stream.once and not self._started:  # a fresh one-shot iterator: pass what earlier epochs trained on
            skip += (epoch - 1) * steps * accum
        self._started, self._saved = True, None
        states, pad, last_epoch = self._states, self._pad, self._epochs
        states.clear()

        def produce(put: Callable[[Any], None]) -> None:  # epoch after epoch: the next loader starts early
            for e in range(epoch, last_epoch + 1):
                produce_epoch(e, position if e == epoch else 0, skip if e == epoch else 0,
                              state if e == epoch else None, put)
                put(EPOCH_END)

        def produce_epoch(epoch: int, position: int, skip: int, state: Any, put: Callable[[Any], None]) -> None:
            step, group = position, []
            for batch, after in stream.batches(epoch, skip, state):
                n = len(next(iter(batch.values())))
                if n < stream.batch_size:
                    if not pad:
                        continue  # dropped; the stream checks that it was the last
                    batch = {k: np.resize(v, (stream.batch_size, *v.shape[1:])) for k, v in batch.items()}
                group.append(batch)
                if len(group) < accum:
                    continue
                if after is not None:
                    states.append(((epoch, step), after))
                put(group[0] if accum == 1 else {k: np.concatenate([g[k] for g in group]) for k in group[0]})
                group, step = [], step + 1
                if step == steps:
                    return
            raise DataError(f"{stream.name} ran out at step {step:,} of epoch {epoch}, which takes {steps:,} steps "
                            f"of {rows} rows: its len() counts a short last batch that is dropped, or it yields fewer "
                            f"batches than before; give {setting('steps_per_epoch', step)}, or "
                            f"{setting('data.last_batch', 'pad')}")

        return BackgroundIterator(produce, max(16, 2 * self._prefetch), name=f"jaxtrain-iter-epoch{epoch}")

    def describe(self) -> str:
        last = ""
        if self._last:
            last = f"; the short last batch ({self._last} rows) {'padded' if self._pad else 'dropped'}"
        return (f"streamed from {type(self._stream.data).__name__} in its order ({self._stream.batch_size} rows a "
                f"batch{last}; up to {self._prefetch} calls read ahead onto the device)")

    def next_args(self, k: int, previous: Any = None) -> tuple[Any, ...]:
        args = super().next_args(k, previous)
        last, states = (self._epoch, self._position - 1), self._states
        while states and states[0][0] < last:  # the states of steps trained past
            states.popleft()
        return args

    def get_state(self) -> dict[str, Any]:
        position, states = self._position, self._states
        saved = states[0][1] if position and states and states[0][0] == (self._epoch, position - 1) else None
        return {"placement": "loader", "epoch": self._epoch, "position": position, "iter_state": saved}

    def set_state(self, state: dict[str, Any], arrays: Any = None) -> None:
        self._saved = state


class StackedBatches:
    """A call source of K stacked batches described by shapes only (`batch`: name -> (shape, dtype)
    of one batch), as the stream feed's calls take them; for compiling a program without data."""

    def __init__(self, batch: dict[str, jax.ShapeDtypeStruct], layout: Layout):
        self._batch, self._layout = batch, layout

    def make_step(self, train_step: Callable) -> StepAt:
        return make_stacked_step(train_step)

    def abstract_args(self, k: int) -> tuple[Any, ...]:
        sharding = self._layout.stacked_batches
        return ({n: jax.ShapeDtypeStruct((k, *x.shape), x.dtype, sharding=sharding) for n, x in self._batch.items()},)


def read_whole(source: Any) -> Any:
    """Every row of a row source, in the source's own structure (a map-style dataset's samples stacked)."""
    rows = source.read(0, len(source))
    return source.unflatten(rows) if hasattr(source, "unflatten") else rows


def as_source(data: Any, name: str) -> tuple[Any, Any]:
    """`(row source, treedef)` for `data`: a source as is (with its treedef, if it has one: a
    map-style dataset), a dict of arrays as an `ArraySource` (treedef None), any other pytree of
    arrays as an `ArraySource` over its leaves plus the treedef that rebuilds a batch."""
    if data_lib.is_source(data):
        return data, getattr(data, "treedef", None)
    data_lib.num_samples(data, name)
    if isinstance(data, dict) and all(isinstance(k, str) for k in data) and not any(
            isinstance(v, (dict, list, tuple)) for v in data.values()):
        return ArraySource({k: np.asarray(v) for k, v in data.items()}), None
    leaves, treedef = jax.tree.flatten(data)
    return ArraySource({f"leaf{i}": np.asarray(leaf) for i, leaf in enumerate(leaves)}), treedef


def adapt_inputs(train_data: Any, val_data: Any, config: TrainConfig) -> tuple[Any, Any, TrainConfig]:
    """`(train, val, config)`: others' datasets and loaders adapted (`data.adapters.adapt`); with a
    loader's batches the batch size is the loader's (times the processes of a job), noted when the
    config asked for another."""
    train_data = adapt(train_data, "train_data", config.seed, config.data.allow_nan)
    val_data = adapt(val_data, "val_data", config.seed, config.data.allow_nan)
    if config.val_split and val_data is not None:
        raise ConfigError(f"{setting('val_split', config.val_split)} holds out rows of train_data for validation, "
                          f"but val_data is given too; pass one of them (or {setting('val_split', 0)})")
    if config.val_split:
        train_data, val_data = split_validation(train_data, config.val_split)
    if isinstance(train_data, BatchStream):
        size = train_data.batch_size * jax.process_count()
        if size != config.batch_size and config.batch_size != TrainConfig.batch_size:
            note(f"train_data yields batches of {train_data.batch_size} rows: "
                 f"{setting('batch_size', config.batch_size)} is not used (the loader's batch size is)")
        config = dataclasses.replace(config, batch_size=size)
    return train_data, val_data, config


def budget_bytes(config: TrainConfig, device: jax.Device) -> int:
    """Device memory the datasets may take on each device (`config.data.memory_budget_gb`, else a default)."""
    if config.data.memory_budget_gb > 0:  # as given, however small (a budget under a byte is one byte)
        return max(1, int(config.data.memory_budget_gb * 1024**3))
    return data_lib.default_budget_bytes(device)


def _bytes(data: Any) -> int:
    return data.row_nbytes * len(data) if data_lib.is_source(data) else data_lib.nbytes(data)


def _placement(config: TrainConfig, data_bytes: int, layout: Layout) -> Placement:
    """Where the training set goes: replicated on every device when it fits the per-device budget,
    its rows split over the devices when only a share fits (or placement=device asks), else streamed."""
    policy, budget, n = config.data.placement, budget_bytes(config, jax.local_devices()[0]), layout.num_devices
    share = -(-data_bytes // n)
    if n > 1 and data_bytes > budget and (policy == "device" or (policy == "auto" and share <= budget)):
        return Placement("device", f"{data_bytes / 2**20:,.1f} MiB, rows split over {n} devices "
                         f"({share / 2**20:,.1f} MiB each; budget {budget / 2**20:,.0f} MiB per device)", split=True)
    return data_lib.choose_placement(policy, data_bytes, budget)


def make_feed(train_data: Any, config: TrainConfig, data_key: jax.Array, layout: Layout) -> Feed:
    """The feed for `train_data` (a pytree of arrays or a row source), placed by `config.data.placement`:
    auto keeps it on the devices within the per-device memory budget and streams it otherwise.
    Data that make their own feed (a replay buffer filled during the run) are asked for it.

    Raises:
      DataError, ConfigError: data without rows, of different lengths, or fewer rows than a batch;
        a batch that does not split over the mesh.
    """
    layout.check_batch(config.batch_size)  # each micro-batch is split over the devices
    if hasattr(train_data, "make_feed"):  # data made during the run (`jaxtrain.rl.replay.ReplayBuffer`)
        return train_data.make_feed(config, data_key, layout)
    if isinstance(train_data, BatchStream):  # batches from a loader, in its order
        return IterFeed(train_data, config, layout)
    if not data_lib.is_source(train_data):
        data_lib.num_samples(train_data, "train_data")
    placement = _placement(config, _bytes(train_data), layout)
    taken = fingerprint(train_data)  # saved in each checkpoint: a resume checks it is the same data
    if placement.where == "stream":
        source, treedef = as_source(train_data, "train_data")
        feed: Feed = StreamFeed(source, config, placement, layout, treedef)
    else:
        if data_lib.is_source(train_data):
            train_data = read_whole(train_data)  # fits the budget: read it whole, once
        feed = DeviceFeed(train_data, config, placement, data_key, layout)
    feed.fingerprint = taken
    return feed


def place_validation(val_data: Any, config: TrainConfig, feed: Feed) -> tuple[Any, bool]:
    """`(data, streamed)`: validation data go on the devices whole when they fit what the training
    data leave of the per-device memory budget, and are evaluated streamed from a row source otherwise."""
    if isinstance(val_data, BatchStream):  # evaluated batch by batch, as the loader gives them
        if val_data.once:
            raise DataError("val_data is a one-shot iterator (a generator), used up by the first evaluation; pass an "
                            "iterable or a callable that returns a fresh iterator (e.g. lambda: batches())")
        return val_data, True
    left = budget_bytes(config, jax.local_devices()[0]) - feed.device_bytes
    if _bytes(val_data) > left and config.data.placement != "device":
        return as_source(val_data, "val_data"), True
    if data_lib.is_source(val_data):
        val_data = read_whole(val_data)
    data_lib.num_samples(val_data, "val_data")
    return val_data, False


def stream_blocks(source: Any, rows_per_block: int, depth: int = 2) -> BackgroundIterator:
    """Consecutive blocks of `rows_per_block` rows of `source` (the last may be shorter), read by a
    background thread `depth` blocks ahead: `{name: (n, ...)}` host arrays."""
    def produce(put: Callable[[dict], None]) -> None:
        for start in range(0, len(source), rows_per_block):
            put(source.read(start, min(len(source), start + rows_per_block)))

    if rows_per_block < 1:
        raise DataError(f"rows_per_block={rows_per_block} must be >= 1")
    return BackgroundIterator(produce, depth, name="jaxtrain-eval-stream")
