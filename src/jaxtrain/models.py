"""Reference models, each imported on its first use (PEP 562), as `jaxtrain._src.models` does:
`GPTConfig`, a GPT's shape, is plain settings that the command line's recipe configs name without
importing JAX."""

from typing import Any

from jaxtrain._src import models as _models
from jaxtrain._src.models import __all__, compiled_init  # noqa: F401


def __getattr__(name: str) -> Any:
    """A model's class or its settings, imported from its module on first use."""
    if name in __all__:
        return getattr(_models, name)
    raise AttributeError(f"module 'jaxtrain.models' has no attribute {name!r}")
