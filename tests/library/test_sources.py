"""Row sources: HDF5 reads equal the written arrays; every bad file is one clear DataError."""

import os
import shutil

import h5py
import numpy as np
import pytest

from jaxtrain._src.data import ArraySource, HDF5Source
from jaxtrain._src.data.sources import check_finite
from jaxtrain._src.errors import DataError


def write_h5(path, chunks=16, compression=None, **arrays):
    with h5py.File(path, "w") as f:
        for name, a in arrays.items():
            f.create_dataset(name, data=a, chunks=(chunks, *a.shape[1:]) if chunks else None, compression=compression)
        f.attrs["seed"] = 7
        f.attrs["mean"] = np.arange(3.0)
    return path


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    return {"features": rng.normal(size=(100, 5)).astype(np.float32), "targets": np.arange(100, dtype=np.int32),
            "tokens": rng.integers(0, 20, (100, 3, 2)).astype(np.int8)}


def test_hdf5_reads_equal_the_written_arrays(tmp_path, arrays):
    path = write_h5(tmp_path / "d.h5", **arrays)
    keys = {"x": "features", "y": "targets", "t": "tokens"}
    with HDF5Source(path, keys) as source:
        assert len(source) == 100 and source.names == ("x", "y", "t") and source.chunk_rows == 16
        assert source.row_shapes == {"x": (5,), "y": (), "t": (3, 2)}
        assert source.dtypes == {"x": np.float32, "y": np.int32, "t": np.int8}
        assert source.row_nbytes == 5 * 4 + 4 + 6
        assert source.attrs == {"seed": 7, "mean": [0.0, 1.0, 2.0]}
        for start, stop in [(0, 100), (3, 4), (15, 33), (99, 100), (50, 50)]:
            block = source.read(start, stop)
            for name, key in keys.items():
                np.testing.assert_array_equal(block[name], arrays[key][start:stop])
                assert block[name].dtype == arrays[key].dtype
    with pytest.raises(DataError, match="was closed"):
        source.read(0, 1)


def test_row_ranges_hold_out_the_last_rows(tmp_path, arrays):
    path = write_h5(tmp_path / "d.h5", **arrays)
    train = HDF5Source(path, {"y": "targets"}, stop=-20)
    val = HDF5Source(path, {"y": "targets"}, start=80)
    assert len(train) == 80 and len(val) == 20
    np.testing.assert_array_equal(val.read(0, 20)["y"], np.arange(80, 100))
    np.testing.assert_array_equal(train.read(70, 80)["y"], np.arange(70, 80))
    with pytest.raises(IndexError):
        train.read(75, 85)
    middle = ArraySource(arrays, 10, 30)
    assert len(middle) == 20
    np.testing.assert_array_equal(middle.read(0, 5)["targets"], np.arange(10, 15))
    for source in (train, val):
        source.close()


def test_contiguous_datasets_get_a_read_size_and_chunks_a_common_multiple(tmp_path, arrays):
    with HDF5Source(write_h5(tmp_path / "c.h5", chunks=None, **arrays), {"x": "features"}) as source:
        assert source.chunk_rows == (1 << 20) // 20
        np.testing.assert_array_equal(source.read(0, 100)["x"], arrays["features"])
    path = tmp_path / "mixed.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("a", data=arrays["features"], chunks=(6, 5))
        f.create_dataset("b", data=arrays["targets"], chunks=(4,))
    with HDF5Source(path, {"a": "a", "b": "b"}) as source:
        assert source.chunk_rows == 12


def _expect(match, path, keys, **kwargs):
    with pytest.raises(DataError, match=match) as info:
        HDF5Source(path, keys, **kwargs)
    assert "\n" not in str(info.value)


def test_bad_files_are_one_clear_line(tmp_path, arrays):
    _expect(r"nope.h5 does not exist; check the path or create it with `jaxtrain data generate`",
            tmp_path / "nope.h5", {"x": "features"})
    (tmp_path / "random.h5").write_bytes(np.random.default_rng(0).bytes(5000))
    _expect(r"cannot open .*random.h5 as HDF5 \(file signature not found\); the file is not HDF5, or it is corrupt "
            "or truncated", tmp_path / "random.h5", {"x": "features"})
    path = write_h5(tmp_path / "d.h5", **arrays)
    shutil.copy(path, tmp_path / "cut.h5")
    os.truncate(tmp_path / "cut.h5", os.path.getsize(path) // 2)
    _expect(r"cannot open .*cut.h5 as HDF5 \(truncated file: .*\); .*corrupt or truncated", tmp_path / "cut.h5",
            {"x": "features"})
    _expect(r"d.h5 has no dataset 'feature' \(it has: features, targets, tokens\); pass keys that exist",
            path, {"x": "feature"})
    _expect(r"d.h5 has 100 rows; the row range \[90, 120\) asks for rows it does not have", path,
            {"x": "features"}, start=90, stop=120)
    _expect(r"d.h5 has 100 rows", path, {"x": "features"}, start=50, stop=50)


def test_unsupported_dtypes_and_unequal_lengths(tmp_path):
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f["strings"] = np.array([b"abc"] * 10)
        f["records"] = np.zeros(10, dtype=[("a", "f4"), ("b", "i4")])
        f["u64"] = np.zeros(10, np.uint64)
        f["complex"] = np.zeros(10, np.complex64)
        f["ten"], f["eleven"] = np.zeros(10), np.zeros(11)
        f["big_endian"] = np.arange(10, dtype=">f4")
        f["scalar"] = 1.0
    for key in ("strings", "records", "u64", "complex"):
        _expect(rf"'{key}' in .*bad.h5 has dtype .*, which cannot be streamed; store it as bool, int8/16/32/64, "
                r"uint8/16/32 or float16/32/64", path, {"x": key})
    _expect(r"datasets in .*bad.h5 have different numbers of rows \(ten: 10, eleven: 11\); they must match", path,
            {"a": "ten", "b": "eleven"})
    _expect(r"'scalar' in .*bad.h5 is a scalar", path, {"x": "scalar"})
    with HDF5Source(path, {"x": "big_endian"}) as source:  # converted to native byte order on read
        block = source.read(0, 10)["x"]
        assert block.dtype == np.float32 and block.dtype.isnative
        np.testing.assert_array_equal(block, np.arange(10))


def test_a_corrupt_chunk_fails_on_read_naming_file_and_rows(tmp_path):
    x = np.random.default_rng(0).integers(0, 5, (4000, 16)).astype(np.float32)
    path = write_h5(tmp_path / "gz.h5", chunks=500, compression="gzip", x=x)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 3000] = bytes(3000)  # zero out compressed chunk data; the header survives
    path.write_bytes(raw)
    with HDF5Source(path, {"x": "x"}) as source:  # opening succeeds: the damage only shows on read
        with pytest.raises(DataError, match=r"cannot read rows [\d,]+–[\d,]+ of 'x' in .*gz.h5 \(.*\); the file is "
                                            "corrupt or truncated") as info:
            for start in range(0, 4000, 500):
                source.read(start, start + 500)
    assert "\n" not in str(info.value)


def test_nan_and_inf_name_the_dataset_and_rows(tmp_path):
    x = np.zeros((3000, 4), np.float32)
    x[2100, 2] = np.nan
    x[2500, 0] = -np.inf
    path = write_h5(tmp_path / "nan.h5", chunks=1024, x=x, ok=np.ones((3000, 2), np.float16))
    with HDF5Source(path, {"x": "x", "ok": "ok"}) as source:
        source.read(0, 2048)
        with pytest.raises(DataError, match=r"rows 2,048–2,999 of 'x' in .*nan.h5 contain NaN/Inf \(2 bad, first row "
                                            r"2,100\); clean the file or drop those rows"):
            source.read(2048, 3000)
    with pytest.raises(DataError, match=r"^row 2,100 of 'x' in arrays contains NaN/Inf"):
        ArraySource({"x": x}, start=2095).read(5, 6)
    check_finite(np.full((2, 2), -1, np.int8), "ints", 0, "arrays")  # integers and bools cannot be NaN: no error
    check_finite(np.ones((2, 2), bool), "flags", 0, "arrays")
    half = np.zeros((4, 3), np.float16)
    half[2, 1] = np.inf  # a float16 block is checked like float32 ones
    with pytest.raises(DataError, match=r"^rows 10–13 of 'h' in arrays contain NaN/Inf \(1 bad, first row 12\)"):
        check_finite(half, "h", 10, "arrays")


def test_read_into_writes_what_read_returns_into_the_callers_arrays(tmp_path, arrays):
    """The streaming loader reads into slices of its window buffers: every source's `read_into`
    fills them with `read`'s rows (converted to native byte order), and checks them as `read` does."""
    from jaxtrain._src.data.adapters import NpySource

    big_endian = {**arrays, "features": arrays["features"].astype(">f4")}
    (tmp_path / "npy").mkdir()
    for name, a in arrays.items():
        np.save(tmp_path / "npy" / f"{name}-0.npy", a[:40])
        np.save(tmp_path / "npy" / f"{name}-1.npy", a[40:])
    keys = {"x": "features", "y": "targets", "t": "tokens"}
    sources = [HDF5Source(write_h5(tmp_path / "d.h5", **big_endian), keys, start=10),
               ArraySource({k: arrays[v] for k, v in keys.items()}, start=10),
               NpySource(tmp_path / "npy", keys, start=10)]
    for source in sources:
        buffer = {k: np.full((50, *arrays[v].shape[1:]), 7, arrays[v].dtype) for k, v in keys.items()}
        source.read_into(25, 60, {k: v[5:40] for k, v in buffer.items()})  # rows 35..69, across the shards' seam
        expected = source.read(25, 60)
        for k, v in buffer.items():
            np.testing.assert_array_equal(v[5:40], expected[k])
            np.testing.assert_array_equal(v[5:40], arrays[keys[k]][35:70])
            assert (v[:5] == 7).all() and (v[40:] == 7).all()  # nothing written outside the slice
        source.close()
    x = np.zeros((64, 2), np.float32)
    x[33, 1] = np.nan
    with HDF5Source(write_h5(tmp_path / "nan.h5", x=x), {"x": "x"}) as source:
        with pytest.raises(DataError, match=r"^rows 32–47 of 'x' in .*nan.h5 contain NaN/Inf \(1 bad, first row 33\)"):
            source.read_into(32, 48, {"x": np.empty((16, 2), np.float32)})


def test_array_source_validates_its_arrays():
    with pytest.raises(DataError, match=r"arrays have different numbers of rows \(a: 3, b: 4\)"):
        ArraySource({"a": np.zeros(3), "b": np.zeros(4)})
    with pytest.raises(DataError, match=r"'s' in arrays has dtype <U1, which cannot be streamed"):
        ArraySource({"s": np.array(["a", "b"])})
