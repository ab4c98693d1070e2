"""DALI (CPU pipelines): its own readers read our rawfiles and TFRecord datasets as built, the
``dali_file`` / ``dali_tfrecord`` loader paths deliver every sample once per epoch with the
build's labels and pixels, close ends DALI's threads, damage is a DatasetError."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from peer_support import worker_children

import data_gen
from storebench.formats import build_dataset, tfrecord
from storebench.loaders.paths import PathOptions, get_loader_path

pytestmark = [pytest.mark.peers, pytest.mark.timeout(120)]
dali = pytest.importorskip("nvidia.dali")
simplejpeg = pytest.importorskip("simplejpeg")

CI = data_gen.PROFILES["ci"]
CASES = [("dali_file", "rawfiles", "jpeg"), ("dali_file", "rawfiles", "raw"),
         ("dali_tfrecord", "tfrecord", "jpeg"), ("dali_tfrecord", "tfrecord", "raw")]
IDS = [f"{path}-{encoding}" for path, _, encoding in CASES]
# DALI decodes JPEG with libjpeg-turbo through nvImageCodec, not with simplejpeg. On the ci
# images every pixel has been identical (mean absolute difference 0); the bound allows the
# last-bit differences another IDCT could give.
MAX_MEAN_ABS_DIFF = 1.0


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[tuple[str, str], Path]:
    out = tmp_path_factory.mktemp("dali")
    return {(name, enc): build_dataset(CI.spec_for(enc), name, out, workers=1).path
            for name in ("rawfiles", "tfrecord") for enc in ("jpeg", "raw")}


def open_path(path: str, root: Path, **options):
    options = {"batch_size": 100, "workers": 2, "seed": 0, "shuffle": True, **options}
    return get_loader_path(path).open(None, None, PathOptions(root=str(root), **options))


def epoch(batches) -> tuple[np.ndarray, list]:
    """The indices of one epoch, and its batches."""
    seen = list(batches)
    return np.concatenate([b.indices for b in seen]), seen


def expected_image(spec, index: int) -> np.ndarray:
    image, _ = data_gen.sample(spec, index)
    return image if spec.encoding == "raw" else simplejpeg.decode_jpeg(image, colorspace="RGB")


# -- (1) DALI's own readers return the stored bytes ----------------------------------------
def run_reader(reader, batch_size: int, count: int):
    """``count`` samples of a one-reader pipeline, as (bytes or arrays, labels or None)."""
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None)
    def pipeline():
        outputs = reader()
        return tuple(outputs) if isinstance(outputs, list | tuple) else outputs

    pipe = pipeline()
    pipe.build()
    payloads, labels = [], []
    while len(payloads) < count:
        outputs = pipe.run()
        payloads += [np.array(outputs[0][k]) for k in range(len(outputs[0]))]
        if len(outputs) > 1:
            labels += np.array(outputs[1].as_array()).reshape(-1).tolist()
    del pipe
    return payloads[:count], labels[:count]


@pytest.mark.parametrize("encoding", ["jpeg", "raw"])
def test_dali_readers_file_and_numpy_read_the_rawfiles_as_built(datasets, encoding):
    from nvidia.dali import fn

    from storebench.formats import read_manifest
    from storebench.loaders.peers.dali import rawfiles_listing

    spec = CI.spec_for(encoding)
    root = datasets[("rawfiles", encoding)]
    files, labels = rawfiles_listing(root, spec, read_manifest(root))
    if encoding == "raw":
        payloads, _ = run_reader(lambda: fn.readers.numpy(files=files), 64, spec.num_samples)
    else:
        payloads, dali_labels = run_reader(
            lambda: fn.readers.file(files=files, labels=labels.tolist()), 64, spec.num_samples)
    for i, payload in enumerate(payloads):
        image, label = data_gen.sample(spec, i)
        if encoding == "raw":
            np.testing.assert_array_equal(payload, image, err_msg=f"sample {i}")
        else:
            assert payload.tobytes() == image, f"sample {i}"
            assert dali_labels[i] == label
    # The listing's labels are the build's (the class directories).
    assert labels.tolist() == [data_gen.sample(spec, i)[1] for i in range(spec.num_samples)]


@pytest.mark.parametrize("encoding", ["jpeg", "raw"])
def test_dali_readers_tfrecord_reads_the_shards_through_the_built_idx_files(datasets, encoding):
    import nvidia.dali.tfrecord as tfrec
    from nvidia.dali import fn

    spec = CI.spec_for(encoding)
    shards = tfrecord.shard_paths(datasets[("tfrecord", encoding)])
    for shard in shards:  # the .idx text is tfrecord2idx's "offset size" per record
        rows = [tuple(map(int, line.split()))
                for line in tfrecord.dali_index_path(shard).read_text().splitlines()]
        assert rows == [tuple(r) for r in tfrecord.read_index(tfrecord.index_path(shard))]
    features = {"image": tfrec.FixedLenFeature((), tfrec.string, ""),
                "label": tfrec.FixedLenFeature([1], tfrec.int64, -1)}

    def reader():
        record = fn.readers.tfrecord(
            path=[str(p) for p in shards],
            index_path=[str(tfrecord.dali_index_path(p)) for p in shards], features=features)
        return record["image"], record["label"]

    payloads, labels = run_reader(reader, 64, spec.num_samples)
    for i, (payload, label) in enumerate(zip(payloads, labels, strict=True)):
        image, want = data_gen.sample(spec, i)
        stored = image.tobytes() if encoding == "raw" else image
        assert payload.tobytes() == stored, f"sample {i}"
        assert label == want


# -- (2) the loader paths: each epoch exactly its samples ----------------------------------
@pytest.mark.parametrize(("path", "format_name", "encoding"), CASES, ids=IDS)
def test_shuffled_epochs_deliver_every_sample_once_with_the_builds_labels_and_pixels(
    datasets, path, format_name, encoding
):
    spec = CI.spec_for(encoding)
    batches, close = open_path(path, datasets[(format_name, encoding)])
    try:
        orders = []
        for _ in range(2):
            order, seen = epoch(batches)
            np.testing.assert_array_equal(np.sort(order), np.arange(spec.num_samples))
            # batch 100: full batches, then the remainder (no padding, nothing repeated)
            assert [len(b) for b in seen] == [100] * (spec.num_samples // 100) + [
                spec.num_samples % 100]
            orders.append(order)
            worst = 0.0
            for batch in seen:
                assert batch.images.dtype == np.uint8
                assert batch.images.shape == (len(batch), *spec.image_shape)
                assert batch.labels.dtype == np.int64 and batch.indices.dtype == np.int64
                for image, label, index in zip(batch.images, batch.labels, batch.indices):
                    assert label == data_gen.sample(spec, int(index))[1]
                    difference = np.abs(image.astype(np.int16)
                                        - expected_image(spec, int(index)).astype(np.int16))
                    if encoding == "raw":
                        assert not difference.any(), f"sample {index}"
                    worst = max(worst, float(difference.mean()))
            assert worst <= MAX_MEAN_ABS_DIFF
        assert not np.array_equal(orders[0], orders[1])  # reshuffled for epoch 2
        assert not np.array_equal(orders[0], np.arange(spec.num_samples))
    finally:
        close()


@pytest.mark.parametrize(("path", "format_name"), [("dali_file", "rawfiles"),
                                                   ("dali_tfrecord", "tfrecord")])
def test_unshuffled_epochs_are_in_stored_order(datasets, path, format_name):
    batches, close = open_path(path, datasets[(format_name, "jpeg")], shuffle=False,
                               batch_size=64)
    try:
        for _ in range(2):
            order, seen = epoch(batches)
            np.testing.assert_array_equal(order, np.arange(256))
            assert [len(b) for b in seen] == [64] * 4
    finally:
        close()


def test_order_follows_the_seed_and_an_unfinished_epoch_is_finished_first(datasets):
    root = datasets[("tfrecord", "jpeg")]
    orders = {}
    for seed in (0, 0, 1):
        batches, close = open_path("dali_tfrecord", root, seed=seed)
        try:
            orders.setdefault(seed, []).append(epoch(batches)[0])
        finally:
            close()
    np.testing.assert_array_equal(orders[0][0], orders[0][1])
    assert not np.array_equal(orders[0][0], orders[1][0])

    batches, close = open_path("dali_tfrecord", root, seed=0)
    try:
        first = next(iter(batches))  # a break after one batch of epoch 1
        assert len(first) == 100
        second, _ = epoch(batches)  # epoch 2, whole
        np.testing.assert_array_equal(np.sort(second), np.arange(256))
    finally:
        close()


# -- (3) close ends DALI's threads ---------------------------------------------------------
def test_close_ends_the_pipeline_threads_and_starts_no_process(datasets):
    # Threads judged by identity, not by count: earlier tests' pools may still be winding
    # down in this process, so a count before and after says nothing about DALI's own.
    me = psutil.Process()
    before = {thread.id for thread in me.threads()}
    batches, close = open_path("dali_file", datasets[("rawfiles", "jpeg")], workers=2)
    next(iter(batches))
    started = {thread.id for thread in me.threads()} - before
    assert started  # DALI runs threads in this process
    assert not worker_children()
    close()
    deadline = time.monotonic() + 5
    while started & {thread.id for thread in me.threads()} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not started & {thread.id for thread in me.threads()}
    assert not worker_children()


# -- (4) damage ---------------------------------------------------------------------------
def run_damaged(path: str, root: Path) -> str:
    """One epoch in a fresh interpreter (a DALI crash must not take pytest with it): the
    error it ended with."""
    script = textwrap.dedent(f"""
        from storebench.loaders.paths import PathOptions, get_loader_path
        batches, close = get_loader_path({path!r}).open(
            None, None, PathOptions(batch_size=64, workers=2, root={str(root)!r}))
        try:
            for batch in batches:
                pass
        except Exception as err:
            print(type(err).__name__, err)
        else:
            print("no error")
        finally:
            close()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def copy_of(datasets, format_name: str, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(datasets[(format_name, "jpeg")], tmp_path / format_name))


def test_truncated_jpeg_is_a_dataset_error_naming_the_file(datasets, tmp_path):
    root = copy_of(datasets, "rawfiles", tmp_path)
    victim = next(root.glob("*/000007.jpg"))
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    out = run_damaged("dali_file", root)
    assert out.startswith("DatasetError") and str(victim) in out


def test_truncated_shard_is_a_dataset_error_naming_the_shard(datasets, tmp_path):
    root = copy_of(datasets, "tfrecord", tmp_path)
    shard = tfrecord.shard_paths(root)[1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    out = run_damaged("dali_tfrecord", root)
    assert out.startswith("DatasetError") and str(shard) in out


def test_damaged_dali_index_is_refused_before_dali_reads_it(datasets, tmp_path):
    from storebench.formats import DatasetError

    root = copy_of(datasets, "tfrecord", tmp_path)
    index = tfrecord.dali_index_path(tfrecord.shard_paths(root)[2])
    index.write_text(index.read_text().replace(" ", " 1", 1))
    with pytest.raises(DatasetError, match=str(index)):
        open_path("dali_tfrecord", root)
    index.unlink()
    with pytest.raises(DatasetError, match=str(index)):
        open_path("dali_tfrecord", root)


def test_wrong_format_is_refused(datasets):
    from storebench.formats import DatasetError

    with pytest.raises(DatasetError, match="reads tfrecord datasets"):
        open_path("dali_tfrecord", datasets[("rawfiles", "jpeg")])
