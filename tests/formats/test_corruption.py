"""Bad input, for every format: a clear error naming the file (and sample), never a wrong sample."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import data_gen
from storebench.formats import (
    FORMATS,
    CorruptSampleError,
    DatasetError,
    ManifestError,
    build_dataset,
    get_format,
    open_dataset,
    read_manifest,
)

CASES = [
    (name, encoding)
    for name, module in FORMATS.items()
    for encoding in data_gen.ENCODINGS
    if encoding in module.ENCODINGS
]
IDS = [f"{name}-{encoding}" for name, encoding in CASES]
VICTIM = 7  # the sample whose stored bytes get damaged


@pytest.fixture
def dataset_copy(ci_dataset, tmp_path):
    def copy(format_name, encoding):
        target = tmp_path / f"{format_name}-{encoding}"
        shutil.copytree(ci_dataset(format_name, encoding), target)
        return target

    return copy


def read_everything(reader):
    for start in range(0, len(reader), 64):
        reader.read_many(np.arange(start, min(start + 64, len(reader))))


@pytest.mark.parametrize(("format_name", "encoding"), CASES, ids=IDS)
def test_flipped_byte_in_a_sample_names_file_and_sample(
    dataset_copy, ci_profile, format_name, encoding
):
    root = dataset_copy(format_name, encoding)
    spec = ci_profile.spec_for(encoding)
    image, _ = data_gen.sample(spec, VICTIM)
    needle = image if isinstance(image, bytes) else image.tobytes()
    hits = []
    for rel in read_manifest(root)["files"]:
        data = (root / rel).read_bytes()
        if data.count(needle) == 1:
            hits.append((root / rel, data.index(needle)))
    if not hits:
        pytest.skip(f"{format_name} does not store sample bytes contiguously (compressed)")
    path, offset = hits[0]
    with open(path, "r+b") as f:
        f.seek(offset + len(needle) // 2)
        byte = f.read(1)
        f.seek(offset + len(needle) // 2)
        f.write(bytes([byte[0] ^ 0x5A]))
    with open_dataset(root) as reader:
        with pytest.raises(CorruptSampleError) as err:
            reader[VICTIM]
        assert err.value.index == VICTIM and err.value.path == path
        assert str(path) in str(err.value) and f"sample {VICTIM}" in str(err.value)
        with pytest.raises(CorruptSampleError, match=f"sample {VICTIM}"):
            reader.read_many([0, VICTIM, 1])
        # The neighbours are still readable and right.
        assert np.array_equal(
            np.asarray(reader[VICTIM + 1][0]), np.asarray(data_gen.sample(spec, VICTIM + 1)[0])
        )


@pytest.mark.parametrize(("format_name", "encoding"), CASES, ids=IDS)
def test_truncated_file_is_refused(dataset_copy, format_name, encoding):
    root = dataset_copy(format_name, encoding)
    manifest = read_manifest(root)
    largest = max(manifest["files"], key=manifest["files"].get)
    path = root / largest
    path.write_bytes(path.read_bytes()[: manifest["files"][largest] // 2])
    with pytest.raises(ManifestError, match=f"{path}.*truncated"):
        open_dataset(root)
    # Past the manifest's size check (the reader itself), still an error naming the file.
    reader = get_format(format_name).open(root, manifest)
    with pytest.raises(DatasetError) as err:
        read_everything(reader)
    assert str(root) in str(err.value)
    reader.close()


@pytest.mark.parametrize(("format_name", "encoding"), CASES, ids=IDS)
def test_garbage_in_the_middle_of_the_largest_file_never_yields_a_wrong_sample(
    dataset_copy, ci_profile, format_name, encoding
):
    root = dataset_copy(format_name, encoding)
    spec = ci_profile.spec_for(encoding)
    manifest = read_manifest(root)
    largest = max(manifest["files"], key=manifest["files"].get)
    path = root / largest
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 512] = np.random.default_rng(0).integers(0, 256, 512, np.uint8).tobytes()
    path.write_bytes(bytes(data))
    try:
        with open_dataset(root) as reader:
            for i, (image, label) in enumerate(reader.iter_sequential()):
                want_image, want_label = data_gen.sample(spec, i)
                assert (
                    np.array_equal(np.asarray(image), np.asarray(want_image)) or image == want_image
                )
                assert label == want_label
    except DatasetError as err:
        assert str(root) in str(err)
    else:
        pytest.fail("512 random bytes in the middle of the data went unnoticed")


def test_missing_path_and_missing_manifest(tmp_path, ci_dataset):
    with pytest.raises(ManifestError, match="no such dataset directory"):
        open_dataset(tmp_path / "nope")
    root = tmp_path / "copy"
    shutil.copytree(ci_dataset("hdf5", "raw"), root)
    (root / "manifest.json").unlink()
    with pytest.raises(ManifestError, match="manifest.json: missing"):
        open_dataset(root)


def test_mismatched_manifest_is_refused(tmp_path, ci_dataset):
    root = tmp_path / "copy"
    shutil.copytree(ci_dataset("memmap", "raw"), root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["num_samples"] += 1
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="num_samples disagrees"):
        open_dataset(root)
    manifest["num_samples"] -= 1
    manifest["manifest_version"] = 99
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="manifest version 99"):
        open_dataset(root)
    (root / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="unreadable manifest"):
        open_dataset(root)


def test_unknown_format_and_refused_encoding(tmp_path):
    with pytest.raises(KeyError, match="unknown format 'zarr'; known formats: .*hdf5"):
        get_format("zarr")
    png = data_gen.DatasetSpec(8, 8, 8, encoding="png")
    with pytest.raises(ValueError, match="'memmap' stores raw only and cannot hold 'png'"):
        build_dataset(png, "memmap", tmp_path)
    assert not any(tmp_path.iterdir()), "a refused build left files behind"


def test_unknown_knob_and_open_option_are_refused(tmp_path, ci_dataset):
    spec = data_gen.DatasetSpec(8, 8, 8)
    with pytest.raises(TypeError, match="'hdf5' has no knob.*chunk_samples"):
        build_dataset(spec, "hdf5", tmp_path, knobs={"chunk": 4})
    with pytest.raises(TypeError, match="'memmap' has no open option.*madvise_random"):
        open_dataset(ci_dataset("memmap", "raw"), readahead=False)
