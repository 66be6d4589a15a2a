"""A GPT decoder in Flax NNX, shaped like nanoGPT's `model.py`: token + position embeddings,
pre-LayerNorm blocks of causal self-attention (`models.attention.causal_attention`: cuDNN on a
GPU, the fastest measured path on a CPU) and a GELU MLP, a final LayerNorm and an output layer
tied to the token embedding.

Initialisation follows nanoGPT: N(0, 0.02) for every linear layer and embedding,
N(0, 0.02/sqrt(2·n_layer)) for the projections that write into the residual stream, zero biases.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxtrain._src import remat as remat_lib
from jaxtrain._src.errors import ConfigError
from jaxtrain._src.models.attention import causal_attention
from jaxtrain._src.models.gpt_config import GPTConfig


def _linear(n_in: int, n_out: int, bias: bool, std: float, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(n_in, n_out, use_bias=bias, kernel_init=nnx.initializers.normal(std), rngs=rngs)


def _dense(layer: nnx.Linear, x: jax.Array) -> jax.Array:
    """`layer` applied to (B, T, C) activations as one (B*T, C) matmul.

    The same math as `layer(x)`, but XLA:CPU compiles the 2-D form's weight gradient (x^T dy)
    to its fast matmul path with no transposed copies of the activations around it:
    the char-gpt workload of `jaxtrain bench profile` measured the baby preset's step at 71-84 ms
    with the 3-D form and 49-51 ms with this one (the 3-D form's GELU-backward fusions wrote
    transposed outputs for Eigen's slower matmuls).
    """
    *lead, C = x.shape
    y = layer(x.reshape(-1, C))  # (B*T, C_out)
    return y.reshape(*lead, y.shape[-1])


class CausalSelfAttention(nnx.Module):
    """Multi-head self-attention where position t attends to positions <= t."""

    def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs):
        C = config.n_embd
        self.n_head = config.n_head
        self.c_attn = _linear(C, 3 * C, config.bias, 0.02, rngs)
        self.c_proj = _linear(C, C, config.bias, 0.02 / math.sqrt(2 * config.n_layer), rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, T, C) -> (B, T, C)
        B, T, C = x.shape
        q, k, v = jnp.split(_dense(self.c_attn, x), 3, axis=-1)  # each (B, T, C)
        q, k, v = (a.reshape(B, T, self.n_head, C // self.n_head) for a in (q, k, v))  # (B, T, nh, hs)
        y = causal_attention(q, k, v)  # (B, T, nh, hs), scale 1/sqrt(hs)
        return _dense(self.c_proj, y.reshape(B, T, C))


class MLPBlock(nnx.Module):
    """Linear(C, 4C) → GELU → Linear(4C, C)."""

    def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs):
        C = config.n_embd
        self.c_fc = _linear(C, 4 * C, config.bias, 0.02, rngs)
        self.c_proj = _linear(4 * C, C, config.bias, 0.02 / math.sqrt(2 * config.n_layer), rngs)

    def __call__(self, x: jax.Array) -> jax.Array:  # (B, T, C) -> (B, T, C)
        return _dense(self.c_proj, jax.nn.gelu(_dense(self.c_fc, x), approximate=False))


class Block(nnx.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs):
        C = config.n_embd
        self.drop = nnx.Dropout(config.dropout)
        self.ln_1 = nnx.LayerNorm(C, epsilon=1e-5, use_bias=config.bias, rngs=rngs)
        self.attn = CausalSelfAttention(config, rngs=rngs)
        self.ln_2 = nnx.LayerNorm(C, epsilon=1e-5, use_bias=config.bias, rngs=rngs)
        self.mlp = MLPBlock(config, rngs=rngs)

    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:  # (B, T, C)
        k1, k2 = jax.random.split(key) if key is not None else (None, None)
        off = True if key is None else None  # None: the module's mode decides (train, or eval())
        x = x + self.drop(self.attn(self.ln_1(x)), deterministic=off, rngs=k1)
        return x + self.drop(self.mlp(self.ln_2(x)), deterministic=off, rngs=k2)


class GPT(nnx.Module):
    """A decoder-only transformer over a vocabulary of `vocab_size` tokens.

    `model(idx)` maps token ids (B, T), T <= block_size, to next-token logits (B, T, vocab_size).
    `key` feeds dropout during training; dropout is off without a key, at rate 0 and in
    evaluation mode (`model.eval()`). `remat` ("none", "blocks", "full"; see `jaxtrain.remat`)
    recomputes each block's activations in the backward pass instead of keeping them. The logits
    are float32 whatever the compute dtype, for the loss.
    """

    def __init__(self, vocab_size: int, config: GPTConfig, *, remat: remat_lib.Mode = "none", rngs: nnx.Rngs):
        self.config = config
        self.remat = remat_lib.check_mode(remat)
        init = nnx.initializers.normal(0.02)
        self.wte = nnx.Embed(vocab_size, config.n_embd, embedding_init=init, rngs=rngs)
        self.wpe = nnx.Embed(config.block_size, config.n_embd, embedding_init=init, rngs=rngs)
        self.drop = nnx.Dropout(config.dropout)
        self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.n_layer)])
        self.ln_f = nnx.LayerNorm(config.n_embd, epsilon=1e-5, use_bias=config.bias, rngs=rngs)

    def __call__(self, idx: jax.Array, key: jax.Array | None = None) -> jax.Array:  # (B, T) -> (B, T, V)
        T = idx.shape[1]
        keys = list(jax.random.split(key, len(self.blocks) + 1)) if key is not None else [None] * (len(self.blocks) + 1)
        # Rows of the tables, not `nnx.Embed.__call__`: that casts to the dtype the table had when it
        # was built (float32) and would undo a bf16 compute dtype for the whole network.
        x = jnp.take(self.wte.embedding[...], idx, axis=0) + self.wpe.embedding[...][:T]  # (B, T, C)
        x = self.drop(x, deterministic=True if key is None else None, rngs=keys[0])
        for block, k in zip(self.blocks, keys[1:]):
            x = remat_lib.call(block, x, k, mode=self.remat)
        # The output layer is the token embedding; float32 logits (accumulated in float32) under bf16.
        h = self.ln_f(x)  # (B, T, C)
        logits = jnp.einsum("nc,vc->nv", h.reshape(-1, h.shape[-1]), self.wte.embedding[...],
                            preferred_element_type=jnp.float32)  # (B*T, V): 2-D, as `_dense`
        return logits.reshape(*h.shape[:-1], logits.shape[-1])  # (B, T, V)


def num_params(model: GPT, exclude_position: bool = True) -> int:
    """Parameter count; like nanoGPT, without the position embedding by default."""
    total = sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return total - (model.wpe.embedding[...].size if exclude_position else 0)


def train_flops_per_token(config: GPTConfig, n_params: int) -> float:
    """Model FLOPs of one training token (forward + backward), as in the PaLM appendix and nanoGPT's
    `estimate_mfu`: 6·N for the weights plus 12·L·C·T for attention."""
    return 6 * n_params + 12 * config.n_layer * config.n_embd * config.block_size


def sample(
    model: GPT,
    prompt: jax.Array,
    num_tokens: int,
    key: jax.Array,
    temperature: float = 1.0,
    top_k: int = 0,
) -> jax.Array:
    """Appends `num_tokens` sampled tokens to `prompt` (P,), P >= 1; returns (P + num_tokens,).

    One compiled `lax.fori_loop` over the new tokens: each step runs the model on the last
    `block_size` tokens (a window read from a fixed-size buffer, so shapes never change and
    nothing recompiles per token) and samples from softmax(logits / temperature), restricted to
    the `top_k` most likely tokens when top_k > 0. The same key gives the same text.
    """
    if temperature <= 0:
        raise ConfigError(f"temperature={temperature} must be > 0")
    model.eval()  # dropout off
    graphdef, state = nnx.split(model)
    model.train()
    T = model.config.block_size
    P = prompt.shape[0]
    L = max(P + num_tokens, T)
    vocab = model.wte.embedding.shape[0]
    k = min(top_k, vocab) if top_k > 0 else vocab

    @jax.jit
    def run(state: nnx.State, prompt: jax.Array, key: jax.Array) -> jax.Array:
        m = nnx.merge(graphdef, state)
        buf = jnp.zeros((L,), jnp.int32).at[:P].set(prompt.astype(jnp.int32))

        def body(n: jax.Array, buf: jax.Array) -> jax.Array:  # n: tokens present
            start = jnp.clip(n - T, 0, L - T)
            window = jax.lax.dynamic_slice_in_dim(buf, start, T)  # (T,); positions >= n are ignored (causal)
            logits = m(window[None])[0, n - 1 - start] / temperature  # (V,)
            kth = jax.lax.top_k(logits, k)[0][-1]
            logits = jnp.where(logits < kth, -jnp.inf, logits)
            token = jax.random.categorical(jax.random.fold_in(key, n), logits)
            return buf.at[n].set(token.astype(jnp.int32))

        return jax.lax.fori_loop(P, P + num_tokens, body, buf)[: P + num_tokens]

    return run(state, prompt, key)
