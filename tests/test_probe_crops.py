"""The training transform every recipe declares, checked from what each recipe delivers:
probe images whose pixels encode their own coordinates (``storebench.recipes.probe``) give
back each crop's box and flip, whatever the recipe's decoder and filter."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from storebench.importer import import_images
from storebench.loaders import RandomResizedCropFlip
from storebench.recipes import RECIPES
from storebench.recipes.probe import (
    PROBE_SIDE,
    CropBox,
    check_draws,
    probe_pixels,
    recover_box,
    write_probe_folder,
)

PROBES = 96


def jpeg_probe() -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(probe_pixels()).save(buffer, format="JPEG", quality=95)
    return np.array(Image.open(buffer))


@pytest.mark.parametrize("box, flip", [((37, 50, 120, 90), False), ((0, 0, 256, 256), True),
                                       ((100, 10, 40, 53), False), ((5, 200, 50, 40), True)])
def test_a_crop_s_box_and_flip_are_read_back_from_its_pixels(box, flip):
    left, top, width, height = box
    crop = np.array(Image.fromarray(jpeg_probe()).resize(
        (224, 224), Image.Resampling.BILINEAR, box=(left, top, left + width, top + height)))
    found = recover_box(crop[:, ::-1] if flip else crop)
    assert found.flipped is flip
    assert np.allclose((found.left, found.top, found.width, found.height), box, atol=0.5)


def test_storebench_s_crop_meets_the_definition_and_a_wrong_one_does_not():
    transform = RandomResizedCropFlip(seed=4)
    probe = jpeg_probe()
    boxes = [recover_box(transform(probe, index=i)) for i in range(256)]
    assert check_draws(boxes) == []
    always = [CropBox(b.left, b.top, b.width, b.height, True) for b in boxes]
    assert check_draws(always)[-1].startswith("100% of 256 draws flipped: not a fair coin")
    large = [b for b in boxes if b.area() > 0.5]
    assert any(p.startswith("areas span only ") for p in check_draws(large * 2))
    wide = CropBox(0, 0, 200, 100, False)
    assert check_draws([wide])[0] == "draw 0 (200x100 at 0,0): ratio 2.000 outside 3/4-4/3"
    assert check_draws([CropBox(-30, 0, 100, 100, False)])[0].endswith(
        f"outside the {PROBE_SIDE}x{PROBE_SIDE} image")


def delivered_images(batch) -> np.ndarray:
    images = batch.images if hasattr(batch, "images") else batch[0]
    return np.asarray(images)


def draws(recipe, root, *, epochs: int = 2) -> list[list[CropBox]]:
    """Every delivered image's box, per epoch, through the recipe's own pipeline."""
    with recipe.open(str(root), batch_size=16, workers=2, seed=5) as run:
        return [[recover_box(image) for batch in run.epoch(number)
                 for image in delivered_images(batch)] for number in range(epochs)]


@pytest.fixture(scope="module")
def probe_sets(tmp_path_factory):
    """The probe folder imported into every main-environment recipe's layout."""
    root = tmp_path_factory.mktemp("probes")
    source = write_probe_folder(root / "source", PROBES)
    layouts = sorted({r.layout for r in RECIPES.values() if r.environment == "main"})
    import_images(source, root / "sets", formats=layouts, resize=(PROBE_SIDE, PROBE_SIDE),
                  progress=False)
    return root / "sets"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [n for n, r in RECIPES.items() if r.environment == "main"])
def test_each_recipe_delivers_the_declared_crop_and_flip(probe_sets, name):
    recipe = RECIPES[name]
    epochs = draws(recipe, probe_sets / f"{recipe.layout}-{recipe.encoding}")
    assert [len(e) for e in epochs] == [PROBES, PROBES]
    assert check_draws([box for epoch in epochs for box in epoch]) == []
    # The second epoch draws afresh: not the first epoch's boxes again.
    first = sorted((round(b.left), round(b.top), round(b.width)) for b in epochs[0])
    second = sorted((round(b.left), round(b.top), round(b.width)) for b in epochs[1])
    assert first != second


def test_tf_data_ranks_draw_their_own_crops(probe_sets):
    """Two input pipelines (ranks) of one tf.data pipeline, same seed: each reads its own
    records, and draws its own crops (the same stream on both would correlate the ranks)."""
    import tensorflow as tf

    from storebench.loaders.tf_adapter import tfrecord_pipeline

    boxes = []
    for rank in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=rank,
                                             num_replicas_in_sync=2)
        pipeline = tfrecord_pipeline(probe_sets / "tfrecord-jpeg", batch_size=32, seed=5,
                                     resize=(224, 224), random_crop=True,
                                     input_context=context, shard_by="record")
        boxes.append([recover_box(image) for images, _ in pipeline
                      for image in np.asarray(images)])
    assert len(boxes[0]) == len(boxes[1]) == PROBES // 2
    assert [(round(b.left), round(b.top)) for b in boxes[0]] != [
        (round(b.left), round(b.top)) for b in boxes[1]]
