"""`lstm`: Flax's SST-2 text classifier (embedding + bidirectional LSTM + attention), in NNX.

Source: google/flax `examples/sst2/models.py` (TextClassifier: Embedder, SimpleBiLSTM,
AttentionClassifier) and `examples/sst2/train.py`. Embeddings initialised N(0, 0.1) with word
dropout (tokens replaced by unk with probability 0.1) and dropout 0.5; a forward and a backward
LSTM (`nnx.RNN(nnx.OptimizedLSTMCell)`, the example's cell; the backward one reverses each sequence
within its length, as the example's `flip_sequences`); Bahdanau-style keys-only MLP attention over
the valid positions, dropout on the encodings and on the context, a tanh MLP with dropout and a
bias-free output layer; sigmoid cross-entropy on one logit. The dropout layers hold RNG streams
(`nnx.Dropout(rate, rngs=rngs)`; the example gets a 'dropout' key per step). The optimizer is the
example's `chain(sgd(0.1, momentum=0.9), add_decayed_weights(3e-6))` (decay added after the SGD
update, so it grows the weights slightly; kept as written). Batch 64, `jax.jit` step.

Shrunk: vocabulary 2000 (the SST-2 vocabulary is ~14k), embeddings 64 wide (300) and LSTMs 64
(256); every batch padded to 60 tokens (the example buckets by length, one shape per bucket). The
example's attention `sow`s its scores into 'intermediates' only when asked; training never asks,
so this port does not sow.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.zoo.base import Batch, ZooModel

SOURCE = "google/flax examples/sst2/models.py (TextClassifier) + examples/sst2/train.py"
PAD, UNK, BOS, EOS = 0, 1, 2, 3  # the example's vocabulary specials


@dataclasses.dataclass(frozen=True)
class ClassifierConfig:
    vocab_size: int = 2000
    embedding_size: int = 64
    hidden_size: int = 64
    output_size: int = 1
    dropout_rate: float = 0.5
    word_dropout_rate: float = 0.1
    max_length: int = 60


def sequence_mask(lengths: jax.Array, max_length: int) -> jax.Array:
    """(B, max_length) True where a position is inside its sequence."""
    return jnp.arange(max_length)[None] < lengths[:, None]


class WordDropout(nnx.Module):
    """Replaces each input id by `unk_idx` with probability `rate` (Dropout for token ids)."""

    def __init__(self, rate: float, unk_idx: int, *, rngs: nnx.Rngs):
        self.rate = rate
        self.unk_idx = unk_idx
        self.deterministic = False
        self.rngs = rngs.dropout.fork()

    def __call__(self, inputs: jax.Array) -> jax.Array:
        if self.deterministic or self.rate == 0.0:
            return inputs
        mask = jax.random.bernoulli(self.rngs(), p=self.rate, shape=inputs.shape)
        return jnp.where(mask, jnp.array([self.unk_idx]), inputs)


class Embedder(nnx.Module):
    """Token ids (B, T) -> embeddings (B, T, E), with word dropout then dropout."""

    def __init__(self, config: ClassifierConfig, *, rngs: nnx.Rngs):
        self.embedding = nnx.Embed(config.vocab_size, config.embedding_size,
                                   embedding_init=nnx.initializers.normal(stddev=0.1), rngs=rngs)
        self.dropout_layer = nnx.Dropout(config.dropout_rate, rngs=rngs)
        self.word_dropout_layer = WordDropout(config.word_dropout_rate, UNK, rngs=rngs)

    def __call__(self, inputs: jax.Array) -> jax.Array:
        return self.dropout_layer(self.embedding(self.word_dropout_layer(inputs)))


class SimpleBiLSTM(nnx.Module):
    """Forward and backward LSTMs over (B, T, E), outputs concatenated: (B, T, 2H)."""

    def __init__(self, in_features: int, hidden_size: int, *, rngs: nnx.Rngs):
        self.forward_lstm = nnx.RNN(nnx.OptimizedLSTMCell(in_features, hidden_size, rngs=rngs))
        # reverse + keep_order: each sequence read backwards from its last valid token, outputs
        # put back in the original order (the example's flip_sequences before and after).
        self.backward_lstm = nnx.RNN(nnx.OptimizedLSTMCell(in_features, hidden_size, rngs=rngs),
                                     reverse=True, keep_order=True)

    def __call__(self, embedded_inputs: jax.Array, lengths: jax.Array) -> jax.Array:
        forward_outputs = self.forward_lstm(embedded_inputs)  # (B, T, H)
        backward_outputs = self.backward_lstm(embedded_inputs, seq_lengths=lengths)  # (B, T, H)
        return jnp.concatenate([forward_outputs, backward_outputs], -1)


class MLP(nnx.Module):
    """Linear → tanh → Dropout → Linear without bias."""

    def __init__(self, in_features: int, hidden_size: int, output_size: int, dropout_rate: float, *,
                 rngs: nnx.Rngs):
        self.intermediate_layer = nnx.Linear(in_features, hidden_size, rngs=rngs)
        self.output_layer = nnx.Linear(hidden_size, output_size, use_bias=False, rngs=rngs)
        self.dropout_layer = nnx.Dropout(dropout_rate, rngs=rngs)

    def __call__(self, inputs: jax.Array) -> jax.Array:
        hidden = self.dropout_layer(nnx.tanh(self.intermediate_layer(inputs)))
        return self.output_layer(hidden)


class KeysOnlyMlpAttention(nnx.Module):
    """Attention scores from the keys alone: softmax over valid positions of MLP(keys)."""

    def __init__(self, in_features: int, hidden_size: int, *, rngs: nnx.Rngs):
        self.keys = nnx.Linear(in_features, hidden_size, use_bias=False, rngs=rngs)
        self.energy = nnx.Linear(hidden_size, 1, use_bias=False, rngs=rngs)

    def __call__(self, keys: jax.Array, mask: jax.Array) -> jax.Array:  # (B, T, K), (B, T) -> (B, T)
        scores = self.energy(nnx.tanh(self.keys(keys))).squeeze(-1)  # (B, T)
        scores = jnp.where(mask, scores, -jnp.inf)  # exp(-inf) = 0 below
        return nnx.softmax(scores, axis=-1)


class AttentionClassifier(nnx.Module):
    """Attention-weighted sum of the encodings, then the MLP."""

    def __init__(self, in_features: int, hidden_size: int, output_size: int, dropout_rate: float, *,
                 rngs: nnx.Rngs):
        self.dropout_layer = nnx.Dropout(dropout_rate, rngs=rngs)
        self.keys_only_mlp_attention = KeysOnlyMlpAttention(in_features, hidden_size, rngs=rngs)
        self.mlp = MLP(in_features, hidden_size, output_size, dropout_rate, rngs=rngs)

    def __call__(self, encoded_inputs: jax.Array, lengths: jax.Array) -> jax.Array:
        encoded_inputs = self.dropout_layer(encoded_inputs)  # (B, T, 2H)
        mask = sequence_mask(lengths, encoded_inputs.shape[1])
        attention = self.keys_only_mlp_attention(encoded_inputs, mask)  # (B, T)
        context = (jnp.expand_dims(attention, 1) @ encoded_inputs).squeeze(1)  # (B, 2H)
        return self.mlp(self.dropout_layer(context))


class TextClassifier(nnx.Module):
    """(token ids (B, T), lengths (B,)) -> logits (B, output_size)."""

    def __init__(self, config: ClassifierConfig, *, rngs: nnx.Rngs):
        self.embedder = Embedder(config, rngs=rngs)
        self.encoder = SimpleBiLSTM(config.embedding_size, config.hidden_size, rngs=rngs)
        self.classifier = AttentionClassifier(2 * config.hidden_size, config.hidden_size, config.output_size,
                                              config.dropout_rate, rngs=rngs)

    def __call__(self, token_ids: jax.Array, lengths: jax.Array) -> jax.Array:
        encoded_inputs = self.encoder(self.embedder(token_ids), lengths)
        return self.classifier(encoded_inputs, lengths)


def sigmoid_cross_entropy_with_logits(*, labels: jax.Array, logits: jax.Array) -> jax.Array:
    """Numerically stable sigmoid cross-entropy, elementwise."""
    zeros = jnp.zeros_like(logits)
    condition = logits >= zeros
    relu_logits = jnp.where(condition, logits, zeros)
    neg_abs_logits = jnp.where(condition, -logits, logits)
    return relu_logits - logits * labels + jnp.log1p(jnp.exp(neg_abs_logits))


def loss_fn(model: TextClassifier, batch: Batch, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean sigmoid cross-entropy of the one logit; also the binary accuracy."""
    logits = model(batch["token_ids"], batch["length"])  # (B, 1)
    labels = jnp.expand_dims(batch["label"], 1)  # (B, 1); the example keeps labels from broadcasting
    loss = jnp.mean(sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    return loss, {"accuracy": jnp.mean((logits >= 0.0) == labels)}


def make_data(n: int, seed: int) -> dict[str, np.ndarray]:
    """token_ids int32 (60,): BOS, 8-58 words, EOS, then PAD; length int32; label int32 in {0, 1}.

    A sentiment-like bag-of-words signal: a positive sentence draws 70% of its words from the lower
    half of the vocabulary, a negative one 70% from the upper half.
    """
    config = ClassifierConfig()
    T = config.max_length
    first, half = EOS + 1, (config.vocab_size - EOS - 1) // 2
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, size=n).astype(np.int32)
    n_words = rng.integers(8, T - 1, size=n)
    lower = (rng.uniform(size=(n, T - 2)) < 0.7) == (label[:, None] == 1)  # word from the lower half?
    words = first + rng.integers(0, half, size=(n, T - 2)) + np.where(lower, 0, half)
    token_ids = np.full((n, T), PAD, np.int32)
    token_ids[:, 0] = BOS
    token_ids[:, 1:-1] = np.where(np.arange(T - 2)[None, :] < n_words[:, None], words, PAD)
    token_ids[np.arange(n), n_words + 1] = EOS
    return {"token_ids": token_ids, "length": (n_words + 2).astype(np.int32), "label": label}


MODEL = ZooModel(
    name="lstm",
    source=SOURCE,
    make_model=lambda seed: TextClassifier(ClassifierConfig(), rngs=nnx.Rngs(seed)),
    loss_fn=loss_fn,
    make_data=make_data,
    optimizer=lambda: optax.chain(optax.sgd(learning_rate=0.1, momentum=0.9), optax.add_decayed_weights(3e-6)),
    batch_size=64,
    hand_jit="jit",
)
