"""`transformer-mha`: the decoder-only Transformer LM of Flax's NNX LM1B example, small.

Source: google/flax `examples/lm1b_nnx/models.py` and `train.py` (removed from the repository in
commit 881b8ed4, Dec 2025; ported from its parent; `examples/lm1b` is the Linen original). Token
embedding (normal(1.0) init), fixed sinusoidal position encodings, Dropout, pre-LayerNorm blocks of
`nnx.MultiHeadAttention(dropout_rate=0.1, broadcast_dropout=False, use_bias=False,
keep_rngs=False)` and a ReLU MLP (Xavier-uniform kernels, normal(1e-6) biases), a final LayerNorm
and a linear output layer. Inputs are shifted right inside the model; a padding mask
(`inputs > 0`) is combined with the causal mask, and the loss is cross-entropy weighted by the
non-padding targets. As in the example, no module holds an RNG stream: the step passes
`rngs=nnx.Rngs(dropout=key)`, and the module is merged from split state inside a `jax.jit` step
with the train state donated. The example switches to training mode in the loss with
`set_attributes(deterministic=False, decode=False)`; `make_model` does it once instead.
AdamW(b1 0.9, b2 0.98, eps 1e-9, weight decay 0.1) at the example's peak lr 0.0016.

Shrunk: vocabulary 1024 (30k SentencePiece), 2 layers of width 64 with 4 heads and MLP 256
(6 x 512 / 8 heads / 2048), sequences of 64 (128), unpacked sentences padded with 0 (the
example packs several per row); the rsqrt schedule's 1000-step warmup is left out.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax import lax

from benchmarks.zoo.base import Batch, ZooModel, markov_stream

SOURCE = "google/flax examples/lm1b_nnx/models.py + train.py (parent of commit 881b8ed4)"


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """The example's hyperparameters (its defaults are the full-size model's)."""

    vocab_size: int = 1024
    emb_dim: int = 64
    num_heads: int = 4
    num_layers: int = 2
    qkv_dim: int = 64
    mlp_dim: int = 256
    max_len: int = 64
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1


KERNEL_INIT = nnx.initializers.xavier_uniform()
BIAS_INIT = nnx.initializers.normal(stddev=1e-6)


def shift_right(x: jax.Array, axis: int = 1) -> jax.Array:
    """Shifts `x` right by one along `axis`, filling with 0 (the decoder's inputs)."""
    pad_widths = [(0, 0)] * x.ndim
    pad_widths[axis] = (1, 0)
    padded = jnp.pad(x, pad_widths, constant_values=x.dtype.type(0))
    return lax.dynamic_slice_in_dim(padded, 0, padded.shape[axis] - 1, axis)


def sinusoidal_init(max_len: int, d_feature: int, min_scale: float = 1.0, max_scale: float = 10000.0) -> np.ndarray:
    """Fixed sin/cos position encodings, (1, max_len, d_feature)."""
    pe = np.zeros((max_len, d_feature), dtype=np.float32)
    position = np.arange(0, max_len)[:, np.newaxis]
    scale_factor = -np.log(max_scale / min_scale) / (d_feature // 2 - 1)
    div_term = min_scale * np.exp(np.arange(0, d_feature // 2) * scale_factor)
    pe[:, : d_feature // 2] = np.sin(position * div_term)
    pe[:, d_feature // 2 : 2 * (d_feature // 2)] = np.cos(position * div_term)
    return pe[np.newaxis]


class MlpBlock(nnx.Module):
    """Linear → ReLU → Dropout → Linear → Dropout."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(config.emb_dim, config.mlp_dim, kernel_init=KERNEL_INIT, bias_init=BIAS_INIT,
                                  rngs=rngs)
        self.linear2 = nnx.Linear(config.mlp_dim, config.emb_dim, kernel_init=KERNEL_INIT, bias_init=BIAS_INIT,
                                  rngs=rngs)
        self.dropout = nnx.Dropout(rate=config.dropout_rate)

    def __call__(self, inputs: jax.Array, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        x = self.dropout(nnx.relu(self.linear1(inputs)), rngs=rngs)  # (B, T, mlp_dim)
        return self.dropout(self.linear2(x), rngs=rngs)


class DecoderBlock(nnx.Module):
    """The example's EncoderDecoder1DBlock: x + Dropout(MHA(LN(x))), then x + MLP(LN(x))."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.ln1 = nnx.LayerNorm(config.emb_dim, rngs=rngs)
        self.ln2 = nnx.LayerNorm(config.emb_dim, rngs=rngs)
        self.attention = nnx.MultiHeadAttention(
            num_heads=config.num_heads,
            in_features=config.emb_dim,
            qkv_features=config.qkv_dim,
            kernel_init=KERNEL_INIT,
            bias_init=BIAS_INIT,
            use_bias=False,
            broadcast_dropout=False,
            dropout_rate=config.attention_dropout_rate,
            rngs=rngs,
            keep_rngs=False,
        )
        self.mlp = MlpBlock(config, rngs=rngs)
        self.dropout = nnx.Dropout(rate=config.dropout_rate)

    def __call__(self, inputs: jax.Array, *, decoder_mask: jax.Array | None = None,
                 rngs: nnx.Rngs | None = None) -> jax.Array:  # (B, T, D) -> (B, T, D)
        x = self.attention(self.ln1(inputs), mask=decoder_mask, rngs=rngs)
        x = self.dropout(x, rngs=rngs) + inputs
        return x + self.mlp(self.ln2(x), rngs=rngs)


class TransformerLM(nnx.Module):
    """Token ids (B, T), 0 = padding -> next-token logits (B, T, vocab_size)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.decode = False
        self.output_embed = nnx.Embed(config.vocab_size, config.emb_dim,
                                      embedding_init=nnx.initializers.normal(stddev=1.0), rngs=rngs)
        self.dropout = nnx.Dropout(rate=config.dropout_rate)
        for idx in range(config.num_layers):  # attribute names as in the example
            setattr(self, f"encoderdecoderblock_{idx}", DecoderBlock(config, rngs=rngs))
        self.encoderdecoder_norm = nnx.LayerNorm(config.emb_dim, rngs=rngs)
        self.logitdense = nnx.Linear(config.emb_dim, config.vocab_size, kernel_init=KERNEL_INIT, bias_init=BIAS_INIT,
                                     rngs=rngs)

    def __call__(self, inputs: jax.Array, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        config = self.config
        decoder_mask = nnx.combine_masks(
            nnx.make_attention_mask(inputs > 0, inputs > 0),
            nnx.make_causal_mask(inputs),
        )  # (B, 1, T, T)
        y = shift_right(inputs.astype(jnp.int32))
        y = self.output_embed(y)  # (B, T, D)
        y = y + sinusoidal_init(config.max_len, config.emb_dim)[:, : y.shape[1]]
        y = self.dropout(y, rngs=rngs)
        for idx in range(config.num_layers):
            y = getattr(self, f"encoderdecoderblock_{idx}")(y, decoder_mask=decoder_mask, rngs=rngs)
        return self.logitdense(self.encoderdecoder_norm(y))  # (B, T, vocab_size)


def make_model(seed: int) -> TransformerLM:
    model = TransformerLM(TransformerConfig(), rngs=nnx.Rngs(params=seed))
    model.set_attributes(deterministic=False, decode=False)  # what the example's loss does every step
    return model


def loss_fn(model: TransformerLM, batch: Batch, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Cross-entropy of next-token prediction over non-padding positions (label smoothing 0)."""
    inputs = batch["inputs"]
    weights = jnp.where(inputs > 0, 1, 0).astype(jnp.float32)  # (B, T)
    logits = model(inputs, rngs=nnx.Rngs(dropout=key))
    token_loss = -jnp.sum(jax.nn.one_hot(inputs, logits.shape[-1]) * nnx.log_softmax(logits), axis=-1)  # (B, T)
    loss = jnp.sum(token_loss * weights) / jnp.sum(weights)
    accuracy = jnp.sum(jnp.equal(jnp.argmax(logits, -1), inputs) * weights) / jnp.sum(weights)
    return loss, {"accuracy": accuracy}


def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
    """inputs int32 (64,): a "sentence" of 16-64 tokens in [1, 1024), then 0s."""
    T, V = TransformerConfig.max_len, TransformerConfig.vocab_size
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, T + 1, size=n)
    stream = markov_stream(n * T, V, seed, first=1)
    inputs = stream.reshape(n, T)
    inputs[np.arange(T)[None, :] >= lengths[:, None]] = 0
    return {"inputs": inputs}


MODEL = ZooModel(
    name="transformer-mha",
    source=SOURCE,
    make_model=make_model,
    loss_fn=loss_fn,
    make_data=make_data,
    optimizer=lambda: optax.adamw(0.0016, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.1),
    batch_size=32,  # per_device_batch_size on one device
    hand_jit="jit",
)
