"""LitData: the ``litdata`` format read back by LitData itself, and the ``litdata`` loader
path (StreamingDataset + StreamingDataLoader) delivering exact epochs."""

from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest
from peer_support import children_left

import data_gen
from storebench.formats import DatasetError, ManifestError, build_dataset, open_dataset
from storebench.formats import litdata_chunks as fmt
from storebench.loaders.paths import PathOptions, get_loader_path

pytestmark = pytest.mark.peers
pytest.importorskip("litdata")
simplejpeg = pytest.importorskip("simplejpeg")
psutil = pytest.importorskip("psutil")

# Small chunks, so that the ci sets (~0.5 MB JPEG, 1.5 MB raw) span several of them.
CHUNK_BYTES = 64 << 10


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """ci JPEG and raw sets as ``litdata`` datasets of several chunks, with the expected
    (image, label) of every sample: ``built[encoding] -> (root, spec, expected)``."""
    root = tmp_path_factory.mktemp("litdata")
    out = {}
    for encoding in ("jpeg", "raw"):
        spec = data_gen.PROFILES["ci"].spec_for(encoding)
        result = build_dataset(spec, fmt.NAME, root, workers=1,
                               knobs={"chunk_bytes": CHUNK_BYTES})
        expected = [data_gen.sample(spec, i) for i in range(spec.num_samples)]
        out[encoding] = (result.path, spec, expected)
    return out


def chunk_list(root):
    return json.loads((root / fmt.INDEX_NAME).read_text())["chunks"]


def decoded(spec, image):
    return simplejpeg.decode_jpeg(image, colorspace="RGB") if spec.encoding == "jpeg" else image


@pytest.mark.parametrize("encoding", ["jpeg", "raw"])
def test_litdata_reads_the_files_bit_identically(built, encoding):
    """LitData's own StreamingDataset reads back the stored bytes (JPEG) or pixels (raw),
    indices and labels; our Reader's blocks are LitData's chunks."""
    import litdata

    root, spec, expected = built[encoding]
    chunks = chunk_list(root)
    assert len(chunks) >= 3
    dataset = litdata.StreamingDataset(input_dir=str(root))
    assert len(dataset) == spec.num_samples
    for i in range(spec.num_samples):
        index, image, label = dataset[i]
        want_image, want_label = expected[i]
        assert index == i and label == want_label
        if encoding == "jpeg":
            assert bytes(image) == want_image
        else:
            assert image.dtype == np.uint8 and np.array_equal(image, want_image)
    with open_dataset(root) as reader:
        sizes = [chunk["chunk_size"] for chunk in chunks]
        assert reader.blocks().tolist() == np.concatenate([[0], np.cumsum(sizes)]).tolist()
    # Nothing written beside the dataset (no cache copy, no lock files).
    assert set(os.listdir(root)) == {"manifest.json", "checksums.npy", fmt.INDEX_NAME,
                                     *(chunk["filename"] for chunk in chunks)}


def run_epoch(batches, spec, expected) -> tuple[list[int], list[np.ndarray]]:
    order, batch_indices = [], []
    for batch in batches:
        assert batch.images.dtype == np.uint8 and batch.images.shape[1:] == spec.image_shape
        assert batch.labels.dtype == np.int64 and batch.indices.dtype == np.int64
        for k, i in enumerate(batch.indices.tolist()):
            want_image, want_label = expected[i]
            assert np.array_equal(batch.images[k], decoded(spec, want_image)), f"sample {i}"
            assert batch.labels[k] == want_label
        order.extend(batch.indices.tolist())
        batch_indices.append(batch.indices)
    return order, batch_indices


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "ordered"])
@pytest.mark.parametrize("encoding", ["jpeg", "raw"])
def test_two_epochs_hold_every_sample_once(built, encoding, shuffle):
    root, spec, expected = built[encoding]
    options = PathOptions(batch_size=30, workers=2, seed=11, root=str(root), shuffle=shuffle,
                          decode="simplejpeg" if encoding == "jpeg" else None)
    batches, close = get_loader_path("litdata").open(None, None, options)
    try:
        orders = []
        for _ in range(2):
            order, batch_indices = run_epoch(batches, spec, expected)
            assert sorted(order) == list(range(spec.num_samples))
            assert sum(len(b) < options.batch_size for b in batch_indices) <= 1
            orders.append(order)
            if not shuffle:  # each worker reads a contiguous range in stored order
                assert all((np.diff(b) == 1).all() for b in batch_indices)
        if shuffle:
            assert orders[0] != orders[1]
            assert orders[0] != sorted(orders[0])
        else:
            assert orders[0] == orders[1]
    finally:
        close()
    assert not children_left()


def test_no_workers_in_stored_order_and_undecoded_bytes(built):
    root, spec, expected = built["jpeg"]
    options = PathOptions(batch_size=50, workers=0, root=str(root), shuffle=False, decode=None)
    batches, close = get_loader_path("litdata").open(None, None, options)
    try:
        got = [(int(i), image, int(label)) for batch in batches
               for i, image, label in zip(batch.indices, batch.images, batch.labels)]
    finally:
        close()
    assert [i for i, _, _ in got] == list(range(spec.num_samples))
    assert all(image == expected[i][0] and label == expected[i][1] for i, image, label in got)


@pytest.mark.timeout(120)
def test_spawned_workers_and_close_mid_epoch_leaves_no_child(built):
    """The dataset class reaches spawned workers by name; close() in the middle of an
    epoch stops them and removes the cache directory."""
    root, spec, expected = built["raw"]
    options = PathOptions(batch_size=16, workers=2, seed=3, root=str(root),
                          start_method="spawn")
    batches, close = get_loader_path("litdata").open(None, None, options)
    iterator = iter(batches)
    batch = next(iterator)
    assert np.array_equal(batch.images[0], expected[int(batch.indices[0])][0])
    assert psutil.Process().children(recursive=True)
    close()
    assert not children_left()
    assert not os.path.exists(batches._cache_dir)


def damaged_copy(built, tmp_path, encoding="jpeg"):
    root = tmp_path / "copy"
    shutil.copytree(built[encoding][0], root)
    return root, root / chunk_list(root)[1]["filename"]


def item_offset(chunk_path, item: int) -> int:
    data = chunk_path.read_bytes()
    return struct.unpack_from("<I", data, 4 * (1 + item))[0]


@pytest.mark.timeout(120)
def test_loader_names_the_chunk_of_a_damaged_item(built, tmp_path):
    """A damaged item in the middle of a chunk (past the manifest's head/tail fingerprints)
    is an error naming the chunk, through the workers, not a wrong sample."""
    root, chunk = damaged_copy(built, tmp_path)
    data = bytearray(chunk.read_bytes())
    middle = struct.unpack_from("<I", data)[0] // 2
    at = item_offset(chunk, middle) + 12  # the item's stored index
    struct.pack_into("<q", data, at, struct.unpack_from("<q", data, at)[0] + 1)
    chunk.write_bytes(bytes(data))
    options = PathOptions(batch_size=30, workers=2, root=str(root), decode="simplejpeg")
    batches, close = get_loader_path("litdata").open(None, None, options)
    try:
        with pytest.raises(DatasetError, match=f"{chunk}.*out of place"):
            for _ in batches:
                pass
    finally:
        close()
    assert not children_left()
    # Our reader refuses the same item, whatever verify says.
    with open_dataset(root, verify=False) as reader, pytest.raises(DatasetError, match=str(chunk)):
        reader.read_many(np.arange(len(reader)))


def test_truncated_chunk_is_refused(built, tmp_path):
    root, chunk = damaged_copy(built, tmp_path)
    data = chunk.read_bytes()
    options = PathOptions(batch_size=30, workers=0, root=str(root), decode="simplejpeg")
    chunk.write_bytes(data[: len(data) // 2])
    with pytest.raises(ManifestError, match=f"{chunk}.*truncated"):
        get_loader_path("litdata").open(None, None, options)
    # Cut under an open loader: LitData waits (2 s) for the chunk to reach its indexed size,
    # then names it (its ChunkWaitTimeoutError, a FileNotFoundError; through DataLoader
    # workers it arrives as a RuntimeError with the same message).
    chunk.write_bytes(data)
    batches, close = get_loader_path("litdata").open(None, None, options)
    try:
        chunk.write_bytes(data[: len(data) // 2])
        with pytest.raises(FileNotFoundError, match=f"Timed out .* {chunk}"):
            for _ in batches:
                pass
    finally:
        close()


@pytest.mark.parametrize("verify", [False, True])
def test_reader_refuses_swapped_chunks(built, tmp_path, verify):
    """Two raw chunks of the same size swapped: the manifest's fingerprints refuse them at
    open, and past those (the reader opened directly) the indices the items store."""
    from storebench.formats import read_manifest

    root = tmp_path / "copy"
    shutil.copytree(built["raw"][0], root)
    first, second = (root / chunk["filename"] for chunk in chunk_list(root)[:2])
    assert first.stat().st_size == second.stat().st_size
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    with pytest.raises(DatasetError, match=str(first)):
        open_dataset(root, verify=verify)
    reader = fmt.open(root, read_manifest(root), verify=verify)
    with reader, pytest.raises(DatasetError, match=f"{first}.*holds sample"):
        reader[0]


def test_index_json_of_another_layout_is_refused(built, tmp_path):
    """A dict sample (which LitData 0.2.76 writes as an Arrow table) or compressed chunks
    are not this format's layout: refused with the file named."""
    from storebench.formats import read_manifest

    root = tmp_path / "copy"
    shutil.copytree(built["jpeg"][0], root)
    index = json.loads((root / fmt.INDEX_NAME).read_text())
    for key, value in (("compression", "zstd"), ("item_loader", "TokensLoader")):
        with pytest.raises(DatasetError, match=f"{fmt.INDEX_NAME}.*{key.split('_')[0]}"):
            fmt.read_index_json(root, json.dumps(
                {**index, "config": {**index["config"], key: value}}).encode())
    (root / fmt.INDEX_NAME).write_text(json.dumps({**index, "chunks": index["chunks"][1:]}))
    reader = fmt.open(root, read_manifest(root))
    with reader, pytest.raises(DatasetError, match=f"{fmt.INDEX_NAME}: not the file"):
        reader[0]
