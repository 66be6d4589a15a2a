"""Recipes: one module per workload (model + data + loss + default config)."""

from jaxtrain._src.errors import ConfigError
from jaxtrain.tools.recipes import alphazero, char_gpt, hdf5_sequence, mlp_regression, mnist_cnn
from jaxtrain.tools.recipes.base import Recipe, RecipeConfig

RECIPES: dict[str, Recipe] = {r.name: r for r in (
    mlp_regression.RECIPE, mnist_cnn.MNIST, mnist_cnn.FASHION, char_gpt.RECIPE, hdf5_sequence.RECIPE,
    alphazero.RECIPE,
)}


def get_recipe(name: str) -> Recipe:
    """The recipe called `name`; ConfigError listing the known ones otherwise."""
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; choose one of: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]


__all__ = ["RECIPES", "Recipe", "RecipeConfig", "get_recipe"]
