"""The ImageNet-like set (JPEGs of many sizes, and its 224x224 raw copy) in every format of
the registry this interpreter can write, read back byte for byte; and the whole build's disk
check, before anything is written."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest
from PIL import Image

import data_gen
from data_gen import PhotoSpec
from storebench.formats import (
    FORMATS,
    DatasetError,
    build_dataset,
    get_format,
    open_dataset,
    unavailable_reason,
)
from storebench.loaders import LazyDataset, PreloadedDataset
from storebench.study import build_profile, check_build_space
from storebench.verify import verify_dataset

NUM = 10
JPEG = PhotoSpec(NUM, seed=data_gen.get_profile("ci").spec_for("jpeg", "imagenet").seed)
RAW = PhotoSpec(NUM, encoding="raw", height=224, width=224, seed=JPEG.seed)
BUILDS = [(name, spec) for spec in (JPEG, RAW) for name, module in FORMATS.items()
          if spec.encoding in module.ENCODINGS and unavailable_reason(name) is None]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("photo")
    for name, spec in BUILDS:
        build_dataset(spec, name, root, workers=1)
    return root


@pytest.fixture(scope="module")
def expected():
    return {spec.encoding: [data_gen.sample(spec, i) for i in range(NUM)] for spec in (JPEG, RAW)}


@pytest.mark.parametrize(("name", "spec"), BUILDS,
                         ids=[f"{name}-{spec.encoding}" for name, spec in BUILDS])
def test_every_format_holds_the_set_byte_for_byte(root, expected, name, spec):
    path = root / f"{name}-{spec.encoding}"
    want = expected[spec.encoding]
    with open_dataset(path) as reader:
        assert reader.spec == spec
        order = [7, 0, 9, 3]
        images, labels = reader.read_many(np.array(order))
        assert list(labels) == [want[i][1] for i in order]
        for image, i in zip(images, order, strict=True):
            if spec.encoding == "jpeg":
                assert bytes(image) == want[i][0]
            else:
                np.testing.assert_array_equal(np.asarray(image).reshape(224, 224, 3), want[i][0])
    assert verify_dataset(path, workers=1).ok


@pytest.mark.parametrize("kind", [LazyDataset, PreloadedDataset])
def test_decoded_images_keep_their_own_sizes(root, expected, kind):
    with open_dataset(root / "hdf5-jpeg") as reader:
        dataset = kind(reader, decode="simplejpeg") if kind is LazyDataset else kind(
            reader, decode="simplejpeg", progress=False)
        assert dataset.is_ragged and dataset.sample_shape is None
        batch = dataset.get_batch([1, 2, 3])
        shapes = [image.shape for image in batch.images]
        assert len(set(shapes)) > 1 and all(s[2] == 3 for s in shapes)
        for image, i in zip(batch.images, (1, 2, 3), strict=True):
            header = data_gen.photo.render_photo(JPEG, i)[0].shape
            assert image.shape == header


def test_a_build_that_cannot_fit_is_refused_before_anything_is_written(tmp_path):
    huge = PhotoSpec(10**9, seed=JPEG.seed)  # about 100 TB
    with pytest.raises(DatasetError, match=r"the large set needs about [\d.]+ MiB, only "
                       r"[\d.]+ MiB is free there; free some space"):
        check_build_space([huge], {"lmdb": get_format("lmdb")}, tmp_path, what="the large set")
    assert list(tmp_path.iterdir()) == []
    # A build of the large profile checks the same way before it generates a sample.
    profile = data_gen.get_profile("large")
    need = sum(spec.num_samples for spec in profile.imagenet) * 100_000
    if need > shutil.disk_usage(tmp_path).free:
        with pytest.raises(DatasetError, match="the large profile's imagenet sets needs about"):
            build_profile("large", tmp_path, formats=["lmdb"], family="imagenet",
                          knob_variants=False, progress=False)
        assert [p.name for p in tmp_path.iterdir()] == []


def test_sets_already_built_are_not_counted_again(root):
    # Every format of the two specs is built in root: nothing more is needed.
    modules = {name: get_format(name) for name, _ in BUILDS}
    check_build_space([JPEG, RAW], modules, root, what="the built sets")


@pytest.mark.timeout(180)
def test_the_tfrecord_pipeline_resizes_the_variable_sizes(root, expected):
    import tensorflow as tf

    from storebench.loaders.tf_adapter import tfrecord_pipeline

    path = root / "tfrecord-jpeg"
    with pytest.raises(ValueError, match="differ in size.*resize="):
        tfrecord_pipeline(path, batch_size=4)
    got = list(tfrecord_pipeline(path, batch_size=4, resize=(64, 48)))
    images = np.concatenate([batch.numpy() for batch, _ in got])
    labels = np.concatenate([lab.numpy() for _, lab in got])
    assert images.shape == (NUM, 64, 48, 3)
    assert labels.tolist() == [label for _, label in expected["jpeg"]]
    # TensorFlow decodes to Pillow's pixels (the accurate IDCT); its resize is its own.
    decoded = np.asarray(Image.open(io.BytesIO(expected["jpeg"][0][0])).convert("RGB"))
    want = tf.image.resize(decoded, (64, 48), antialias=False).numpy()
    np.testing.assert_array_equal(images[0], np.clip(np.round(want), 0, 255).astype(np.uint8))


@pytest.mark.parametrize("workers", [1, 2])
def test_the_raw_copy_made_from_the_jpeg_samples_is_the_generated_raw_set(workers):
    jpegs = [data_gen.sample(JPEG, i) for i in range(NUM)]
    made = list(data_gen.photo.training_copies(RAW, iter(jpegs), workers=workers,
                                               chunk_size=3))
    assert [label for _, label in made] == [label for _, label in jpegs]
    for i, (image, _) in enumerate(made):
        np.testing.assert_array_equal(image, data_gen.sample(RAW, i)[0])
    with pytest.raises(ValueError, match="training copies are raw samples"):
        next(data_gen.photo.training_copies(JPEG, iter(jpegs)))


def test_a_profile_build_makes_its_raw_copy_from_the_jpeg_set_and_it_verifies(tmp_path):
    built = build_profile("ci", tmp_path, formats=["memmap", "rawfiles"], family="imagenet",
                          knob_variants=False, workers=2, progress=False,
                          encodings=["raw", "jpeg"])
    # The JPEG set is generated first, whatever order the encodings were named in.
    assert [r.path.name for r in built] == ["rawfiles-jpeg", "memmap-raw", "rawfiles-raw"]
    for result in built:
        assert verify_dataset(result.path, workers=1).ok, result.path
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
