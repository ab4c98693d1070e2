"""The feeder's CUDA copies: exact bytes on the device in every copy mode, and a device buffer
never refilled while work the consumer queued still reads it.

These run only where torch sees a CUDA device; without one every test is skipped with that
reason (``tests/loaders/test_gpu.py`` covers the CPU feeder and the refusals).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from feed_batches import make_batches as tiny_batches
from feed_batches import reusing_source

from storebench.loaders import (
    AcceleratorUnavailableError,
    EmulatedAccelerator,
    GpuFeeder,
    run_feed,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device: torch.cuda.is_available() is False on this machine",
)

# Batches of 64 samples of 32x32x3: copies long enough to overlap with a consumer's step.
make_batches = functools.partial(tiny_batches, size=64, image_shape=(32, 32, 3))
COPY_MODES = {
    "pageable": {},
    "pinned": {"pinned": True},
    "pinned-async": {"pinned": True, "non_blocking": True},
}
# About 10 ms of GPU time per consumer step (torch.cuda._sleep spins for this many cycles):
# long enough that a copy not ordered after the step would land while the step still reads.
CONSUMER_SPIN_CYCLES = 20_000_000


@pytest.mark.parametrize("mode", COPY_MODES)
def test_every_copy_mode_lands_each_batchs_exact_bytes_in_alternating_device_buffers(mode):
    batches = make_batches(5, last=17)
    feeder = GpuFeeder(reusing_source(batches), device="cuda", **COPY_MODES[mode])
    assert feeder.uses_cuda and feeder.timing == "cuda-events"
    pointers = []
    for k, (images, labels) in enumerate(feeder):
        assert images.device.type == "cuda" and labels.device.type == "cuda"
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        np.testing.assert_array_equal(images.cpu().numpy(), batches[k].images)
        np.testing.assert_array_equal(labels.cpu().numpy(), batches[k].labels)
        pointers.append(images.data_ptr())
    assert len(pointers) == len(batches)
    assert pointers[0::2] == [pointers[0]] * 3 and pointers[1::2] == [pointers[1]] * 3
    assert pointers[0] != pointers[1]
    stats = feeder.stats()
    assert stats["batches"] == 6
    assert stats["bytes"] == sum(b.images.nbytes + b.labels.nbytes for b in batches)
    assert stats["device"].startswith("cuda") and stats["device_copy_seconds"] > 0
    # A pinned copy's host staging is part of its copy time; a pageable one has none.
    assert (stats["staging_seconds"] > 0) == ("pinned" in COPY_MODES[mode])
    assert stats["copy_seconds"] == pytest.approx(
        stats["staging_seconds"] + stats["device_copy_seconds"])


@pytest.mark.parametrize("mode", COPY_MODES)
def test_a_device_buffer_is_not_refilled_while_the_consumers_queued_step_reads_it(mode):
    """The consumer queues a slow step on the compute stream and then reads the batch; the
    host asks for the next batches at once. A copy that did not wait for the step (the
    feeder's ``released`` events) would overwrite the buffer before the read."""
    batches = make_batches(8)
    feeder = GpuFeeder(reusing_source(batches), device="cuda", **COPY_MODES[mode])
    seen = []
    for images, labels in feeder:
        torch.cuda._sleep(CONSUMER_SPIN_CYCLES)
        seen.append((images.clone(), labels.clone()))  # queued behind the spin
    torch.cuda.synchronize()
    for (images, labels), batch in zip(seen, batches, strict=True):
        np.testing.assert_array_equal(images.cpu().numpy(), batch.images)
        np.testing.assert_array_equal(labels.cpu().numpy(), batch.labels)


def reusing_pinned_source(batches):
    """As ``reusing_source``, through two page-locked torch tensors: a batch the feeder
    reads in place is scribbled over as soon as the next one is asked for."""
    images = torch.empty(batches[0].images.shape, dtype=torch.uint8).pin_memory()
    labels = torch.empty(len(batches[0]), dtype=torch.int64).pin_memory()
    for batch in batches:
        n = len(batch)
        images[:n].copy_(torch.from_numpy(batch.images))
        labels[:n].copy_(torch.from_numpy(batch.labels))
        yield images[:n], labels[:n]
        images.fill_(0)
        labels.fill_(-1)


@pytest.mark.parametrize("mode", ["pinned", "pinned-async"])
def test_a_page_locked_batch_is_read_in_place_before_the_loader_reuses_it(mode):
    batches = make_batches(6, last=9)
    feeder = GpuFeeder(reusing_pinned_source(batches), device="cuda", **COPY_MODES[mode])
    seen = []
    for images, labels in feeder:
        torch.cuda._sleep(CONSUMER_SPIN_CYCLES)  # the copies queue behind a slow step
        seen.append((images.clone(), labels.clone()))
    torch.cuda.synchronize()
    for (images, labels), batch in zip(seen, batches, strict=True):
        np.testing.assert_array_equal(images.cpu().numpy(), batch.images)
        np.testing.assert_array_equal(labels.cpu().numpy(), batch.labels)
    stats = feeder.stats()
    assert stats["staging_seconds"] == 0.0 and stats["device_copy_seconds"] > 0
    assert stats["bytes"] == sum(b.images.nbytes + b.labels.nbytes for b in batches)


def test_buffers_grow_for_a_larger_batch_without_disturbing_the_batch_in_hand():
    small, large = make_batches(2, size=16), make_batches(2, size=96)
    feeder = GpuFeeder(small + large, device="cuda", pinned=True, non_blocking=True)
    got = [(images.clone(), labels.clone()) for images, labels in feeder]
    torch.cuda.synchronize()
    for (images, labels), batch in zip(got, small + large, strict=True):
        np.testing.assert_array_equal(images.cpu().numpy(), batch.images)
        np.testing.assert_array_equal(labels.cpu().numpy(), batch.labels)


@pytest.mark.parametrize("mode", COPY_MODES)
def test_run_feed_on_cuda_charges_every_idle_moment_and_counts_every_byte(mode):
    batches = make_batches(10)
    accelerator = EmulatedAccelerator(0.005)
    fed = run_feed(GpuFeeder(batches, device="cuda", **COPY_MODES[mode]), accelerator,
                   warmup_batches=2)
    assert fed.device.startswith("cuda") and fed.batches == 8 and fed.samples == 8 * 64
    assert fed.compute_seconds == pytest.approx(8 * 0.005)
    assert fed.compute_seconds + fed.stall_seconds == pytest.approx(fed.wall_seconds, rel=1e-9)
    assert fed.transfer_bytes == sum(b.images.nbytes + b.labels.nbytes for b in batches[2:])
    assert fed.transfer_seconds > 0 and fed.transfer_bytes_per_second > 0


def test_cuda_copy_options_are_refused_for_a_cpu_device_on_a_cuda_machine():
    with pytest.raises(AcceleratorUnavailableError,
                       match=r"pinned=True, non_blocking=True only apply to copies to a "
                             r"CUDA device, not cpu"):
        GpuFeeder(make_batches(1), device="cpu", pinned=True, non_blocking=True)


@pytest.mark.timeout(120)
def test_a_pinned_dataloaders_batches_reach_the_device_in_sampler_order(memmap_raw):
    """``torch_dataloader(pin_memory=True)``: every batch is page-locked, and the feeder
    copies the DataLoader's tensors to the device byte for byte, in the sampler's order."""
    from storebench.loaders import LazyDataset, ShuffleSampler
    from storebench.loaders.torch_adapter import torch_dataloader

    dataset = LazyDataset(memmap_raw)
    sampler = ShuffleSampler(len(dataset), seed=11)
    loader = torch_dataloader(dataset, batch_size=48, sampler=sampler, num_workers=2,
                              multiprocessing_context="spawn", pin_memory=True)
    order = np.concatenate([np.asarray(b) for b in loader.batch_sampler])
    pinned = []

    def recording(batches):
        for images, labels in batches:
            pinned.append(images.is_pinned() and labels.is_pinned())
            yield images, labels

    feeder = GpuFeeder(recording(loader), device="cuda", pinned=True, non_blocking=True)
    got = [(images.cpu().numpy(), labels.cpu().numpy()) for images, labels in feeder]
    assert pinned and all(pinned)
    assert feeder.stats()["staging_seconds"] == 0.0  # read in place, never staged
    assert sum(len(labels) for _, labels in got) == len(dataset) == len(order)
    start = 0
    for images, labels in got:
        want = dataset.get_batch(order[start:start + len(labels)])
        np.testing.assert_array_equal(images, want.images)
        np.testing.assert_array_equal(labels, want.labels)
        start += len(labels)


def _prefetcher(kind: str, dataset, batches):
    from storebench.loaders import ProcessPrefetcher, ThreadPrefetcher

    if kind == "process":
        return ProcessPrefetcher(dataset, batches, workers=2, start_method="fork",
                                 pin_memory=True)
    return ThreadPrefetcher(dataset, batches, workers=2, pin_memory=True)


def _page_locked(batch) -> bool:
    """The batch's images lie in page-locked memory (a thread prefetcher's labels come from
    the dataset in arrays of their own, and are copied from there)."""
    return torch.from_numpy(batch.images).is_pinned()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("mode", ["pinned", "pinned-async"])
def test_a_prefetcher_with_pinned_slots_has_each_batch_copied_where_it_lies(
        memmap_raw, kind, mode):
    """``pin_memory=True``: every batch arrives in page-locked memory and the feeder copies
    it from there, with no staging copy, byte for byte in the sampler's order, while the
    consumer queues slow steps (a copy not finished before the slot is refilled would land
    a later batch's bytes). A pass left early lets go of the locks and the next pass takes
    them again; closing lets go of them, and the last batch stays readable."""
    from storebench.loaders import BatchSampler, LazyDataset, ShuffleSampler

    dataset = LazyDataset(memmap_raw)
    batches = BatchSampler(ShuffleSampler(len(dataset), seed=5), 48)  # 512: a short last one
    order = np.concatenate([np.asarray(b) for b in batches])
    loader = _prefetcher(kind, dataset, batches)
    try:
        for first in loader:  # a pass left early
            assert _page_locked(first)
            break
        assert not _page_locked(first)  # its workers stopped, and its locks went with them
        locked, kept = [], []

        def recording(source):
            for batch in source:
                locked.append(_page_locked(batch))
                kept.append(batch)
                yield batch

        feeder = GpuFeeder(recording(loader), device="cuda", **COPY_MODES[mode])
        seen = []
        for images, labels in feeder:
            torch.cuda._sleep(CONSUMER_SPIN_CYCLES)
            seen.append((images.clone(), labels.clone()))
        torch.cuda.synchronize()
    finally:
        loader.close()
    assert locked and all(locked)
    assert feeder.stats()["staging_seconds"] == 0.0 and feeder.stats()["device_copy_seconds"] > 0
    start = 0
    for images, labels in seen:
        want = dataset.get_batch(order[start:start + len(labels)])
        np.testing.assert_array_equal(images.cpu().numpy(), want.images)
        np.testing.assert_array_equal(labels.cpu().numpy(), want.labels)
        start += len(labels)
    assert start == len(order)
    last = kept[-1]
    assert not _page_locked(last)  # closed: the locks are gone, the memory is not
    np.testing.assert_array_equal(last.images, dataset.get_batch(order[-len(last):]).images)


def test_a_pageable_batch_is_still_staged_when_the_feeder_copies_pinned():
    """Batches from unlocked memory (a prefetcher without pin_memory) go through the
    feeder's own staging buffer: the in-place branch is only for page-locked memory."""
    batches = make_batches(3)
    feeder = GpuFeeder(reusing_source(batches), device="cuda", pinned=True)
    for _ in feeder:
        pass
    assert feeder.stats()["staging_seconds"] > 0
