"""torchdata's StatefulDataLoader: our dataset and sampler through it deliver every sample once
per epoch, a state_dict taken mid-epoch resumes the epoch in a new loader, close ends the
workers, damage is the reader's error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from peer_support import children_left, damaged_memmap_copy, worker_children

import data_gen
from storebench.formats import DatasetError, build_dataset, open_dataset
from storebench.loaders import LazyDataset, SequentialSampler, ShuffleSampler
from storebench.loaders.paths import PathOptions, get_loader_path

pytestmark = [pytest.mark.peers, pytest.mark.timeout(120)]
pytest.importorskip("torchdata")
simplejpeg = pytest.importorskip("simplejpeg")

CI = data_gen.PROFILES["ci"]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("torchdata")
    return {enc: build_dataset(CI.spec_for(enc), "memmap" if enc == "raw" else "lmdb", out,
                               workers=1).path for enc in ("raw", "jpeg")}


@pytest.fixture
def dataset(request, datasets):
    """A LazyDataset over the ci set of ``request.param`` (jpeg decoded with simplejpeg)."""
    encoding = request.param
    with open_dataset(datasets[encoding]) as reader:
        yield LazyDataset(reader, decode=None if encoding == "raw" else "simplejpeg")


def open_path(dataset, sampler, **options):
    options = {"batch_size": 40, "workers": 2, "start_method": "fork", "seed": 0, **options}
    return get_loader_path("torchdata").open(dataset, sampler, PathOptions(**options))


def expected_image(spec, index: int) -> np.ndarray:
    image, _ = data_gen.sample(spec, index)
    return image if spec.encoding == "raw" else simplejpeg.decode_jpeg(image, colorspace="RGB")


@pytest.mark.parametrize("dataset", ["raw", "jpeg"], indirect=True)
@pytest.mark.parametrize("workers", [0, 2])
def test_epochs_follow_the_sampler_with_the_builds_labels_and_pixels(dataset, workers):
    spec = CI.spec_for("raw" if dataset.reader.is_raw else "jpeg")
    n = spec.num_samples
    sampler = ShuffleSampler(n, seed=5)
    batches, close = open_path(dataset, sampler, workers=workers)
    try:
        orders = []
        for number in (0, 1):
            sampler.set_epoch(number)
            seen = list(batches)
            order = np.concatenate([b.indices for b in seen])
            np.testing.assert_array_equal(order, sampler.indices())  # exactly the sampler's
            assert [len(b) for b in seen] == [40] * (n // 40) + ([n % 40] if n % 40 else [])
            for batch in seen:
                assert isinstance(batch.images, np.ndarray) and batch.images.dtype == np.uint8
                assert batch.labels.dtype == np.int64 and batch.indices.dtype == np.int64
                for image, label, index in zip(batch.images, batch.labels, batch.indices):
                    assert label == data_gen.sample(spec, int(index))[1]
                    np.testing.assert_array_equal(image, expected_image(spec, int(index)))
            orders.append(order)
        assert not np.array_equal(orders[0], orders[1])
    finally:
        close()
    assert not children_left()


@pytest.mark.parametrize("dataset", ["jpeg"], indirect=True)
def test_unshuffled_epoch_is_in_stored_order(dataset):
    batches, close = open_path(dataset, SequentialSampler(len(dataset)), workers=0)
    order = np.concatenate([b.indices for b in batches])
    np.testing.assert_array_equal(order, np.arange(len(dataset)))
    assert close() is None


@pytest.mark.parametrize("dataset", ["raw"], indirect=True)
@pytest.mark.parametrize("workers", [0, 2])
def test_state_dict_mid_epoch_resumes_the_epoch_in_a_new_loader(dataset, workers):
    n = len(dataset)
    sampler = ShuffleSampler(n, seed=9)
    sampler.set_epoch(3)
    first, close_first = open_path(dataset, sampler, workers=workers)
    before = []
    try:
        for batch in first:
            before.append(batch.indices.copy())
            if len(before) == 5:
                break
        state = first.state_dict()
    finally:
        close_first()
    assert not children_left()

    second, close_second = open_path(dataset, sampler, workers=workers)
    try:
        second.load_state_dict(state)
        after = [batch.indices.copy() for batch in second]
        # A resumed loader's next epoch is a whole one again.
        again = np.concatenate([batch.indices for batch in second])
    finally:
        close_second()
    assert not children_left()
    head, tail = np.concatenate(before), np.concatenate(after)
    assert len(head) == 5 * 40 and len(tail) == n - 5 * 40
    np.testing.assert_array_equal(np.concatenate([head, tail]), sampler.indices())
    np.testing.assert_array_equal(np.sort(again), np.arange(n))


@pytest.mark.parametrize("dataset", ["raw"], indirect=True)
def test_spawned_workers_deliver_the_epoch(dataset):
    batches, close = open_path(dataset, ShuffleSampler(len(dataset), seed=2), workers=2,
                               start_method="spawn", batch_size=128)
    try:
        order = np.concatenate([b.indices for b in batches])
        np.testing.assert_array_equal(np.sort(order), np.arange(len(dataset)))
    finally:
        close()
    assert not children_left()


@pytest.mark.parametrize("dataset", ["jpeg"], indirect=True)
def test_close_ends_the_workers_of_an_unfinished_epoch(dataset):
    batches, close = open_path(dataset, ShuffleSampler(len(dataset), seed=1), workers=2)
    next(iter(batches))
    assert worker_children()  # the workers are up
    close()
    assert not children_left()


def test_damaged_file_is_the_readers_error_naming_it(datasets, tmp_path):
    root, images = damaged_memmap_copy(datasets["raw"], tmp_path / "memmap-raw")
    with open_dataset(root, verify=True) as reader:
        batches, close = open_path(LazyDataset(reader), SequentialSampler(len(reader)),
                                   workers=2)
        try:
            with pytest.raises(DatasetError, match=str(images)):
                list(batches)
        finally:
            close()
    assert not children_left()
