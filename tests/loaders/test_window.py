"""The ordered prefetch window, under every transport: threads, processes with shared-memory
slots (fork, spawn, forkserver), and the pickled-queue baseline."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
from test_prefetch import (
    FailingDataset,
    SlowDataset,
    assert_same,
    collected,
    our_children,
    segment_exists,
    serial,
    wait_gone,
)

from storebench.loaders import (
    BaselinePickledQueuePrefetcher,
    Batch,
    BatchSampler,
    LazyDataset,
    OrderedWindow,
    ProcessPrefetcher,
    SequentialSampler,
    ShuffleSampler,
    ThreadPrefetcher,
    WorkerDiedError,
    WorkerError,
)
from storebench.loaders.prefetch import SHM_DIR, SHM_PREFIX
from storebench.loaders.window import WorkerFailure

BACKENDS = [
    "thread",
    "process-fork",
    "process-spawn",
    "process-forkserver",
    "pickled-fork",
    "pickled-spawn",
]
PROCESS_BACKENDS = [b for b in BACKENDS if b != "thread"]


def make(backend: str, dataset, batches, **knobs):
    """The prefetcher of ``backend`` ("kind-start_method") over ``dataset``."""
    kind, _, start_method = backend.partition("-")
    if kind == "thread":
        return ThreadPrefetcher(dataset, batches, **knobs)
    if kind == "process":
        return ProcessPrefetcher(dataset, batches, start_method=start_method, **knobs)
    return BaselinePickledQueuePrefetcher(dataset, batches, start_method=start_method, **knobs)


def our_segments() -> set[str]:
    """This process's shared-memory segments (other processes on the machine make theirs)."""
    mine = f"{SHM_PREFIX}{os.getpid()}_"
    return {name for name in os.listdir(SHM_DIR) if name.startswith(mine)}


class JitteryDataset(LazyDataset):
    """Takes longer on some batches than others, so that workers finish out of order."""

    def get_batch(self, indices, *, out=None):
        time.sleep(0.004 * (int(np.asarray(indices)[0]) % 3))
        return super().get_batch(indices, out=out)


class LoggingDataset(LazyDataset):
    """Appends the first sample index of each batch it starts to ``log`` (any process)."""

    def __init__(self, reader, log: str) -> None:
        super().__init__(reader)
        self.log = log

    def get_batch(self, indices, *, out=None):
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{int(np.asarray(indices)[0])}\n".encode())
        finally:
            os.close(fd)
        return super().get_batch(indices, out=out)


def started(log: Path) -> int:
    return len(log.read_text().split()) if log.exists() else 0


@pytest.fixture
def batches(memmap_raw):
    return BatchSampler(ShuffleSampler(len(memmap_raw), seed=7), 48)


@pytest.fixture
def before():
    """Children and threads before the test, after starting the long-lived helpers (the
    resource tracker and the forkserver) that the first use of each start method leaves."""
    return our_children(), threading.active_count()


def assert_nothing_left(children: set[int], threads: int) -> None:
    # No waiting: clean-up must be done by the time the loop has unwound.
    assert our_children() - children == set()
    assert our_segments() == set()
    assert threading.active_count() == threads


# -- the window alone, over a scripted in-process transport -------------------------------
class ReversingTransport:
    """Finishes the pending batches newest first (the worst order for the window), and
    checks backpressure on every submit against what the consumer has let go of."""

    def __init__(self, depth: int, let_go: list[int], fail_at: int | None = None) -> None:
        self.depth, self.let_go, self.fail_at = depth, let_go, fail_at
        self.pending: list[tuple[int, int, np.ndarray]] = []
        self.running = False
        self.starts = self.stops = 0
        self.slots_in_use: dict[int, int] = {}
        self.submitted = 0

    def start(self) -> None:
        if not self.running:
            self.running, self.starts = True, self.starts + 1

    def stop(self) -> None:
        if self.running:
            self.running, self.stops = False, self.stops + 1
            self.pending.clear()
            self.slots_in_use.clear()
            self.let_go[0] = self.submitted  # a pass left early lets go of all it started

    def submit(self, seq, slot, indices) -> None:
        assert self.running
        assert seq < self.let_go[0] + self.depth, f"batch {seq} submitted too early"
        assert slot not in self.slots_in_use, f"slot {slot} reused while batch held"
        self.slots_in_use[slot] = seq
        self.submitted = seq + 1
        self.pending.append((seq, slot, indices))

    def wait(self):
        seq, slot, indices = self.pending.pop()
        if seq == self.fail_at:
            return [(seq, WorkerFailure("scripted worker", 0, "Traceback: boom", ValueError()))]
        return [(seq, Batch(indices * 10, indices, indices))]

    def batch(self, slot, indices, result):
        del self.slots_in_use[slot]  # its reuse is checked against let_go in submit()
        return result


def test_the_window_orders_and_bounds_whatever_order_work_finishes_in():
    order = [np.arange(k, k + 3) for k in range(0, 30, 3)]
    let_go = [0]
    transport = ReversingTransport(depth=3, let_go=let_go)
    window = OrderedWindow(transport, depth=3, copy=False, name="test window")
    got = []
    for batch in window.run(order, owner=None):
        got.append(batch.labels.tolist())
        let_go[0] += 1  # counted before the next next(): the window may now refill
    assert got == [b.tolist() for b in order]
    assert (transport.starts, transport.stops) == (1, 0)  # a pass run to its end keeps workers


def test_the_window_raises_a_worker_failure_in_order_and_closes():
    order = [np.arange(k, k + 2) for k in range(0, 20, 2)]
    let_go = [0]
    transport = ReversingTransport(depth=4, let_go=let_go, fail_at=5)
    window = OrderedWindow(transport, depth=4, copy=False, name="test window")
    delivered = 0
    with pytest.raises(WorkerError, match=r"scripted worker 0 failed on batch 5 .*\[10, 11\]"):
        for _ in window.run(order, owner=None):
            delivered += 1
            let_go[0] += 1
    assert delivered == 5
    assert window.closed and not transport.running


def test_the_window_stops_workers_when_a_pass_is_left_and_restarts_them():
    order = [np.arange(k, k + 2) for k in range(0, 20, 2)]
    let_go = [0]
    transport = ReversingTransport(depth=2, let_go=let_go)
    window = OrderedWindow(transport, depth=2, copy=False, name="test window")
    for k, _ in enumerate(window.run(order, owner=None)):
        let_go[0] += 1
        if k == 3:
            break
    assert (transport.starts, transport.stops) == (1, 1) and not window.closed
    got = []
    for batch in window.run(order, owner=None):
        got.append(batch.labels.tolist())
        let_go[0] += 1
    assert got == [b.tolist() for b in order]
    assert transport.starts == 2


# -- every transport ----------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_come_out_in_sampler_order(memmap_raw, batches, backend):
    dataset = JitteryDataset(memmap_raw)
    with make(backend, dataset, batches, workers=3, depth=4) as pf:
        for epoch in (0, 1, 0):
            pf.set_epoch(epoch)
            assert_same(collected(pf), serial(dataset, batches))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_workers_run_exactly_depth_batches_ahead(memmap_raw, tmp_path, backend):
    log = tmp_path / "started.txt"
    dataset = LoggingDataset(memmap_raw, str(log))
    order = BatchSampler(SequentialSampler(len(memmap_raw)), 64)  # 8 batches
    depth = 3
    with make(backend, dataset, order, workers=2, depth=depth) as pf:
        for k, batch in enumerate(pf):
            assert batch.indices[0] == 64 * k
            want = min(k + depth, len(order))  # batch k held: k + 1 .. k + depth - 1 may run
            deadline = time.monotonic() + 30
            while started(log) < want and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.05)  # room for a runaway worker to show itself
            assert started(log) == want, f"holding batch {k}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_exception_reaches_the_consumer_with_its_traceback(
    memmap_raw, batches, backend, before
):
    dataset = FailingDataset(memmap_raw, bad=300)
    bad_batch = next(k for k, b in enumerate(batches) if 300 in b)
    loader = make(backend, dataset, batches)
    delivered = 0
    with pytest.raises(WorkerError) as caught:
        for _ in loader:
            delivered += 1
    assert delivered == bad_batch  # every batch before the bad one arrived, in order
    message = str(caught.value)
    assert f"failed on batch {bad_batch}" in message
    assert "boom at sample 300" in message and "Traceback" in message and "get_batch" in message
    assert isinstance(caught.value.__cause__, ValueError)
    assert loader.closed
    with pytest.raises(RuntimeError, match="is closed"):
        iter(loader)
    assert_nothing_left(*before)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["process-fork", "process-spawn", "pickled-fork"])
def test_a_killed_worker_raises_worker_died_error(memmap_raw, batches, backend):
    dataset = SlowDataset(memmap_raw, delay=0.2)
    pf = make(backend, dataset, batches, workers=2)
    with pytest.raises(WorkerDiedError, match=r"worker 0 \(pid \d+\) .*signal SIGKILL"):
        for k, _ in enumerate(pf):
            if k == 0:
                os.kill(pf.pids[0], signal.SIGKILL)
    assert pf.closed
    assert wait_gone(pf.pids) == []
    assert our_segments() == set()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pass_left_early_does_not_disturb_the_next(memmap_raw, batches, backend):
    dataset = LazyDataset(memmap_raw)
    want = serial(dataset, batches)
    with make(backend, dataset, batches, workers=2) as pf:
        for k, _ in enumerate(pf):
            if k == 1:
                break
        with pytest.raises(ZeroDivisionError):
            for k, _ in enumerate(pf):
                if k == 3:
                    1 / 0  # noqa: B018 -- an error in the loop body, not in a worker
        assert not pf.closed
        assert_same(collected(pf), want)
        assert_same(collected(pf), want)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["thread", "process-fork", "pickled-fork"])
def test_a_stale_pass_raises_without_closing_the_new_one(memmap_raw, batches, backend):
    dataset = LazyDataset(memmap_raw)
    want = serial(dataset, batches)
    with make(backend, dataset, batches) as pf:
        old = iter(pf)
        next(old)
        assert_same(collected(pf), want)
        with pytest.raises(RuntimeError, match="newer pass"):
            next(old)
        assert not pf.closed
        assert_same(collected(pf), want)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["thread", "process-fork"])
def test_batches_are_views_of_depth_reused_buffers(memmap_raw, batches, backend):
    depth = 3
    with make(backend, LazyDataset(memmap_raw), batches, depth=depth) as pf:
        addresses = [b.images.__array_interface__["data"][0] for b in pf]
    assert len(set(addresses)) == depth  # no batch was copied out of its slot
    assert all(a == addresses[k % depth] for k, a in enumerate(addresses))


# -- interrupts and abandoned iterators ---------------------------------------------------
# 60 interrupts, mostly fork and threads (cheap), a few spawn and forkserver (~1 s each).
INTERRUPTS = (
    [("thread", k) for k in range(18)]
    + [("process-fork", k) for k in range(22)]
    + [("process-spawn", k) for k in (0, 3, 6, 10)]
    + [("process-forkserver", k) for k in (1, 8)]
    + [("pickled-fork", k) for k in range(10)]
    + [("pickled-spawn", k) for k in (0, 4, 7, 10)]
)


@pytest.mark.timeout(180)
def test_keyboard_interrupts_in_the_loop_body_leave_nothing_behind(memmap_raw, batches):
    assert len(INTERRUPTS) == 60
    dataset = LazyDataset(memmap_raw)
    for backend in dict.fromkeys(b for b, _ in INTERRUPTS):  # start long-lived helpers once
        with make(backend, dataset, batches) as pf:
            next(iter(pf))
    children, threads = our_children(), threading.active_count()
    assert our_segments() == set()
    for n, (backend, at) in enumerate(INTERRUPTS):
        pf = make(backend, dataset, batches, workers=2)
        with pytest.raises(KeyboardInterrupt):
            for k, _ in enumerate(pf):
                if k == at % len(batches):
                    if n % 2:  # a real Ctrl-C, handled by Python's default SIGINT handler
                        signal.raise_signal(signal.SIGINT)
                        time.sleep(1)  # the interrupt lands here, inside the loop body
                    raise KeyboardInterrupt
        # pf is still referenced: the unwinding loop itself must have cleaned up.
        assert not pf.closed
        assert our_children() - children == set(), (backend, at)
        assert our_segments() == set(), (backend, at)
        assert threading.active_count() == threads, (backend, at)
        pf.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", BACKENDS)
def test_break_then_del_leaves_nothing_running_without_the_garbage_collector(
    memmap_raw, batches, backend
):
    dataset = LazyDataset(memmap_raw)
    with make(backend, dataset, batches) as warm:  # long-lived helpers start here, not below
        next(iter(warm))
    children, threads = our_children(), threading.active_count()
    gc.disable()
    try:
        pf = make(backend, dataset, batches)
        for k, _ in enumerate(pf):
            if k == 2:
                break
        assert_nothing_left(children, threads)  # the break alone stopped everything
        it = iter(pf)
        next(it)
        del it  # an abandoned iterator, never exhausted nor closed
        assert_nothing_left(children, threads)
        next(iter(pf))  # a temporary iterator: workers start again, and stop again
        assert_nothing_left(children, threads)
        gone = weakref.ref(pf)
        del pf
        assert gone() is None  # freed by reference counting: no cycle keeps it
        assert_nothing_left(children, threads)
    finally:
        gc.enable()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["thread", "process-fork", "pickled-fork"])
def test_for_over_a_temporary_prefetcher_runs_to_the_end(memmap_raw, batches, backend):
    dataset = LazyDataset(memmap_raw)
    got = [(np.array(b.images), np.array(b.labels)) for b in make(backend, dataset, batches)]
    assert_same(got, serial(dataset, batches))


@pytest.mark.timeout(60)
def test_a_segment_is_named_after_this_process_and_unlinked_on_close(memmap_raw, batches):
    with ProcessPrefetcher(LazyDataset(memmap_raw), batches, start_method="fork") as pf:
        assert pf.shm_name.startswith(f"{SHM_PREFIX}{os.getpid()}_")
        assert segment_exists(pf.shm_name)
        assert our_segments() == {pf.shm_name}
    assert our_segments() == set()
