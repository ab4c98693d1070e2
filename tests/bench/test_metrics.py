"""Process-tree memory and CPU accounting."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

from storebench.bench.metrics import (
    PeakMemorySampler,
    RegionMeasurement,
    process_memory,
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
                            "cpu_system_seconds", "peak_pss_bytes", "peak_uss_bytes"}
    assert metrics["cpu_seconds"][0] == pytest.approx(
        metrics["cpu_user_seconds"][0] + metrics["cpu_system_seconds"][0])
    # The spawned child's interpreter start-up alone takes CPU; it was reaped inside.
    assert metrics["cpu_seconds"][0] > 0
    assert metrics["peak_pss_bytes"][1] == "bytes"


def test_metrics_before_the_block_ends_are_refused():
    with pytest.raises(RuntimeError, match="before the measured block finished"):
        RegionMeasurement().metrics()
    with pytest.raises(ValueError, match="interval"):
        PeakMemorySampler(interval=0)
