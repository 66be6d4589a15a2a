"""Streaming batches from a row source in bounded host memory, read ahead by background threads.

Order of one epoch, a pure function of (seed, epoch):
  1. The N rows are cut into contiguous blocks of `block_rows` rows (a multiple of the source's
     chunk size, so every read is a few whole HDF5 chunks); the last block may be shorter.
  2. The blocks are permuted with a generator seeded by (seed, epoch).
  3. Consecutive groups of `window_blocks` permuted blocks form windows; the rows of a window are
     shuffled together with a generator seeded by (seed, epoch, window): a shuffle buffer of
     `window_blocks * block_rows` rows.
  4. Batches are consecutive runs of `batch_size` rows of that order (one may span two windows).

Randomness this gives: every row is mixed with the rows of `window_blocks` blocks drawn at random
from the whole dataset, and its position in the epoch is uniform over its window; rows of one
block always share a window, so two rows of the same block land within one window's span of the
epoch. With the defaults (blocks of ~1 MiB, windows of ~32 MiB) this is close to a full shuffle
for datasets of a few windows and a block-local one for 10^8 rows; rows in a file sorted by a
label therefore still need a larger window (or a file written in random order).

Memory (`StreamLoader.host_nbytes`): the block permutation (N / block_rows integers), two window
buffers (the window being served and the one being read) and the ready-batch queue. The two buffers
are mapped once per stream, outside the C heap, and reused for every window of every epoch; blocks
are read straight into them where the source can (`read_into`). Fresh arrays for every window,
freed into a C heap that the batches were being cut from at the same time, left the heap a little
larger after each window: a run over 10x the rows went through 10x the windows and ended higher. Nothing
holds an index array of all N rows, so host memory does not grow with the dataset, and the reader
never reads further ahead than those two windows and the queue, however long the consumer waits.
`iter_epoch(epoch, start_batch)` computes which window holds the first requested row and reads
nothing before it: a run restored from a checkpoint mid-epoch continues with the identical order.
"""

from __future__ import annotations

import math
import mmap
import queue
import threading
import time
from typing import Any, Callable, Iterator, TypeGuard

import jax
import jax.numpy as jnp
import numpy as np

from jaxtrain._src.data.sources import RowSource, RowSourceInto
from jaxtrain._src.errors import ConfigError, DataError

BLOCK_BYTES = 1 << 20  # default block: about 1 MiB of rows, rounded to whole chunks
WINDOW_BYTES = 32 << 20  # default shuffle window: about 32 MiB of rows

_ITEM, _DONE, _ERROR = range(3)
EPOCH_END = object()  # put after each epoch's batches by a stream of several epochs: no stack spans two


class _Stopped(Exception):
    """Raised inside a producer thread when its consumer closed the iterator."""


def _put(q: queue.Queue, stop: threading.Event, kind: int, item: Any) -> None:
    while not stop.is_set():
        try:
            q.put((kind, item), timeout=0.05)
            return
        except queue.Full:
            continue
    raise _Stopped


def _run(produce: Callable[[Callable[[Any], None]], None], q: queue.Queue, stop: threading.Event) -> None:
    try:
        produce(lambda item: _put(q, stop, _ITEM, item))
        _put(q, stop, _DONE, None)
    except _Stopped:
        pass
    except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises it
        try:
            _put(q, stop, _ERROR, e)
        except _Stopped:
            pass


class BackgroundIterator:
    """Runs `produce(put)` in a daemon thread; iterating yields what it puts, in order.

    At most `depth` items wait in the queue. An exception in the thread is re-raised, as the same
    object, by the consumer's next `next()`. `close()` (or leaving a `with` block, or exhausting
    the iterator) stops and joins the thread. `wait_s` is the total time the consumer spent
    blocked waiting for items.
    """

    def __init__(self, produce: Callable[[Callable[[Any], None]], None], depth: int, name: str):
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._finished = False
        self.wait_s = 0.0
        # The thread holds the queue and the event, not `self`: a dropped iterator is collected and
        # its `__del__` stops the thread.
        self._thread = threading.Thread(target=_run, args=(produce, self._queue, self._stop), name=name, daemon=True)
        self._thread.start()

    def __iter__(self) -> "BackgroundIterator":
        return self

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        t0 = time.perf_counter()
        kind, item = self._queue.get()
        self.wait_s += time.perf_counter() - t0
        if kind == _ITEM:
            return item
        self._finished = True
        self._thread.join()
        if kind == _ERROR:
            raise item
        raise StopIteration

    def close(self) -> None:
        """Stops the thread (it exits at its next put, after any read in progress) and joins it."""
        self._finished = True
        self._stop.set()
        while True:  # unblock a producer waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join()

    def __enter__(self) -> "BackgroundIterator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not self._finished:
            self._stop.set()


class EpochPlan:
    """The order of one epoch (see the module docstring), from indices alone.

    Attributes:
      blocks: (num_blocks,) the permuted block indices.
      window_starts: (num_windows + 1,) the epoch position of each window's first row, then N.
    """

    def __init__(self, n: int, block_rows: int, window_blocks: int, seed: int, epoch: int):
        self.n, self.block_rows, self.window_blocks = n, block_rows, window_blocks
        self.seed, self.epoch = seed, epoch
        num_blocks = -(-n // block_rows)
        self.blocks = np.random.default_rng((seed, epoch, 0)).permutation(num_blocks)  # (num_blocks,)
        sizes = np.full(num_blocks, block_rows, np.int64)
        sizes[-1] = n - (num_blocks - 1) * block_rows
        window_sizes = np.add.reduceat(sizes[self.blocks], np.arange(0, num_blocks, window_blocks))
        self.window_starts = np.concatenate([[0], np.cumsum(window_sizes)])  # (num_windows + 1,)

    @property
    def num_windows(self) -> int:
        return len(self.window_starts) - 1

    def window_of(self, row: int) -> int:
        """The window holding epoch position `row`."""
        return int(np.searchsorted(self.window_starts, row, side="right")) - 1

    def block_ranges(self, window: int) -> list[tuple[int, int]]:
        """The source row ranges [start, stop) of the window's blocks, in window order."""
        blocks = self.blocks[window * self.window_blocks : (window + 1) * self.window_blocks]
        return [(int(b) * self.block_rows, min(self.n, (int(b) + 1) * self.block_rows)) for b in blocks]

    def window_order(self, window: int) -> np.ndarray:
        """(window rows,) the shuffle of the window's rows (indices into its blocks, concatenated)."""
        size = int(self.window_starts[window + 1] - self.window_starts[window])
        return np.random.default_rng((self.seed, self.epoch, 1, window)).permutation(size)


def _mapped(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array in memory mapped for it alone, not taken from the C heap: its pages go
    back to the system when it is dropped, whatever else the heap holds (np.empty where the
    platform has no private anonymous maps, or for no bytes)."""
    count = math.prod(shape)
    nbytes = count * np.dtype(dtype).itemsize
    if not nbytes or not hasattr(mmap, "MAP_PRIVATE"):
        return np.empty(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE), dtype, count).reshape(shape)


def reads_into(source: Any) -> TypeGuard[RowSourceInto]:
    """Whether `source.read_into` gives what `source.read` gives: the class that defines the
    source's `read` defines `read_into` beside it. A subclass or wrapper that changes `read` (checks
    its rows, as hdf5-sequence's range check does; forwards other attributes to a source inside)
    is read through its `read`, so nothing it adds is skipped."""
    for klass in type(source).__mro__:
        if "read" in vars(klass):
            return "read_into" in vars(klass)
    return False


class _WindowReader:
    """Reads one window's blocks into a window buffer given to it (one of a stream's two), a few
    blocks at a time.

    `buffer` holds at least the window's rows ({name: (rows, ...)}); the reader uses its first ones.
    With `keep` (sorted window-buffer indices), only those rows are kept: each block is read whole
    (it is a run of whole chunks) and the kept rows are copied into the buffer's first `len(keep)`
    rows; `slot[i]` is where window row i went. Without, a source with `read_into` reads each block
    straight into the buffer.
    """

    def __init__(self, source: RowSource, plan: EpochPlan, window: int, buffer: dict[str, np.ndarray],
                 keep: np.ndarray | None = None):
        self.source = source
        self.ranges = plan.block_ranges(window)
        size = int(plan.window_starts[window + 1] - plan.window_starts[window])
        self.keep = keep
        rows = size if keep is None else len(keep)
        self.buffer = {k: v[:rows] for k, v in buffer.items()}  # (kept rows, ...)
        self.slot = None
        if keep is not None:
            self.slot = np.full(size, -1, np.int64)
            self.slot[keep] = np.arange(len(keep))
        self._into = source.read_into if keep is None and reads_into(source) else None  # reads straight in
        self._next, self._filled, self._window_row = 0, 0, 0

    @property
    def remaining(self) -> int:
        return len(self.ranges) - self._next

    def read(self, blocks: int | None = None) -> None:
        end = len(self.ranges) if blocks is None else min(len(self.ranges), self._next + blocks)
        for start, stop in self.ranges[self._next : end]:
            at = self._filled
            if self._into is not None:
                self._into(start, stop, {k: v[at : at + stop - start] for k, v in self.buffer.items()})
                self._filled += stop - start
            else:
                block = self.source.read(start, stop)
                if self.keep is not None:  # the rows of this block that this process serves
                    lo, hi = np.searchsorted(self.keep, [self._window_row, self._window_row + stop - start])
                    block = {k: v[self.keep[lo:hi] - self._window_row] for k, v in block.items()}
                for k, v in block.items():
                    self.buffer[k][at : at + len(v)] = v
                self._filled += len(next(iter(block.values())))
            self._window_row += stop - start
        self._next = end


class StreamLoader:
    """Shuffled batches from a row source, read in whole chunks by a background thread.

    Args:
      source: an `HDF5Source`, `ArraySource` or anything with `__len__`, `chunk_rows`, `read`.
      batch_size: rows per batch (B).
      seed: the data-order seed; the order of epoch e is a function of (seed, e) only.
      block_rows: rows per contiguous read, a multiple of `source.chunk_rows`; default about 1 MiB.
      window_blocks: blocks per shuffle window; default `window_bytes` (32 MiB) of rows.
      drop_last: drop the epoch's final partial batch (its rows differ per epoch).
      queue_depth: ready host batches kept ahead of the consumer.
      window_bytes: the shuffle window's size in bytes, when window_blocks is not given.
      share: `(index, count)`: serve only rows `index * B / count .. (index + 1) * B / count - 1` of
        every batch (one process's slice of a global batch, in the same global order); the rows
        of other slices are never kept. B must divide by count.

    Raises:
      ConfigError: a non-positive size, or block_rows not a multiple of the chunk size.
      DataError: the source has fewer rows than one batch (with drop_last).
    """

    def __init__(self, source: RowSource, batch_size: int, *, seed: int, block_rows: int | None = None,
                 window_blocks: int | None = None, drop_last: bool = True, queue_depth: int = 16,
                 window_bytes: int = WINDOW_BYTES, share: tuple[int, int] = (0, 1)):
        chunk = max(1, int(source.chunk_rows))
        row_nbytes = max(1, int(getattr(source, "row_nbytes", 1)))
        if block_rows is None:
            block_rows = chunk * max(1, round(BLOCK_BYTES / (chunk * row_nbytes)))
        if window_blocks is None:
            window_blocks = max(1, window_bytes // (block_rows * row_nbytes))
        for name, value in (("batch_size", batch_size), ("block_rows", block_rows),
                            ("window_blocks", window_blocks), ("queue_depth", queue_depth)):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ConfigError(f"{name}={value} must be an integer >= 1")
        if block_rows % chunk:
            raise ConfigError(f"block_rows={block_rows} must be a multiple of the source's chunk size ({chunk} rows) "
                              "so that every read covers whole chunks")
        if seed < 0:
            raise ConfigError(f"seed={seed} must be >= 0")
        index, count = share
        if count > 1 and not drop_last:
            raise ConfigError("a share of each batch needs drop_last=True (the last batch has fewer rows)")
        if not (0 <= index < count and batch_size % count == 0):
            raise ConfigError(f"share={share}: batches of {batch_size} rows cannot be split into {count} equal slices")
        self.share = (index * batch_size // count, (index + 1) * batch_size // count)  # [lo, hi) of each batch
        self.source, self.batch_size, self.seed = source, batch_size, seed
        self.block_rows, self.window_blocks = block_rows, window_blocks
        self.drop_last, self.queue_depth = drop_last, queue_depth
        n = len(source)
        if drop_last and n < batch_size:
            raise DataError(f"the data has {n:,} rows, fewer than one batch of {batch_size}; lower the batch size "
                            "or use more rows")
        probe = source.read(0, 1)  # row shapes and dtypes, whatever the source type
        self._shapes = {k: v.shape[1:] for k, v in probe.items()}
        self._dtypes = {k: v.dtype for k, v in probe.items()}

    def __len__(self) -> int:
        return self.num_batches

    @property
    def num_batches(self) -> int:
        """Batches per epoch; without drop_last the last one has `len(source) % batch_size` rows."""
        n, b = len(self.source), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    @property
    def window_nbytes(self) -> int:
        """Host bytes of one shuffle window."""
        return self._window_rows * self._row_nbytes

    @property
    def host_nbytes(self) -> int:
        """The most host memory a stream of this loader reads ahead into, whatever the data's size:
        its two window buffers, `queue_depth` ready batches and the batch being filled (besides
        the block permutation, N / block_rows integers). The reader never reads more rows ahead
        of the consumer than fit in it."""
        return 2 * self.window_nbytes + (self.queue_depth + 1) * self.batch_size * self._row_nbytes

    @property
    def _row_nbytes(self) -> int:
        return sum(np.dtype(self._dtypes[k]).itemsize * math.prod(s) for k, s in self._shapes.items())

    @property
    def _window_rows(self) -> int:
        return min(len(self.source), self.window_blocks * self.block_rows)

    def plan(self, epoch: int) -> EpochPlan:
        """The order of epoch `epoch`."""
        return EpochPlan(len(self.source), self.block_rows, self.window_blocks, self.seed, epoch)

    def iter_epoch(self, epoch: int, start_batch: int = 0) -> BackgroundIterator:
        """Host batches {name: (B, ...)} of epoch `epoch`, from batch `start_batch` on (with a
        `share`, this process's rows of each batch).

        The returned iterator reads ahead in a daemon thread; close it (or use `with`) to stop
        early. A DataError raised while reading (NaN/Inf, a corrupt file) is re-raised by `next()`.
        """
        if not 0 <= start_batch <= self.num_batches:
            raise ValueError(f"start_batch={start_batch} is outside the epoch's {self.num_batches} batches")
        produce = lambda put: self._produce(epoch, start_batch, put, self._buffers())  # noqa: E731
        return BackgroundIterator(produce, self.queue_depth, name=f"jaxtrain-stream-epoch{epoch}")

    def iter_epochs(self, epoch: int, start_batch: int, last_epoch: int, batches: int) -> BackgroundIterator:
        """`iter_epoch` of epochs `epoch`..`last_epoch` one after another, `batches` of each (the
        first from `start_batch`), read by one thread: the next epoch's first window is read while
        the batches read ahead of this epoch's end are trained on, not after."""
        if not 0 <= start_batch <= batches <= self.num_batches:
            raise ValueError(f"batches={batches}, start_batch={start_batch}: at most the epoch's {self.num_batches}")

        def produce(put: Callable[[Any], None]) -> None:
            buffers = self._buffers()  # one pair for every epoch
            for e in range(epoch, last_epoch + 1):
                self._produce(e, start_batch if e == epoch else 0, put, buffers, batches)
                put(EPOCH_END)

        return BackgroundIterator(produce, self.queue_depth, name=f"jaxtrain-stream-epoch{epoch}")

    def _keep(self, plan: EpochPlan, window: int) -> np.ndarray | None:
        """The window-buffer rows this process serves (sorted), or None for all."""
        lo, hi = self.share
        if (lo, hi) == (0, self.batch_size):
            return None
        first, last = int(plan.window_starts[window]), int(plan.window_starts[window + 1])
        offset = np.arange(first, last) % self.batch_size  # each epoch position's place in its batch
        return np.sort(plan.window_order(window)[(offset >= lo) & (offset < hi)])

    def _buffers(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """A stream's two window buffers ({name: (window rows, ...)}), made in its reader thread and
        dropped (unmapped) when the thread ends: window w is read into buffer w % 2 while window
        w - 1 is served from the other."""
        rows = self._window_rows
        first, second = ({k: _mapped((rows, *s), self._dtypes[k]) for k, s in self._shapes.items()} for _ in range(2))
        return first, second

    def _reader(self, plan: EpochPlan, window: int, buffers: tuple[dict, dict]) -> _WindowReader:
        return _WindowReader(self.source, plan, window, buffers[window % 2], self._keep(plan, window))

    def _produce(self, epoch: int, start_batch: int, put: Callable[[dict], None], buffers: tuple[dict, dict],
                 batches: int | None = None) -> None:
        B, (lo, hi) = self.batch_size, self.share
        plan = self.plan(epoch)
        end = self.num_batches * B if self.drop_last else len(self.source)  # epoch rows served
        if batches is not None:
            end = min(end, batches * B)
        row = start_batch * B
        if row >= end:
            return
        window = plan.window_of(row)
        reader: _WindowReader | None  # None after the last window
        reader = self._reader(plan, window, buffers)
        reader.read()
        pieces: list[dict[str, np.ndarray]] = []
        filled = 0
        while row < end:
            assert reader is not None  # None only once the last window is served: then row == end
            first, last = int(plan.window_starts[window]), min(int(plan.window_starts[window + 1]), end)
            current, order, slot = reader.buffer, plan.window_order(window), reader.slot
            reader = self._reader(plan, window + 1, buffers) if last < end else None
            puts_left = -(-(last - row) // B)
            while row < last:
                take = min(B - filled, last - row)
                a, b = max(filled, lo) - filled, min(filled + take, hi) - filled  # this share's part of the run
                if a < b:
                    index = order[row - first + a : row - first + b]
                    pieces.append({k: v[index if slot is None else slot[index]] for k, v in current.items()})
                filled, row = filled + take, row + take
                if filled == B or row == end:
                    put(pieces[0] if len(pieces) == 1 else {k: np.concatenate([p[k] for p in pieces]) for k in current})
                    pieces, filled = [], 0
                    if reader is not None:  # spread the next window's reads over this window's batches
                        reader.read(-(-reader.remaining // max(1, puts_left)))
                        puts_left -= 1
            if reader is not None:
                reader.read()
            window += 1


class DevicePrefetcher:
    """Moves host batches to the device in a thread, keeping `depth` batches there ahead.

    Items on the queue are stacks of batches {name: (g, B, ...)}: the thread stacks g = `group`
    host batches with `np.stack` and transfers them with one `device_put`, so `next_batches(g)`
    costs the consumer only the hand-over (one transfer per stack is much cheaper than a
    device_put per batch followed by `jnp.stack`).
    Other k are served by concatenating stacks on the device. A final batch of a different size is
    never stacked with full ones.

    Args:
      batches: host batches {name: (B, ...)}, e.g. `StreamLoader.iter_epoch(e)`; closed with this.
      depth: batches kept on the device ahead of the consumer.
      device: a `jax.Device` or `Sharding` for `jax.device_put` (default: the default device), or a
        function that places a host stack {name: (g, B, ...)} and returns the device arrays.
      group: batches per transfer; default the k of the first `next_batches(k)` (1 for `next()`).
        The thread starts at that first request. A later request for more batches than a group
        raises the group to it (the queue holds `depth / group` groups: a run whose K grows after
        its first calls, or a stream that runs on across epochs, keeps calls, not batches, ahead).
    """

    def __init__(self, batches: Iterator[dict[str, np.ndarray]], depth: int = 2, device: Any = None,
                 group: int | None = None):
        if depth < 1 or (group is not None and group < 1):
            raise ConfigError(f"depth={depth} and group={group} must be >= 1")
        self._source, self._depth, self._device, self._group = batches, depth, device, group
        self._size = [group or 0]  # the group the transfer thread stacks next (a list it reads each time)
        self._leftover: dict[str, jax.Array] | None = None
        self._it: BackgroundIterator | None = None

    @property
    def wait_s(self) -> float:
        """Seconds the consumer has spent waiting for batches (input-bound time)."""
        return self._it.wait_s if self._it is not None else 0.0

    def _start(self, k: int) -> BackgroundIterator:
        group = self._group or k
        self._size[0] = group
        batches, device, size = self._source, self._device, self._size
        produce = lambda put: _transfer(batches, device, size, put)  # noqa: E731 - must not hold `self`
        self._it = BackgroundIterator(produce, -(-self._depth // group), name="jaxtrain-device-prefetch")
        return self._it

    def next_batches(self, k: int) -> dict[str, jax.Array]:
        """The next k batches stacked on the device: {name: (k, B, ...)}.

        Fewer than k come back at the end of the data, or before a batch of a different size.

        Raises:
          StopIteration: no batches are left.
        """
        if self._it is not None and k > self._size[0]:
            self._size[0] = k  # from the next group on
        parts: list[dict[str, jax.Array]] = []
        count = 0
        while count < k:
            stack = self._leftover if self._leftover is not None else self._next_stack(not parts, k)
            self._leftover = None
            if stack is None:
                break
            g = _num(stack)
            if parts and _shape(stack, 1) != _shape(parts[0], 1):
                self._leftover = stack
                break
            if count + g > k:
                stack, self._leftover = _split(stack, k - count)
                g = k - count
            parts.append(stack)
            count += g
        if len(parts) == 1:
            return parts[0]
        return {name: jnp.concatenate([p[name] for p in parts]) for name in parts[0]}

    def _next_stack(self, required: bool, k: int) -> dict[str, jax.Array] | None:
        try:
            return next(self._it or self._start(k))
        except StopIteration:
            if required:
                raise
            return None

    def __iter__(self) -> "DevicePrefetcher":
        return self

    def __next__(self) -> dict[str, jax.Array]:
        """The next single batch {name: (B, ...)} on the device."""
        return {k: v[0] for k, v in self.next_batches(1).items()}

    def close(self) -> None:
        """Stops the transfer thread and closes the host-batch iterator."""
        if self._it is not None:
            self._it.close()
        if hasattr(self._source, "close"):
            self._source.close()

    def __enter__(self) -> "DevicePrefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _transfer(batches: Iterator[dict], device: Any, group: list[int], put: Callable[[dict], None]) -> None:
    """Stacks up to `group[0]` host batches of one size and puts them on the device."""
    place = device if callable(device) else lambda host: jax.device_put(host, device)
    for pending in _groups(iter(batches), group):
        while pending:  # split where the batch size changes (the last batch without drop_last)
            n = next((i for i, b in enumerate(pending) if _shape(b) != _shape(pending[0])), len(pending))
            run, pending = pending[:n], pending[n:]
            # (g, B, ...) in memory of its own (`_mapped`): a call's K batches, megabytes each time,
            # never cut from (and left to fragment) the C heap; dropped before waiting to queue.
            host = {k: np.stack([b[k] for b in run], out=_mapped((n, *run[0][k].shape), run[0][k].dtype))
                    for k in run[0]}
            placed = jax.block_until_ready(place(host))
            del host
            put(placed)


def _groups(it: Iterator[Any], group: list[int]) -> Iterator[list[dict]]:
    """Lists of up to `group[0]` batches of `it`, none across an `EPOCH_END`."""
    pending: list[dict] = []
    for batch in it:
        if batch is not EPOCH_END:
            pending.append(batch)
        if pending and (batch is EPOCH_END or len(pending) >= group[0]):
            yield pending
            pending = []
    if pending:
        yield pending


def _shape(batch: dict, skip: int = 0) -> tuple:
    return tuple(v.shape[skip:] for v in batch.values())


def _num(stack: dict) -> int:
    return next(iter(stack.values())).shape[0]


def _split(stack: dict, n: int) -> tuple[dict, dict]:
    return {k: v[:n] for k, v in stack.items()}, {k: v[n:] for k, v in stack.items()}
