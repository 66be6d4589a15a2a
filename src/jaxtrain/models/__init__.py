"""Reference models."""

from jaxtrain.models.mlp import MLP

__all__ = ["MLP"]
