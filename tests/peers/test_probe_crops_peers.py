"""The peers' recipes deliver the declared training crop and flip (``storebench.recipes.probe``
reads each crop's box back from probe images' pixels): DALI and FFCV with their own crop ops,
the others with storebench's; in the peers environment, where their libraries are."""

from __future__ import annotations

import numpy as np
import pytest

from storebench.importer import import_images
from storebench.recipes import RECIPES
from storebench.recipes.probe import PROBE_SIDE, check_draws, recover_box, write_probe_folder

pytestmark = pytest.mark.peers

PROBES = 96
PEER_RECIPES = [name for name, recipe in RECIPES.items() if recipe.environment == "peers"]


@pytest.fixture(scope="module")
def probe_sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("peer-probes")
    source = write_probe_folder(root / "source", PROBES)
    layouts = sorted({RECIPES[n].layout for n in PEER_RECIPES if not RECIPES[n].unavailable()})
    import_images(source, root / "sets", formats=layouts, resize=(PROBE_SIDE, PROBE_SIDE),
                  progress=False)
    return root / "sets"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", PEER_RECIPES)
def test_each_peer_recipe_delivers_the_declared_crop_and_flip(probe_sets, name):
    recipe = RECIPES[name]
    reason = recipe.unavailable()
    if reason:
        pytest.skip(reason)
    root = probe_sets / f"{recipe.layout}-{recipe.encoding}"
    with recipe.open(str(root), batch_size=16, workers=2, seed=5) as run:
        epochs = [[recover_box(image) for batch in run.epoch(number)
                   for image in np.asarray(batch.images)] for number in range(2)]
    assert [len(e) for e in epochs] == [PROBES, PROBES]
    assert check_draws([box for epoch in epochs for box in epoch]) == []
    first = sorted((round(b.left), round(b.top), round(b.width)) for b in epochs[0])
    second = sorted((round(b.left), round(b.top), round(b.width)) for b in epochs[1])
    assert first != second, "the second epoch repeats the first epoch's crops"
