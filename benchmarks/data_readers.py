"""Reader throughput: jaxtrain's StreamLoader against Grain pipelines over the same HDF5 file.

Grain (`pip install grain`, not a jaxtrain dependency) wants a random-access source. Three
pipelines are measured:
  grain_rows:         a per-row source (`__getitem__(i)` reads row i), globally shuffled, batched.
                      One HDF5 call per row and field: the pattern HDF5 is slowest at.
  grain_block_window: a per-block source (`__getitem__(j)` reads block j, whole chunks), blocks
                      shuffled, flattened to rows, a window shuffle of the same size as
                      StreamLoader's, batched: the same randomness as StreamLoader.
  grain_block_rebatch: blocks shuffled, rows shuffled within each block in NumPy, re-batched:
                      cheapest, but rows only mix within one block.
"""

from __future__ import annotations

import os
import time
from typing import Iterator

import numpy as np

from jaxtrain._src.data.sources import HDF5Source
from jaxtrain._src.data.stream import StreamLoader


def _rows_per_s(batches: Iterator[dict], batch_size: int, num_batches: int) -> float:
    next(batches)  # first batch: thread start and first window, not throughput
    t0 = time.perf_counter()
    done = 0
    for _ in range(num_batches):
        try:
            next(batches)
        except StopIteration:
            break
        done += 1
    return done * batch_size / (time.perf_counter() - t0)


class _RowSource:
    """Grain random-access source of single rows."""

    def __init__(self, source: HDF5Source):
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.source.read(int(i), int(i) + 1).items()}


class _BlockSource:
    """Grain random-access source of contiguous blocks of rows."""

    def __init__(self, source: HDF5Source, block_rows: int):
        self.source, self.block_rows = source, block_rows

    def __len__(self) -> int:
        return -(-len(self.source) // self.block_rows)

    def __getitem__(self, j: int) -> dict[str, np.ndarray]:
        start = int(j) * self.block_rows
        return self.source.read(start, min(start + self.block_rows, len(self.source)))


def reader_throughput(path: str | os.PathLike, keys: dict[str, str], batch_size: int,
                      num_batches: int) -> dict[str, float]:
    """Rows/s of StreamLoader and of the Grain pipelines above, each over `num_batches` batches.

    The per-row Grain pipeline is measured over a tenth of the batches (it is orders slower).
    Needs `grain` installed.
    """
    import grain

    results: dict[str, float] = {}
    with HDF5Source(path, keys) as source:
        loader = StreamLoader(source, batch_size, seed=0)
        with loader.iter_epoch(0) as batches:
            results["stream_loader"] = _rows_per_s(batches, batch_size, num_batches)
        block_rows, window_rows = loader.block_rows, loader.block_rows * loader.window_blocks

        rows = grain.MapDataset.source(_RowSource(source)).shuffle(seed=0).batch(batch_size)
        results["grain_rows"] = _rows_per_s(iter(rows.to_iter_dataset()), batch_size, max(1, num_batches // 10))

        class Split(grain.experimental.FlatMapTransform):
            max_fan_out = block_rows

            def flat_map(self, block):
                n = len(next(iter(block.values())))
                return [{k: v[i] for k, v in block.items()} for i in range(n)]

        blocks = grain.MapDataset.source(_BlockSource(source, block_rows)).shuffle(seed=0).to_iter_dataset()
        window = grain.experimental.WindowShuffleIterDataset(
            grain.experimental.FlatMapIterDataset(blocks, Split()), window_size=window_rows, seed=0)
        results["grain_block_window"] = _rows_per_s(iter(window.batch(batch_size)), batch_size, num_batches)

        def shuffle_rows(block, rng):
            order = rng.permutation(len(next(iter(block.values()))))
            return {k: v[order] for k, v in block.items()}

        shuffled = grain.MapDataset.source(_BlockSource(source, block_rows)).shuffle(seed=0).random_map(
            shuffle_rows, seed=0).to_iter_dataset()
        rebatch = grain.experimental.RebatchIterDataset(shuffled, batch_size=batch_size, drop_remainder=True)
        results["grain_block_rebatch"] = _rows_per_s(iter(rebatch), batch_size, num_batches)
    return results


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(reader_throughput(sys.argv[1], {"x": "features", "y": "targets"}, int(sys.argv[2]),
                                       int(sys.argv[3])), indent=2))
