"""Parquet: pyarrow reads what we documented, the knobs are honoured, damage is named."""

from __future__ import annotations

import json
import os
import pickle
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import data_gen
from storebench.formats import (
    CorruptSampleError,
    DatasetError,
    ManifestError,
    build_dataset,
    open_dataset,
    parquet,
    read_manifest,
)

pytestmark = pytest.mark.timeout(120)
CI = data_gen.PROFILES["ci"]
ENCODINGS = ("raw", "png", "jpeg")
ROW_GROUP = 100  # 512 raw samples -> five full row groups and one of 12


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("parquet")
    built = {
        enc: build_dataset(CI.spec_for(enc), "parquet", out, workers=1).path for enc in ENCODINGS
    }
    built["raw-groups"] = build_dataset(
        CI.spec_for("raw"),
        "parquet",
        out,
        knobs={"row_group_size": ROW_GROUP},
        workers=1,
        name="parquet-raw-groups",
    ).path
    return built


@pytest.fixture
def damaged_copy(datasets, tmp_path):
    target = tmp_path / "parquet-raw"
    shutil.copytree(datasets["raw-groups"], target)
    return target


def stored_bytes(spec, index: int) -> tuple[bytes, int]:
    image, label = data_gen.sample(spec, index)
    return (image.tobytes() if isinstance(image, np.ndarray) else image), label


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_read_table_gives_the_documented_columns(datasets, encoding):
    spec = CI.spec_for(encoding)
    table = pq.read_table(datasets[encoding] / parquet.FILENAME)
    assert table.schema.names == ["image", "label"]
    assert table.schema.field("image").type == pa.binary()
    assert table.schema.field("label").type == pa.int64()
    assert json.loads(table.schema.metadata[b"storebench.spec"]) == spec.to_dict()
    images, labels = table.column("image").to_pylist(), table.column("label").to_pylist()
    assert len(images) == spec.num_samples
    for i in range(0, spec.num_samples, 17):
        assert (images[i], labels[i]) == stored_bytes(spec, i)


def test_row_groups_follow_the_knob(datasets):
    path = datasets["raw-groups"] / parquet.FILENAME
    metadata = pq.ParquetFile(path).metadata
    sizes = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
    assert sizes == [100, 100, 100, 100, 100, 12]
    with open_dataset(datasets["raw-groups"]) as reader:
        assert reader.blocks().tolist() == [0, 100, 200, 300, 400, 500, 512]
    with open_dataset(datasets["raw"]) as reader:  # the default, 256
        assert reader.blocks().tolist() == [0, 256, 512]


@pytest.mark.parametrize(
    ("knob", "codec"), [("none", "UNCOMPRESSED"), ("zstd", "ZSTD"), ("snappy", "SNAPPY")]
)
def test_compression_knob_is_honoured(tmp_path, knob, codec):
    spec = CI.spec_for("png")
    root = build_dataset(spec, "parquet", tmp_path, knobs={"compression": knob}, workers=1).path
    metadata = pq.ParquetFile(root / parquet.FILENAME).metadata
    codecs = {
        metadata.row_group(g).column(c).compression
        for g in range(metadata.num_row_groups)
        for c in range(metadata.num_columns)
    }
    assert codecs == {codec}
    with open_dataset(root) as reader:
        assert reader[3][0] == stored_bytes(spec, 3)[0]


def test_unknown_compression_is_refused(tmp_path):
    with pytest.raises(ValueError, match="compression must be one of"):
        build_dataset(
            CI.spec_for("png"), "parquet", tmp_path, knobs={"compression": "lzma"}, workers=1
        )


@pytest.mark.parametrize("key", ["raw-groups", "png", "jpeg"])
def test_read_many_across_row_groups_returns_the_requested_order(datasets, key):
    root = datasets[key]
    spec = read_manifest(root)["spec"]
    spec = data_gen.DatasetSpec.from_dict(spec)
    rng = np.random.default_rng(3)
    tail = [spec.num_samples - 1, 0, 0]
    order = np.concatenate([rng.permutation(spec.num_samples)[:150], tail])
    with open_dataset(root) as reader:
        out = np.zeros((len(order), *spec.image_shape), np.uint8) if reader.is_raw else None
        images, labels = reader.read_many(order, out=out)
        if reader.is_raw:
            assert images is out
        for k, i in enumerate(order.tolist()):
            image, label = data_gen.sample(spec, i)
            assert labels[k] == label
            if reader.is_raw:
                np.testing.assert_array_equal(images[k], image)
            else:
                assert images[k] == image
        # Per-sample access, in and out of the cached row group.
        for i in (5, 6, 250, 7):
            image, label = data_gen.sample(spec, i % spec.num_samples)
            got, got_label = reader[i % spec.num_samples]
            assert got_label == label
            assert np.array_equal(got, image) if reader.is_raw else got == image


def test_reader_pickles_without_handles(datasets):
    with open_dataset(datasets["raw-groups"]) as reader:
        expected = reader[150][0]
        clone = pickle.loads(pickle.dumps(reader))
    assert all(value is None for key, value in vars(clone).items() if key.startswith("_h_"))
    with clone:
        np.testing.assert_array_equal(clone[150][0], expected)
        assert clone.blocks().tolist() == [0, 100, 200, 300, 400, 500, 512]


def flip_inside_sample(path, spec, index: int) -> None:
    content = path.read_bytes()
    at = content.find(stored_bytes(spec, index)[0])
    assert at > 0
    with open(path, "r+b") as f:
        f.seek(at + 1000)
        f.write(bytes([content[at + 1000] ^ 0xFF]))


def test_verify_false_still_checks_page_checksums(damaged_copy):
    """verify=False skips only the per-sample CRC32C: the page checksum refuses the damaged
    row group, naming its first sample; the other groups stay readable."""
    path = damaged_copy / parquet.FILENAME
    spec = CI.spec_for("raw")
    flip_inside_sample(path, spec, 250)  # row group 2: samples 200..299
    with open_dataset(damaged_copy, verify=False) as reader:
        with pytest.raises(CorruptSampleError, match="CRC checksum verification failed") as err:
            reader[250]
        assert err.value.path == path and err.value.index == 200
        with pytest.raises(CorruptSampleError, match="row group 2"):
            reader.read_many([0, 260])
        np.testing.assert_array_equal(reader[310][0], data_gen.sample(spec, 310)[0])
    with open_dataset(damaged_copy) as reader, pytest.raises(CorruptSampleError):
        reader[250]


def test_flipped_byte_with_manifest_checks_names_the_sample(damaged_copy):
    path = damaged_copy / parquet.FILENAME
    spec = CI.spec_for("raw")
    victim = 250
    flip_inside_sample(path, spec, victim)
    with open_dataset(damaged_copy) as reader:
        with pytest.raises(CorruptSampleError, match="fails its page checksum") as caught:
            reader[victim]
        assert caught.value.path == path and caught.value.index == victim
        with pytest.raises(CorruptSampleError, match=f"sample {victim}: row group 2"):
            reader.read_many([10, 420, 251, victim])
        # The damaged page's other samples are checked one by one against the manifest.
        images, labels = reader.read_many([251, 249, 10])
        for image, label, i in zip(images, labels, (251, 249, 10), strict=True):
            want_image, want_label = data_gen.sample(spec, i)
            np.testing.assert_array_equal(image, want_image)
            assert label == want_label


def test_truncated_file_is_caught_by_manifest_and_reader(damaged_copy):
    path = damaged_copy / parquet.FILENAME
    os.truncate(path, path.stat().st_size - 50)
    with pytest.raises(ManifestError, match=f"{path}.*truncated"):
        open_dataset(damaged_copy)
    reader = parquet.open(damaged_copy, read_manifest(damaged_copy))
    with reader, pytest.raises(DatasetError, match=f"{path}: cannot open as Parquet"):
        reader[0]


def test_file_cut_inside_the_data_names_file_and_sample(damaged_copy):
    """The footer survives but a row group's pages are gone: the damage is named by sample."""
    path = damaged_copy / parquet.FILENAME
    metadata = pq.ParquetFile(path).metadata
    content = path.read_bytes()
    footer_length = int.from_bytes(content[-8:-4], "little") + 8
    group = metadata.row_group(4)
    start = min(group.column(c).data_page_offset for c in range(group.num_columns))
    # Drop most of row group 4's bytes but keep the footer: offsets past the cut now point
    # at the wrong data or past the end.
    os.truncate(path, 0)
    path.write_bytes(content[: start + 64] + content[-footer_length:])
    reader = parquet.open(damaged_copy, read_manifest(damaged_copy), verify=False)
    with reader:
        np.testing.assert_array_equal(reader[0][0], data_gen.sample(reader.spec, 0)[0])
        with pytest.raises(CorruptSampleError, match="row group 4") as caught:
            reader[450]
        assert caught.value.path == path and caught.value.index == 400


def test_a_row_group_read_keeps_pyarrows_buffer_and_joins_several_chunks():
    single = pa.chunked_array([pa.array([b"ab", b"cde"], type=pa.binary())])
    one = parquet._one_chunk(single)
    # The very buffer pyarrow read, not a copy of it.
    assert one.buffers()[2].address == single.chunk(0).buffers()[2].address
    several = pa.chunked_array([pa.array([b"ab"], type=pa.binary()),
                                pa.array([b"cde", b"f"], type=pa.binary())])
    joined = parquet._one_chunk(several)
    assert isinstance(joined, pa.Array)
    assert joined.to_pylist() == [b"ab", b"cde", b"f"]


def test_bad_row_group_size_is_refused(tmp_path):
    with pytest.raises(ValueError, match="row_group_size"):
        build_dataset(
            CI.spec_for("png"), "parquet", tmp_path, knobs={"row_group_size": 0}, workers=1
        )


@pytest.mark.timeout(120)
def test_threads_reading_row_groups_of_one_reader_get_exact_bytes(datasets):
    # Two ThreadPrefetcher workers once hung inside pyarrow's read_row_group, reading row
    # groups of one ParquetFile at the same time; reads now take turns on a lock.
    from storebench.loaders import BatchSampler, LazyDataset, ShuffleSampler, ThreadPrefetcher

    spec = CI.spec_for("raw")
    with open_dataset(datasets["raw-groups"], verify=False) as reader:
        dataset = LazyDataset(reader)
        for epoch in range(20):
            order = BatchSampler(ShuffleSampler(len(dataset), seed=epoch), 16)
            with ThreadPrefetcher(dataset, order, workers=4) as prefetcher:
                for batch in prefetcher:
                    for k, index in enumerate(batch.indices[:2]):
                        assert batch.images[k].tobytes() == stored_bytes(spec, int(index))[0]


def test_row_group_reads_count_each_group_read_not_the_cached_one(datasets):
    """Groups of 100: samples 90..109 span groups 0 and 1; 100..105 are in the cached
    group 1; sample 0 is in group 0 again, which group 1 evicted."""
    with open_dataset(datasets["raw-groups"], verify=False) as reader:
        assert reader.row_group_reads == (0, 0.0)
        reader.read_many(np.arange(90, 110))
        count, seconds = reader.row_group_reads
        assert count == 2 and seconds > 0
        reader.read_many(np.arange(100, 106))
        assert reader.row_group_reads == (2, seconds)
        reader[0]
        assert reader.row_group_reads[0] == 3


def test_a_block_shuffled_epoch_reads_each_row_group_once(tmp_path):
    """Row groups of 10 and batches of 64: every batch spans seven groups or more, and the
    one it ends in is the one the next batch begins in; it must be the one left cached. (In
    group-number order the last group read was whichever had the highest number, and the
    next batch read its first group again.)"""
    from storebench.loaders import BatchSampler, BlockShuffleSampler

    root = build_dataset(CI.spec_for("raw"), "parquet", tmp_path,
                         knobs={"row_group_size": 10}, workers=1).path
    with open_dataset(root, verify=False) as reader:
        groups = len(reader.blocks()) - 1
        for batch in BatchSampler(BlockShuffleSampler.from_reader(reader, seed=0), 64):
            reader.read_many(np.asarray(batch))
        assert reader.row_group_reads[0] == groups
