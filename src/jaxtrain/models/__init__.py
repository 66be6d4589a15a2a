"""Reference models."""

from jaxtrain.models.cnn import CNN, Conv2D
from jaxtrain.models.mlp import MLP

__all__ = ["CNN", "Conv2D", "MLP"]
