"""StreamLoader and DevicePrefetcher: every row once, a reproducible order, exact resume, errors from the
reader thread, no leaked threads, and host memory that does not grow with the number of rows."""

import gc
import subprocess
import sys
import textwrap
import threading
import time

import h5py
import numpy as np
import pytest

from jaxtrain._src.data import ArraySource, DevicePrefetcher, HDF5Source, StreamLoader
from jaxtrain._src.errors import ConfigError, DataError


def id_arrays(n: int) -> dict[str, np.ndarray]:
    ids = np.arange(n)
    return {"id": ids, "x": np.stack([ids, -ids], axis=1).astype(np.float32)}  # x derives from the row id


def write_h5(path, arrays, chunks):
    with h5py.File(path, "w") as f:
        for name, a in arrays.items():
            f.create_dataset(name, data=a, chunks=(min(chunks, len(a)), *a.shape[1:]))
    return path


def epoch_ids(loader, epoch, start_batch=0):
    with loader.iter_epoch(epoch, start_batch) as batches:
        return [b["id"] for b in batches]


def loader_threads():
    return [t for t in threading.enumerate() if t.name.startswith("jaxtrain-")]


@pytest.mark.parametrize("n", [1, 37, 1000, 1537])
@pytest.mark.parametrize("chunk", [16, 100])
@pytest.mark.parametrize("batch", [7, 32])
def test_every_row_exactly_once_per_epoch(tmp_path, n, chunk, batch):
    path = write_h5(tmp_path / "d.h5", id_arrays(n), chunk)
    with HDF5Source(path, {"id": "id", "x": "x"}) as source:
        loader = StreamLoader(source, batch, seed=3, block_rows=source.chunk_rows, window_blocks=3, drop_last=False)
        assert loader.num_batches == -(-n // batch)
        for epoch in (0, 1):
            with loader.iter_epoch(epoch) as batches:
                got = list(batches)
            sizes = [len(b["id"]) for b in got]
            assert sizes == [batch] * (n // batch) + ([n % batch] if n % batch else [])
            ids = np.concatenate([b["id"] for b in got])
            assert sorted(ids.tolist()) == list(range(n))
            for b in got:  # rows stay whole: every field of a row comes from the same row
                np.testing.assert_array_equal(b["x"], np.stack([b["id"], -b["id"]], axis=1))


def test_drop_last_serves_num_batches_full_batches_of_distinct_rows():
    loader = StreamLoader(ArraySource(id_arrays(1537), chunk_rows=16), 100, seed=0, block_rows=32, window_blocks=3)
    assert loader.num_batches == 15
    dropped = []
    for epoch in (0, 1):
        ids = epoch_ids(loader, epoch)
        assert [len(b) for b in ids] == [100] * 15
        served = np.concatenate(ids)
        assert len(set(served.tolist())) == 1500
        dropped.append(set(range(1537)) - set(served.tolist()))
    assert dropped[0] != dropped[1]  # the final partial batch differs per epoch
    with pytest.raises(DataError, match="the data has 1,537 rows, fewer than one batch of 2000; lower the batch size"):
        StreamLoader(ArraySource(id_arrays(1537)), 2000, seed=0)


def test_order_is_a_function_of_seed_and_epoch():
    source = ArraySource(id_arrays(1000), chunk_rows=10)
    kwargs = dict(block_rows=20, window_blocks=4, drop_last=False)
    a = np.concatenate(epoch_ids(StreamLoader(source, 32, seed=5, **kwargs), 2))
    b = np.concatenate(epoch_ids(StreamLoader(source, 32, seed=5, **kwargs), 2))
    c = np.concatenate(epoch_ids(StreamLoader(source, 32, seed=5, **kwargs), 3))
    d = np.concatenate(epoch_ids(StreamLoader(source, 32, seed=6, **kwargs), 2))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and not np.array_equal(a, d)
    assert np.mean(a == np.arange(1000)) < 0.05  # actually shuffled


def test_windows_hold_whole_blocks_and_shuffle_within_them():
    block, window_blocks, n = 20, 4, 1010
    loader = StreamLoader(ArraySource(id_arrays(n), chunk_rows=10), 10, seed=1, block_rows=block,
                          window_blocks=window_blocks, drop_last=False)
    order = np.concatenate(epoch_ids(loader, 0))
    plan = loader.plan(0)
    assert plan.num_windows == -(-51 // window_blocks) and plan.window_starts[-1] == n
    for w in range(plan.num_windows):
        rows = order[plan.window_starts[w] : plan.window_starts[w + 1]]
        blocks = np.unique(rows // block)
        assert len(blocks) == min(window_blocks, 51 - w * window_blocks)
        expected = np.concatenate([np.arange(b * block, min(n, (b + 1) * block)) for b in blocks])
        np.testing.assert_array_equal(np.sort(rows), expected)  # the window is exactly its blocks' rows


class CountingSource(ArraySource):
    """An ArraySource that records the row ranges read from it (the loader reads with `read_into`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads = []

    def read(self, start, stop):
        self.reads.append((start, stop))
        return super().read(start, stop)

    def read_into(self, start, stop, out):
        self.reads.append((start, stop))
        super().read_into(start, stop, out)

    @property
    def rows_read(self):
        return sum(stop - start for start, stop in self.reads)


def test_start_batch_resumes_with_the_identical_order_and_skips_reading():
    source = CountingSource(id_arrays(1537), chunk_rows=16)
    loader = StreamLoader(source, 7, seed=9, block_rows=32, window_blocks=3, drop_last=False)
    full = epoch_ids(loader, 4)
    plan = loader.plan(4)
    window_rows = int(plan.window_starts[1])
    boundary = [int(s) // 7 for s in plan.window_starts[1:4]]  # batches that straddle window boundaries
    for start in sorted({1, 5, *boundary, *(b + 1 for b in boundary), loader.num_batches - 1, loader.num_batches}):
        source.reads.clear()
        tail = epoch_ids(loader, 4, start)
        assert len(tail) == len(full) - start
        for a, b in zip(tail, full[start:]):
            np.testing.assert_array_equal(a, b)
        if start < loader.num_batches:  # nothing before the window of the first requested row was read
            first_window = plan.window_of(start * 7)
            assert sum(b - a for a, b in source.reads) <= len(source) - int(plan.window_starts[first_window])
    assert window_rows == 96


def test_hdf5_and_in_memory_sources_give_identical_batches(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"x": rng.normal(size=(1000, 6)).astype(np.float32), "y": rng.integers(0, 9, 1000).astype(np.int32)}
    path = write_h5(tmp_path / "d.h5", arrays, 50)
    kwargs = dict(seed=2, block_rows=100, window_blocks=3)
    with HDF5Source(path, {"x": "x", "y": "y"}, stop=-100) as h5:
        from_file = list(StreamLoader(h5, 32, **kwargs).iter_epoch(1))
    in_memory = list(StreamLoader(ArraySource(arrays, stop=-100), 32, **kwargs).iter_epoch(1))
    assert len(from_file) == len(in_memory) == 900 // 32
    for a, b in zip(from_file, in_memory):
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["y"], b["y"])


def test_nan_in_the_reader_thread_is_raised_in_the_consumer(tmp_path):
    arrays = id_arrays(1000)
    arrays["x"][777, 1] = np.nan
    path = write_h5(tmp_path / "nan.h5", arrays, 50)
    with HDF5Source(path, {"id": "id", "x": "x"}) as source:
        loader = StreamLoader(source, 10, seed=0, block_rows=50, window_blocks=2)
        message = r"rows 750–799 of 'x' in .*nan.h5 contain NaN/Inf \(1 bad, first row 777\)"
        with pytest.raises(DataError, match=message):
            for _ in loader.iter_epoch(0):
                pass
        with pytest.raises(DataError, match="rows 750–799 of 'x'"):
            with DevicePrefetcher(loader.iter_epoch(0)) as prefetcher:
                while True:
                    prefetcher.next_batches(4)
    assert not loader_threads()


def test_closing_early_stops_the_threads():
    loader = StreamLoader(ArraySource(id_arrays(5000), chunk_rows=10), 10, seed=0, block_rows=50, window_blocks=2,
                          queue_depth=2)
    for epoch in range(3):
        with loader.iter_epoch(epoch) as batches:
            next(batches)
        assert not loader_threads()
    batches = loader.iter_epoch(0)
    next(batches)
    del batches  # dropped without close: the thread notices at its next put
    gc.collect()
    deadline = time.monotonic() + 5
    while loader_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not loader_threads()


def test_device_prefetcher_stacks_batches_on_the_device():
    arrays = id_arrays(100)
    loader = StreamLoader(ArraySource(arrays, chunk_rows=5), 8, seed=0, block_rows=10, window_blocks=2,
                          drop_last=False)
    host = epoch_ids(loader, 0)  # 12 batches of 8, then one of 4
    release = threading.Event()

    def held_back(batches):  # the first batch comes only when `release` is set
        release.wait()
        yield from batches

    t0 = time.perf_counter()
    with DevicePrefetcher(held_back(loader.iter_epoch(0)), depth=2) as prefetcher:
        threading.Timer(0.25, release.set).start()
        first = prefetcher.next_batches(4)  # group = 4 from here on
        assert first["id"].shape == (4, 8) and first["x"].shape == (4, 8, 2)
        second = prefetcher.next_batches(6)  # 4 + half of the next stack, joined on the device
        third = prefetcher.next_batches(5)  # the rest of that stack and a full one, then the size changes
        last = prefetcher.next_batches(5)  # the final batch of 4 rows comes alone
        with pytest.raises(StopIteration):
            prefetcher.next_batches(5)
        # The consumer waited for the held-back first batch (0.25 s, less thread start-up) and never longer
        # than the block has run.
        assert 0.15 <= prefetcher.wait_s <= time.perf_counter() - t0
    assert [s["id"].shape for s in (second, third, last)] == [(6, 8), (2, 8), (1, 4)]
    got = [np.asarray(row) for s in (first, second, third, last) for row in s["id"]]
    assert len(got) == len(host) == 13
    for a, b in zip(got, host):
        np.testing.assert_array_equal(a, b)
    assert not loader_threads()
    single = next(iter(DevicePrefetcher(loader.iter_epoch(0))))
    np.testing.assert_array_equal(np.asarray(single["id"]), host[0])


def test_bad_loader_settings_are_config_errors():
    source = ArraySource(id_arrays(100), chunk_rows=16)
    with pytest.raises(ConfigError, match=r"block_rows=24 must be a multiple of the source's chunk size \(16 rows\)"):
        StreamLoader(source, 8, seed=0, block_rows=24)
    with pytest.raises(ConfigError, match="batch_size=0 must be an integer >= 1"):
        StreamLoader(source, 0, seed=0)
    with pytest.raises(ValueError, match="start_batch=13 is outside the epoch's 12 batches"):
        StreamLoader(source, 8, seed=0).iter_epoch(0, 13)


PEAK_RSS = textwrap.dedent("""
    import resource, sys
    from jaxtrain._src.data import HDF5Source, StreamLoader
    with HDF5Source(sys.argv[1], {"x": "x"}) as source:
        loader = StreamLoader(source, 4096, seed=0, block_rows=16384, window_blocks=4, drop_last=False)
        rows = sum(len(b["x"]) for b in loader.iter_epoch(0))
    assert rows == len(source), rows
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB
""")


@pytest.mark.slow
def test_host_memory_does_not_grow_with_the_number_of_rows(tmp_path):
    peaks = []
    for n in (200_000, 2_000_000):  # 12.8 MB and 128 MB of float32 rows; windows of 4 MiB
        path = tmp_path / f"{n}.h5"
        with h5py.File(path, "w") as f:
            ds = f.create_dataset("x", (n, 16), np.float32, chunks=(4096, 16))
            for start in range(0, n, 200_000):
                ds[start : start + 200_000] = np.full((min(200_000, n - start), 16), 1.0, np.float32)
        proc = subprocess.run([sys.executable, "-c", PEAK_RSS, str(path)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        peaks.append(int(proc.stdout.split()[-1]) / 1024)  # MiB
        path.unlink()
    small, large = peaks
    assert large <= small * 1.10 + 8, f"peak RSS {small:.0f} MiB for 2e5 rows, {large:.0f} MiB for 2e6 rows"


def settled(source, quiet=0.2, timeout=5.0):
    """The source's rows read once its reader has stopped reading (blocked on a full queue): no read
    for `quiet` seconds."""
    deadline, last, since = time.monotonic() + timeout, source.rows_read, time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        time.sleep(0.02)
        if source.rows_read != last:
            last, since = source.rows_read, time.monotonic()
    return last


def test_read_ahead_is_bounded_by_two_windows_and_the_queue_across_epochs(monkeypatch):
    """However long the consumer waits, the reader reads at most `host_nbytes` of rows ahead of it
    (two windows and the queue), at the start, mid-epoch and across an epoch's end, and it does read
    ahead (the queue fills); the window buffers are mapped once per stream, not once per window:
    100 windows an epoch, three epochs, two buffers."""
    import jaxtrain._src.data.stream as stream

    mapped = []
    monkeypatch.setattr(stream, "_mapped", lambda shape, dtype: mapped.append((shape, dtype)) or np.empty(shape, dtype))
    source = CountingSource(id_arrays(20_000), chunk_rows=10)
    B, row_nbytes = 8, 8 + 2 * 4  # id int64, x 2 x float32
    loader = StreamLoader(source, B, seed=0, block_rows=50, window_blocks=4, queue_depth=4)
    window_rows = 200
    assert loader.window_nbytes == window_rows * row_nbytes
    assert loader.host_nbytes == (2 * window_rows + 5 * B) * row_nbytes
    source.reads.clear()
    epochs = 3
    with loader.iter_epochs(1, 0, epochs, loader.num_batches) as batches:
        consumed = 0
        for stop_at in (0, 30, loader.num_batches - 2, loader.num_batches + 40):  # the last two: across epoch 1's end
            while consumed < stop_at:
                if next(batches) is not stream.EPOCH_END:
                    consumed += 1
            ahead = settled(source) - consumed * B
            assert loader.queue_depth * B <= ahead <= loader.host_nbytes // row_nbytes, (stop_at, ahead)
        served = consumed + sum(b is not stream.EPOCH_END for b in batches)
    assert served == epochs * loader.num_batches and source.rows_read == epochs * 20_000
    assert [shape for shape, _ in mapped] == [(window_rows,), (window_rows, 2)] * 2  # id and x of two buffers


def test_shares_of_each_batch_are_the_one_process_order_split_and_keep_only_their_rows():
    """Process p of P serves rows p·B/P .. (p+1)·B/P - 1 of every global batch: concatenated, the
    shares are the single-process batches, from any start batch, and a share's window buffer holds
    only its own rows."""
    source = ArraySource(id_arrays(1537), chunk_rows=16)
    kwargs = dict(seed=3, block_rows=32, window_blocks=3)
    whole = StreamLoader(source, 32, **kwargs)
    shares = [StreamLoader(source, 32, share=(p, 4), **kwargs) for p in range(4)]
    for epoch, start in ((1, 0), (2, 7)):
        expected = epoch_ids(whole, epoch, start)
        parts = [epoch_ids(s, epoch, start) for s in shares]
        assert len(expected) == len(parts[0]) == whole.num_batches - start
        for i, batch in enumerate(expected):
            assert all(len(p[i]) == 8 for p in parts)
            np.testing.assert_array_equal(np.concatenate([p[i] for p in parts]), batch)
    plan = shares[1].plan(1)
    keep = shares[1]._keep(plan, 0)
    assert len(keep) == pytest.approx(int(plan.window_starts[1]) / 4, abs=8)  # a quarter of the window's rows
    with pytest.raises(ConfigError, match="cannot be split into 3 equal slices"):
        StreamLoader(source, 32, share=(0, 3), **kwargs)
