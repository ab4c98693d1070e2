"""WebDataset: our tar shards read by WebDataset itself, its loader path, and the Reader's
own checks on the tars (the generic contract and corruption tests cover the rest)."""

from __future__ import annotations

import os
import shutil
import tarfile

import numpy as np
import pytest
from peer_support import children_left, worker_children

import data_gen
from storebench.formats import (
    CorruptSampleError,
    DatasetError,
    ManifestError,
    build_dataset,
    open_dataset,
    read_manifest,
)
from storebench.formats import webdataset_tar as fmt
from storebench.loaders.paths import PathOptions, get_loader_path

pytestmark = pytest.mark.peers
wds = pytest.importorskip("webdataset")
pytest.importorskip("torch")
simplejpeg = pytest.importorskip("simplejpeg")

SHARD = 64  # samples per shard: ci jpeg (256) in 4 shards, raw (512) in 8
DECODE = {"raw": None, "png": None, "jpeg": "simplejpeg"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``built(encoding, samples_per_shard=SHARD) -> dataset root``, each built once."""
    root = tmp_path_factory.mktemp("wds")
    done = {}

    def build(encoding: str, samples_per_shard: int = SHARD):
        key = (encoding, samples_per_shard)
        if key not in done:
            spec = data_gen.PROFILES["ci"].spec_for(encoding)
            done[key] = build_dataset(spec, fmt.NAME, root, workers=1,
                                      knobs={"samples_per_shard": samples_per_shard},
                                      name=f"{encoding}-{samples_per_shard}").path
        return done[key]

    return build


@pytest.fixture
def copy_of(built, tmp_path):
    def copy(encoding: str, samples_per_shard: int = SHARD):
        target = tmp_path / f"{encoding}-{samples_per_shard}"
        shutil.copytree(built(encoding, samples_per_shard), target)
        return target

    return copy


def expected_image(spec, index: int) -> np.ndarray:
    image, _ = data_gen.sample(spec, index)
    if spec.encoding == "jpeg":
        return simplejpeg.decode_jpeg(image, colorspace="RGB")
    return image


def urls(root) -> list[str]:
    return [str(p) for p in fmt.shard_paths(root, read_manifest(root))]


# -- the files, read by WebDataset itself ------------------------------------------------------
@pytest.mark.parametrize("encoding", ["raw", "png", "jpeg"])
def test_webdataset_reads_the_files_bit_identically(built, encoding):
    root = built(encoding)
    spec = data_gen.PROFILES["ci"].spec_for(encoding)
    ext = fmt.IMAGE_EXTS[encoding][0]
    dataset = wds.WebDataset(urls(root), shardshuffle=False).decode()  # .npy, .cls; not images
    keys = []
    for sample in dataset:
        index = int(sample["__key__"])
        keys.append(index)
        want_image, want_label = data_gen.sample(spec, index)
        assert set(sample) >= {ext, "cls"}
        if encoding == "raw":
            assert sample[ext].dtype == np.uint8 and np.array_equal(sample[ext], want_image)
        else:
            assert sample[ext] == want_image  # the stored bytes, never re-encoded
        assert sample["cls"] == want_label
    assert keys == list(range(spec.num_samples))


def test_shards_are_ustar_without_pax_headers(built):
    root = built("jpeg")
    for path in urls(root):
        with open(path, "rb") as f:
            assert f.read(512)[257:265] == b"ustar\x0000"  # POSIX ustar, not GNU or PAX
        with tarfile.open(path) as tar:
            members = tar.getmembers()
        assert all(m.isreg() and not m.pax_headers for m in members)
        assert [m.offset_data - m.offset for m in members] == [512] * len(members)


def test_blocks_are_the_shards_and_the_index_places_every_member(built):
    root = built("raw")
    with open_dataset(root) as reader:
        assert reader.blocks().tolist() == [0, 64, 128, 192, 256, 320, 384, 448, 512]
        index = np.load(root / fmt.INDEX_NAME)
    with tarfile.open(root / "shard-000002.tar") as tar:
        member = tar.getmember("00000130.npy")
    assert index[130].tolist()[:3] == [2, member.offset_data, member.size]


def test_samples_per_shard_is_checked(tmp_path):
    spec = data_gen.DatasetSpec(8, 8, 8)
    with pytest.raises(ValueError, match="samples_per_shard must be a positive integer"):
        build_dataset(spec, fmt.NAME, tmp_path, knobs={"samples_per_shard": 0})


# -- the Reader's own checks on the tars (verify=False: the format's checks only) -------------
def rewrite_member(path, index: int, ext: str, *, name: str | None = None,
                   data: bytes | None = None) -> None:
    """Rename sample ``index``'s member or replace its data (same length), keeping the tar
    valid (the header checksum recomputed)."""
    with tarfile.open(path) as tar:
        member = tar.getmember(f"{index:08d}.{ext}")
    with open(path, "r+b") as f:
        if name is not None:
            member.name = name
            f.seek(member.offset)
            f.write(member.tobuf(tarfile.USTAR_FORMAT))
        if data is not None:
            assert len(data) == member.size
            f.seek(member.offset_data)
            f.write(data)


@pytest.mark.parametrize("verify", [False, True])
def test_a_member_that_is_not_the_indexed_one_is_refused(copy_of, verify):
    root = copy_of("jpeg")
    path = root / "shard-000000.tar"
    rewrite_member(path, 7, "jpg", name="00000070.jpg")
    reader = fmt.open(root, read_manifest(root), verify=verify)  # past the fingerprints
    with reader, pytest.raises(CorruptSampleError, match="tar member '00000070.jpg'") as err:
        reader[7]
    assert err.value.path == path and err.value.index == 7
    with reader, pytest.raises(CorruptSampleError, match="sample 7"):
        reader.read_many([6, 7, 8])
    with reader:
        assert reader[8][0] == data_gen.sample(reader.spec, 8)[0]


def test_a_changed_label_file_is_refused_without_verify(copy_of):
    root = copy_of("jpeg")
    label = data_gen.sample(data_gen.PROFILES["ci"].spec_for("jpeg"), 9)[1]
    rewrite_member(root / "shard-000000.tar", 9, "cls", data=str((label + 1) % 10).encode())
    reader = fmt.open(root, read_manifest(root), verify=False)
    with reader, pytest.raises(CorruptSampleError, match=r"00000009.cls holds .*index says"):
        reader[9]


@pytest.mark.parametrize("verify", [False, True])
def test_swapped_shards_are_refused(copy_of, verify):
    root = copy_of("raw")  # full shards of raw samples all have one size
    a, b = root / "shard-000001.tar", root / "shard-000002.tar"
    assert a.stat().st_size == b.stat().st_size
    data_a = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data_a)
    with pytest.raises(DatasetError, match="shard-00000[12].tar: not the file"):
        open_dataset(root, verify=verify)
    reader = fmt.open(root, read_manifest(root), verify=verify)
    with reader, pytest.raises(CorruptSampleError, match="shard-000001.tar.*tar member"):
        reader.read_many(np.arange(len(reader)))


# -- the loader path ---------------------------------------------------------------------------
def open_path(root, *, shuffle=True, workers=2, seed=0, batch_size=32, decode=None):
    options = PathOptions(batch_size=batch_size, workers=workers, seed=seed, root=str(root),
                          shuffle=shuffle, decode=decode)
    return get_loader_path("webdataset").open(None, None, options)


def epoch(batches, spec) -> np.ndarray:
    """Every index of one epoch, in delivery order, each image and label checked."""
    seen = []
    for batch in batches:
        assert batch.images.dtype == np.uint8 and batch.labels.dtype == np.int64
        assert batch.images.shape[1:] == spec.image_shape and len(batch) <= 32
        for k, index in enumerate(batch.indices):
            assert np.array_equal(batch.images[k], expected_image(spec, int(index)))
            assert batch.labels[k] == data_gen.sample(spec, int(index))[1]
        seen.append(batch.indices)
    return np.concatenate(seen)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_loader_shuffles_each_epoch_differently_and_delivers_every_sample(built, encoding):
    spec = data_gen.PROFILES["ci"].spec_for(encoding)
    batches, close = open_path(built(encoding), decode=DECODE[encoding])
    try:
        first, second = epoch(batches, spec), epoch(batches, spec)
    finally:
        close()
    for order in (first, second):
        assert np.array_equal(np.sort(order), np.arange(spec.num_samples))
    assert not np.array_equal(first, second)
    assert not np.array_equal(first, np.arange(spec.num_samples))
    # The same seed orders the same: epoch 1 again from a fresh object.
    again, close = open_path(built(encoding), decode=DECODE[encoding])
    try:
        assert np.array_equal(np.concatenate([b.indices for b in again]), first)
    finally:
        close()
    assert not children_left()


@pytest.mark.timeout(60)
def test_loader_without_shuffle_keeps_stored_order_per_worker(built):
    spec = data_gen.PROFILES["ci"].spec_for("jpeg")
    batches, close = open_path(built("jpeg"), shuffle=False, decode="simplejpeg")
    try:
        for _ in range(2):
            seen = [b.indices for b in batches]
            assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(spec.num_samples))
            # Each batch: consecutive samples of one shard (a worker reads its shards in order).
            for indices in seen:
                assert np.array_equal(indices, np.arange(indices[0], indices[0] + len(indices)))
                assert indices[0] // SHARD == indices[-1] // SHARD
    finally:
        close()
    # One worker: plain index order.
    batches, close = open_path(built("jpeg"), shuffle=False, workers=1, decode="simplejpeg")
    try:
        assert np.array_equal(epoch(batches, spec), np.arange(spec.num_samples))
    finally:
        close()


@pytest.mark.timeout(60)
def test_fewer_shards_than_workers_still_covers_every_sample(built):
    spec = data_gen.PROFILES["ci"].spec_for("jpeg")
    root = built("jpeg", 500)  # one shard
    batches, close = open_path(root, decode="simplejpeg")
    try:
        assert batches.workers == 1
        assert np.array_equal(np.sort(epoch(batches, spec)), np.arange(spec.num_samples))
    finally:
        close()


@pytest.mark.timeout(60)
def test_close_mid_epoch_leaves_no_child_process(built):
    batches, close = open_path(built("raw"))
    iterator = iter(batches)
    next(iterator)
    assert worker_children()  # the workers are running
    close()
    assert not children_left()
    # The next epoch starts afresh and is complete.
    assert sum(len(b) for b in batches) == 512
    close()
    assert not children_left()


def test_decoders_are_checked(built):
    with pytest.raises(ValueError, match="raw pixels"):
        open_path(built("raw"), decode="simplejpeg")
    with pytest.raises(ValueError, match="simplejpeg decodes JPEG only"):
        open_path(built("png"), decode="simplejpeg")


def test_damaged_shard_is_refused_before_the_workers_start(copy_of):
    root = copy_of("jpeg")
    path = root / "shard-000001.tar"
    os.truncate(path, path.stat().st_size // 2)
    with pytest.raises(ManifestError, match=f"{path}.*truncated"):
        open_path(root, decode="simplejpeg")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cut", ["inside a member", "at a member boundary"])
def test_shard_cut_under_an_open_loader_is_a_dataset_error_naming_it(copy_of, cut):
    root = copy_of("jpeg")
    path = root / "shard-000001.tar"
    batches, close = open_path(root, decode="simplejpeg")
    index = np.load(root / fmt.INDEX_NAME)
    start = int(index[SHARD + 10, 1]) - 512  # sample 74's header: a member boundary
    os.truncate(path, start + 700 if cut == "inside a member" else start)
    try:
        with pytest.raises(DatasetError, match=f"{path}.*truncated"):
            for _ in batches:
                pass
    finally:
        close()
    assert not children_left()
