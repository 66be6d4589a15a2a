"""Data: sources, datasets, placement and in-graph transforms."""

from jaxtrain._src.data import *  # noqa: F401,F403
from jaxtrain._src.data import __all__  # noqa: F401
