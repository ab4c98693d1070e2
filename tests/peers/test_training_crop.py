"""The standard training transform in the peers' own pipelines, on the ci ImageNet-like
JPEGs (64 images of many sizes): the peers without a crop op of their own deliver exactly
storebench's seeded crop for each sample and epoch; DALI and FFCV crop with their own ops
(224x224 arrays, the build's labels, every sample once)."""

from __future__ import annotations

import numpy as np
import pytest

import data_gen
from storebench.formats import build_dataset, open_dataset
from storebench.loaders import LazyDataset, ShuffleSampler
from storebench.loaders.paths import PathOptions, get_loader_path
from storebench.loaders.train_transform import RandomResizedCropFlip

pytestmark = pytest.mark.peers
pytest.importorskip("torch")
pytest.importorskip("simplejpeg")

SEED = 3
BATCH = 16


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """``jpegs(format) -> root`` of the ci ImageNet-like JPEG set in that format."""
    root = tmp_path_factory.mktemp("train-crop")
    spec = data_gen.get_profile("ci").spec_for("jpeg", "imagenet")
    done = {}

    def build(fmt: str):
        if fmt not in done:
            done[fmt] = build_dataset(spec, fmt, root, workers=1).path
        return done[fmt]

    return build


def options(root, **extra) -> PathOptions:
    return PathOptions(batch_size=BATCH, workers=2, seed=SEED, root=str(root), shuffle=True,
                       decode="simplejpeg", transform="train", **extra)


def epochs(batches, n: int, count: int = 2) -> list[list]:
    """``count`` epochs of (indices, labels, images), each checked to hold every sample once."""
    out = []
    for _ in range(count):
        got = [(b.indices.copy(), b.labels.copy(), np.array(b.images)) for b in batches]
        order = np.concatenate([indices for indices, _, _ in got])
        assert sorted(order.tolist()) == list(range(n))
        out.append(got)
    return out


def expected(root, epoch: int):
    reader = open_dataset(root, verify=False)
    # The peers resize with Pillow, as the torchvision transforms of their docs do.
    dataset = LazyDataset(reader, decode="simplejpeg",
                          transform=RandomResizedCropFlip(seed=SEED, resampler="pillow"))
    dataset.set_epoch(epoch)
    return dataset


def assert_storebench_crops(batches, root, what: str) -> None:
    """Every sample of each epoch of ``batches`` is storebench's seeded crop of it for that
    epoch, pixel for pixel, with its label."""
    for number, epoch in enumerate(epochs(batches, 64)):
        with expected(root, number) as want:
            for indices, labels, images in epoch:
                assert images.shape[1:] == (224, 224, 3)
                for k, index in enumerate(indices.tolist()):
                    image, label = want[index]
                    assert labels[k] == label
                    assert np.array_equal(images[k], image), (what, number, index)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("path", "fmt", "module"), [
    ("webdataset", "webdataset", "webdataset"), ("litdata", "litdata", "litdata")])
def test_a_peer_without_a_crop_op_delivers_storebench_s_crop(jpegs, path, fmt, module):
    pytest.importorskip(module)
    root = jpegs(fmt)
    batches, close = get_loader_path(path).open(None, None, options(root))
    try:
        assert_storebench_crops(batches, root, path)
    finally:
        close()


@pytest.mark.timeout(240)
def test_spdl_crops_each_epoch_as_storebench_does(jpegs):
    pytest.importorskip("spdl.pipeline")
    root = jpegs("rawfiles")  # LMDB refuses a second open in one process: the reference
    reader = open_dataset(root, verify=False)
    dataset = LazyDataset(reader, decode="simplejpeg")
    sampler = ShuffleSampler(len(dataset), seed=SEED)
    batches, close = get_loader_path("spdl").open(dataset, sampler, options(root))
    try:
        assert_storebench_crops(batches, root, "spdl")
    finally:
        close()
        dataset.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("path", "fmt", "module"), [
    ("dali_file", "rawfiles", "nvidia.dali"), ("ffcv", "ffcv", "ffcv")])
def test_dali_and_ffcv_crop_with_their_own_ops(jpegs, path, fmt, module):
    pytest.importorskip(module)
    root = jpegs(fmt)
    batches, close = get_loader_path(path).open(None, None, options(root))
    spec = data_gen.get_profile("ci").spec_for("jpeg", "imagenet")
    try:
        for epoch in epochs(batches, 64):
            for indices, labels, images in epoch:
                assert images.dtype == np.uint8 and images.shape[1:] == (224, 224, 3)
                assert labels.tolist() == [data_gen.sample(spec, int(i))[1] for i in indices]
    finally:
        close()
