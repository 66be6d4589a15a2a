"""The GPT's shape (`GPTConfig`): plain settings, importable without JAX (the command line's help
reads them)."""

from __future__ import annotations

import dataclasses

from jaxtrain._src.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """The GPT's shape."""

    block_size: int = 64
    """Context length T (tokens the model sees)."""
    n_layer: int = 4
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads per block; n_embd must divide by it."""
    n_embd: int = 128
    """Embedding width C."""
    dropout: float = 0.0
    """Dropout on embeddings and residual branches during training (nanoGPT also drops attention
    weights; fused attention kernels have no dropout, so this model does not)."""
    bias: bool = False
    """Biases in linear layers and LayerNorms (nanoGPT's shakespeare_char runs use none)."""

    def __post_init__(self) -> None:
        for field in ("block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, field) < 1:
                raise ConfigError(f"model.{field}={getattr(self, field)} must be an integer >= 1")
        if self.n_embd % self.n_head:
            raise ConfigError(f"model.n_embd={self.n_embd} must be divisible by model.n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout} must be in [0, 1)")
