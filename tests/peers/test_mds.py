"""MosaicML Streaming: our MDS datasets read back by streaming's own reader and
StreamingDataset, the ``mds`` loader path (exact epochs, order, clean-up of processes,
shared memory and lock files), and damage.

streaming is imported through ``streaming_import`` (its vision zoo needs torchvision, which
cannot be imported here). The datasets are built with 64 KiB shards so that the ci specs
span many shards (the default 8 MiB would hold each in one).
"""

from __future__ import annotations

import re
import shutil
import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
from peer_support import children_left, worker_children

import data_gen
from storebench.formats import DatasetError, build_dataset, open_dataset, read_manifest
from storebench.formats import mds as mds_format
from storebench.loaders.paths import PathOptions, get_loader_path

pytestmark = pytest.mark.peers
# Not pytest.importorskip("streaming"): a plain import of streaming fails here (torchvision).
if find_spec("streaming") is None:
    pytest.skip("MosaicML Streaming is not installed (the peers environment has it)",
                allow_module_level=True)
simplejpeg = pytest.importorskip("simplejpeg")

BATCH = 32
SIZE_LIMIT = 1 << 16
STREAMING_SHM = re.compile(r"^\d{6}_[a-z_]+$")


@pytest.fixture(scope="module")
def streaming():
    from storebench.streaming_import import import_streaming

    return import_streaming()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The ci raw and jpeg specs as mds datasets of 64 KiB shards: {encoding: (spec, root)}."""
    root = tmp_path_factory.mktemp("mds")
    profile = data_gen.PROFILES["ci"]
    out = {}
    for encoding in ("raw", "jpeg"):
        spec = profile.spec_for(encoding)
        result = build_dataset(spec, "mds", root, workers=1, knobs={"size_limit": SIZE_LIMIT})
        out[encoding] = spec, result.path
    return out


def leftovers(prefix: int) -> list[Path]:
    """What a StreamingDataset of shared-memory prefix ``prefix`` created and left: its
    /dev/shm segments and its lock files."""
    from storebench.loaders.peers.mds_loader import SHM_DIR, dataset_shared_names

    names, locks = dataset_shared_names(prefix)
    return [p for p in [SHM_DIR / name for name in names] + locks if p.exists()]


def open_path(root: Path, *, workers: int = 2, shuffle: bool = True, seed: int = 5):
    decode = "simplejpeg" if read_manifest(root)["encoding"] == "jpeg" else None
    options = PathOptions(batch_size=BATCH, workers=workers, seed=seed, root=str(root),
                          shuffle=shuffle, decode=decode)
    return get_loader_path("mds").open(None, None, options)


def want_image(spec, i: int) -> np.ndarray:
    image, _ = data_gen.sample(spec, i)
    return image if spec.encoding == "raw" else simplejpeg.decode_jpeg(image, colorspace="RGB")


def test_import_streaming_replaces_only_the_vision_zoo(streaming):
    from storebench.environments import UNAVAILABLE_HERE

    assert streaming.MDSWriter.__module__ == "streaming.base.format.mds.writer"
    assert streaming.StreamingDataset.__module__ == "streaming.base.dataset"
    assert "torchvision" not in sys.modules
    with pytest.raises(ImportError, match="torchvision") as err:
        streaming.vision.StreamingImageNet  # noqa: B018 - the access is what is tested
    assert UNAVAILABLE_HERE["torchvision"] in str(err.value)
    with pytest.raises(ImportError, match="torchvision"):
        from streaming.vision import StreamingCIFAR10  # noqa: F401
    assert not hasattr(streaming.vision, "__file__")  # dunders stay AttributeErrors
    assert streaming.text.StreamingC4.__module__ == "streaming.text.c4"


@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_streaming_reads_our_shards_bit_identically(built, streaming, encoding):
    from streaming.base.format import reader_from_json

    spec, root = built[encoding]
    index = (root / "index.json").read_text()
    import json

    shards = json.loads(index)["shards"]
    assert len(shards) > 4 and all(s["compression"] is None for s in shards)
    assert [s["raw_data"]["basename"] for s in shards] == [
        f"shard.{k:05d}.mds" for k in range(len(shards))]
    i = 0
    for info in shards:
        shard = reader_from_json(str(root), None, info)
        for k in range(info["samples"]):
            sample = shard.get_item(k)
            image, label = data_gen.sample(spec, i)
            assert sample["index"] == i and sample["label"] == label
            if encoding == "raw":
                assert sample["image"].dtype == np.uint8 and np.array_equal(sample["image"], image)
            else:
                assert sample["image"] == image  # stored byte for byte
            i += 1
    assert i == spec.num_samples
    mds_format.check_shard_hashes(root)  # streaming's xxh64 of every shard, as index.json says
    with open_dataset(root) as reader:  # our reader: the shards are its blocks
        bounds = np.cumsum([0] + [s["samples"] for s in shards])
        assert reader.blocks().tolist() == bounds.tolist()


def test_streaming_dataset_random_access_matches(built, streaming):
    """streaming's StreamingDataset over the directory, no download, random access."""
    from storebench.loaders.peers.mds_loader import release_shared_state

    spec, root = built["jpeg"]
    dataset = streaming.StreamingDataset(local=str(root), remote=None, batch_size=BATCH)
    try:
        assert dataset.num_samples == spec.num_samples
        for i in (0, 77, spec.num_samples - 1):
            image, label = data_gen.sample(spec, i)
            assert dataset[i] == {"image": image, "index": i, "label": label}
    finally:
        release_shared_state(dataset)
    assert not leftovers(dataset._shm_prefix_int)


def check_epoch(batches, spec) -> np.ndarray:
    """One epoch's indices in delivery order, checking every image and label."""
    order = []
    for batch in batches:
        assert batch.images.dtype == np.uint8 and batch.images.shape[1:] == spec.image_shape
        assert batch.labels.dtype == np.int64 and batch.indices.dtype == np.int64
        assert len(batch) <= BATCH
        for image, label, i in zip(batch.images, batch.labels, batch.indices):
            assert np.array_equal(image, want_image(spec, int(i))), f"sample {i}"
            assert label == data_gen.sample(spec, int(i))[1]
        order.append(batch.indices)
    order = np.concatenate(order)
    assert np.array_equal(np.sort(order), np.arange(spec.num_samples))
    return order


@pytest.mark.timeout(120)
def test_shuffled_epochs_are_exact_and_differ_then_close_cleans_up(built):
    spec, root = built["jpeg"]
    batches, close = open_path(root, workers=2, shuffle=True)
    prefix = batches.dataset._shm_prefix_int
    try:
        first = check_epoch(batches, spec)
        second = check_epoch(batches, spec)
        assert batches.epoch == 2
        assert not np.array_equal(first, second)
        assert not np.array_equal(first, np.arange(spec.num_samples))
        assert leftovers(prefix)  # streaming's shared memory is there while open
    finally:
        close()
    assert not children_left()
    assert not leftovers(prefix)
    close()  # idempotent


@pytest.mark.timeout(120)
def test_unshuffled_epochs_are_in_stored_order(built):
    spec, root = built["raw"]
    batches, close = open_path(root, workers=2, shuffle=False)
    try:
        assert np.array_equal(check_epoch(batches, spec), np.arange(spec.num_samples))
        assert np.array_equal(check_epoch(batches, spec), np.arange(spec.num_samples))
    finally:
        close()
    assert not children_left()


@pytest.mark.timeout(120)
def test_same_seed_same_order_and_in_process_iteration(built):
    """workers=0 iterates in this process (streaming's threads here): same order as with
    workers for the same seed and epoch, and close() ends those threads."""
    import threading

    spec, root = built["raw"]
    before = set(threading.enumerate())
    batches, close = open_path(root, workers=0, shuffle=True, seed=11)
    try:
        order = check_epoch(batches, spec)
    finally:
        close()
    assert set(threading.enumerate()) <= before
    again, close = open_path(root, workers=2, shuffle=True, seed=11)
    try:
        assert np.array_equal(np.concatenate([b.indices for b in again]), order)
    finally:
        close()


@pytest.mark.timeout(120)
def test_abandoned_epoch_then_a_full_one_then_close(built):
    spec, root = built["jpeg"]
    batches, close = open_path(root, workers=2)
    prefix = batches.dataset._shm_prefix_int
    try:
        it = iter(batches)
        next(it)
        assert worker_children()  # the workers are up
        check_epoch(batches, spec)  # the abandoned epoch's workers stop; a full epoch follows
        next(iter(batches))
    finally:
        close()  # with an epoch left unfinished
    assert not children_left()
    assert not leftovers(prefix)


def damaged_copy(built, tmp_path, encoding: str, victim: int, edit) -> tuple[Path, Path]:
    """A copy of a built dataset with sample ``victim``'s record edited in its shard:
    ``edit(record: bytearray, image_at: int, image_len: int)``. The victim sits in the
    middle of its shard, outside the manifest's head/tail fingerprints."""
    spec, source = built[encoding]
    root = tmp_path / source.name
    shutil.copytree(source, root)
    with open_dataset(root) as reader:
        shard, begin, end = reader.record_span(victim)
    data = bytearray(shard.read_bytes())
    span = read_manifest(root)["fingerprints"][shard.name]
    assert span["head"] <= begin and end <= len(data) - span["tail"], "pick another victim"
    record = data[begin:end]
    image_at = 0 if spec.encoding == "raw" else 4
    edit(record, image_at, len(record) - image_at - 16)
    data[begin:end] = record
    shard.write_bytes(bytes(data))
    return root, shard


def index_of_victim(victim: int):
    def edit(record, image_at, image_len):
        record[image_at + image_len:image_at + image_len + 8] = (victim + 1).to_bytes(8, "little")
    return edit


@pytest.mark.parametrize("verify", [False, True])
def test_our_reader_refuses_a_record_of_another_sample(built, tmp_path, verify):
    root, shard = damaged_copy(built, tmp_path, "raw", 100, index_of_victim(100))
    with open_dataset(root, verify=verify) as reader:
        reader[99]
        with pytest.raises(DatasetError, match=f"{shard}: sample 100: holds the record of "
                                               "sample 101"):
            reader[100]


@pytest.mark.timeout(120)
def test_loader_names_shard_and_sample_for_a_misplaced_record(built, tmp_path):
    root, shard = damaged_copy(built, tmp_path, "raw", 100, index_of_victim(100))
    batches, close = open_path(root, workers=2, shuffle=False)
    try:
        with pytest.raises(DatasetError, match=f"{shard}: sample 100: the record holds "
                                               "sample 101"):
            for _ in batches:
                pass
    finally:
        close()
    assert not children_left()


@pytest.mark.timeout(120)
def test_loader_names_shard_and_sample_for_an_undecodable_jpeg(built, tmp_path):
    def garble(record, image_at, image_len):
        record[image_at:image_at + image_len] = bytes(image_len)

    root, shard = damaged_copy(built, tmp_path, "jpeg", 60, garble)
    batches, close = open_path(root, workers=0, shuffle=True)
    try:
        with pytest.raises(DatasetError, match=f"{shard}: sample 60: cannot decode"):
            for _ in batches:
                pass
    finally:
        close()


def test_loader_refuses_another_format_and_a_wrong_decoder(built, tmp_path):
    spec, _ = built["raw"]
    other = build_dataset(spec, "memmap", tmp_path, workers=1).path
    with pytest.raises(DatasetError, match="reads 'mds' datasets"):
        open_path(other)
    options = PathOptions(batch_size=BATCH, root=str(built["raw"][1]), decode="simplejpeg")
    with pytest.raises(ValueError, match="raw pixels"):
        get_loader_path("mds").open(None, None, options)


def test_writer_leaves_no_threads_behind_on_success_or_failure(tmp_path):
    import threading

    spec = data_gen.DatasetSpec(8, 8, 8, encoding="raw")
    before = set(threading.enumerate())
    build_dataset(spec, "mds", tmp_path, workers=1)
    out = tmp_path / "failed"
    out.mkdir()
    bad = [(np.zeros((8, 8, 3), np.uint8), 0), (np.zeros((4, 4, 3), np.uint8), 1)]
    with pytest.raises(DatasetError, match="sample 1 is uint8 \\(4, 4, 3\\)"):
        mds_format.write(iter(bad), out, spec, size_limit=SIZE_LIMIT)
    with pytest.raises(ValueError, match="size_limit"):
        build_dataset(spec, "mds", tmp_path, workers=1, knobs={"size_limit": 2**32}, force=True)
    assert {t for t in threading.enumerate() if t.name != "tqdm_monitor"} <= before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
