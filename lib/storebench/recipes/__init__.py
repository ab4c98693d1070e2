"""Recipes: whole training input pipelines, the unit the answer recommends.

``RECIPES`` maps a recipe's name to its ``Recipe`` (``recipes.base``), one module per
member: storebench's own, the common default (torch's DataLoader over an ImageFolder), and
each peer library's pipeline as its docs recommend it. Each member declares its layout,
reader, decoder, transform traits (resize filter, whole image or crop window), loader path,
parallelism and tuning (with the doc it follows), output, the situations it cannot serve
and why, and the code a user copies. Adding a recipe is one module and one line below.
"""

from __future__ import annotations

import importlib

from .base import (
    FILTERS,
    IN_RAM,
    OBJECT_STORAGE,
    OUT_OF_CORE,
    SITUATIONS,
    TRANSFORM,
    WINDOWS,
    Recipe,
    TransformTraits,
    Tuning,
)

# Member modules, in the order tables list them: storebench's, the default, the peers'.
RECIPE_MODULES = ("storebench_window", "storebench_window_plain", "storebench_thread",
                  "storebench_process", "storebench_memmap",
                  "torch_imagefolder", "tf_data", "ffcv", "dali", "webdataset", "litdata",
                  "mds", "spdl", "torchdata", "lance", "zarr",
                  "ray_data_files", "ray_data_parquet", "ray_data_webdataset")


def _load() -> dict[str, Recipe]:
    found: dict[str, Recipe] = {}
    for module in RECIPE_MODULES:
        recipe = importlib.import_module(f"{__name__}.{module}").RECIPE
        if recipe.name in found:
            raise ValueError(f"two recipes are named {recipe.name!r}")
        found[recipe.name] = recipe
    return found


RECIPES: dict[str, Recipe] = _load()


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise KeyError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}") from None


__all__ = ["FILTERS", "IN_RAM", "OBJECT_STORAGE", "OUT_OF_CORE", "RECIPES", "SITUATIONS",
           "TRANSFORM", "WINDOWS", "Recipe", "TransformTraits", "Tuning", "get_recipe"]
