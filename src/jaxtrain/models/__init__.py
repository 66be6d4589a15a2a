"""Reference models."""

from jaxtrain.models.cnn import CNN, Conv2D, SequenceCNN
from jaxtrain.models.gpt import GPT, GPTConfig
from jaxtrain.models.mlp import MLP

__all__ = ["CNN", "Conv2D", "GPT", "GPTConfig", "MLP", "SequenceCNN"]
