"""Causal attention paths against a float64 NumPy reference.

Tolerances: float32 paths within 1e-5 (rtol and atol) of the float64 reference; bf16 inputs give
bf16 outputs within 3e-2 absolute of the float32 result on the same (bf16-rounded) inputs — bf16
keeps 8 significant bits (relative rounding 2^-9 ≈ 0.002), the probabilities are rounded to bf16
before the second matmul, and the outputs here have magnitudes up to about 3.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxtrain._src.models import attention
from jaxtrain._src.models import gpt as gpt_module
from jaxtrain._src.models.gpt import GPT, GPTConfig

pytestmark = pytest.mark.xla_defaults  # attention paths against a float64 reference

TOL = dict(rtol=1e-5, atol=1e-5)
BF16_ATOL = 3e-2
CPU_PATHS = ["heads_major", "heads_minor", "xla"]


def _inputs(B=2, T=16, nh=3, hs=8, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(0), 3)
    return tuple(jax.random.normal(k, (B, T, nh, hs)).astype(dtype) for k in keys)


def reference(q, k, v) -> np.ndarray:
    """softmax(q·kᵀ/√hs, keys <= query)·v in float64, per batch and head; (B, T, nh, hs)."""
    q, k, v = (np.asarray(a, np.float64).transpose(0, 2, 1, 3) for a in (q, k, v))  # (B, nh, T, hs)
    T, hs = q.shape[2], q.shape[3]
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)  # (B, nh, T, T)
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return (weights @ v).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("path", CPU_PATHS)
def test_each_path_equals_the_float64_reference(path):
    q, k, v = _inputs()
    out = jax.jit(attention.PATHS[path])(q, k, v)
    assert out.shape == q.shape and out.dtype == jnp.float32
    np.testing.assert_allclose(out, reference(q, k, v), **TOL)


def test_causal_attention_equals_the_reference_and_takes_the_cpu_path():
    q, k, v = _inputs(T=33)
    np.testing.assert_allclose(attention.causal_attention(q, k, v), reference(q, k, v), **TOL)
    assert attention.choose_path(jnp.float32, "cpu") == attention.CPU_PATH == "heads_major"


@pytest.mark.parametrize("path", [*CPU_PATHS, "causal_attention"])
def test_bf16_inputs_give_bf16_outputs_close_to_float32(path):
    fn = attention.causal_attention if path == "causal_attention" else attention.PATHS[path]
    q, k, v = _inputs(dtype=jnp.bfloat16)
    out = jax.jit(fn)(q, k, v)
    assert out.dtype == jnp.bfloat16
    want = fn(*(a.astype(jnp.float32) for a in (q, k, v)))  # the same rounded inputs, computed in float32
    np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=0, atol=BF16_ATOL)


@pytest.mark.parametrize("path", ["heads_major", "heads_minor"])
def test_the_softmax_runs_in_float32_under_bf16(path):
    q, k, v = _inputs(dtype=jnp.bfloat16)
    jaxpr = jax.make_jaxpr(attention.PATHS[path])(q, k, v)
    exps = [e for e in jaxpr.eqns if e.primitive.name == "exp"]
    assert exps and all(e.outvars[0].aval.dtype == jnp.float32 for e in exps)


def test_gpu_choice_is_cudnn_in_half_precision_and_xla_otherwise():
    assert attention.choose_path(jnp.bfloat16, "gpu") == "cudnn"
    assert attention.choose_path(jnp.float16, "gpu") == "cudnn"
    assert attention.choose_path(jnp.float32, "gpu") == "xla"


def test_a_refused_cudnn_call_falls_back_to_xla(monkeypatch):
    """On this CPU cuDNN raises while tracing; causal_attention must then give the XLA result."""
    monkeypatch.setattr(attention, "choose_path", lambda dtype, platform=None: "cudnn")
    q, k, v = _inputs(dtype=jnp.bfloat16)
    if jax.default_backend() == "gpu":
        pytest.skip("cuDNN may accept these inputs on a GPU")
    out = attention.causal_attention(q, k, v)
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(attention.xla(q, k, v), np.float32))


def test_gpt_logits_equal_those_with_jax_nn_dot_product_attention(monkeypatch):
    """The baby GPT (block 64, 4 layers × 128, 4 heads) with the chosen path against the previous
    attention, `jax.nn.dot_product_attention`, on the same weights: within 1e-5."""
    model = GPT(65, GPTConfig(), rngs=nnx.Rngs(0))
    idx = jax.random.randint(jax.random.key(1), (2, 64), 0, 65)
    logits = model(idx)
    monkeypatch.setattr(gpt_module, "causal_attention",
                        lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True))
    np.testing.assert_allclose(logits, model(idx), **TOL)


def _dot_dtypes(jaxpr) -> list:
    """Output dtypes of every dot_general in a jaxpr, sub-jaxprs included."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            out.append(eqn.outvars[0].aval.dtype)
        for param in eqn.params.values():
            sub = getattr(param, "jaxpr", param)
            if hasattr(sub, "eqns"):
                out += _dot_dtypes(sub)
    return out


def test_gpt_under_bf16_parameters_runs_its_matmuls_in_bf16_and_returns_float32_logits():
    """Only the attention scores (one per layer) and the logits accumulate in float32; a float32
    embedding lookup (what `nnx.Embed.__call__` does) would make every matmul float32."""
    config = GPTConfig(block_size=8, n_layer=2, n_head=2, n_embd=16)
    graphdef, state = nnx.split(GPT(11, config, rngs=nnx.Rngs(0)))
    state = jax.tree.map(lambda a: a.astype(jnp.bfloat16) if jnp.issubdtype(a.dtype, jnp.floating) else a, state)
    forward = lambda state, idx: nnx.merge(graphdef, state)(idx)  # noqa: E731
    idx = jnp.zeros((1, 8), jnp.int32)
    assert jax.eval_shape(forward, state, idx).dtype == jnp.float32
    dots = _dot_dtypes(jax.make_jaxpr(forward)(state, idx).jaxpr)
    assert dots.count(jnp.float32) == config.n_layer + 1  # scores per layer, logits
    assert dots.count(jnp.bfloat16) == config.n_layer * 5  # qkv, p·v, proj, fc, mlp proj
