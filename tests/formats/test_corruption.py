"""Bad input, for every format: a clear error naming the file (and sample), never a wrong sample."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from format_cases import format_cases, format_param

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
    unavailable_reason,
)
from storebench.formats.base import sample_checksum, sample_checksums

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
    """A copy to damage. Its LMDB file is no build of this user's (storebench.formats.trust):
    the tests that read LMDB copies open them with trust=True, as a user who knows where a
    file came from would."""
    def copy(format_name, encoding):
        target = tmp_path / f"{format_name}-{encoding}"
        shutil.copytree(ci_dataset(format_name, encoding), target)
        return target

    return copy


def read_everything(reader):
    for start in range(0, len(reader), 64):
        reader.read_many(np.arange(start, min(start + 64, len(reader))))


def flip_a_byte_of(root: Path, spec, index: int) -> Path:
    """Flip one byte in the middle of sample ``index``'s stored bytes; the file it is in
    (skips where the format does not store them as they are)."""
    image, _ = data_gen.sample(spec, index)
    needle = image if isinstance(image, bytes) else image.tobytes()
    hits = []
    for rel in read_manifest(root)["files"]:
        data = (root / rel).read_bytes()
        if data.count(needle) == 1:
            hits.append((root / rel, data.index(needle)))
    if not hits:
        pytest.skip(f"{root.name} does not store sample bytes contiguously (compressed)")
    path, offset = hits[0]
    with open(path, "r+b") as f:
        f.seek(offset + len(needle) // 2)
        byte = f.read(1)
        f.seek(offset + len(needle) // 2)
        f.write(bytes([byte[0] ^ 0x5A]))
    return path


def test_a_batchs_checksums_are_each_samples_checksum():
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=(6, 4, 5, 3), dtype=np.uint8)
    labels = np.array([3, -1, 0, 2**40, 7, 9], dtype=np.int64)
    encoded = [rng.bytes(n) for n in (0, 1, 17, 300, 5, 64)]
    for images, picked in ((raw, labels), (raw[::2], labels[::2]), (encoded, labels),
                           (raw[:0], labels[:0])):
        expected = [sample_checksum(image, int(label)) for image, label in zip(images, picked)]
        got = sample_checksums(images, picked)
        assert got.dtype == np.uint32 and got.tolist() == expected


@pytest.mark.parametrize(("format_name", "encoding"), [("memmap", "raw"), ("lmdb", "jpeg"),
                                                       ("parquet", "raw")])
def test_a_batch_with_two_damaged_samples_names_the_first_in_its_order(
    dataset_copy, ci_profile, format_name, encoding
):
    root = dataset_copy(format_name, encoding)
    spec = ci_profile.spec_for(encoding)
    later = VICTIM + 3
    flip_a_byte_of(root, spec, VICTIM)
    flip_a_byte_of(root, spec, later)
    # Parquet's page checksums refuse the damaged group without verify: the manifest's
    # checksums are what name the sample.
    with open_dataset(root, verify=True, trust=True) as reader:
        for batch, named in (([later, 0, VICTIM], later), ([VICTIM, 1, later], VICTIM)):
            with pytest.raises(CorruptSampleError) as err:
                reader.read_many(batch)
            assert err.value.index == named and f"sample {named}" in str(err.value)
        assert reader.read_many([0, VICTIM + 1])[1].tolist() == [
            data_gen.sample(spec, 0)[1], data_gen.sample(spec, VICTIM + 1)[1]]


@pytest.mark.parametrize(("format_name", "encoding"), [("memmap", "raw"), ("lmdb", "jpeg")])
def test_an_unverified_readers_batch_is_checked_on_demand_with_the_callers_reason(
    ci_dataset, format_name, encoding
):
    """What a benchmark does after its timed, unverified reads: ``check_batch`` compares a
    batch with the manifest whatever ``verify`` says, and names the first wrong sample in
    the batch's order with the reason the caller gives."""
    with open_dataset(ci_dataset(format_name, encoding), verify=False) as reader:
        batch = [VICTIM + 3, 0, VICTIM]
        images, labels = reader.read_many(batch)
        reader.check_batch(batch, images, labels)  # as built: passes
        if reader.is_raw:
            images = images.copy()
            images[2, 0, 0, 0] ^= 1
            images[0, 0, 0, 0] ^= 1
        else:
            images = [images[0][:-1] + bytes([images[0][-1] ^ 1]), images[1],
                      images[2][:-1] + bytes([images[2][-1] ^ 1])]
        with pytest.raises(CorruptSampleError, match="differs here") as err:
            reader.check_batch(batch, images, labels, problem="differs here")
        assert err.value.index == VICTIM + 3
        with pytest.raises(CorruptSampleError, match="checksum mismatch") as err:
            reader.check_batch(batch[1:], images[1:], labels[1:])
        assert err.value.index == VICTIM
        wrong_label = labels.copy()
        wrong_label[1] += 1
        with pytest.raises(CorruptSampleError) as err:
            reader.check_batch(batch, reader.read_many(batch)[0], wrong_label)
        assert err.value.index == 0


@pytest.mark.parametrize(("format_name", "encoding"), format_cases(CASES, IDS))
def test_flipped_byte_in_a_sample_names_file_and_sample(
    dataset_copy, ci_profile, format_name, encoding
):
    root = dataset_copy(format_name, encoding)
    spec = ci_profile.spec_for(encoding)
    path = flip_a_byte_of(root, spec, VICTIM)
    with open_dataset(root, trust=True) as reader:
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


@pytest.mark.parametrize(("format_name", "encoding"), format_cases(CASES, IDS))
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


@pytest.mark.parametrize(("format_name", "encoding"), format_cases(CASES, IDS))
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


def test_a_listed_file_that_is_gone_is_named_whole(tmp_path, ci_dataset):
    root = tmp_path / "copy"
    shutil.copytree(ci_dataset("rawfiles", "raw"), root)
    gone = sorted(read_manifest(root)["files"])[7]
    (root / gone).unlink()
    with pytest.raises(ManifestError) as err:
        open_dataset(root)
    assert str(err.value) == f"{root / gone}: listed in the manifest but missing"


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
    with pytest.raises(KeyError, match="unknown format 'n5'; known formats: .*hdf5"):
        get_format("n5")
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


# -- verify=False: what the formats' own checks and the open-time identity checks catch -----
def read_all_both_ways(root, *, verify):
    """Open and read every sample by batches and one by one; the first DatasetError wins."""
    with open_dataset(root, verify=verify) as reader:
        read_everything(reader)
        for i in range(len(reader)):
            reader[i]


def same_size_pairs(root):
    """Pairs of data files of equal size and different content (swappable undetected by size)."""
    manifest = read_manifest(root)
    by_size = {}
    for rel, size in sorted(manifest["files"].items()):
        by_size.setdefault(size, []).append(rel)
    for rels in by_size.values():
        for a, b in zip(rels, rels[1:]):
            if (root / a).read_bytes() != (root / b).read_bytes():
                return a, b
    return None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize(("format_name", "encoding"), format_cases(CASES, IDS))
def test_swapped_files_are_refused(dataset_copy, format_name, encoding, verify):
    root = dataset_copy(format_name, encoding)
    pair = same_size_pairs(root)
    if pair is None:
        pytest.skip(f"{format_name}-{encoding} has no two data files of the same size")
    a, b = root / pair[0], root / pair[1]
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    with pytest.raises(DatasetError) as err:
        read_all_both_ways(root, verify=verify)
    assert str(a) in str(err.value) or str(b) in str(err.value)


@pytest.fixture(scope="module")
def donors(tmp_path_factory, ci_profile):
    """The ci raw spec with another seed, built in every raw-capable format: files of the
    same names and (mostly) the same sizes as the real ones, with other contents."""
    root = tmp_path_factory.mktemp("donors")
    spec = ci_profile.spec_for("raw")
    other = data_gen.DatasetSpec(**{**spec.to_dict(), "seed": spec.seed + 100})
    for name in FORMATS:
        if unavailable_reason(name) is None:
            build_dataset(other, name, root, workers=1)
    return root


@pytest.mark.timeout(120)
@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("format_name", [format_param(n) for n in sorted(FORMATS)])
def test_file_replaced_by_another_datasets_is_refused(dataset_copy, donors, format_name, verify):
    root = dataset_copy(format_name, "raw")
    manifest = read_manifest(root)
    largest = max(manifest["files"], key=manifest["files"].get)
    donor = donors / f"{format_name}-raw"
    # rawfiles: the same sample index, whatever class directory the donor filed it under.
    source = donor / largest
    if not source.exists():
        source = next(donor.glob(f"*/{Path(largest).name}"))
    shutil.copyfile(source, root / largest)
    with pytest.raises(DatasetError) as err:
        read_all_both_ways(root, verify=verify)
    assert str(root / largest) in str(err.value)


@pytest.mark.parametrize(("format_name", "encoding"), [("tfrecord", "raw"), ("parquet", "raw"),
                                                       ("tfrecord", "png"), ("parquet", "jpeg")])
def test_flipped_sample_byte_is_caught_by_the_formats_own_checks(
    dataset_copy, ci_profile, format_name, encoding
):
    """TFRecord's data CRC and Parquet's page checksums stay on with verify=False."""
    root = dataset_copy(format_name, encoding)
    image, _ = data_gen.sample(ci_profile.spec_for(encoding), VICTIM)
    needle = image if isinstance(image, bytes) else image.tobytes()
    path = root / next(rel for rel in read_manifest(root)["files"]
                       if needle in (root / rel).read_bytes())
    data = bytearray(path.read_bytes())
    data[data.index(needle) + len(needle) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with open_dataset(root, verify=False) as reader:
        with pytest.raises(CorruptSampleError) as err:
            reader[VICTIM]
        assert err.value.path == path
        with pytest.raises(CorruptSampleError):
            reader.read_many([VICTIM])


def zero_first_occurrence(path, needle: bytes, what: str) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0, f"{what} not found in {path}"
    data[at : at + len(needle)] = bytes(len(needle))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_zeroed_tfrecord_index_entry_is_refused(dataset_copy, encoding, verify):
    from storebench.formats import tfrecord

    root = dataset_copy("tfrecord", encoding)
    path = tfrecord.index_path(tfrecord.shard_paths(root)[1])
    entry = tfrecord.read_index(path)[5].astype("<i8").tobytes()
    zero_first_occurrence(path, entry, "index entry 5")
    with pytest.raises(DatasetError, match=f"{path}: not the file this dataset was built"):
        read_all_both_ways(root, verify=verify)
    # Past the open-time fingerprints (the reader opened directly), its structure check.
    reader = tfrecord.open(root, read_manifest(root), verify=verify)
    with reader, pytest.raises(DatasetError, match=f"{path}: damaged offset index: record 5"):
        reader[0]


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("encoding", ["png", "jpeg"])
def test_zeroed_hdf5_offset_is_refused(dataset_copy, encoding, verify):
    import h5py

    root = dataset_copy("hdf5", encoding)
    with h5py.File(root / "data.h5", "r") as f:
        offsets = f["offsets"][:]
    # Offsets 5..7 as stored: zeroing offset 6 keeps the file's size and structure.
    zero_first_occurrence(root / "data.h5", offsets[6:7].astype("<i8").tobytes(), "offset 6")
    with pytest.raises(DatasetError, match="data.h5"):
        read_all_both_ways(root, verify=verify)
    reader = get_format("hdf5").open(root, read_manifest(root), verify=verify)
    with reader, pytest.raises(DatasetError, match="data.h5: offsets are not an increasing"):
        reader[0]


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize(("format_name", "encoding"), [
    ("memmap", "raw"), ("hdf5", "raw"), ("hdf5", "jpeg"), ("lmdb", "raw"), ("lmdb", "png"),
])
def test_damaged_label_array_is_refused(dataset_copy, format_name, encoding, verify):
    """A label changed where all labels are stored together: caught at open by the labels'
    CRC32C in the manifest, not returned as a wrong label."""
    root = dataset_copy(format_name, encoding)
    manifest = read_manifest(root)
    with get_format(format_name).open(root, manifest) as reader:
        labels = reader.read_many(np.arange(len(reader)))[1].astype("<i8")
    victim = int(np.flatnonzero(labels)[3])
    damaged = labels.copy()
    damaged[victim] = 0
    hits = [rel for rel in manifest["files"] if labels.tobytes() in (root / rel).read_bytes()]
    assert len(hits) == 1
    path = root / hits[0]
    path.write_bytes(path.read_bytes().replace(labels.tobytes(), damaged.tobytes()))
    with pytest.raises(DatasetError, match=str(path)):
        read_all_both_ways(root, verify=verify)
    # Past the open-time fingerprints (which cover the file's ends only), the labels' CRC.
    reader = get_format(format_name).open(root, manifest, verify=verify)
    with reader, pytest.raises(DatasetError, match="labels.*differ from the ones written at"):
        reader[0]


def edit_manifest(root, edit, *, reseal: bool):
    """Change the manifest; ``reseal`` recomputes its digest, as a deliberate edit would."""
    from storebench.formats.manifest import manifest_digest

    path = root / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    if reseal:
        manifest["manifest_digest"] = manifest_digest(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(("format_name", "encoding"), format_cases(CASES, IDS))
def test_manifest_edited_by_hand_is_refused(dataset_copy, format_name, encoding):
    root = dataset_copy(format_name, encoding)
    edit_manifest(root, lambda m: m["spec"].update(seed=m["spec"]["seed"] + 1), reseal=False)
    with pytest.raises(ManifestError, match="edited after the build"):
        open_dataset(root, verify=False)


@pytest.mark.parametrize("format_name", [format_param(n) for n in sorted(FORMATS)])
def test_resealed_manifest_claiming_another_encoding_is_refused(dataset_copy, format_name):
    """Even with a recomputed digest, a manifest calling raw data png is refused at open."""
    root = dataset_copy(format_name, "raw")

    def claim_png(manifest):
        manifest["encoding"] = manifest["spec"]["encoding"] = "png"

    edit_manifest(root, claim_png, reseal=True)
    with pytest.raises(DatasetError):
        open_dataset(root, verify=False)


@pytest.mark.parametrize("format_name", [format_param(n) for n in sorted(FORMATS)])
def test_resealed_manifest_with_another_shape_is_refused(dataset_copy, format_name):
    root = dataset_copy(format_name, "raw")

    def swap_shape(manifest):
        manifest["spec"]["height"], manifest["spec"]["width"] = 16, 64

    edit_manifest(root, swap_shape, reseal=True)
    with pytest.raises(DatasetError):
        read_all_both_ways(root, verify=False)


@pytest.mark.parametrize("reseal", [False, True])
def test_unknown_format_in_manifest_is_a_manifest_error(dataset_copy, reseal):
    root = dataset_copy("hdf5", "raw")
    edit_manifest(root, lambda m: m.update(format="n5"), reseal=reseal)
    match = "unknown format 'n5'" if reseal else "edited after the build"
    with pytest.raises(ManifestError, match=match):
        open_dataset(root)


def test_old_manifest_version_asks_for_a_rebuild(dataset_copy):
    root = dataset_copy("memmap", "raw")
    edit_manifest(root, lambda m: m.update(manifest_version=1), reseal=True)
    with pytest.raises(ManifestError, match="manifest version 1.*rebuild"):
        open_dataset(root)


NPY_HEADER_DAMAGE = {
    "unterminated string": (b"{'descr': '", b"{'descr': \""),
    "huge shape": (b"'shape': (", b"'shape': (99999999999999, "),
    "not a literal": (b"'fortran_order': False", b"'fortran_order': Fals("),
}


@pytest.mark.parametrize("damage", sorted(NPY_HEADER_DAMAGE))
@pytest.mark.parametrize(("format_name", "rel"), [
    ("tfrecord", "data-00002-of-00004.index"), ("memmap", "labels.npy"),
    ("memmap", "images.npy"),
])
def test_damaged_npy_header_is_a_dataset_error_naming_the_file(
    dataset_copy, format_name, rel, damage
):
    """Never MemoryError, tokenize.TokenError or SyntaxError from NumPy's header parser,
    even past the open-time fingerprint check (the reader opened directly)."""
    root = dataset_copy(format_name, "raw")
    path = root / rel
    old, new = NPY_HEADER_DAMAGE[damage]
    data = path.read_bytes()
    assert old in data[:128]
    path.write_bytes(data.replace(old, new, 1))
    reader = get_format(format_name).open(root, read_manifest(root))
    with reader, pytest.raises(DatasetError, match=str(path)):
        reader.read_many([0, 1])


# -- truncation under an open reader ---------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize(("format_name", "encoding"), format_cases(CASES, IDS))
def test_file_truncated_under_an_open_reader_is_an_error_not_a_crash(
    dataset_copy, ci_profile, format_name, encoding, verify
):
    """Memory-mapped readers (memmap, LMDB) and HDF5 (which reads zeros past the end) check
    the file's size before each read: a shrunken file is a DatasetError, not SIGBUS or zeros.
    Elsewhere the read fails, or comes from a row group read before the cut: never wrong."""
    root = dataset_copy(format_name, encoding)
    spec = ci_profile.spec_for(encoding)
    manifest = read_manifest(root)
    largest = max(manifest["files"], key=manifest["files"].get)
    with open_dataset(root, verify=verify, trust=True) as reader:
        reader.read_many([0, len(reader) - 1])
        os.truncate(root / largest, manifest["files"][largest] // 3)
        try:
            for i, (image, label) in enumerate(reader.iter_sequential(batch_size=64)):
                want_image, want_label = data_gen.sample(spec, i)
                assert np.array_equal(np.asarray(image), np.asarray(want_image))
                assert label == want_label
        except DatasetError as err:
            assert str(root) in str(err)
        else:
            assert format_name not in ("memmap", "lmdb", "hdf5"), "the shrunken file went unseen"
