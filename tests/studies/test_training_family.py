"""The training-set studies on the ImageNet-like family: where its sets live, which studies
read them, and the transform their loader cases apply (``studies.grid``, ``study``)."""

from __future__ import annotations

import numpy as np
import pytest

import data_gen
from storebench.bench.case import Case
from storebench.bench.plan import family_data_dir
from storebench.formats import read_manifest
from storebench.loaders.train_transform import RandomResizedCropFlip
from storebench.studies.grid import decode_params, profile_datasets
from storebench.studies.shared_cases import sample_transform
from storebench.study import build_profile, study_data_dir, study_family


@pytest.fixture(scope="module")
def both_families(tmp_path_factory):
    """The ci profile's raw sets of both families, each where ``storebench study`` puts it."""
    root = tmp_path_factory.mktemp("data") / "ci"
    for family in data_gen.FAMILIES:
        build_profile("ci", family_data_dir(root, family), formats=["lmdb", "tfrecord"],
                      family=family, knob_variants=False, progress=False)
    return root


def test_profiles_name_the_family_their_training_studies_read():
    assert data_gen.get_profile("ci").study_family == "synthetic"
    for name in ("small", "medium", "large"):
        assert data_gen.get_profile(name).study_family == "imagenet"
    with pytest.raises(ValueError, match="study_family must be one of"):
        data_gen.Profile("x", (), study_family="photos")


def test_synthetic_only_studies_read_the_synthetic_sets_whatever_the_family():
    assert study_family("formats", "small") == "imagenet"
    assert study_family("formats", "small", "synthetic") == "synthetic"
    assert study_family("formats", "ci", "imagenet") == "imagenet"
    assert study_family("peers", "small") == "imagenet"
    for name in ("targets", "startup", "resume", "gpu_decode"):
        assert study_family(name, "small", "imagenet") == "synthetic"
    assert study_data_dir("prefetch", "small", "data/small") == family_data_dir(
        "data/small", "imagenet")
    assert str(study_data_dir("targets", "small", "data/small")) == "data/small"
    with pytest.raises(ValueError, match="unknown dataset family 'photos'"):
        study_family("formats", "small", "photos")


def test_each_family_is_found_in_its_own_directory_only(both_families):
    synthetic = profile_datasets("ci", both_families)
    imagenet = profile_datasets("ci", family_data_dir(both_families, "imagenet"))
    assert sorted(m["spec"]["seed"] for _, m in synthetic) == sorted(
        s.seed for s in data_gen.get_profile("ci").specs for _ in range(2))
    assert {m["spec"].get("kind") for _, m in imagenet} == {"photo"}
    assert sorted((m["format"], m["encoding"]) for _, m in imagenet) == [
        ("lmdb", "jpeg"), ("lmdb", "raw"), ("tfrecord", "jpeg"), ("tfrecord", "raw")]
    assert not {p for p, _ in synthetic} & {p for p, _ in imagenet}


def test_training_sets_are_read_through_the_training_transform(both_families):
    imagenet = dict(((m["format"], m["encoding"]), (p, m)) for p, m in profile_datasets(
        "ci", family_data_dir(both_families, "imagenet")))
    assert decode_params(imagenet["lmdb", "jpeg"][1]) == {"decode": "simplejpeg",
                                                         "transform": "train"}
    assert decode_params(imagenet["lmdb", "raw"][1]) == {"decode": None, "transform": "train"}
    synthetic_jpeg = next(m for _, m in profile_datasets("ci", both_families)
                          if m["encoding"] == "jpeg")
    assert decode_params(synthetic_jpeg) == {"decode": "simplejpeg"}


def test_a_case_builds_the_seeded_training_transform_or_refuses_an_unknown_one():
    case = Case(study="prefetch", function="m:f", params={"transform": "train", "seed": 7})
    assert sample_transform(case) == RandomResizedCropFlip(seed=7)
    assert sample_transform(Case(study="prefetch", function="m:f")) is None
    bad = Case(study="prefetch", function="m:f", params={"transform": "blur"})
    with pytest.raises(ValueError, match="unknown transform 'blur'; known: 'train'"):
        sample_transform(bad)


def test_tf_data_applies_its_own_training_crop_to_every_sample_once(both_families):
    from storebench.loaders.tf_adapter import tfrecord_pipeline

    root = family_data_dir(both_families, "imagenet") / "tfrecord-jpeg"
    count = read_manifest(root)["num_samples"]
    pipeline = tfrecord_pipeline(root, batch_size=16, shuffle_buffer=count, seed=3,
                                 resize=(224, 224), random_crop=True)
    labels, shapes = [], set()
    for images, batch_labels in pipeline:
        shapes.add(tuple(images.shape[1:]))
        labels += batch_labels.numpy().tolist()
    assert shapes == {(224, 224, 3)}
    spec = data_gen.get_profile("ci").spec_for("jpeg", "imagenet")
    expected = [data_gen.photo.photo_sample(spec, i)[1] for i in range(count)]
    assert sorted(labels) == sorted(expected)


@pytest.mark.parametrize("kwargs, message", [
    ({"random_crop": True}, "needs JPEG or PNG records, decode=True and resize"),
    ({"random_crop": True, "resize": (224, 224), "decode": False}, "decode=True"),
])
def test_tf_data_training_crop_refuses_what_it_cannot_crop(both_families, kwargs, message):
    from storebench.loaders.tf_adapter import tfrecord_pipeline

    root = family_data_dir(both_families, "imagenet") / "tfrecord-jpeg"
    with pytest.raises(ValueError, match=message):
        tfrecord_pipeline(root, batch_size=8, **kwargs)


def test_tf_data_training_crop_refuses_raw_records(both_families):
    from storebench.loaders.tf_adapter import tfrecord_pipeline

    root = family_data_dir(both_families, "imagenet") / "tfrecord-raw"
    with pytest.raises(ValueError, match="random_crop=True crops encoded images"):
        tfrecord_pipeline(root, batch_size=8, resize=(224, 224), random_crop=True)
    assert np.asarray(next(iter(tfrecord_pipeline(root, batch_size=8)))[0]).shape[1:] == (
        224, 224, 3)
