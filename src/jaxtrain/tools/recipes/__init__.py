"""Recipes: one module per workload (model + data + loss + default config).

`CATALOG` names the recipes and says what each trains without importing one, so that `jaxtrain
recipes` and `jaxtrain train --help` answer at once; `RECIPES`, `Recipe` and `RecipeConfig` import
the recipe modules, and JAX with them, on first use (PEP 562 `__getattr__`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jaxtrain import ConfigError

if TYPE_CHECKING:
    from jaxtrain.tools.recipes.base import Recipe, RecipeConfig

# name -> each recipe's `description` (tests/tools/test_cli.py checks that the two agree)
CATALOG = {
    "alphazero": "AlphaZero self-play with mctx on the clique game (Sim: n=6, k=3), on the device end to end",
    "char-gpt": "character-level GPT on Tiny Shakespeare (presets: baby = nanoGPT's CPU config, seed, long)",
    "fashion-mnist-cnn": "the same CNN on Fashion-MNIST (target >= 90% test accuracy)",
    "hdf5-sequence": "1-D CNN on protein-like sequences streamed from HDF5 (make one with `jaxtrain data generate`)",
    "mlp-regression": "MLP 128→512→512→64 regression on 50k synthetic samples (the case-study workload)",
    "mnist-cnn": "small CNN on MNIST (target >= 99.0% test accuracy in 3 epochs)",
}


def _recipes() -> dict[str, Recipe]:
    """`RECIPES`, built on the first call and kept (the same dict afterwards)."""
    if "RECIPES" not in globals():
        from jaxtrain.tools.recipes import alphazero, char_gpt, hdf5_sequence, mlp_regression, mnist_cnn

        globals()["RECIPES"] = {r.name: r for r in (
            mlp_regression.RECIPE, mnist_cnn.MNIST, mnist_cnn.FASHION, char_gpt.RECIPE, hdf5_sequence.RECIPE,
            alphazero.RECIPE,
        )}
    return globals()["RECIPES"]


def __getattr__(name: str) -> Any:
    if name == "RECIPES":
        return _recipes()
    if name in ("Recipe", "RecipeConfig"):
        from jaxtrain.tools.recipes import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`; ConfigError listing the known ones otherwise."""
    recipes = _recipes()
    if name not in recipes:
        raise ConfigError(f"unknown recipe {name!r}; choose one of: {', '.join(sorted(recipes))}")
    return recipes[name]


__all__ = ["CATALOG", "RECIPES", "Recipe", "RecipeConfig", "get_recipe"]
