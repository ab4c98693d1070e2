"""Each format's files are what the README documents, readable with the format's own library
and no storebench (TFRecord and Parquet: see test_tfrecord.py and test_parquet.py)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

import data_gen


@pytest.mark.parametrize("encoding", data_gen.ENCODINGS)
def test_hdf5_layout(ci_dataset, ci_profile, encoding):
    import h5py

    spec = ci_profile.spec_for(encoding)
    with h5py.File(ci_dataset("hdf5", encoding) / "data.h5", "r") as f:
        images, labels = f["images"], f["labels"]
        assert labels.dtype == np.int64 and labels.shape == (spec.num_samples,)
        assert json.loads(f.attrs["storebench_spec"]) == spec.to_dict()
        assert f.attrs["encoding"] == encoding
        for i in (0, 17, spec.num_samples - 1):
            want_image, want_label = data_gen.sample(spec, i)
            if encoding == "raw":
                assert images.dtype == np.uint8 and images.shape == (
                    spec.num_samples,
                    *spec.image_shape,
                )
                assert images.chunks[1:] == spec.image_shape
                assert np.array_equal(images[i], want_image)
            else:
                offsets = f["offsets"]
                assert offsets.dtype == np.int64 and offsets.shape == (spec.num_samples + 1,)
                assert images.dtype == np.uint8 and images.shape == (offsets[-1],)
                assert images[offsets[i] : offsets[i + 1]].tobytes() == want_image
            assert labels[i] == want_label
        if encoding != "raw":
            # Plain bytes, no variable-length types: nothing in the global heap.
            assert images.dtype.metadata is None or "vlen" not in images.dtype.metadata
            assert images.chunks is None  # uncompressed: contiguous, one read per range


@pytest.mark.parametrize("encoding", data_gen.ENCODINGS)
def test_lmdb_layout(ci_dataset, ci_profile, encoding):
    import lmdb

    spec = ci_profile.spec_for(encoding)
    env = lmdb.open(str(ci_dataset("lmdb", encoding)), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            labels = np.frombuffer(txn.get(b"__labels__"), dtype="<i8")
            assert json.loads(txn.get(b"__spec__")) == spec.to_dict()
            keys = [key for key, _ in txn.cursor() if not key.startswith(b"__")]
            assert keys == [b"%08d" % i for i in range(spec.num_samples)]
            for i in (0, 17, spec.num_samples - 1):
                want_image, want_label = data_gen.sample(spec, i)
                value = txn.get(b"%08d" % i)
                stored = want_image if encoding != "raw" else want_image.tobytes()
                assert value == stored and labels[i] == want_label
    finally:
        env.close()


def test_memmap_layout(ci_dataset, ci_profile):
    spec = ci_profile.spec_for("raw")
    root = ci_dataset("memmap", "raw")
    images = np.load(root / "images.npy", mmap_mode="r")
    labels = np.load(root / "labels.npy")
    assert images.shape == (spec.num_samples, *spec.image_shape) and images.dtype == np.uint8
    for i in (0, 17, spec.num_samples - 1):
        want_image, want_label = data_gen.sample(spec, i)
        assert np.array_equal(images[i], want_image) and labels[i] == want_label


@pytest.mark.parametrize("encoding", data_gen.ENCODINGS)
def test_rawfiles_is_an_image_folder(ci_dataset, ci_profile, encoding):
    spec = ci_profile.spec_for(encoding)
    root = ci_dataset("rawfiles", encoding)
    extension = {"raw": ".npy", "png": ".png", "jpeg": ".jpg"}[encoding]
    found = {}
    for class_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for path in sorted(class_dir.iterdir()):
            assert path.suffix == extension
            found[int(path.stem)] = (int(class_dir.name), path)
    assert sorted(found) == list(range(spec.num_samples))
    for i in (0, 17, spec.num_samples - 1):
        label, path = found[i]
        want_image, want_label = data_gen.sample(spec, i)
        assert label == want_label
        if encoding == "raw":
            assert np.array_equal(np.load(path), want_image)
        else:
            assert path.read_bytes() == want_image
            pixels = np.asarray(Image.open(io.BytesIO(path.read_bytes())))
            assert pixels.shape == spec.image_shape
