"""Hooks: small objects that react to the training loop's events."""

from jaxtrain._src.hooks import *  # noqa: F401,F403
from jaxtrain._src.hooks import __all__  # noqa: F401
