"""Reference models, each loaded on first use (PEP 562): `GPTConfig`, the GPT's shape, is plain
settings that the command line's help reads without importing JAX."""

from __future__ import annotations

import importlib
from typing import Any, Callable, TypeVar

__all__ = ["CNN", "Conv2D", "GPT", "GPTConfig", "MLP", "SequenceCNN", "compiled_init"]

_MODULES = {"CNN": "cnn", "Conv2D": "cnn", "SequenceCNN": "cnn", "GPT": "gpt", "GPTConfig": "gpt_config",
            "MLP": "mlp"}

M = TypeVar("M")


def compiled_init(factory: Callable[..., M], seed: int | None = None) -> M:
    """A model built by its constructor traced and run as one compiled program.

    `compiled_init(lambda rngs: MLP(sizes, rngs=rngs), seed)`: the constructor gets `nnx.Rngs(seed)`
    and the seed enters the program as an input, so models of one shape share one program whatever
    their seeds (a sweep or a population over seeds compiles it once; the persistent cache serves it
    across processes). `compiled_init(lambda: MLP(sizes, rngs=nnx.Rngs(0)))` (no seed) compiles
    the constructor as it is, with any seed inside it a constant of the program.

    Built eagerly, every random initialiser is an op compiled on its first use: mlp-regression's
    MLP took 1.70 s to build on a busy 2-core machine, 0.85 s as one program (mnist-cnn's CNN
    3.3 s -> 2.6 s). The recipes that use it get the same weights bit for bit (tested); char-gpt's
    scaled normal initialisers differ in the last bit under jit, so it builds eagerly.
    """
    import jax
    from flax import nnx

    from jaxtrain._src.memory import release_free_heap

    if seed is None:
        model = nnx.jit(factory)()
    else:
        model = nnx.jit(lambda key: factory(nnx.Rngs(key)))(jax.random.key(seed))
    release_free_heap()  # what compiling the initialiser freed
    return model


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
