"""TFRecord: real tf.data reads what we wrote, the offset index agrees with it, damage is named."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import data_gen
from storebench.formats import (
    CorruptSampleError,
    DatasetError,
    ManifestError,
    build_dataset,
    open_dataset,
    read_manifest,
    tfrecord,
)
from storebench.formats import example_proto as ep

pytestmark = pytest.mark.timeout(120)
CI = data_gen.PROFILES["ci"]
ENCODINGS = ("raw", "png", "jpeg")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("tfrecord")
    return {
        enc: build_dataset(CI.spec_for(enc), "tfrecord", out, workers=1).path for enc in ENCODINGS
    }


@pytest.fixture
def damaged_copy(datasets, tmp_path):
    """A private copy of the raw dataset to damage."""
    target = tmp_path / "tfrecord-raw"
    shutil.copytree(datasets["raw"], target)
    return target


def stored_bytes(spec, index: int) -> tuple[bytes, int]:
    image, label = data_gen.sample(spec, index)
    return (image.tobytes() if isinstance(image, np.ndarray) else image), label


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        value = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([value ^ 0xFF]))


# -- layout -------------------------------------------------------------------------------
def test_shards_and_indexes_are_laid_out_as_documented(datasets):
    root = datasets["raw"]
    names = [p.name for p in tfrecord.shard_paths(root)]
    assert names == [f"data-{k:05d}-of-00004.tfrecord" for k in range(4)]
    for shard in tfrecord.shard_paths(root):
        assert tfrecord.index_path(shard).name == shard.name.replace(".tfrecord", ".index")
        assert tfrecord.index_path(shard).is_file()
    with open_dataset(root) as reader:
        assert reader.blocks().tolist() == [0, 128, 256, 384, 512]
        assert set(reader.files()) == {root / name for name in read_manifest(root)["files"]}


def test_num_shards_knob_sets_shard_count_and_blocks(tmp_path):
    spec = CI.spec_for("png")
    root = build_dataset(spec, "tfrecord", tmp_path, knobs={"num_shards": 3}, workers=1).path
    shards = tfrecord.shard_paths(root)
    assert [p.name for p in shards] == [f"data-{k:05d}-of-00003.tfrecord" for k in range(3)]
    with open_dataset(root) as reader:
        blocks = reader.blocks()
        assert blocks.tolist() == [0, 85, 170, 256]
        assert [len(tfrecord.read_index(tfrecord.index_path(p))) for p in shards] == (
            np.diff(blocks).tolist()
        )
        # A block's first sample really is the first record of its shard.
        for shard, start in zip(shards, blocks[:-1], strict=False):
            first = next(tfrecord.scan_records(shard))[1]
            image = ep.parse_example(first).features.feature["image"].bytes_list.value[0]
            assert image == stored_bytes(spec, int(start))[0]


def test_bad_num_shards_is_refused(tmp_path):
    with pytest.raises(ValueError, match="num_shards"):
        build_dataset(CI.spec_for("png"), "tfrecord", tmp_path, knobs={"num_shards": 0}, workers=1)


# -- TensorFlow reads what we wrote ----------------------------------------------------------
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_tf_data_reads_every_record(datasets, encoding):
    tf = pytest.importorskip("tensorflow")
    spec = CI.spec_for(encoding)
    shards = [str(p) for p in tfrecord.shard_paths(datasets[encoding])]
    feature_spec = tfrecord.tf_feature_spec()
    parsed = tf.data.TFRecordDataset(shards).map(
        lambda record: tf.io.parse_single_example(record, feature_spec)
    )
    count = 0
    for i, features in enumerate(parsed.as_numpy_iterator()):
        image, label = stored_bytes(spec, i)
        assert features["image"] == image, f"sample {i}"
        assert features["label"] == label
        assert (features["height"], features["width"], features["channels"]) == spec.image_shape
        count += 1
    assert count == spec.num_samples


def test_example_messages_match_tensorflow_both_ways():
    tf = pytest.importorskip("tensorflow")
    ours = ep.make_example({"image": b"\x00\xffpixels"}, {"label": -3, "height": 7})
    theirs = tf.train.Example.FromString(ours)
    assert theirs.features.feature["image"].bytes_list.value == [b"\x00\xffpixels"]
    assert theirs.features.feature["label"].int64_list.value == [-3]
    reference = tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"abc"])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[5, 6])),
        "score": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5])),
    })).SerializeToString()
    parsed = ep.parse_example(reference).features.feature
    assert parsed["image"].bytes_list.value == [b"abc"]
    assert list(parsed["label"].int64_list.value) == [5, 6]
    assert list(parsed["score"].float_list.value) == [0.5]
    # Private pool: our classes and TensorFlow's are distinct and both still work.
    assert ep.Example is not tf.train.Example


def test_framing_matches_tensorflow_writer(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path = tmp_path / "tf-written.tfrecord"
    payloads = [b"", b"x", os.urandom(5000)]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for payload in payloads:
            writer.write(payload)
    assert path.read_bytes() == b"".join(tfrecord.frame_record(p) for p in payloads)
    assert [data for _, data in tfrecord.scan_records(path)] == payloads


# -- the offset index ------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_offset_index_agrees_with_tf_data_record_order(datasets, encoding):
    tf = pytest.importorskip("tensorflow")
    for shard in tfrecord.shard_paths(datasets[encoding]):
        index = tfrecord.read_index(tfrecord.index_path(shard))
        np.testing.assert_array_equal(index, tfrecord.build_index(shard))
        content = shard.read_bytes()
        assert index[-1].sum() == len(content)
        records = list(tf.data.TFRecordDataset([str(shard)]).as_numpy_iterator())
        assert len(records) == len(index)
        for record, (offset, length) in zip(records, index, strict=True):
            assert content[offset + 12 : offset + length - 4] == record


def test_reader_never_imports_tensorflow(datasets):
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        import data_gen
        from storebench.formats import read_manifest, tfrecord
        for root in {[str(p) for p in datasets.values()]!r}:
            with tfrecord.open(root, read_manifest(root)) as reader:
                order = np.random.default_rng(0).permutation(len(reader))
                images, labels = reader.read_many(order)
                for k in (0, len(order) // 2, len(order) - 1):
                    image, label = data_gen.sample(reader.spec, int(order[k]))
                    assert labels[k] == label
                    assert np.array_equal(images[k], image) if reader.is_raw else images[k] == image
                assert sum(1 for _ in reader.iter_sequential()) == len(reader)
        assert "tensorflow" not in sys.modules, "tensorflow was imported"
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=100)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# -- random access -------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_read_many_returns_the_requested_order(datasets, encoding):
    spec = CI.spec_for(encoding)
    rng = np.random.default_rng(7)
    order = np.concatenate([rng.permutation(spec.num_samples)[:100], [5, 5, 4, 6, 0]])
    with open_dataset(datasets[encoding]) as reader:
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
        single, label = reader[int(order[0])]
        assert labels[0] == label
        assert np.array_equal(single, images[0]) if reader.is_raw else single == images[0]


def test_reader_pickles_without_handles(datasets):
    with open_dataset(datasets["png"]) as reader:
        expected = reader[10]
        clone = pickle.loads(pickle.dumps(reader))
    assert all(value is None for key, value in vars(clone).items() if key.startswith("_h_"))
    with clone:
        assert clone[10] == expected


# -- damage --------------------------------------------------------------------------------
def record_span(root: Path, index: int) -> tuple[Path, int, int]:
    """(shard, offset, framed length) of sample ``index`` from the offset index."""
    bounds = tfrecord.shard_bounds(512, 4)
    shard = int(np.searchsorted(bounds, index, side="right")) - 1
    path = tfrecord.shard_paths(root)[shard]
    offset, length = tfrecord.read_index(tfrecord.index_path(path))[index - bounds[shard]]
    return path, int(offset), int(length)


@pytest.mark.parametrize("verify", [False, True])
def test_flipped_data_byte_names_shard_and_sample(damaged_copy, verify):
    victim = 300
    shard, offset, length = record_span(damaged_copy, victim)
    flip_byte(shard, offset + length // 2)
    # verify=False: the TFRecord data CRC alone must catch it.
    with open_dataset(damaged_copy, verify=verify) as reader:
        with pytest.raises(CorruptSampleError, match="data CRC mismatch") as caught:
            reader[victim]
        assert caught.value.path == shard and caught.value.index == victim
        assert f"sample {victim}" in str(caught.value) and shard.name in str(caught.value)
        with pytest.raises(CorruptSampleError) as caught:
            reader.read_many([1, 299, victim, 301])
        assert caught.value.path == shard and caught.value.index == victim
        np.testing.assert_array_equal(reader[victim + 1][0], data_gen.sample(reader.spec, 301)[0])


def test_flipped_length_byte_names_shard_and_sample(damaged_copy):
    victim = 2
    shard, offset, _ = record_span(damaged_copy, victim)
    flip_byte(shard, offset + 1)
    with open_dataset(damaged_copy, verify=False) as reader:
        with pytest.raises(CorruptSampleError, match="length CRC mismatch") as caught:
            reader.read_many(np.arange(8))
        assert caught.value.path == shard and caught.value.index == victim


def test_truncated_shard_is_caught_by_manifest_and_reader(damaged_copy):
    shards = tfrecord.shard_paths(damaged_copy)
    last = shards[-1]
    size = last.stat().st_size
    # Cut under an open reader: the reader names the shard and the cut record.
    with open_dataset(damaged_copy, verify=False) as reader:
        reader.read_many([0, 400])
        os.truncate(last, size - 100)
        np.testing.assert_array_equal(reader[510][0], data_gen.sample(reader.spec, 510)[0])
        with pytest.raises(CorruptSampleError, match="cut off") as caught:
            reader[511]
        assert caught.value.path == last and caught.value.index == 511
        with pytest.raises(CorruptSampleError, match="cut off") as caught:
            reader.read_many(np.arange(400, 512)[::-1])
        assert caught.value.path == last and caught.value.index == 511
    with pytest.raises(ManifestError, match=f"{last.name}.*truncated"):
        open_dataset(damaged_copy)
    # Past the manifest's size check, the reader refuses the shard at open.
    reader = tfrecord.open(damaged_copy, read_manifest(damaged_copy))
    with reader, pytest.raises(DatasetError, match=f"{last}: shard is cut off"):
        reader[0]
    with pytest.raises(DatasetError, match=f"{last.name}: record 127: file ends inside"):
        list(tfrecord.scan_records(last))


def test_missing_index_is_named(damaged_copy):
    index = tfrecord.index_path(tfrecord.shard_paths(damaged_copy)[1])
    index.unlink()
    with pytest.raises(ManifestError, match=f"{index.name}.*missing"):
        open_dataset(damaged_copy)
    reader = tfrecord.open(damaged_copy, read_manifest(damaged_copy))
    with reader, pytest.raises(DatasetError, match=f"{index}: offset index missing"):
        reader[0]


def test_index_that_disagrees_with_the_shard_is_refused(damaged_copy):
    index = tfrecord.index_path(tfrecord.shard_paths(damaged_copy)[0])
    np.save(index.with_suffix(".tmp.npy"), tfrecord.read_index(index)[:-1])
    os.replace(index.with_suffix(".tmp.npy"), index)
    reader = tfrecord.open(damaged_copy, read_manifest(damaged_copy))
    with reader, pytest.raises(DatasetError, match="indexes 127 records"):
        reader[0]
