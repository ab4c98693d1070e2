"""FFCV: our ``.beton`` files read back by FFCV's own reader and Loader, and the ``ffcv``
loader path (epochs, order, cleanup, refusals).

FFCV decodes JPEG with libjpeg-turbo's fast integer DCT (``TJFLAG_FASTDCT``): its pixels are
exactly ``simplejpeg.decode_jpeg(..., fastdct=True)``'s, and differ from simplejpeg's default
(accurate DCT) decode by a mean absolute difference of about 1.0 (up to ~1.4 per image on the
ci set), a little over the 1.0 the peers allow for other decoders; both are checked below.
"""

from __future__ import annotations

import shutil
import threading
import time

import numpy as np
import pytest
from peer_support import children_left, worker_children

import data_gen
from storebench.formats import DatasetError, build_dataset, ffcv_beton
from storebench.loaders.paths import PathOptions, get_loader_path

pytestmark = pytest.mark.peers
ffcv = pytest.importorskip("ffcv")
simplejpeg = pytest.importorskip("simplejpeg")

BATCH = 60


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The ci raw, jpeg and png specs built as ffcv datasets: {encoding: (spec, root)}."""
    root = tmp_path_factory.mktemp("ffcv")
    profile = data_gen.PROFILES["ci"]
    out = {}
    for encoding in ("raw", "jpeg", "png"):
        spec = profile.spec_for(encoding)
        out[encoding] = spec, build_dataset(spec, "ffcv", root, workers=1).path
    return out


def ffcv_threads() -> list[threading.Thread]:
    from ffcv.loader.epoch_iterator import EpochIterator

    return [t for t in threading.enumerate() if isinstance(t, EpochIterator) and t.is_alive()]


def test_on_disk_types_are_ffcvs():
    """The reader's copies of FFCV's file layout (it parses without importing FFCV)."""
    from ffcv.fields import BytesField, IntField, RGBImageField
    from ffcv.fields.rgb_image import IMAGE_MODES
    from ffcv.types import (
        ALLOC_TABLE_TYPE,
        CURRENT_VERSION,
        TYPE_ID_HANDLER,
        FieldDescType,
        HeaderType,
        get_metadata_type,
    )
    from ffcv.writer import MIN_PAGE_SIZE

    assert ffcv_beton.FILE_VERSION == CURRENT_VERSION
    assert HeaderType == ffcv_beton.HEADER_TYPE
    assert FieldDescType == ffcv_beton.FIELD_DESC_TYPE
    assert ffcv_beton.ALLOC_TABLE_TYPE == ALLOC_TABLE_TYPE
    assert ffcv_beton.MIN_PAGE_SIZE == MIN_PAGE_SIZE
    assert (IMAGE_MODES["jpg"], IMAGE_MODES["raw"]) == (ffcv_beton.MODE_JPG, ffcv_beton.MODE_RAW)
    assert {name: TYPE_ID_HANDLER[i].__name__ for name, i in ffcv_beton.TYPE_IDS.items()} == {
        name: name for name in ffcv_beton.TYPE_IDS}
    for encoding, image in (("raw", RGBImageField()), ("png", BytesField())):
        assert ffcv_beton.metadata_type(encoding) == get_metadata_type(
            [image, IntField(), IntField()])


@pytest.mark.parametrize("encoding", ["raw", "jpeg", "png"])
def test_ffcvs_reader_reads_our_files_bit_identically(built, encoding):
    """ffcv.reader.Reader (the Loader's own) finds every sample's stored bytes, label and
    index: JPEG and PNG bytes as given (never re-encoded), raw pixels as they are."""
    from ffcv.fields import BytesField, IntField, RGBImageField
    from ffcv.reader import Reader

    spec, root = built[encoding]
    reader = Reader(str(root / ffcv_beton.FILENAME))
    assert reader.num_samples == spec.num_samples
    image_type = BytesField if encoding == "png" else RGBImageField
    assert [type(h) for h in reader.handlers.values()] == [image_type, IntField, IntField]
    assert list(reader.handlers) == ["image", "label", "index"]
    data = np.memmap(root / ffcv_beton.FILENAME, dtype=np.uint8, mode="r")
    size_at = dict(zip(reader.alloc_table["ptr"].tolist(), reader.alloc_table["size"].tolist()))
    image_meta = reader.metadata["f0"]
    for i in range(spec.num_samples):
        want, label = data_gen.sample(spec, i)
        ptr = int(image_meta["ptr" if encoding == "png" else "data_ptr"][i])
        stored = data[ptr : ptr + size_at[ptr]]
        if encoding == "raw":
            assert np.array_equal(stored.reshape(spec.image_shape), want), f"sample {i}"
        else:
            assert stored.tobytes() == want, f"sample {i}"
        assert reader.metadata["f1"][i] == label and reader.metadata["f2"][i] == i
    if encoding != "png":
        assert set(image_meta["mode"]) == {1 if encoding == "raw" else 0}
        assert set(image_meta["height"]) == {spec.height}
        assert set(image_meta["width"]) == {spec.width}


def test_ffcvs_loader_reads_png_bytes(built):
    """PNG (BytesField) is FFCV-readable too, through its BytesDecoder (no image decode)."""
    from ffcv.fields.decoders import BytesDecoder, IntDecoder
    from ffcv.loader import Loader, OrderOption

    spec, root = built["png"]
    loader = Loader(str(root / ffcv_beton.FILENAME), batch_size=100, num_workers=1,
                    order=OrderOption.SEQUENTIAL, drop_last=False,
                    pipelines={"image": [BytesDecoder()], "label": [IntDecoder()],
                               "index": [IntDecoder()]})
    seen = 0
    for padded, labels, indices in loader:
        for k, i in enumerate(indices.reshape(-1)):
            want, label = data_gen.sample(spec, int(i))
            assert padded[k][: len(want)].tobytes() == want and labels[k, 0] == label
            seen += 1
    assert seen == spec.num_samples


def read_epoch(batches):
    got = [(b.images, b.labels, b.indices) for b in batches]
    for images, labels, indices in got:
        assert images.dtype == np.uint8 and labels.dtype == indices.dtype == np.int64
    sizes = [len(indices) for _, _, indices in got]
    assert all(size == BATCH for size in sizes[:-1]) and 0 < sizes[-1] <= BATCH
    return (np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got]),
            np.concatenate([g[2] for g in got]))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffle", "stored-order"])
@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_loader_path_yields_each_sample_once_per_epoch(built, encoding, shuffle):
    spec, root = built[encoding]
    n = spec.num_samples
    options = PathOptions(batch_size=BATCH, workers=2, seed=11, root=str(root), shuffle=shuffle,
                          decode="simplejpeg" if encoding == "jpeg" else None)
    batches, close = get_loader_path("ffcv").open(None, None, options)
    try:
        orders = []
        for _ in range(2):
            images, labels, indices = read_epoch(batches)
            assert np.array_equal(np.sort(indices), np.arange(n))
            assert images.shape == (n, *spec.image_shape)
            differences = []
            for image, label, i in zip(images, labels, indices):
                want, want_label = data_gen.sample(spec, int(i))
                assert label == want_label
                if encoding == "raw":
                    assert np.array_equal(image, want), f"sample {i}"
                else:  # FFCV's libjpeg-turbo decode uses the fast DCT
                    fast = simplejpeg.decode_jpeg(want, colorspace="RGB", fastdct=True)
                    assert np.array_equal(image, fast), f"sample {i}"
                    accurate = simplejpeg.decode_jpeg(want, colorspace="RGB")
                    differences.append(np.abs(image.astype(int) - accurate).mean())
            if differences:
                assert np.mean(differences) <= 1.1 and max(differences) <= 2.0
            orders.append(indices)
        if shuffle:
            assert not np.array_equal(orders[0], orders[1])
            assert not np.array_equal(orders[0], np.arange(n))
        else:
            assert np.array_equal(orders[0], np.arange(n))
            assert np.array_equal(orders[1], np.arange(n))
    finally:
        close()
    assert not ffcv_threads()


@pytest.mark.timeout(60)
def test_close_ends_an_abandoned_epoch_and_leaves_no_children(built):
    _, root = built["raw"]
    before = worker_children()
    batches, close = get_loader_path("ffcv").open(
        None, None, PathOptions(batch_size=8, workers=2, seed=1, root=str(root)))
    epoch = iter(batches)
    next(epoch)  # FFCV's thread has filled its queue ahead and waits on it
    time.sleep(0.5)
    assert ffcv_threads()
    close()
    assert not ffcv_threads()
    assert not children_left(before=frozenset(before))
    epoch.close()  # the abandoned generator: nothing left to stop


def test_build_runs_in_this_process_and_frees_its_shared_memory(tmp_path):
    from pathlib import Path

    spec = data_gen.DatasetSpec(40, 8, 8, encoding="raw", seed=4)
    shm_before = set(Path("/dev/shm").iterdir())
    children_before = worker_children()
    build_dataset(spec, "ffcv", tmp_path, workers=1)
    assert not worker_children() - children_before
    assert not {p for p in set(Path("/dev/shm").iterdir()) - shm_before
                if p.name.startswith("psm_")}


def test_loader_path_refuses_png_and_damaged_files(built, tmp_path):
    options = PathOptions(batch_size=BATCH, root=str(built["png"][1]))
    with pytest.raises(DatasetError, match="FFCV decodes JPEG .* only.*png"):
        get_loader_path("ffcv").open(None, None, options)

    root = tmp_path / "damaged"
    shutil.copytree(built["jpeg"][1], root)
    path = root / ffcv_beton.FILENAME
    data = bytearray(path.read_bytes())
    data[ffcv_beton.HEADER_TYPE.itemsize + 3 * ffcv_beton.FIELD_DESC_TYPE.itemsize + 16] ^= 1
    path.write_bytes(bytes(data))  # sample 0's label, in the metadata table
    options = PathOptions(batch_size=BATCH, root=str(root))
    with pytest.raises(DatasetError, match=str(path)):
        get_loader_path("ffcv").open(None, None, options)
    path.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(DatasetError, match=f"{path}.*truncated"):
        get_loader_path("ffcv").open(None, None, options)
    assert not ffcv_threads()
