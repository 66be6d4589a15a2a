"""Reference models against independent NumPy / lax references (float32: rtol 1e-5, atol 1e-5)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxtrain._src.models import CNN
from jaxtrain._src.models.cnn import avg_pool_2x2, conv2d_same
from jaxtrain._src.models.gpt import GPT, GPTConfig, sample

pytestmark = pytest.mark.xla_defaults  # models against NumPy / lax references

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel_size,c_in,c_out", [((3, 3), 1, 4), ((3, 3), 5, 7), ((5, 3), 2, 3)])
def test_im2col_conv_equals_lax_conv(kernel_size, c_in, c_out):
    kx, kk = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (2, 9, 8, c_in))
    kernel = jax.random.normal(kk, (*kernel_size, c_in, c_out))
    want = jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    # Jitted, as models use it (op by op, its dozens of small ops compile one at a time: 10x slower here).
    np.testing.assert_allclose(jax.jit(conv2d_same)(x, kernel), want, **TOL)


def test_avg_pool_equals_numpy():
    x = np.random.default_rng(0).normal(size=(2, 6, 4, 3)).astype(np.float32)
    want = (x[:, 0::2, 0::2] + x[:, 1::2, 0::2] + x[:, 0::2, 1::2] + x[:, 1::2, 1::2]) / 4
    np.testing.assert_allclose(avg_pool_2x2(jnp.asarray(x)), want, **TOL)


def test_cnn_shapes_and_parameter_count():
    # Abstract shapes: the same trace as a real forward pass, without compiling the initialisers and the layers.
    model = nnx.eval_shape(lambda: CNN(rngs=nnx.Rngs(0)))
    assert nnx.eval_shape(lambda m, x: m(x), model, jnp.zeros((3, 28, 28, 1))).shape == (3, 10)
    n = sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert n == (9 * 1 * 32 + 32) + (9 * 32 * 64 + 64) + (3136 * 256 + 256) + (256 * 10 + 10)


def _gpt(**kw):
    config = GPTConfig(**{"block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16, **kw})
    return GPT(11, config, rngs=nnx.Rngs(0))


def test_gpt_is_causal():
    """Changing token t changes no logit before position t, and does change the one at t."""
    model = _gpt()
    forward = nnx.jit(lambda m, idx: m(idx))  # one compilation, not one per op
    idx = jax.random.randint(jax.random.key(1), (2, 8), 0, 11)
    base = forward(model, idx)
    for t in (0, 3, 7):
        changed = forward(model, idx.at[:, t].set((idx[:, t] + 1) % 11))
        np.testing.assert_array_equal(changed[:, :t], base[:, :t])
        assert not np.allclose(changed[:, t], base[:, t])


def test_attention_equals_numpy_softmax_attention():
    model = _gpt()
    attn = model.blocks[0].attn
    x = np.random.default_rng(0).normal(size=(2, 8, 16)).astype(np.float32)
    w_qkv = np.asarray(attn.c_attn.kernel[...], np.float64)
    w_proj = np.asarray(attn.c_proj.kernel[...], np.float64)
    q, k, v = np.split(x.astype(np.float64) @ w_qkv, 3, axis=-1)  # (B, T, C) each
    B, T, C, H = 2, 8, 16, 2
    heads = lambda a: a.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)  # noqa: E731  (B, H, T, hs)
    scores = heads(q) @ heads(k).transpose(0, 1, 3, 2) / np.sqrt(C // H)  # (B, H, T, T)
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    y = (weights @ heads(v)).transpose(0, 2, 1, 3).reshape(B, T, C) @ w_proj
    np.testing.assert_allclose(attn(jnp.asarray(x)), y, **TOL)


def test_output_layer_is_tied_to_the_token_embedding():
    model = _gpt()
    params = nnx.state(model, nnx.Param)
    assert not any("lm_head" in jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params))
    h = jax.random.normal(jax.random.key(2), (1, 1, 16))
    np.testing.assert_allclose(model.wte.attend(h), h @ model.wte.embedding[...].T, **TOL)


def test_sampling_is_deterministic_for_a_key_and_keeps_the_prompt():
    model = _gpt()
    prompt = jnp.array([1, 2, 3])
    a = sample(model, prompt, 20, jax.random.key(5))
    b = sample(model, prompt, 20, jax.random.key(5))
    c = sample(model, prompt, 20, jax.random.key(6))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (23,) and list(a[:3]) == [1, 2, 3] and not np.array_equal(a, c)


def test_top_1_sampling_is_greedy_decoding_over_a_sliding_window():
    """Independent reference: a Python loop that re-runs the model on the last block_size tokens."""
    model = _gpt()
    out = sample(model, jnp.array([4]), 12, jax.random.key(0), top_k=1)  # 13 tokens > block_size 8
    forward = nnx.jit(lambda m, idx: m(idx))  # compiled per context length (1..8), not per token
    tokens = [4]
    for _ in range(12):
        logits = forward(model, jnp.asarray(tokens[-8:])[None])[0, -1]
        tokens.append(int(jnp.argmax(logits)))
    assert list(np.asarray(out)) == tokens


def test_dropout_is_active_only_in_training_with_a_key():
    model = _gpt(dropout=0.5)
    idx = jnp.zeros((1, 8), jnp.int32)
    np.testing.assert_array_equal(model(idx), model(idx))  # no key: deterministic
    assert not np.allclose(model(idx, jax.random.key(0)), model(idx))
    model.eval()
    np.testing.assert_array_equal(model(idx, jax.random.key(0)), model(idx))


def test_gpt_dense_equals_the_3d_linear_in_value_and_gradients():
    """`gpt._dense` (one (B*T, C) matmul, chosen for XLA:CPU's speed) against `nnx.Linear` on (B, T, C)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxtrain._src.models.gpt import _dense, _linear

    layer = _linear(16, 48, True, 0.02, nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (3, 5, 16))
    graphdef, params = nnx.split(layer)

    def loss(params, x, apply):
        out = apply(nnx.merge(graphdef, params), x)
        return jnp.sum(jnp.sin(out))

    ours = jax.value_and_grad(loss, argnums=(0, 1))(params, x, _dense)
    reference = jax.value_and_grad(loss, argnums=(0, 1))(params, x, lambda layer, x: layer(x))
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(reference), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
