"""The recipes as people read them: a table of every recipe, one recipe in full (its traits,
tuning, versions here, the situations it cannot serve, its code), and the docs' recipes
page. Everything comes from the registry (``storebench.recipes``)."""

from __future__ import annotations

import pandas as pd

from ..recipes import FILTERS, RECIPES, SITUATIONS, TRANSFORM, Recipe, get_recipe
from ..text import markdown_table

# Where a recipe's code reads its dataset, as the user's own set would lie.
EXAMPLE_DATASET = "data/mine/{layout}-{encoding}"
RECIPES_PAGE = "docs/recipes.md"
# The notebook showing the recipes: no study's, so no study names it.
RECIPES_NOTEBOOK = "13_recipes.ipynb"


def example_dataset(recipe: Recipe) -> str:
    return EXAMPLE_DATASET.format(layout=recipe.layout, encoding=recipe.encoding)


def recipes_table() -> pd.DataFrame:
    """One row per recipe: what it is, its transform's filter and window, its parallelism,
    its environment and where it cannot serve."""
    rows = []
    for recipe in RECIPES.values():
        cannot = "; ".join(f"{s}: {recipe.why_not(s)}" for s in SITUATIONS
                           if not recipe.serves(s))
        rows.append({"recipe": recipe.name, "pipeline": recipe.label,
                     "decoder": recipe.decoder,
                     "resize filter": recipe.transform.filter,
                     "decodes": recipe.transform.window,
                     "parallelism": recipe.parallelism,
                     "environment": recipe.environment,
                     "cannot serve": cannot or "-"})
    return pd.DataFrame(rows)


def recipe_text(name: str) -> str:
    """One recipe in full, as ``storebench recipes NAME`` prints it."""
    recipe = get_recipe(name)
    versions = ", ".join(f"{dist} {version}" for dist, version in recipe.versions().items())
    lines = [f"{recipe.name}: {recipe.label}",
             f"  layout:      {recipe.layout}-{recipe.encoding}",
             f"  reader:      {recipe.reader}",
             f"  decoder:     {recipe.decoder}",
             f"  transform:   {TRANSFORM}; {recipe.transform.by}",
             f"  filter:      {recipe.transform.filter}: {FILTERS[recipe.transform.filter]}",
             f"  decodes:     {recipe.transform.window}",
             f"  parallelism: {recipe.parallelism}",
             f"  output:      {recipe.output}",
             f"  environment: {recipe.environment} ({versions or 'no extra library'} here)",
             f"  follows:     {recipe.doc}"]
    if recipe.note:
        lines.append(f"  note:        {recipe.note}")
    lines.append("  tuning:")
    lines += [f"    {t.knob} = {t.value}: {t.advice}" for t in recipe.tuning]
    lines.append("  situations:")
    lines += [f"    {s}: " + (recipe.why_not(s) and f"cannot: {recipe.why_not(s)}" or "can")
              for s in SITUATIONS]
    lines += ["  code:", *("    " + line if line else ""
                           for line in recipe.snippet(example_dataset(recipe)).splitlines())]
    return "\n".join(lines)


def render_recipes_page() -> str:
    """The docs' recipes block: the table, then each recipe's tuning, doc and code."""
    parts = [f"Every recipe applies the same training transform: {TRANSFORM}. Speed is "
             "compared within one resize filter, or with the filter beside the ratio: "
             + "; ".join(f"**{name}**: {text}" for name, text in FILTERS.items()) + ".",
             "", markdown_table(recipes_table())]
    for recipe in RECIPES.values():
        # A doc of this site is linked from the docs, not from the repository's root.
        link = recipe.doc if recipe.doc.startswith("https://") else recipe.doc.removeprefix(
            "docs/")
        parts += ["", f"## {recipe.name}", "",
                  f"{recipe.label}. Follows [{recipe.doc}]({link})."
                  + (f" {recipe.note[0].upper()}{recipe.note[1:]}." if recipe.note else "")]
        parts += [""] + [f"- `{t.knob}` = {t.value}: {t.advice}" for t in recipe.tuning]
        parts += ["", "```python", recipe.snippet(example_dataset(recipe)).rstrip("\n"),
                  "```"]
    return "\n".join(parts) + "\n"
