"""In-graph preprocessing and augmentation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxtrain._src.data import compose, gaussian_noise, normalize

pytestmark = pytest.mark.xla_defaults  # in-graph preprocessing against NumPy


def test_normalize_matches_numpy():
    x = np.random.default_rng(0).normal(3.0, 2.0, (64, 5)).astype(np.float32)
    out = jax.jit(normalize("x", x.mean(0), x.std(0)))({"x": x, "y": x[:, :1]})
    np.testing.assert_allclose(out["x"], (x - x.mean(0)) / (x.std(0) + 1e-6), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["y"], x[:, :1])


def test_gaussian_noise_is_keyed_and_has_the_right_scale():
    batch = {"x": jnp.zeros((4000, 8))}
    noise = jax.jit(gaussian_noise("x", 0.5))
    a, b = noise(batch, jax.random.key(0)), noise(batch, jax.random.key(0))
    np.testing.assert_array_equal(a["x"], b["x"])
    assert float(jnp.std(a["x"])) == pytest.approx(0.5, rel=0.02)
    assert not np.array_equal(a["x"], noise(batch, jax.random.key(1))["x"])


def test_compose_applies_in_order_with_separate_keys():
    shift = lambda b: {**b, "x": b["x"] + 1.0}  # noqa: E731
    double = lambda b: {**b, "x": b["x"] * 2.0}  # noqa: E731
    np.testing.assert_allclose(compose(shift, double)({"x": jnp.ones(3)})["x"], 4.0)
    out = compose(gaussian_noise("x", 1.0), gaussian_noise("x", 1.0))({"x": jnp.zeros(1000)}, jax.random.key(0))
    assert float(jnp.std(out["x"])) == pytest.approx(np.sqrt(2), rel=0.1)


def test_standardize_images_adds_a_channel_axis_only_where_there_is_none():
    from jaxtrain.data import standardize_images

    fn = standardize_images("x", mean=0.5, std=0.25)
    gray = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)  # (B, H, W)
    rgb = np.arange(2 * 3 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3, 3)  # (B, H, W, C)
    for pixels, shape in [(gray, (2, 3, 3, 1)), (rgb, (2, 3, 3, 3))]:
        out = np.asarray(fn({"x": pixels})["x"])
        assert out.shape == shape and out.dtype == np.float32
        np.testing.assert_allclose(out.reshape(pixels.shape), (pixels / 255.0 - 0.5) / 0.25, rtol=1e-6)
