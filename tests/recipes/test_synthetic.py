"""One regression teacher: the recipe's in-memory data are the rows `data generate` writes."""

import dataclasses

import h5py
import numpy as np

from jaxtrain._src.data import generate_dataset, make_rows
from jaxtrain._src.data.synthetic import GEN_BLOCK_ROWS, regression_rows
from jaxtrain.tools.recipes.mlp_regression import RegressionDataConfig, make_data


def test_recipe_data_equal_the_generated_file_for_the_same_seed(tmp_path):
    config = RegressionDataConfig(samples=GEN_BLOCK_ROWS + 1000, val_samples=700, seed=1234)  # two generation blocks
    train, val = make_data(config)
    result = generate_dataset("mlp-regression", tmp_path / "reg.h5", config.samples, chunk_rows=512, seed=config.seed)
    with h5py.File(result.path) as f:
        features, targets = f["features"][...], f["targets"][...]
    n_train = config.samples - config.val_samples
    # Exact equality: the same float32 rows, not merely the same distribution.
    np.testing.assert_array_equal(train["x"], features[:n_train])
    np.testing.assert_array_equal(train["y"], targets[:n_train])
    np.testing.assert_array_equal(val["x"], features[n_train:])
    np.testing.assert_array_equal(val["y"], targets[n_train:])


def test_regression_rows_depend_on_the_seed_and_row_only():
    full = regression_rows(5, 0, 3 * GEN_BLOCK_ROWS)
    piece = regression_rows(5, GEN_BLOCK_ROWS - 10, 2 * GEN_BLOCK_ROWS + 10)  # crosses two block boundaries
    for name in ("features", "targets"):
        np.testing.assert_array_equal(piece[name], full[name][GEN_BLOCK_ROWS - 10 : 2 * GEN_BLOCK_ROWS + 10])
        np.testing.assert_array_equal(make_rows("mlp-regression", 5, 0, 100)[name], full[name][:100])
    assert not np.array_equal(regression_rows(6, 0, 100)["features"], full["features"][:100])
    empty = regression_rows(5, 10, 10)
    assert empty["features"].shape == (0, 128) and empty["targets"].dtype == np.float32


def test_recipe_sizes_and_noise_reach_the_teacher():
    config = RegressionDataConfig(samples=600, val_samples=100, features=12, targets=3, teacher_width=7)
    train, val = make_data(config)
    assert train["x"].shape == (500, 12) and train["y"].shape == (500, 3) and val["y"].shape == (100, 3)
    assert train["x"].dtype == train["y"].dtype == np.float32
    # Same teacher and inputs: only the noise differs, by label_noise times the same N(0, 1) draws.
    quiet, _ = make_data(dataclasses.replace(config, label_noise=0.0))
    np.testing.assert_array_equal(quiet["x"], train["x"])
    noise = (train["y"] - quiet["y"]) / 0.1
    assert 0.9 < noise.std() < 1.1
