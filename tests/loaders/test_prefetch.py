from __future__ import annotations

import gc
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from storebench.formats import open_dataset
from storebench.loaders import (
    BaselineLockedListPrefetcher,
    BaselinePickledQueuePrefetcher,
    BatchSampler,
    LazyDataset,
    PreloadedDataset,
    ProcessPrefetcher,
    ShuffleSampler,
    ThreadPrefetcher,
    WorkerDiedError,
    WorkerError,
)

START_METHODS = ["fork", "spawn", "forkserver"]


class FailingDataset(LazyDataset):
    """Raises in get_batch for batches holding sample ``bad``."""

    def __init__(self, reader, bad: int) -> None:
        super().__init__(reader)
        self.bad = bad

    def get_batch(self, indices, *, out=None):
        if self.bad in np.asarray(indices):
            raise ValueError(f"boom at sample {self.bad}")
        return super().get_batch(indices, out=out)


class SlowDataset(LazyDataset):
    """Takes ``delay`` seconds per batch, so a consumer is reliably waiting."""

    def __init__(self, reader, delay: float) -> None:
        super().__init__(reader)
        self.delay = delay

    def get_batch(self, indices, *, out=None):
        time.sleep(self.delay)
        return super().get_batch(indices, out=out)


def halve(image):
    return image[::2, ::2]


def serial(dataset, batches):
    return [(b.images.copy(), b.labels.copy()) for b in (dataset.get_batch(i) for i in batches)]


def collected(loader):
    return [(np.array(b.images), np.array(b.labels)) for b in loader]


def assert_same(got, want):
    assert len(got) == len(want)
    for (gi, gl), (wi, wl) in zip(got, want, strict=True):
        np.testing.assert_array_equal(gi, wi)
        np.testing.assert_array_equal(gl, wl)


def our_children() -> set[int]:
    """Child processes, without multiprocessing's long-lived helpers (the resource tracker
    and the forkserver, started once per interpreter)."""
    pids = set()
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            cmdline = ""
        if "resource_tracker" in cmdline or "forkserver" in cmdline:
            continue
        pids.add(child.pid)
    return pids


def segment_exists(name: str) -> bool:
    # Only our own segments are checked: other processes on the machine create theirs.
    return (Path("/dev/shm") / name).exists()


def wait_gone(pids, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(
        psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids
    ):
        time.sleep(0.05)
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


@pytest.fixture
def batches(memmap_raw):
    return BatchSampler(ShuffleSampler(len(memmap_raw), seed=7), 48)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method", START_METHODS)
def test_process_prefetcher_is_ordered_and_deterministic(memmap_raw, batches, start_method):
    dataset = LazyDataset(memmap_raw)
    with ProcessPrefetcher(dataset, batches, workers=2, depth=3, start_method=start_method) as pf:
        assert pf.start_method == start_method
        assert segment_exists(pf.shm_name)
        for epoch in (0, 1, 0):
            pf.set_epoch(epoch)
            assert_same(collected(pf), serial(dataset, batches))
        pids = pf.pids
    assert wait_gone(pids) == []
    assert not segment_exists(pf.shm_name)


@pytest.mark.timeout(60)
def test_thread_prefetcher_is_ordered_and_deterministic(memmap_raw, batches):
    dataset = LazyDataset(memmap_raw)
    threads_before = threading.active_count()
    with ThreadPrefetcher(dataset, batches, workers=3, depth=2) as tp:
        for epoch in (0, 1):
            tp.set_epoch(epoch)
            assert_same(collected(tp), serial(dataset, batches))
    assert threading.active_count() == threads_before


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["thread", "process"])
def test_copy_true_batches_stay_valid(memmap_raw, batches, kind):
    dataset = PreloadedDataset(memmap_raw, progress=False)
    cls = ThreadPrefetcher if kind == "thread" else ProcessPrefetcher
    extra = {} if kind == "thread" else {"start_method": "fork"}
    with cls(dataset, batches, workers=2, depth=2, copy=True, **extra) as pf:
        kept = list(pf)  # held across the whole pass: only correct if they own memory
    assert_same([(b.images, b.labels) for b in kept], serial(dataset, batches))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["thread", "process"])
def test_an_abandoned_pass_does_not_disturb_the_next(memmap_raw, batches, kind):
    dataset = LazyDataset(memmap_raw)
    cls = ThreadPrefetcher if kind == "thread" else ProcessPrefetcher
    extra = {} if kind == "thread" else {"start_method": "fork"}
    with cls(dataset, batches, workers=2, **extra) as pf:
        for k, _ in enumerate(pf):
            if k == 1:
                break
        assert_same(collected(pf), serial(dataset, batches))


@pytest.mark.timeout(60)
def test_process_prefetcher_delivers_decoded_and_transformed_arrays(build_ci, encoded_format):
    with open_dataset(build_ci(encoded_format, "jpeg")) as reader:
        dataset = LazyDataset(reader, decode="simplejpeg", transform=halve)
        order = BatchSampler(ShuffleSampler(len(reader), seed=1), 32)
        with ProcessPrefetcher(dataset, order, workers=2, start_method="fork") as pf:
            got = collected(pf)
        assert got[0][0].shape == (32, 32, 32, 3)
        assert_same(got, serial(dataset, order))


@pytest.mark.timeout(60)
def test_process_prefetcher_refuses_variable_size_samples(memmap_raw):
    dataset = LazyDataset(memmap_raw, transform=lambda img: img[: 1 + img[0, 0, 0] % 30])
    order = BatchSampler(ShuffleSampler(len(memmap_raw), seed=1), 32)
    with (
        ProcessPrefetcher(dataset, order, workers=1, start_method="fork") as pf,
        pytest.raises(WorkerError, match="variable-size samples"),
    ):
        list(pf)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["thread", "process", "baseline-list", "baseline-pickled"])
def test_worker_exceptions_reach_the_consumer_with_traceback(memmap_raw, batches, kind):
    dataset = FailingDataset(memmap_raw, bad=300)
    bad_batch = next(k for k, b in enumerate(batches) if 300 in b)
    children_before = our_children()
    loader = {
        "thread": lambda: ThreadPrefetcher(dataset, batches),
        "process": lambda: ProcessPrefetcher(dataset, batches, start_method="fork"),
        "baseline-list": lambda: BaselineLockedListPrefetcher(dataset, batches),
        "baseline-pickled": lambda: BaselinePickledQueuePrefetcher(
            dataset, batches, start_method="fork"
        ),
    }[kind]()
    delivered = 0
    with pytest.raises(WorkerError) as caught:
        for _ in loader:
            delivered += 1
    assert delivered == bad_batch  # every batch before the bad one arrived, in order
    message = str(caught.value)
    assert "boom at sample 300" in message and "Traceback" in message and "get_batch" in message
    if kind in ("thread", "process"):
        assert isinstance(caught.value.__cause__, ValueError)
        assert loader.closed
    loader.close()
    assert wait_gone(our_children() - children_before) == []


@pytest.mark.timeout(60)
def test_a_sigkilled_worker_makes_the_consumer_raise(memmap_raw, batches):
    dataset = SlowDataset(memmap_raw, delay=0.3)
    pf = ProcessPrefetcher(dataset, batches, workers=2, start_method="fork")
    pids = pf.pids
    with pytest.raises(WorkerDiedError, match=r"prefetch worker 0 .*signal SIGKILL"):
        for k, _ in enumerate(pf):
            if k == 0:
                os.kill(pids[0], signal.SIGKILL)
    assert pf.closed
    assert wait_gone(pids) == []
    assert not segment_exists(pf.shm_name)


@pytest.mark.timeout(120)
def test_repeated_open_close_and_gc_leave_nothing_behind(memmap_raw, batches):
    dataset = LazyDataset(memmap_raw)
    with ProcessPrefetcher(dataset, batches, start_method="fork") as pf:
        next(iter(pf))  # starts the resource tracker, which lives as long as we do
    children, threads = our_children(), threading.active_count()
    names = []
    for start_method in ("fork", "fork", "spawn"):
        with ProcessPrefetcher(dataset, batches, start_method=start_method) as pf:
            names.append(pf.shm_name)
            for k, _ in enumerate(pf):
                if k == 2:
                    break
    abandoned = ProcessPrefetcher(dataset, batches, start_method="fork")
    next(iter(abandoned))
    pids, names = abandoned.pids, [*names, abandoned.shm_name]
    del abandoned
    gc.collect()
    assert wait_gone(pids) == []
    for _ in range(3):
        with ThreadPrefetcher(dataset, batches) as tp:
            next(iter(tp))
    unclosed = ThreadPrefetcher(dataset, batches)
    next(iter(unclosed))
    del unclosed
    gc.collect()
    assert wait_gone(our_children() - children) == []
    assert not any(segment_exists(name) for name in names)
    assert threading.active_count() == threads


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["thread", "process"])
def test_keyboard_interrupt_while_waiting_cleans_up(memmap_raw, batches, kind):
    dataset = SlowDataset(memmap_raw, delay=2.0)
    threads, children = threading.active_count(), our_children()
    loader = (
        ThreadPrefetcher(dataset, batches, workers=1)
        if kind == "thread"
        else ProcessPrefetcher(dataset, batches, workers=1, start_method="fork")
    )
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        next(iter(loader))  # blocks on the slow first batch when the interrupt arrives
    timer.join()
    assert loader.closed
    assert wait_gone(our_children() - children) == []
    if kind == "process":
        assert not segment_exists(loader.shm_name)
    assert threading.active_count() == threads


@pytest.mark.timeout(60)
def test_baselines_deliver_the_same_batches(memmap_raw, batches):
    dataset = LazyDataset(memmap_raw)
    want = serial(dataset, batches)
    with BaselineLockedListPrefetcher(dataset, batches) as baseline:
        assert_same(collected(baseline), want)
    with BaselinePickledQueuePrefetcher(dataset, batches, start_method="fork") as baseline:
        assert_same(collected(baseline), want)
        assert_same(collected(baseline), want)
