"""The same samples through torch DataLoader and tf.data as through the plain dataset."""

from __future__ import annotations

import numpy as np
import pytest

from storebench.formats import open_dataset
from storebench.loaders import (
    AcceleratorUnavailableError,
    BatchSampler,
    LazyDataset,
    SequentialSampler,
    ShuffleSampler,
)


def serial(dataset, batches):
    return [(b.images.copy(), b.labels.copy()) for b in (dataset.get_batch(i) for i in batches)]


def assert_same(got, want):
    assert len(got) == len(want)
    for (gi, gl), (wi, wl) in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(gi), wi)
        np.testing.assert_array_equal(np.asarray(gl), wl)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_torch_dataloader_yields_the_sampler_order(memmap_raw, num_workers):
    import torch

    from storebench.loaders.torch_adapter import torch_dataloader

    dataset = LazyDataset(memmap_raw)
    sampler = ShuffleSampler(len(dataset), seed=4)
    options = (
        {"persistent_workers": True, "prefetch_factor": 3, "multiprocessing_context": "fork"}
        if num_workers
        else {}
    )
    loader = torch_dataloader(
        dataset, batch_size=40, sampler=sampler, num_workers=num_workers, **options
    )
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        got = [(images.numpy().copy(), labels.numpy().copy()) for images, labels in loader]
        assert all(isinstance(images, torch.Tensor) for images, _ in loader)
        assert_same(got, serial(dataset, BatchSampler(sampler, 40)))
    assert len(loader) == 13


def test_torch_dataloader_refuses_pinning_without_cuda(memmap_raw):
    import torch

    from storebench.loaders.torch_adapter import torch_dataloader

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(AcceleratorUnavailableError, match="pin_memory=True needs a CUDA"):
        torch_dataloader(LazyDataset(memmap_raw), batch_size=8, pin_memory=True)


def test_tfrecord_pipeline_in_file_order_matches_the_reader(build_ci):
    import tensorflow as tf

    from storebench.loaders.tf_adapter import tfrecord_pipeline

    root = build_ci("tfrecord", "raw")
    with open_dataset(root) as reader:
        dataset = LazyDataset(reader)
        want = serial(dataset, BatchSampler(SequentialSampler(len(reader)), 100))
        pipeline = tfrecord_pipeline(root, batch_size=100)
        got = [(images.numpy(), labels.numpy()) for images, labels in pipeline]
        assert got[0][0].dtype == np.uint8 and got[0][1].dtype == np.int64
        assert_same(got, want)
        shuffled = tfrecord_pipeline(
            root, batch_size=64, shuffle_buffer=128, cache=True, seed=3, deterministic=False
        )
        labels = np.concatenate([b[1].numpy() for b in shuffled])
        images = np.concatenate([b[0].numpy() for b in shuffled])
        assert labels.tolist() != want_labels(want)
        key = np.lexsort(images.reshape(len(images), -1).T)
        all_images = np.concatenate([w[0] for w in want])
        ref = np.lexsort(all_images.reshape(len(all_images), -1).T)
        np.testing.assert_array_equal(images[key], all_images[ref])  # a permutation
        assert isinstance(pipeline, tf.data.Dataset)


def want_labels(want):
    return np.concatenate([w[1] for w in want]).tolist()


@pytest.mark.parametrize("encoding", ["jpeg", "png"])
def test_tfrecord_pipeline_decodes_to_the_same_pixels_as_our_decoders(build_ci, encoding):
    from storebench.loaders.tf_adapter import tfrecord_pipeline

    root = build_ci("tfrecord", encoding)
    with open_dataset(root) as reader:
        order = BatchSampler(SequentialSampler(len(reader)), 100)
        want = serial(LazyDataset(reader, decode="pil"), order)
        if encoding == "jpeg":
            assert_same(serial(LazyDataset(reader, decode="simplejpeg"), order), want)
        got = [(i.numpy(), lab.numpy()) for i, lab in tfrecord_pipeline(root, batch_size=100)]
        assert_same(got, want)


def test_generator_dataset_matches_the_reader(memmap_raw):
    from storebench.loaders.tf_adapter import gil_bound_generator_dataset

    dataset = LazyDataset(memmap_raw)
    order = BatchSampler(ShuffleSampler(len(dataset), seed=2), 100)
    got = [(i.numpy(), lab.numpy()) for i, lab in gil_bound_generator_dataset(dataset, order)]
    assert_same(got, serial(dataset, order))
