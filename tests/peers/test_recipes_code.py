"""The peers' recipes (``storebench.recipes``): the code each prints runs an epoch of the ci
ImageNet-like JPEGs in its own layout, in the peers environment where their libraries are."""

from __future__ import annotations

import subprocess
import sys

import pytest

import data_gen
from storebench.formats import build_dataset
from storebench.recipes import RECIPES

pytestmark = pytest.mark.peers

PEER_RECIPES = [name for name, recipe in RECIPES.items() if recipe.environment == "peers"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", PEER_RECIPES)
def test_a_peer_recipe_s_code_runs_an_epoch_of_its_dataset(name, tmp_path):
    recipe = RECIPES[name]
    reason = recipe.unavailable()
    if reason:
        pytest.skip(reason)
    spec = data_gen.get_profile("ci").spec_for(recipe.encoding, "imagenet")
    root = build_dataset(spec, recipe.layout, tmp_path / "data", workers=1).path
    script = tmp_path / "recipe.py"
    script.write_text(recipe.snippet(str(root)) + "print('epoch done')\n")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.endswith("epoch done\n")
