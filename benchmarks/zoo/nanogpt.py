"""`nanogpt`: nanoGPT's GPT ported line by line to Flax NNX, in its baby Shakespeare-char CPU config.

Source: karpathy/nanoGPT `model.py` (LayerNorm with a bias flag, CausalSelfAttention with one c_attn
projection for q, k, v, MLP with exact GELU, Block, GPT with tied token embedding / lm_head,
N(0, 0.02) init with N(0, 0.02 / sqrt(2 n_layer)) for every c_proj, `configure_optimizers`' AdamW
that decays only parameters with ndim >= 2) and `train.py` (clip_grad_norm 1.0, `get_lr`: linear
warmup then cosine decay to min_lr). Attention is the non-flash path of model.py (explicit mask,
softmax, attention dropout). Dropout layers hold RNG streams (`nnx.Dropout(rate, rngs=rngs)`; the
CPU config's rate is 0). The loop is a `jax.jit` step over split state with donation.

Config (README's "I only have a macbook" run of config/train_shakespeare_char.py): block_size 64,
batch 12, n_layer 4, n_head 4, n_embd 128, dropout 0.0, bias False, vocab 65, lr 1e-3 with 100
warmup steps and cosine decay to 1e-4 over 2000, betas (0.9, 0.99), weight decay 0.1. Nothing
is shrunk.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.zoo.base import Batch, ZooModel, markov_stream

SOURCE = "karpathy/nanoGPT model.py + train.py (config/train_shakespeare_char.py, README CPU settings)"


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 65  # Tiny Shakespeare's characters
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False  # True: bias in Linears and LayerNorms, like GPT-2. False: a bit better and faster


def _normal(std: float) -> nnx.Initializer:
    return nnx.initializers.normal(stddev=std)


class CausalSelfAttention(nnx.Module):
    def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs):
        assert config.n_embd % config.n_head == 0
        proj_std = 0.02 / math.sqrt(2 * config.n_layer)  # GPT-2's scaled init of residual projections
        self.c_attn = nnx.Linear(config.n_embd, 3 * config.n_embd, use_bias=config.bias, kernel_init=_normal(0.02),
                                 rngs=rngs)
        self.c_proj = nnx.Linear(config.n_embd, config.n_embd, use_bias=config.bias, kernel_init=_normal(proj_std),
                                 rngs=rngs)
        self.attn_dropout = nnx.Dropout(config.dropout, rngs=rngs)
        self.resid_dropout = nnx.Dropout(config.dropout, rngs=rngs)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        # model.py's registered buffer; a plain array attribute is non-trainable state in NNX
        self.bias = jnp.tril(jnp.ones((config.block_size, config.block_size)))[None, None]  # (1, 1, T, T)

    def __call__(self, x: jax.Array) -> jax.Array:
        B, T, C = x.shape  # batch size, sequence length, embedding dimensionality (n_embd)
        q, k, v = jnp.split(self.c_attn(x), 3, axis=2)  # each (B, T, C)
        k = k.reshape(B, T, self.n_head, C // self.n_head).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
        q = q.reshape(B, T, self.n_head, C // self.n_head).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
        v = v.reshape(B, T, self.n_head, C // self.n_head).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
        att = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(k.shape[-1]))  # (B, nh, T, T)
        att = jnp.where(self.bias[:, :, :T, :T] == 0, -jnp.inf, att)
        att = self.attn_dropout(jax.nn.softmax(att, axis=-1))
        y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)  # re-assemble all head outputs side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nnx.Module):
    def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs):
        proj_std = 0.02 / math.sqrt(2 * config.n_layer)
        self.c_fc = nnx.Linear(config.n_embd, 4 * config.n_embd, use_bias=config.bias, kernel_init=_normal(0.02),
                               rngs=rngs)
        self.c_proj = nnx.Linear(4 * config.n_embd, config.n_embd, use_bias=config.bias,
                                 kernel_init=_normal(proj_std), rngs=rngs)
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jax.nn.gelu(self.c_fc(x), approximate=False)  # torch's nn.GELU() is the exact erf form
        return self.dropout(self.c_proj(x))


class Block(nnx.Module):
    def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs):
        self.ln_1 = nnx.LayerNorm(config.n_embd, epsilon=1e-5, use_bias=config.bias, rngs=rngs)
        self.attn = CausalSelfAttention(config, rngs=rngs)
        self.ln_2 = nnx.LayerNorm(config.n_embd, epsilon=1e-5, use_bias=config.bias, rngs=rngs)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nnx.Module):
    """`model(idx (B, T)) -> logits (B, T, vocab_size)`; the lm_head is the token embedding's transpose."""

    def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.wte = nnx.Embed(config.vocab_size, config.n_embd, embedding_init=_normal(0.02), rngs=rngs)
        self.wpe = nnx.Embed(config.block_size, config.n_embd, embedding_init=_normal(0.02), rngs=rngs)
        self.drop = nnx.Dropout(config.dropout, rngs=rngs)
        self.h = nnx.List([Block(config, rngs=rngs) for _ in range(config.n_layer)])
        self.ln_f = nnx.LayerNorm(config.n_embd, epsilon=1e-5, use_bias=config.bias, rngs=rngs)

    def __call__(self, idx: jax.Array) -> jax.Array:
        b, t = idx.shape
        assert t <= self.config.block_size, \
            f"Cannot forward sequence of length {t}, block size is only {self.config.block_size}"
        pos = jnp.arange(0, t)  # (t,)
        tok_emb = self.wte(idx)  # token embeddings of shape (b, t, n_embd)
        pos_emb = self.wpe(pos)  # position embeddings of shape (t, n_embd)
        x = self.drop(tok_emb + pos_emb)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return self.wte.attend(x)  # weight tying: lm_head.weight is wte.weight


def loss_fn(model: GPT, batch: Batch, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """F.cross_entropy over every position (mean over B * T)."""
    logits = model(batch["x"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss, {}


def get_lr(it: jax.Array, learning_rate: float = 1e-3, warmup_iters: int = 100, lr_decay_iters: int = 2000,
           min_lr: float = 1e-4) -> jax.Array:
    """train.py's schedule: linear warmup, then cosine decay to min_lr, then min_lr."""
    warmup = learning_rate * (it + 1) / (warmup_iters + 1)
    decay_ratio = jnp.clip((it - warmup_iters) / (lr_decay_iters - warmup_iters), 0.0, 1.0)
    coeff = 0.5 * (1.0 + jnp.cos(jnp.pi * decay_ratio))  # 1 -> 0
    return jnp.where(it < warmup_iters, warmup, min_lr + coeff * (learning_rate - min_lr))


def configure_optimizers(weight_decay: float = 0.1, betas: tuple[float, float] = (0.9, 0.99),
                         grad_clip: float = 1.0) -> optax.GradientTransformation:
    """Gradient clipping then AdamW, decaying only tensors with ndim >= 2 (matmul weights, embeddings)."""
    return optax.chain(
        optax.clip_by_global_norm(grad_clip),
        optax.adamw(get_lr, b1=betas[0], b2=betas[1], weight_decay=weight_decay,
                    mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)),
    )


def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
    """Tiny-Shakespeare-char-shaped rows: x, y int32 (64,), y = x shifted by one (train.py's get_batch).

    Rows start at random offsets of one character stream, as get_batch draws them.
    """
    T = GPTConfig.block_size
    stream = markov_stream(max(4 * n, 10 * T), GPTConfig.vocab_size, seed)
    ix = np.random.default_rng(seed).integers(0, len(stream) - T - 1, size=n)
    x = np.stack([stream[i:i + T] for i in ix])
    y = np.stack([stream[i + 1:i + 1 + T] for i in ix])
    return {"x": x, "y": y}


MODEL = ZooModel(
    name="nanogpt",
    source=SOURCE,
    make_model=lambda seed: GPT(GPTConfig(), rngs=nnx.Rngs(seed)),
    loss_fn=loss_fn,
    make_data=make_data,
    optimizer=configure_optimizers,
    batch_size=12,
    hand_jit="jit",
)
