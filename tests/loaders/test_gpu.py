"""CPU-only behaviour of the feeder and the emulated accelerator.

The emulated accelerator keeps its own clock, so compute seconds are exact and the AU
accounting (compute + waiting for data + host copy + host overhead = wall) is an identity;
what depends on the machine's speed is only which of those terms the idle time lands in.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from feed_batches import make_batches, reusing_source

from storebench.loaders import (
    AcceleratorUnavailableError,
    EmulatedAccelerator,
    GpuFeeder,
    run_feed,
)
from storebench.loaders.gpu import _DeviceClock

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


class VirtualClock:
    """Time that passes only in sleeps: the host's own work takes none, so a feed's
    accounting is checked exactly, whatever the machine's speed or stalls."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


@pytest.fixture
def virtual_clock(monkeypatch) -> VirtualClock:
    """``storebench.loaders.gpu`` on a ``VirtualClock``."""
    import storebench.loaders.gpu as gpu

    clock = VirtualClock()
    monkeypatch.setattr(gpu, "time", clock)
    return clock


@needs_no_cuda
@pytest.mark.parametrize("options", [{"pinned": True}, {"non_blocking": True}, {"device": "cuda"}])
def test_cuda_options_are_refused_with_a_clear_message(options):
    with pytest.raises(AcceleratorUnavailableError, match=r"need\(s\) a CUDA device.*is_available"):
        GpuFeeder(make_batches(1), **options)


@needs_no_cuda
def test_cpu_feeder_copies_every_batch_into_double_buffers():
    batches = make_batches(5, last=3)  # a short last batch
    feeder = GpuFeeder(batches)
    assert feeder.device.type == "cpu" and feeder.timing == "perf_counter"
    got = []
    for images, labels in feeder:
        assert isinstance(images, torch.Tensor)
        got.append((images.clone(), labels.clone(), images.data_ptr()))
    for (images, labels, _), batch in zip(got, batches, strict=True):
        np.testing.assert_array_equal(images.numpy(), batch.images)
        np.testing.assert_array_equal(labels.numpy(), batch.labels)
    assert len({ptr for *_, ptr in got}) == 2  # two buffers, alternating
    stats = feeder.stats()
    assert stats["batches"] == 6 and stats["bytes"] == sum(
        b.images.nbytes + b.labels.nbytes for b in batches
    )
    # No staging on the CPU: the whole copy is the one memcpy into the "device" buffer.
    assert stats["staging_seconds"] == 0.0
    assert stats["copy_seconds"] == stats["device_copy_seconds"] > 0


@needs_no_cuda
def test_device_tensor_keeps_its_bytes_after_the_loader_reuses_its_buffer():
    batches = make_batches(6)
    feeder = GpuFeeder(reusing_source(batches), device="cpu")
    previous = None
    for k, (images, labels) in enumerate(feeder):
        np.testing.assert_array_equal(images.numpy(), batches[k].images)
        np.testing.assert_array_equal(labels.numpy(), batches[k].labels)
        if previous is not None:
            # One batch back is in the other device buffer, untouched by this copy.
            np.testing.assert_array_equal(previous.numpy(), batches[k - 1].images)
        previous = images


def test_a_buffer_is_refilled_only_after_its_step_ended_and_copies_overlap_compute(
        virtual_clock):
    batches = make_batches(6)
    feeder = GpuFeeder(reusing_source(batches), device="cpu")
    clock = _DeviceClock()
    steps, fed_log = [], []
    step = 0.05
    for k, fed in enumerate(feeder._fed(wait_for_slot=clock.wait_for_slot)):
        np.testing.assert_array_equal(fed.images.numpy(), batches[k].images)
        np.testing.assert_array_equal(fed.labels.numpy(), batches[k].labels)
        assert fed.slot == k % 2
        steps.append(clock.launch(fed.slot, step, virtual_clock.perf_counter()))
        fed_log.append(fed)
    for k in range(2, len(batches)):
        assert fed_log[k].copy_started >= steps[k - 2][1]  # the buffer's last step had ended
        assert fed_log[k].copied <= steps[k - 1][1]  # ... while the other step still ran
        assert steps[k][0] == steps[k - 1][1]  # so the accelerator never idled
    for (_, end), (start, _) in zip(steps, steps[1:], strict=False):
        assert start >= end  # one step at a time


def test_au_accounting_when_the_source_is_slower_than_the_accelerator(virtual_clock):
    delay = 0.03

    def slow_source():
        for batch in make_batches(8):
            virtual_clock.sleep(delay)  # the data takes 3x the compute time
            yield batch

    accelerator = EmulatedAccelerator(0.01)
    fed = run_feed(GpuFeeder(slow_source(), device="cpu"), accelerator, warmup_batches=2)
    assert fed.batches == 6 and fed.samples == 48 and fed.device == "cpu"
    assert fed.compute_seconds == pytest.approx(6 * 0.01)
    assert fed.stall_seconds > 0 and fed.au < 0.5
    # Every idle moment is charged to one host activity: the terms add up to the wall.
    assert fed.compute_seconds + fed.stall_seconds == pytest.approx(fed.wall_seconds, rel=1e-9)
    total = fed.au + fed.wait_for_data_fraction + fed.host_copy_fraction
    assert total + fed.host_overhead_fraction == pytest.approx(1.0)
    # The accelerator waits (delay - compute) per batch, at least, and it is for the data.
    assert fed.wait_for_data_seconds >= fed.batches * (delay - 0.01) * 0.9
    assert fed.host_copy_seconds == 0.0 and fed.host_overhead_seconds == 0.0
    assert fed.transfer_bytes == 6 * (8 * 48 + 8 * 8)


def test_a_ready_source_keeps_the_accelerator_busy_and_the_host_never_waits_for_data(
        virtual_clock):
    batches = make_batches(8)
    accelerator = EmulatedAccelerator(0.05)
    fed = run_feed(GpuFeeder(batches, device="cpu"), accelerator, warmup_batches=2)
    assert fed.batches == 6 and fed.samples == 48
    # The host fetched and copied each batch while the previous step was computing.
    assert fed.wait_for_data_seconds == 0.0
    assert fed.host_copy_seconds == 0.0 and fed.host_overhead_seconds == 0.0
    assert fed.au == pytest.approx(1.0) and fed.compute_seconds == pytest.approx(0.3)
    assert fed.samples_per_second == pytest.approx(48 / 0.3)


def test_max_batches_stops_early_and_counts_only_measured_batches():
    accelerator = EmulatedAccelerator(0.0, seconds_per_sample=1e-4)
    fed = run_feed(GpuFeeder(make_batches(20), device="cpu"), accelerator, warmup_batches=3,
                   max_batches=4)
    assert fed.batches == 4 and fed.samples == 32
    assert fed.transfer_bytes == 4 * (8 * 48 + 8 * 8) and fed.transfer_seconds > 0
    assert fed.compute_seconds == pytest.approx(4 * 8 * 1e-4)


def test_batches_without_a_feeder_are_computed_in_place_one_step_at_a_time():
    asked = []

    def recording_source():
        for batch in make_batches(6):
            asked.append(time.perf_counter())
            yield batch

    fed = run_feed(recording_source(), EmulatedAccelerator(0.02), warmup_batches=1)
    assert fed.batches == 5 and fed.transfer_bytes == 0 and fed.host_copy_seconds == 0.0
    # The loader may reuse a batch's memory once asked again: each step ends first.
    assert all(b - a >= 0.02 for a, b in zip(asked, asked[1:], strict=False))
    assert fed.compute_seconds + fed.stall_seconds == pytest.approx(fed.wall_seconds, rel=1e-9)
    assert fed.au < 1.0


def test_emulated_accelerator_rates_and_errors():
    per_sample = EmulatedAccelerator.for_throughput(1000.0)
    assert per_sample.seconds_per_sample == pytest.approx(0.001)
    assert per_sample.step_seconds(10) == pytest.approx(0.01)
    assert EmulatedAccelerator(0.002, seconds_per_sample=0.001).step_seconds(3) == 0.005
    with pytest.raises(ValueError, match="seconds_per_batch=-1.0"):
        EmulatedAccelerator(-1.0)
    with pytest.raises(ValueError, match="seconds_per_sample=nan"):
        EmulatedAccelerator(0.0, seconds_per_sample=float("nan"))
    with pytest.raises(ValueError, match="only 2 batches.*warmup_batches=2"):
        run_feed(make_batches(2), EmulatedAccelerator(0.0), warmup_batches=2)



def test_read_ahead_batches_is_what_each_loader_may_hold_before_it_is_asked(memmap_raw):
    from torch.utils.data import DataLoader

    from storebench.loaders import (
        BatchSampler,
        LazyDataset,
        ProcessPrefetcher,
        SequentialSampler,
        ThreadPrefetcher,
        read_ahead_batches,
    )

    assert read_ahead_batches(iter(make_batches(3))) == 0
    assert read_ahead_batches(DataLoader(range(8), batch_size=2)) == 0
    assert read_ahead_batches(DataLoader(range(8), batch_size=2, num_workers=2,
                                         prefetch_factor=3)) == 6
    dataset = LazyDataset(memmap_raw)
    order = BatchSampler(SequentialSampler(len(dataset)), 8)
    with ThreadPrefetcher(dataset, order, workers=2) as loader:
        assert read_ahead_batches(loader) == loader.depth == 4
    with ProcessPrefetcher(dataset, order, workers=3, depth=5, start_method="fork") as loader:
        assert read_ahead_batches(loader) == 5
