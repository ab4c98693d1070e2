"""CPU-only behaviour of the feeder and the emulated accelerator."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from storebench.loaders import (
    AcceleratorUnavailableError,
    Batch,
    EmulatedAccelerator,
    GpuFeeder,
    run_feed,
)

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def make_batches(count: int, size: int = 8):
    rng = np.random.default_rng(0)
    return [
        Batch(
            rng.integers(0, 255, (size, 4, 4, 3), dtype=np.uint8),
            np.arange(size, dtype=np.int64) + k,
            np.arange(size),
        )
        for k in range(count)
    ]


@needs_no_cuda
@pytest.mark.parametrize("options", [{"pinned": True}, {"non_blocking": True}, {"device": "cuda"}])
def test_cuda_options_are_refused_with_a_clear_message(options):
    with pytest.raises(AcceleratorUnavailableError, match=r"need\(s\) a CUDA device.*is_available"):
        GpuFeeder(make_batches(1), **options)


@needs_no_cuda
def test_cpu_feeder_copies_every_batch_into_double_buffers():
    batches = make_batches(5) + [make_batches(1, size=3)[0]]  # a short last batch
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


def test_au_is_near_one_when_data_is_ready_and_low_when_starved():
    accelerator = EmulatedAccelerator(0.01)
    fed = run_feed(make_batches(12), accelerator, warmup_batches=2)
    assert fed.emulated and fed.accelerator == "emulated (sleep)"
    assert fed.batches == 10 and fed.samples == 80
    assert 0.5 < fed.au <= 1.0 and fed.stall_fraction < 0.5

    def slow_source():
        for batch in make_batches(8):
            time.sleep(0.04)  # data takes 4x the compute time
            yield batch

    starved = run_feed(slow_source(), accelerator, warmup_batches=1)
    assert starved.au < 0.5 < starved.stall_fraction
    assert starved.au + starved.stall_fraction <= 1.0 + 1e-6


def test_emulated_accelerator_modes_and_rates():
    busy = EmulatedAccelerator(0.002, busy_wait=True)
    assert busy.step(10) >= 0.002 and busy.description == "emulated (busy-wait)"
    per_sample = EmulatedAccelerator.for_throughput(1000.0)
    assert per_sample.seconds_per_sample == pytest.approx(0.001)
    with pytest.raises(ValueError):
        EmulatedAccelerator(-1.0)
    with pytest.raises(ValueError, match="warmup"):
        run_feed(make_batches(2), EmulatedAccelerator(0.0), warmup_batches=2)
