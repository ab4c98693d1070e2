"""Process-tree memory and CPU accounting."""

from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np
import pytest

from storebench.bench.metrics import (
    MAX_SAMPLER_DUTY,
    PeakMemorySampler,
    RegionMeasurement,
    process_memory,
    sampler_wait,
    tree_memory,
    tree_pids,
)

MIB = 1 << 20


def _hold_memory(nbytes: int, ready, release) -> None:
    block = np.ones(nbytes, dtype=np.uint8)  # touched: private, resident
    ready.set()
    release.wait(60)
    del block


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_memory_of_children_counts_in_the_tree(method):
    context = multiprocessing.get_context(method)
    ready = [context.Event() for _ in range(2)]
    release = context.Event()
    children = [context.Process(target=_hold_memory, args=(64 * MIB, r, release))
                for r in ready]
    for child in children:
        child.start()
    try:
        for r in ready:
            assert r.wait(30)
        pids = tree_pids(os.getpid())
        assert {c.pid for c in children} <= set(pids)
        whole = tree_memory(os.getpid())
        own = process_memory(os.getpid())
        # Both children's 64 MiB are private to them: the tree has at least 128 MiB more USS.
        assert whole.uss_bytes - own[1] >= 2 * 64 * MIB * 0.95
        assert whole.pss_bytes >= whole.uss_bytes
        assert whole.processes >= 3
    finally:
        release.set()
        for child in children:
            child.join(30)


def test_peak_is_kept_after_memory_is_freed():
    with PeakMemorySampler(interval=0.01) as sampler:
        before = tree_memory(os.getpid()).uss_bytes
        block = np.ones(200 * MIB, dtype=np.uint8)
        sampler._sample()  # also sampled by the thread; this makes the test deterministic
        del block
    after = tree_memory(os.getpid()).uss_bytes
    assert sampler.peak_uss_bytes >= before + 190 * MIB
    assert after < sampler.peak_uss_bytes - 150 * MIB
    assert sampler._thread is None


def test_gone_process_has_no_memory():
    process = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    process.start()
    process.join()
    assert process_memory(process.pid) is None
    assert tree_pids(process.pid) == []


def test_measurement_counts_cpu_of_finished_children_and_reports_metrics():
    context = multiprocessing.get_context("spawn")
    with RegionMeasurement(interval=0.01) as measurement:
        child = context.Process(target=sum, args=(range(3_000_000),))
        child.start()
        child.join()
    metrics = measurement.metrics()
    assert set(metrics) == {"wall_seconds", "cpu_seconds", "cpu_user_seconds",
                            "cpu_system_seconds", "peak_pss_bytes", "peak_uss_bytes",
                            "peak_memory_sample_gap_s", "kernel_peak_bytes",
                            "kernel_peak_from_cgroup", "peak_memory_reliable"}
    gap, unit = metrics["peak_memory_sample_gap_s"]
    assert unit == "s" and gap >= 0.01  # never closer than the interval
    assert metrics["cpu_seconds"][0] == pytest.approx(
        metrics["cpu_user_seconds"][0] + metrics["cpu_system_seconds"][0])
    # The spawned child's interpreter start-up alone takes CPU; it was reaped inside.
    assert metrics["cpu_seconds"][0] > 0
    assert metrics["peak_pss_bytes"][1] == "bytes"


def test_a_costly_sample_stretches_the_wait_to_bound_the_sampler_duty():
    assert sampler_wait(0.05, 0.001) == 0.05
    assert sampler_wait(0.05, 0.011) == pytest.approx(0.011 / MAX_SAMPLER_DUTY)
    assert sampler_wait(0.05, 0.011, max_duty=0.5) == 0.05


def test_sampler_spends_at_most_its_duty_on_slow_samples(monkeypatch):
    """Samples that take 30 ms each: waits of 0.6 s between them, not the 1 ms interval (a
    slower machine only spreads them further apart)."""
    sampler = PeakMemorySampler(interval=0.001)
    real_sample = sampler._sample

    def slow_sample():
        time.sleep(0.03)
        real_sample()

    monkeypatch.setattr(sampler, "_sample", slow_sample)
    with sampler:
        time.sleep(0.5)
    assert 2 <= sampler.samples <= 4  # start, stop, and the one after the first 1 ms wait
    assert sampler.longest_wait >= 0.03 / MAX_SAMPLER_DUTY


def test_metrics_before_the_block_ends_are_refused():
    with pytest.raises(RuntimeError, match="before the measured block finished"):
        RegionMeasurement().metrics()
    with pytest.raises(ValueError, match="interval"):
        PeakMemorySampler(interval=0)
