"""Reference models, each imported on its first use (PEP 562), as `jaxtrain._src.models` does:
`GPTConfig`, a GPT's shape, is plain settings that the command line's recipe configs name without
importing JAX."""

from typing import TYPE_CHECKING, Any

from jaxtrain._src import models as _models
from jaxtrain._src.models import __all__, compiled_init  # noqa: F401

if TYPE_CHECKING:  # what type checkers see; at run time `__getattr__` imports the same
    from jaxtrain._src.models.cnn import CNN, Conv2D, SequenceCNN  # noqa: F401
    from jaxtrain._src.models.gpt import GPT  # noqa: F401
    from jaxtrain._src.models.gpt_config import GPTConfig  # noqa: F401
    from jaxtrain._src.models.mlp import MLP  # noqa: F401


def __getattr__(name: str) -> Any:
    """A model's class or its settings, imported from its module on first use."""
    if name in __all__:
        return getattr(_models, name)
    raise AttributeError(f"module 'jaxtrain.models' has no attribute {name!r}")
