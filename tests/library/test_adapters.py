"""Others' data in fit: map-style datasets (PyTorch, Hugging Face, Grain, plain classes) in jaxtrain's
order equal the arrays they hold; iterables of batches (DataLoader, Grain, generators) train in
their own order, resume exactly (a Grain source without a stable repr() by skipping), are fingerprinted
through their datasets so that a resume on changed data is refused, and every bad input is one line."""

import itertools
import re
import shutil
import time

import jax
import numpy as np
import pytest
from conftest import mse, regression_data, silent, small_mlp

from jaxtrain import CheckpointConfig, DataConfig, TrainConfig
from jaxtrain._src.checkpoint import Checkpointer
from jaxtrain._src.data import adapters
from jaxtrain._src.data.adapters import BatchStream, MapSource, NpySource, adapt
from jaxtrain._src.data.fingerprint import data_change, fingerprint
from jaxtrain._src.errors import ConfigError, DataError
from jaxtrain._src.feeds import epoch_permutation
from jaxtrain._src.hooks.checkpointing import CheckpointHook
from jaxtrain._src.loop import RunOptions, run

torch = pytest.importorskip("torch")
grain = pytest.importorskip("grain")
datasets = pytest.importorskip("datasets")

N, B = 200, 16  # 200 rows: 12 full batches and a short one of 8
TRAIN, VAL = regression_data(N), regression_data(40, seed=1)


def _params(result) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(result.state.params)]


def _fit(train, val=VAL, run_dir=None, resume=False, console=None, **overrides):
    config = TrainConfig(**{"epochs": 2, "batch_size": B, "steps_per_call": 3, "tensorboard": False, **overrides})
    return run(small_mlp(), mse, train, val, config, run_dir=run_dir, resume=resume, verbosity="summary",
               session=RunOptions(console=console or silent()))


class Rows:
    """A plain map-style dataset: one dict sample per index."""

    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data["x"])

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.data.items()}

    def __repr__(self):  # Grain's DataLoader checks a resumed source by its repr
        return f"Rows({len(self)})"


class TorchRows(torch.utils.data.Dataset):
    def __init__(self, data):
        self.x, self.y = (torch.from_numpy(data[k]) for k in ("x", "y"))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


def _jaxtrain_order_batches(data, seed=0):
    """A callable whose fresh iterator yields, epoch after epoch, the batches of jaxtrain's own order
    for `data` on the device (so an iterable can be checked against arrays to the bit)."""
    data_key = jax.random.split(jax.random.key(seed))[1]
    epoch = [0]

    def batches():
        epoch[0] += 1
        perm = np.asarray(epoch_permutation(data_key, np.int32(epoch[0]), len(data["x"])))
        for i in range(0, len(perm) - B + 1, B):
            yield {k: v[perm[i : i + B]] for k, v in data.items()}

    return batches, epoch


@pytest.fixture(scope="module")
def on_arrays():
    return _fit(TRAIN)


@pytest.mark.parametrize("make", [
    lambda: Rows(TRAIN),
    lambda: TorchRows(TRAIN),
    lambda: datasets.Dataset.from_dict(TRAIN),
    lambda: grain.MapDataset.source(Rows(TRAIN)),
], ids=["class", "torch-dataset", "hf-dataset", "grain-mapdataset"])
def test_map_style_datasets_equal_the_arrays_they_hold(make, on_arrays):
    result = _fit(make())
    for a, b in zip(_params(result), _params(on_arrays), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert result.history[-1]["val_loss"] == pytest.approx(on_arrays.history[-1]["val_loss"], rel=1e-6)


def test_an_iterable_in_jaxtrains_order_equals_the_arrays_and_a_shuffling_loader_learns_as_well(on_arrays):
    batches, epochs = _jaxtrain_order_batches(TRAIN)
    console = silent()
    result = _fit(batches, steps_per_epoch=N // B, console=console)  # no len(): steps given
    assert epochs[0] == 2  # one fresh iterator per epoch (the first, read before training, serves epoch 1)
    for a, b in zip(_params(result), _params(on_arrays), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert "streamed from function in its order" in console.file.getvalue()

    tensors = torch.utils.data.TensorDataset(torch.from_numpy(TRAIN["x"]), torch.from_numpy(TRAIN["y"]))
    loader = torch.utils.data.DataLoader(tensors, batch_size=B, shuffle=True, generator=torch.Generator())
    tuples = lambda model, batch, key: mse(model, {"x": batch[0], "y": batch[1]}, key)  # noqa: E731
    config = TrainConfig(epochs=2, batch_size=B, steps_per_call=3, tensorboard=False)
    shuffled = run(small_mlp(), tuples, loader, (VAL["x"], VAL["y"]), config, verbosity="silent")
    assert shuffled.summary["steps"] == 2 * (N // B)  # the short last batch dropped
    assert shuffled.history[0]["samples_dropped"] == N % B
    # another order of the same samples: the same loss within noise (10% after 24 steps here)
    assert shuffled.history[-1]["val_loss"] == pytest.approx(on_arrays.history[-1]["val_loss"], rel=0.1)


def test_a_large_map_style_dataset_streams_in_the_order_of_arrays_streamed():
    stream = DataConfig(placement="stream", shuffle_window_mb=1)
    from_map, from_arrays = _fit(TorchRows(TRAIN), data=stream), _fit(TRAIN, data=stream)
    for a, b in zip(_params(from_map), _params(from_arrays), strict=True):
        np.testing.assert_array_equal(a, b)
    assert "input_wait_fraction" in from_map.history[0]


def test_map_style_reads_use_a_batched_read_where_the_dataset_has_one():
    class Counting(Rows):
        singles = batched = 0

        def __getitem__(self, i):
            i = int(i)  # takes no slices
            Counting.singles += 1
            return super().__getitem__(i)

        def __getitems__(self, indices):
            Counting.batched += 1
            return [super(Counting, self).__getitem__(i) for i in indices]

    source = MapSource(Counting(TRAIN))
    block = source.read(10, 74)
    np.testing.assert_array_equal(block["x"], TRAIN["x"][10:74])
    assert (Counting.singles, Counting.batched) == (1, 1)  # sample 0 for the spec, then one call for 64 rows
    assert MapSource(Counting(TRAIN)).mode == "getitems"
    threaded = MapSource(Ragged(TRAIN, bad=None), threads=4)  # one sample at a time, on 4 threads
    assert threaded.mode == "samples"
    np.testing.assert_array_equal(threaded.read(0, N)["y"], TRAIN["y"])
    # A dataset whose ds[a:b] stacks its samples is read a range at a time; one whose slice differs
    # from its samples (here: noise drawn per call) is read sample by sample.
    assert MapSource(Rows(TRAIN)).mode == "slice" and MapSource(TorchRows(TRAIN)).mode == "slice"
    tensors = torch.utils.data.TensorDataset(torch.from_numpy(TRAIN["x"]), torch.from_numpy(TRAIN["y"]))
    assert MapSource(tensors).mode == "slice"
    np.testing.assert_array_equal(MapSource(tensors).read(5, 150)["leaf0"], TRAIN["x"][5:150])

    class Noisy(Rows):
        def __getitem__(self, i):
            sample = super().__getitem__(i)
            return {**sample, "x": sample["x"] + np.random.normal(size=sample["x"].shape).astype(np.float32)}

    assert MapSource(Noisy(TRAIN)).mode == "samples"


def test_batches_from_a_loader_accumulate_pad_and_count(on_arrays):
    tensors = torch.utils.data.TensorDataset(torch.from_numpy(TRAIN["x"]), torch.from_numpy(TRAIN["y"]))
    tuples = lambda model, batch, key: mse(model, {"x": batch[0], "y": batch[1]}, key)  # noqa: E731
    loader = torch.utils.data.DataLoader(tensors, batch_size=B)
    config = TrainConfig(epochs=1, batch_size=B, grad_accum=2, steps_per_call=2, tensorboard=False,
                         data=DataConfig(last_batch="pad"))
    result = run(small_mlp(), tuples, loader, None, config, verbosity="silent")
    assert result.summary["steps"] == 13 // 2  # 12 full batches and the padded 13th, two a step
    assert result.history[0]["samples_dropped"] == N % B  # the padded 13th batch (8 samples) had no partner

    def generator():  # a plain callable without len(): counted once, in a pass before training
        return ({k: v[i : i + B] for k, v in TRAIN.items()} for i in range(0, N, B))

    console = silent()
    import contextlib
    import io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        counted = _fit(generator, console=console, data=DataConfig(last_batch="pad"))
    assert counted.summary["steps"] == 2 * 13
    assert "counted 13 batches of an epoch in one pass" in err.getvalue()
    assert "the short last batch (8 rows) padded" in console.file.getvalue()


def test_batch_size_is_the_loaders():
    loader = torch.utils.data.DataLoader(TorchRows(TRAIN), batch_size=25)
    import contextlib
    import io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        result = _fit(loader, batch_size=64, epochs=1)
    assert result.summary["steps"] == 8 and "yields batches of 25 rows" in err.getvalue()


def _resume_each_mid_epoch(tmp_path, train, every=5, **overrides):
    """Trains with checkpoints every few steps, then resumes from each mid-epoch one (as after a
    kill) and checks the result equals the uninterrupted run bit for bit."""
    ckpt = CheckpointConfig(every_steps=every, keep_last=100, keep_best=0)
    reference = _fit(train(), run_dir=tmp_path / "full", checkpoint=ckpt, **overrides)
    spe = reference.summary["steps"] // 2
    mid = [s for s in Checkpointer(tmp_path / "full" / "checkpoints").steps() if s % spe]
    assert len(mid) >= 2
    for step in mid:
        run = tmp_path / f"from-{step}"
        shutil.copytree(tmp_path / "full", run)
        for later in (p for p in (run / "checkpoints").iterdir() if p.name.isdigit() and int(p.name) > step):
            shutil.rmtree(later)
        resumed = _fit(train(), run_dir=run, resume=True, checkpoint=ckpt, **overrides)
        for a, b in zip(_params(resumed), _params(reference), strict=True):
            np.testing.assert_array_equal(a, b)
    return reference


def test_resume_is_exact_for_map_style_grain_and_torch_loaders(tmp_path):
    _resume_each_mid_epoch(tmp_path / "map", lambda: TorchRows(TRAIN), data=DataConfig(placement="stream"))

    def grain_loader():
        sampler = grain.samplers.IndexSampler(N, shuffle=True, seed=7, num_epochs=1)
        return grain.DataLoader(data_source=Rows(TRAIN), sampler=sampler, worker_count=0,
                                operations=[grain.transforms.Batch(B, drop_remainder=True)])

    _resume_each_mid_epoch(tmp_path / "grain", grain_loader, steps_per_epoch=N // B)

    def torch_loader():
        return torch.utils.data.DataLoader(TorchRows(TRAIN), batch_size=B, shuffle=True, generator=torch.Generator())

    _resume_each_mid_epoch(tmp_path / "torch", torch_loader)


class Augmented(TorchRows):
    """A dataset whose samples change from one read to the next (random augmentation)."""

    def __getitem__(self, i):
        sample = super().__getitem__(i)
        return {**sample, "x": sample["x"] + 0.01 * torch.randn(sample["x"].shape)}


class NoRepr(Rows):
    """A Grain source with Python's default repr(): a memory address, new in every process."""

    __repr__ = object.__repr__


def _loader(data, cls=TorchRows):
    return torch.utils.data.DataLoader(cls(data), batch_size=B, shuffle=True, generator=torch.Generator())


def test_a_loader_is_fingerprinted_through_its_dataset():
    def fp(data):
        return fingerprint(BatchStream(data, "train_data"))

    same = fp(_loader(TRAIN))
    assert same == fp(_loader(TRAIN)) and same["rows"] == N and "sample_crc32" in same
    assert data_change(same, fp(_loader(regression_data(N + N // 8)))) == f"rows {N:,} -> {N + N // 8:,}"
    scaled = {k: v * 1.5 for k, v in TRAIN.items()}  # the same rows, other values
    assert data_change(same, fp(_loader(scaled))) == "other values in the 8 rows sampled"
    augmented = fp(_loader(TRAIN, Augmented))  # checked by its length and arrays only: no false refusal
    assert "sample_crc32" not in augmented and data_change(augmented, fp(_loader(TRAIN, Augmented))) is None
    sampler = grain.samplers.IndexSampler(N, shuffle=True, seed=7, num_epochs=1)
    grain_loader = grain.DataLoader(data_source=NoRepr(TRAIN), sampler=sampler, worker_count=0,
                                    operations=[grain.transforms.Batch(B, drop_remainder=True)])
    assert fp(grain_loader)["source"] == "the DataLoader's NoRepr" and fp(grain_loader)["rows"] == N
    assert fp(grain.MapDataset.source(Rows(TRAIN)).batch(B))["rows"] == -(-N // B)  # its batches, by index
    assert fp(lambda: iter([TRAIN])) == {"unchecked": "train_data (function) has no map-style dataset to sample"}


def test_a_loader_whose_dataset_changed_is_refused_on_resume_and_one_without_a_dataset_noted(tmp_path, capsys):
    ckpt = CheckpointConfig(every_steps=5, keep_last=100, keep_best=0)
    _fit(_loader(TRAIN), run_dir=tmp_path / "run", checkpoint=ckpt, epochs=1)
    with pytest.raises(DataError) as e:
        _fit(_loader(regression_data(N + N // 2)), run_dir=tmp_path / "run", resume=True, checkpoint=ckpt)
    assert _one_line(e).startswith(f"the training data changed since checkpoint step {N // B} was saved (the "
                                   f"DataLoader's TorchRows ({N + N // 2} rows): rows {N} -> {N + N // 2}); a resume "
                                   "would continue on other data")

    unchecked = fingerprint(BatchStream(lambda: iter([TRAIN]), "train_data"))  # no dataset to sample: a note
    capsys.readouterr()
    CheckpointHook(tmp_path / "c", ckpt)._check_data({"step": 12, "data": unchecked}, unchecked, False)
    assert capsys.readouterr().err == ("note: train_data (function) has no map-style dataset to sample: the resume "
                                       "cannot check that the training data are those of checkpoint step 12\n")


def test_a_grain_loader_built_otherwise_refuses_its_saved_state_in_one_line():
    def stream(seed):
        sampler = grain.samplers.IndexSampler(N, shuffle=True, seed=seed, num_epochs=1)
        return BatchStream(grain.DataLoader(data_source=Rows(TRAIN), sampler=sampler, worker_count=0,
                                            operations=[grain.transforms.Batch(B, drop_remainder=True)]), "train_data")

    first = stream(7)
    state = [after for _, after in itertools.islice(first.batches(1), 3)][-1]
    assert first.refused(1, state) is None and stream(7).refused(1, state) is None  # a stable repr: taken back
    with pytest.raises(DataError) as e:
        stream(8).refused(1, state)  # another shuffle
    assert _one_line(e) == ("train_data cannot resume from the loader state saved in the checkpoint: the loader "
                            "refused it (ValueError: Sampler in checkpoint does not match dataloader sampler.); build "
                            "the loader as the run did (its sampler, workers and source), or start a new run")


def test_a_grain_source_without_a_stable_repr_resumes_exactly_by_skipping_and_says_what_to_add(tmp_path, capsys):
    def grain_loader():
        sampler = grain.samplers.IndexSampler(N, shuffle=True, seed=7, num_epochs=1)
        return grain.DataLoader(data_source=NoRepr(TRAIN), sampler=sampler, worker_count=0,
                                operations=[grain.transforms.Batch(B, drop_remainder=True)])

    ckpt = CheckpointConfig(every_steps=5, keep_last=100, keep_best=0)
    first = grain_loader()  # kept alive: a new source never takes its address (its repr) in this process
    reference = _fit(first, run_dir=tmp_path / "run", checkpoint=ckpt, steps_per_epoch=N // B)
    for later in (p for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit() and int(p.name) > 18):
        shutil.rmtree(later)  # as if killed after step 18 (of 24), mid-epoch 2, in another process
    capsys.readouterr()
    resumed = _fit(grain_loader(), run_dir=tmp_path / "run", resume=True, checkpoint=ckpt, steps_per_epoch=N // B)
    assert resumed.summary["steps"] == reference.summary["steps"] == 2 * (N // B) and first is not None
    for a, b in zip(_params(resumed), _params(reference), strict=True):
        np.testing.assert_array_equal(a, b)
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == ["note: train_data: resuming step 6 of epoch 2 by skipping the 6 batches of epoch 2 already "
                     "trained on (the loader refused its saved state: Grain compares the data source by repr(), and "
                     "NoRepr's holds a memory address, new in every process; give NoRepr a stable __repr__ (e.g. "
                     "def __repr__(self): return f\"NoRepr({len(self)})\") so that a resume takes the saved "
                     "position)"], notes


def test_npy_and_npz_shards_read_as_one_range(tmp_path):
    (tmp_path / "npy").mkdir()
    (tmp_path / "npz").mkdir()
    bounds = [0, 70, 71, 150, N]
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        for k, v in TRAIN.items():
            np.save(tmp_path / "npy" / f"{k}-{i:05d}.npy", v[a:b])
        np.savez(tmp_path / "npz" / f"{i:05d}.npz", **{k: v[a:b] for k, v in TRAIN.items()})
    for folder in ("npy", "npz"):
        source = NpySource(tmp_path / folder)
        assert len(source) == N and source.names == ("x", "y")
        for lo, hi in ((0, N), (65, 151), (70, 71), (199, 200)):
            block = source.read(lo, hi)
            for k in TRAIN:
                np.testing.assert_array_equal(block[k], TRAIN[k][lo:hi])
    stream = DataConfig(placement="stream", shuffle_window_mb=1)
    sharded, arrays = _fit(NpySource(tmp_path / "npy"), data=stream), _fit(TRAIN, data=stream)
    for a, b in zip(_params(sharded), _params(arrays), strict=True):
        np.testing.assert_array_equal(a, b)


class Ragged(Rows):
    """Sample `bad` is shorter; no slices (one sample at a time)."""

    def __init__(self, data, bad=37):
        super().__init__(data)
        self.bad = bad

    def __getitem__(self, i):
        sample = super().__getitem__(int(i))
        return {**sample, "x": sample["x"][:5]} if i == self.bad else sample


def _one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text, text
    return text


def test_bad_inputs_are_one_line_each():
    with pytest.raises(DataError) as e:
        MapSource(Ragged(TRAIN)).read(0, 64)
    assert "sample 37 of data has field 'x' of shape (5,) where the first had (8,): ragged samples" in _one_line(e)
    with pytest.raises(DataError) as e:
        adapt(Rows({"x": TRAIN["x"][:0], "y": TRAIN["y"][:0]}), "train_data")
    assert "train_data (Rows) has no samples" in _one_line(e)
    with pytest.raises(DataError) as e:
        adapt(datasets.Dataset.from_dict({"text": ["a", "b"], "y": [1, 2]}), "train_data")
    assert "train_data's field 'text' holds strings" in _one_line(e)

    def changing():
        yield {k: v[:B] for k, v in TRAIN.items()}
        yield {"x": TRAIN["x"][:B].astype(np.float64), "y": TRAIN["y"][:B]}

    with pytest.raises(DataError) as e:
        _fit(changing, epochs=1, steps_per_epoch=2)
    assert "batch 1 of epoch 1 of train_data has field 'x' of dtype float64 where the first had float32" in _one_line(e)

    def short_in_the_middle():
        for n in (B, 5, B):
            yield {k: v[:n] for k, v in TRAIN.items()}

    with pytest.raises(DataError) as e:
        _fit(short_in_the_middle, epochs=1, steps_per_epoch=2)
    assert "batch 1 of epoch 1 of train_data has 5 rows, fewer than the first's 16, and is not the last" in _one_line(e)

    once = ({k: v[i : i + B] for k, v in TRAIN.items()} for i in range(0, N - B + 1, B))
    with pytest.raises(DataError) as e:
        _fit(once, epochs=2, steps_per_epoch=N // B)
    assert "train_data ran out: it is a one-shot iterator (a generator), used up by epoch 1" in _one_line(e)
    with pytest.raises(ConfigError) as e:
        _fit((b for b in [{"x": TRAIN["x"][:B], "y": TRAIN["y"][:B]}]))
    assert "one-shot iterator (a generator) without a length: give TrainConfig(steps_per_epoch=N)" in _one_line(e)
    with pytest.raises(DataError) as e:
        _fit(lambda: iter([]))
    assert "train_data yields no batches" in _one_line(e)
    with pytest.raises(DataError) as e:
        _fit(lambda: iter([(1.0, 2.0)]))
    assert "train_data yields single samples" in _one_line(e)
    with pytest.raises(DataError) as e:
        _fit(TRAIN, val=(b for b in [VAL]))
    assert "val_data is a one-shot iterator" in _one_line(e)


@pytest.mark.slow  # worker processes
def test_a_dataloader_worker_error_or_death_is_one_line_not_a_hang():
    from _worker_rows import Crashing, Dying  # light to unpickle in a spawned worker

    loader = torch.utils.data.DataLoader(Crashing(TRAIN), batch_size=B, num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(DataError) as e:
        _fit(loader, epochs=1)
    line = _one_line(e)
    assert "train_data raised ValueError at batch 3 of epoch 1: ValueError in DataLoader worker process 0" in line
    assert line.endswith("ValueError: corrupt record 50")
    loader = torch.utils.data.DataLoader(Dying(TRAIN), batch_size=B, num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(DataError) as e:
        _fit(loader, epochs=1)
    assert re.search(r"train_data raised (RuntimeError at batch \d+ of epoch 1: DataLoader worker \(pid\(s\) \d+\) "
                     r"exited unexpectedly|(ConnectionResetError|EOFError) at batch \d+ of epoch 1: .*a worker process "
                     r"of the loader died)", _one_line(e)), _one_line(e)  # torch's check, or the broken pipe first
    reset = adapters._iteration_error(ConnectionResetError(104, "Connection reset by peer"), "train_data", 1, 2)
    assert str(reset) == ("train_data raised ConnectionResetError at batch 2 of epoch 1: [Errno 104] Connection reset "
                          "by peer; a worker process of the loader died (killed, or out of memory)")


@pytest.mark.slow  # a worker process
def test_a_loader_with_workers_is_fingerprinted_in_a_worker_not_here():
    from _worker_rows import OpensOnFirstUse

    here = BatchStream(torch.utils.data.DataLoader(OpensOnFirstUse(TRAIN), batch_size=B), "train_data")
    dataset = OpensOnFirstUse(TRAIN)
    here.data = torch.utils.data.DataLoader(dataset, batch_size=B, num_workers=1, multiprocessing_context="spawn")
    # (swapped in after the stream read its first batch here: one worker process started, not two)
    assert fingerprint(here) == fingerprint(BatchStream(_loader(TRAIN, Rows), "train_data")) | {
        "source": "the DataLoader's OpensOnFirstUse"}
    assert dataset.opened_in is None  # its workers, children of this process, inherit nothing opened here


def test_adapt_passes_arrays_and_sources_through_and_picks_the_kind():
    assert adapt(TRAIN) is TRAIN and adapt((TRAIN["x"], TRAIN["y"]))[0] is TRAIN["x"]
    assert isinstance(adapt(Rows(TRAIN)), MapSource)
    assert isinstance(adapt(torch.utils.data.DataLoader(TorchRows(TRAIN), batch_size=4)), BatchStream)
    assert isinstance(adapt(lambda: iter([TRAIN])), BatchStream)
    with pytest.raises(DataError, match="open it first: jaxtrain.data.HDF5Source"):
        adapt("data.h5", "train_data")


def test_shards_that_cannot_be_read_in_place_or_change_are_one_line(tmp_path):
    (tmp_path / "z").mkdir()
    np.savez_compressed(tmp_path / "z" / "00000.npz", x=TRAIN["x"])
    with pytest.raises(DataError) as e:
        NpySource(tmp_path / "z")
    assert "'x' in " in _one_line(e) and "is compressed (np.savez_compressed)" in _one_line(e)
    (tmp_path / "n").mkdir()
    np.save(tmp_path / "n" / "x-0.npy", TRAIN["x"])
    np.save(tmp_path / "n" / "y-0.npy", TRAIN["y"][:-1])
    with pytest.raises(DataError) as e:
        NpySource(tmp_path / "n")
    assert "have different numbers of rows (x: 200, y: 199)" in _one_line(e)
    np.save(tmp_path / "n" / "y-0.npy", TRAIN["y"])
    source = NpySource(tmp_path / "n", {"features": "x"}, start=10, stop=-10)
    assert len(source) == 180 and source.names == ("features",)
    np.testing.assert_array_equal(source.read(0, 5)["features"], TRAIN["x"][10:15])
    with open(tmp_path / "n" / "x-0.npy", "r+b") as f:  # cut short under a running source
        f.truncate(1000)
    with pytest.raises(DataError) as e:
        source.read(100, 150)
    assert "changed while it was being read (size" in _one_line(e)
    with pytest.raises(DataError, match="has no array 'z'"):
        NpySource(tmp_path / "n", {"x": "z"})


def test_validation_data_of_every_kind_give_the_arrays_validation_loss(on_arrays):
    expected = on_arrays.history[-1]["val_loss"]
    as_dicts = [{"x": x, "y": y} for x, y in zip(*(torch.from_numpy(VAL[k]).split(16) for k in ("x", "y")))]
    for val in (Rows(VAL),                                            # map-style: on the device whole
                datasets.Dataset.from_dict(VAL),
                lambda: iter(as_dicts),                               # batches of 16, 16 and a short 8
                grain.MapDataset.source(Rows(VAL)).batch(B)):         # Grain's batches by index
        result = _fit(TRAIN, val=val)
        assert result.history[-1]["val_loss"] == pytest.approx(expected, rel=1e-6), type(val).__name__


def test_sample_by_sample_reads_keep_threads_where_they_help():
    class Waiting(Rows):  # waits outside the GIL for each sample, as a file read does
        def __getitem__(self, i):
            time.sleep(0.002)
            return super().__getitem__(int(i))

    source = MapSource(Waiting(TRAIN))
    assert source.mode == "samples" and source._threads is None
    for start in range(0, 96, 16):  # three reads timed on 1 thread, three on 4: 32 ms against 8 ms each
        np.testing.assert_array_equal(source.read(start, start + 16)["x"], TRAIN["x"][start : start + 16])
    source.read(96, 112)
    assert source._threads == 4
    assert MapSource(Waiting(TRAIN), threads=1)._threads == 1
