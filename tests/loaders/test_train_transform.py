"""The seeded training transform: torchvision's crop arithmetic, the same pixels on every
loader path and start method for the same epoch, and the reduced decode's PSNR reported.

The sets are real builds of the ImageNet-like JPEG set (images of many sizes, a few
greyscale) and its 224x224 raw copy."""

from __future__ import annotations

import io
import math
import pickle

import numpy as np
import pytest
import simplejpeg
from PIL import Image

import data_gen
from data_gen import PhotoSpec
from storebench.formats import build_dataset, open_dataset
from storebench.loaders import (
    BatchSampler,
    LazyDataset,
    PreloadedDataset,
    ProcessPrefetcher,
    RandomResizedCropFlip,
    ShuffleSampler,
    ThreadPrefetcher,
    reduced_decode_psnr,
)
from storebench.loaders.train_transform import CROP_TRIES

NUM = 20
SEED = data_gen.get_profile("ci").spec_for("jpeg", "imagenet").seed
JPEG = PhotoSpec(NUM, seed=SEED)
RAW = PhotoSpec(NUM, encoding="raw", height=224, width=224, seed=SEED)
TRANSFORM = RandomResizedCropFlip(224, seed=7)
EPOCHS = (0, 1)
# Reduced decodes of these images stay above this PSNR against the full decode (pooled
# over the set): the fine texture loses most, as it does in photographs.
PSNR_FLOOR_DB = 25.0


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    build_dataset(JPEG, "lmdb", root, workers=1)
    build_dataset(RAW, "memmap", root, workers=1)
    return {"jpeg": root / "lmdb-jpeg", "raw": root / "memmap-raw"}


@pytest.fixture(scope="module")
def want(roots):
    """Each epoch's images, in index order, from the dataset read directly."""
    out = {}
    for encoding, path in roots.items():
        with open_dataset(path) as reader:
            dataset = LazyDataset(reader, decode="simplejpeg" if encoding == "jpeg" else None,
                                  transform=TRANSFORM)
            for epoch in EPOCHS:
                dataset.set_epoch(epoch)
                out[encoding, epoch] = dataset.get_batch(range(NUM)).images.copy()
    return out


def pil_crop_flip(image: np.ndarray, p, size: int) -> np.ndarray:
    """torchvision's resized_crop on a PIL image (crop, then bilinear resize), then flip."""
    pil = Image.fromarray(image).crop((p.left, p.top, p.left + p.width, p.top + p.height))
    out = np.asarray(pil.resize((size, size), Image.Resampling.BILINEAR))
    return out[:, ::-1] if p.flipped else out


def test_crops_follow_torchvision_arithmetic():
    t = RandomResizedCropFlip(224, seed=1)
    flips, fallbacks = [], 0
    for index in range(400):
        p = t.params(375, 500, index=index, epoch=3)
        assert p == t.params(375, 500, index=index, epoch=3)  # a pure function
        assert 0 <= p.top <= 375 - p.height and 0 <= p.left <= 500 - p.width
        area = p.height * p.width / (375 * 500)
        # Rounding each side moves the area and ratio a little past the drawn bounds.
        assert 0.07 <= area <= 1.0
        if area < 1.0:
            assert 3 / 4 * 0.97 <= p.width / p.height <= 4 / 3 * 1.03
        else:
            fallbacks += 1
        flips.append(p.flipped)
    assert 0.4 < np.mean(flips) < 0.6
    assert t.params(375, 500, index=1, epoch=0) != t.params(375, 500, index=1, epoch=1)
    # Ten tries that cannot fit, then the central crop at the nearest allowed ratio.
    wide = RandomResizedCropFlip(8, seed=0, scale=(1.0, 1.0))
    p = wide.params(100, 1000, index=0, epoch=0)
    assert CROP_TRIES == 10
    assert (p.top, p.height, p.width) == (0, 100, round(100 * 4 / 3))
    assert p.left == (1000 - p.width) // 2
    tall = wide.params(1000, 100, index=0, epoch=0)
    assert (tall.width, tall.height, tall.left) == (100, round(100 / (3 / 4)), 0)


def pil_vertical_first(image: np.ndarray, p, size: int) -> np.ndarray:
    """The same crop resized by Pillow one axis at a time, rows first: Pillow's weights and
    rounding in the order storebench's resize runs its passes."""
    pil = Image.fromarray(image).crop((p.left, p.top, p.left + p.width, p.top + p.height))
    tall = pil.resize((p.width, size), Image.Resampling.BILINEAR)  # vertical pass only
    out = np.asarray(tall.resize((size, size), Image.Resampling.BILINEAR))
    return out[:, ::-1] if p.flipped else out


def test_the_crop_is_cut_then_resized_as_torchvision_does_with_pil():
    image = np.asarray(Image.open(io.BytesIO(data_gen.sample(JPEG, 2)[0])).convert("RGB"))
    pillow = RandomResizedCropFlip(TRANSFORM.size, seed=TRANSFORM.seed, resampler="pillow")
    for index in range(6):
        p = TRANSFORM.params(*image.shape[:2], index=index, epoch=0)
        got = TRANSFORM(image, index=index, epoch=0)
        assert got.shape == (224, 224, 3) and got.dtype == np.uint8
        # storebench's C resize: Pillow's arithmetic with the vertical pass first, so
        # within one level of Pillow's own order, whichever Pillow picks.
        np.testing.assert_array_equal(got, pil_vertical_first(image, p, 224))
        assert np.abs(got.astype(int) - pil_crop_flip(image, p, 224)).max() <= 1
        np.testing.assert_array_equal(pillow(image, index=index, epoch=0),
                                      pil_crop_flip(image, p, 224))
    grey = image[:, :, :1]
    assert TRANSFORM(grey, index=0, epoch=0).shape == (224, 224, 1)
    np.testing.assert_array_equal(TRANSFORM(grey, index=0, epoch=0),
                                  TRANSFORM(image, index=0, epoch=0)[:, :, :1])


def test_epochs_differ_and_every_image_is_cropped(want):
    assert want["jpeg", 0].shape == (NUM, 224, 224, 3)
    assert not np.array_equal(want["jpeg", 0], want["jpeg", 1])
    assert not np.array_equal(want["raw", 0], want["raw", 1])


def check_pass(batches, want_epoch, got) -> None:
    order = [idx.tolist() for idx in batches]
    assert [b.indices.tolist() for b in got] == order
    for batch, indices in zip(got, order, strict=True):
        np.testing.assert_array_equal(np.asarray(batch.images), want_epoch[indices])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("encoding", ["jpeg", "raw"])
@pytest.mark.parametrize("kind", [LazyDataset, PreloadedDataset])
def test_thread_prefetcher_delivers_the_same_pixels(roots, want, encoding, kind):
    with open_dataset(roots[encoding]) as reader:
        options = {"progress": False} if kind is PreloadedDataset else {}
        dataset = kind(reader, decode="simplejpeg" if encoding == "jpeg" else None,
                       transform=TRANSFORM, **options)
        batches = BatchSampler(ShuffleSampler(NUM, seed=2), 6)
        with ThreadPrefetcher(dataset, batches, workers=2, depth=2, copy=True) as prefetcher:
            for epoch in (1, 0):  # not in order: the epoch, not the pass count, decides
                prefetcher.set_epoch(epoch)
                check_pass(batches, want[encoding, epoch], list(prefetcher))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_process_prefetcher_delivers_the_same_pixels(roots, want, start_method):
    with open_dataset(roots["jpeg"]) as reader:
        dataset = LazyDataset(reader, decode="simplejpeg", transform=TRANSFORM)
        batches = BatchSampler(ShuffleSampler(NUM, seed=4), 5)
        with ProcessPrefetcher(dataset, batches, workers=2, depth=2, copy=True,
                               start_method=start_method) as prefetcher:
            for epoch in EPOCHS:
                prefetcher.set_epoch(epoch)
                check_pass(batches, want["jpeg", epoch], list(prefetcher))


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("num_workers", "context", "persistent"),
                         [(0, None, False), (2, "fork", True), (2, "spawn", False)])
def test_torch_dataloader_delivers_the_same_pixels(roots, want, num_workers, context,
                                                   persistent):
    from storebench.loaders.torch_adapter import torch_dataloader

    with open_dataset(roots["jpeg"]) as reader:
        dataset = LazyDataset(reader, decode="simplejpeg", transform=TRANSFORM)
        sampler = ShuffleSampler(NUM, seed=6)
        options = ({"multiprocessing_context": context, "persistent_workers": persistent}
                   if num_workers else {})
        loader = torch_dataloader(dataset, batch_size=4, sampler=sampler,
                                  num_workers=num_workers, **options)
        for epoch in EPOCHS:  # persistent workers too take each epoch from the sampler
            sampler.set_epoch(epoch)
            order = [idx.tolist() for idx in BatchSampler(sampler, 4)]
            got = list(loader)
            assert len(got) == len(order)
            for (images, _), indices in zip(got, order, strict=True):
                np.testing.assert_array_equal(images.numpy(), want["jpeg", epoch][indices])
        del loader


def test_reduced_decode_psnr_is_reported_above_its_floor(roots):
    jpegs = [data_gen.sample(JPEG, i)[0] for i in range(NUM)]
    report = reduced_decode_psnr(jpegs, TRANSFORM)
    assert report.images == NUM
    assert math.isfinite(report.psnr_db) and report.psnr_db > PSNR_FLOOR_DB
    assert report.worst_psnr_db <= report.psnr_db
    assert 0 < report.reduced_share <= 1 and 0 < report.pixel_fraction < 1
    # The dataset's decode="reduced" is that decode, crop for crop.
    with open_dataset(roots["jpeg"]) as reader:
        dataset = LazyDataset(reader, decode="reduced", transform=TRANSFORM)
        dataset.set_epoch(1)
        batch = dataset.get_batch([3, 0])
    for image, i in zip(batch.images, (3, 0), strict=True):
        np.testing.assert_array_equal(image, TRANSFORM.decode_reduced(jpegs[i], index=i,
                                                                       epoch=1))
    # A crop under 7/8 of 224 on a side needs the full scale: then it is the full decode's.
    shapes = [simplejpeg.decode_jpeg_header(data)[:2] for data in jpegs]
    small = next(i for i, (h, w) in enumerate(shapes)
                 if min(TRANSFORM.params(h, w, index=i, epoch=0).height,
                        TRANSFORM.params(h, w, index=i, epoch=0).width) < 190)
    full = TRANSFORM(simplejpeg.decode_jpeg(jpegs[small]), index=small, epoch=0)
    np.testing.assert_array_equal(
        TRANSFORM.decode_reduced(jpegs[small], index=small, epoch=0), full)


def test_what_the_transform_and_reduced_decode_refuse(roots):
    with open_dataset(roots["jpeg"]) as reader:
        with pytest.raises(ValueError, match="decode='reduced' decodes JPEGs.*transform="
                           "RandomResizedCropFlip\\(\\), got jpeg samples and transform=None"):
            LazyDataset(reader, decode="reduced")
        with pytest.raises(ValueError, match="works on decoded images.*decode='auto'"):
            LazyDataset(reader, transform=TRANSFORM)
    with open_dataset(roots["raw"]) as reader, pytest.raises(ValueError, match="raw pixels"):
        LazyDataset(reader, decode="reduced", transform=TRANSFORM)
    with pytest.raises(ValueError, match="scale must be 0 < lo <= hi <= 1"):
        RandomResizedCropFlip(scale=(0.5, 0.1))
    with pytest.raises(ValueError, match="size must be a positive integer"):
        RandomResizedCropFlip(0)
    assert pickle.loads(pickle.dumps(TRANSFORM)) == TRANSFORM
