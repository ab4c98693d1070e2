"""The training-set studies on the ImageNet-like family: where its sets live, which studies
read them, and the transform their loader cases apply (``studies.grid``, ``study``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
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


def test_a_build_is_named_by_what_it_holds(both_families):
    from storebench.studies.grid import dataset_workload

    found = {(m["format"], m["encoding"], m["spec"].get("kind")): m
             for _, m in [*profile_datasets("ci", both_families),
                          *profile_datasets("ci", family_data_dir(both_families, "imagenet"))]}
    jpeg = found["lmdb", "jpeg", "photo"]
    kb = jpeg["bytes_apparent"] / 64 / 1e3
    assert dataset_workload(jpeg) == (
        f"64 ImageNet-like JPEGs of many sizes, {kb:,.0f} KB stored per sample")
    raw = found["lmdb", "raw", "photo"]
    assert dataset_workload(raw).startswith(
        "64 ImageNet-like images pre-decoded as 224x224x3 raw arrays, ")
    assert dataset_workload(found["lmdb", "raw", None]).startswith(
        "512 synthetic 32x32x3 raw arrays, ")
    assert dataset_workload(found["lmdb", "jpeg", None]).startswith("256 synthetic 64x64 JPEGs, ")


def test_every_guide_row_names_the_workload_its_study_recorded(both_families, tmp_path):
    """What a study's cases read goes into the results directory as it runs, and the guide
    rows of that study name it (by their encoding facet)."""
    import json

    from storebench.guide import Candidate, choose
    from storebench.report.guide import with_workload
    from storebench.results import WORKLOADS_FILE, Results, Stat
    from storebench.study import planned_cases, record_workloads

    def choose_row(study, facets):
        only = Candidate("a", "A", Stat(1.0, 1.0, 1.0, 1, "samples/s", (1.0,)))
        return choose(study, "which?", "samples_per_s", [only], facets=facets)

    imagenet = family_data_dir(both_families, "imagenet")
    cases = planned_cases("lazy_vs_preloaded", "ci", imagenet, None)
    written = record_workloads(tmp_path, "lazy_vs_preloaded", cases)
    assert json.loads((tmp_path / WORKLOADS_FILE).read_text()) == written
    jpeg = written["lazy_vs_preloaded"]["jpeg"]
    assert jpeg.startswith("64 ImageNet-like JPEGs of many sizes, ")
    assert " or " not in jpeg  # its builds in several formats are one set, said once
    assert jpeg.endswith("; read through the training crop (random resized crop to 224, flip)")
    record_workloads(tmp_path, "formats", planned_cases("formats", "ci", both_families, None))
    again = json.loads((tmp_path / WORKLOADS_FILE).read_text())
    assert sorted(again) == ["formats", "lazy_vs_preloaded"]
    assert "read through" not in again["formats"]["raw"]  # the formats study reads bytes

    results = Results(pd.DataFrame(), {}, tmp_path, again)
    row = choose_row("lazy_vs_preloaded", {"encoding": "jpeg"})
    assert with_workload(row, results).workload == jpeg
    unknown = choose_row("lazy_vs_preloaded", {})
    assert with_workload(unknown, results).workload == "; ".join(
        again["lazy_vs_preloaded"].values())


def test_one_set_built_in_several_formats_is_named_once_with_its_size_range(both_families):
    from storebench.studies.grid import cases_workloads

    root = family_data_dir(both_families, "imagenet")
    builds = [root / "lmdb-jpeg", root / "tfrecord-jpeg"]
    sizes = [read_manifest(p)["bytes_apparent"] / 64 / 1e3 for p in builds]
    cases = [Case(study="prefetch", function="m:f", dataset=str(p),
                  params={"transform": "train"}) for p in builds]
    low, high = f"{min(sizes):,.0f}", f"{max(sizes):,.0f}"
    stored = low if low == high else f"{low}\u2013{high}"
    assert cases_workloads(cases) == {"jpeg": (
        f"64 ImageNet-like JPEGs of many sizes, {stored} KB stored per sample; read through "
        "the training crop (random resized crop to 224, flip)")}
