"""SPDL: its pipeline (thread stages, or one multi-threaded subprocess) over our dataset and
sampler delivers exactly the sampler's order with the build's bytes, reshuffles per epoch,
and leaves no thread or process behind; spdl.io decodes close to simplejpeg."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from peer_support import children_left, damaged_memmap_copy

import data_gen
from storebench.bench.case import Case, Trial
from storebench.formats import DatasetError, build_dataset, open_dataset
from storebench.loaders import LazyDataset, SequentialSampler, ShuffleSampler
from storebench.loaders.paths import PathOptions, get_loader_path

pytestmark = [pytest.mark.peers, pytest.mark.timeout(180)]
pytest.importorskip("spdl.pipeline")
simplejpeg = pytest.importorskip("simplejpeg")
psutil = pytest.importorskip("psutil")

CI = data_gen.PROFILES["ci"]
PATHS = ("spdl", "spdl_io", "spdl_process")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("spdl")
    return {enc: build_dataset(CI.spec_for(enc), "memmap" if enc == "raw" else "lmdb", out,
                               workers=1).path for enc in ("raw", "jpeg")}


def needs(path: str) -> None:
    reason = get_loader_path(path).unavailable()
    if reason:
        pytest.skip(reason)


def open_path(path, dataset, sampler, **options):
    options = {"batch_size": 40, "workers": 2, "seed": 0, "decode": "simplejpeg", **options}
    return get_loader_path(path).open(dataset, sampler, PathOptions(**options))


def serial_epoch(reader, order: np.ndarray, decode: str | None):
    """Our serial read of ``order``: what every SPDL epoch must equal."""
    with LazyDataset(reader, decode=decode) as dataset:
        return [dataset[int(i)] for i in order]


def thread_ids() -> set[int]:
    return {thread.id for thread in psutil.Process().threads()}


def threads_left(started: set[int], seconds: float = 5.0) -> set[int]:
    deadline = time.monotonic() + seconds
    while (left := started & thread_ids()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize("path", ["spdl", "spdl_process"])
@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_epochs_are_the_samplers_order_with_the_builds_bytes(datasets, path, encoding):
    spec = CI.spec_for(encoding)
    decode = None if encoding == "raw" else "simplejpeg"
    before_threads = thread_ids()
    with open_dataset(datasets[encoding]) as reader:
        dataset = LazyDataset(reader, decode=decode)
        sampler = ShuffleSampler(len(reader), seed=5)
        batches, close = open_path(path, dataset, sampler, decode=decode)
        orders = []
        try:
            for number in (0, 1):
                sampler.set_epoch(number)
                wanted_order = sampler.indices()
                seen = list(batches)
                order = np.concatenate([b.indices for b in seen])
                np.testing.assert_array_equal(order, wanted_order)
                n = spec.num_samples
                assert [len(b) for b in seen] == [40] * (n // 40) + ([n % 40] if n % 40 else [])
                images = np.concatenate([b.images for b in seen])
                labels = np.concatenate([b.labels for b in seen])
                want = serial_epoch(reader, order, decode)
                assert labels.tolist() == [label for _, label in want]
                np.testing.assert_array_equal(images, np.stack([image for image, _ in want]))
                orders.append(order)
        finally:
            close()
    assert not np.array_equal(orders[0], orders[1])
    assert not children_left()
    assert not threads_left(thread_ids() - before_threads)


def test_spdl_io_decodes_within_the_tolerance_of_simplejpeg(datasets):
    """spdl.io decodes with FFmpeg: the same shapes, labels and order, pixels close to
    simplejpeg's (``DECODER_TOLERANCE``), never equal by accident of an unread image."""
    from storebench.studies.peers.cases import DECODER_TOLERANCE

    needs("spdl_io")
    tolerance = DECODER_TOLERANCE[get_loader_path("spdl_io").decode]
    with open_dataset(datasets["jpeg"]) as reader:
        dataset = LazyDataset(reader, decode="simplejpeg")
        batches, close = open_path("spdl_io", dataset, SequentialSampler(len(reader)))
        try:
            seen = list(batches)
        finally:
            close()
        order = np.concatenate([b.indices for b in seen])
        np.testing.assert_array_equal(order, np.arange(len(reader)))
        want = serial_epoch(reader, order, "simplejpeg")
    images = np.concatenate([b.images for b in seen]).astype(np.int16)
    reference = np.stack([image for image, _ in want]).astype(np.int16)
    assert images.shape == reference.shape
    per_image = np.abs(images - reference).reshape(len(order), -1).mean(axis=1)
    assert per_image.max() <= tolerance
    assert per_image.mean() > 0  # FFmpeg's own decode, not simplejpeg's
    assert [int(x) for b in seen for x in b.labels] == [label for _, label in want]


@pytest.mark.parametrize("path", PATHS)
def test_close_mid_epoch_ends_threads_and_subprocess(datasets, path):
    needs(path)
    before_threads, before_children = thread_ids(), frozenset(
        c.pid for c in psutil.Process().children(recursive=True))
    with open_dataset(datasets["jpeg"]) as reader:
        dataset = LazyDataset(reader, decode="simplejpeg")
        batches, close = open_path(path, dataset, ShuffleSampler(len(reader), seed=1),
                                   batch_size=8)
        iterator = iter(batches)
        batch = next(iterator)
        assert len(batch) == 8
        if path == "spdl_process":
            assert children_left(0, before=before_children)
        else:
            assert thread_ids() - before_threads  # the pipeline's own threads
        close()
        del iterator
    assert not children_left(before=before_children)
    assert not threads_left(thread_ids() - before_threads)


@pytest.mark.parametrize("path", ["spdl", "spdl_process"])
def test_a_damaged_file_is_the_readers_error_naming_it(datasets, tmp_path, path):
    """A sample damaged after the build: our reader's DatasetError, naming the file, reaches
    the training loop through SPDL's stages (and out of its subprocess)."""
    root, images = damaged_memmap_copy(datasets["raw"], tmp_path / "memmap-raw")
    with open_dataset(root, verify=True) as reader:
        batches, close = open_path(path, LazyDataset(reader), SequentialSampler(len(reader)),
                                   decode=None)
        try:
            with pytest.raises(DatasetError, match=str(images)):
                list(batches)
        finally:
            close()
    assert not children_left()


def test_the_peers_case_checks_spdl_epochs(datasets):
    """The peers study's case runs each SPDL path, with its exactness checks, to a row."""
    from storebench.studies.peers.cases import peer_epochs_case

    for path in PATHS:
        if get_loader_path(path).unavailable():
            continue
        case = Case(study="peers", function="x:y", format="lmdb", encoding="jpeg",
                    dataset=str(datasets["jpeg"]), loader="lazy", prefetcher=path, workers=2,
                    batch_size=64, access="shuffle", warmup=False,
                    params={"decode": "simplejpeg", "environment": "peers",
                            "later_epochs_min_s": 0.0})
        trial = Trial(case, repeat=0)
        metrics = peer_epochs_case(case, trial)
        assert metrics["samples"][0] == CI.spec_for("jpeg").num_samples
        assert metrics["later_epochs"][0] >= 1


@pytest.mark.parametrize("path", ["spdl", "spdl_process"])
def test_an_epoch_after_one_left_unfinished_is_whole_and_the_next_epochs(datasets, path):
    """A ``break`` mid-epoch, then a new pass: the next epoch's order, every sample once,
    nothing left over from the abandoned epoch."""
    with open_dataset(datasets["raw"]) as reader:
        sampler = ShuffleSampler(len(reader), seed=9)
        batches, close = open_path(path, LazyDataset(reader), sampler, decode=None,
                                   batch_size=16)
        try:
            first = next(iter(batches))
            sampler.set_epoch(0)
            np.testing.assert_array_equal(first.indices, sampler.indices()[:16])
            order = np.concatenate([b.indices for b in batches])
        finally:
            close()
        sampler.set_epoch(1)
        np.testing.assert_array_equal(order, sampler.indices())
    assert not children_left()
