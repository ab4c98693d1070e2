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
    WorkerStartError,
)
from storebench.loaders.window import Cut, CutReader

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
    threads_before = set(threading.enumerate())
    with ThreadPrefetcher(dataset, batches, workers=3, depth=2) as tp:
        for epoch in (0, 1):
            tp.set_epoch(epoch)
            assert_same(collected(tp), serial(dataset, batches))
    assert set(threading.enumerate()) <= threads_before


class ConsumerGatedDataset(LazyDataset):
    """Records which thread read each batch. A worker thread's reads wait until the
    consumer (the thread that made the dataset) has read a batch, so a consumer that does
    read finds nothing arrived and must; the consumer's later reads wait until a worker has
    read, so both read however the machine schedules the threads (a busy machine could
    otherwise leave every batch to the consumer). ``consumer_raises`` is raised in the
    consumer's reads."""

    def __init__(self, reader, consumer_raises: BaseException | None = None) -> None:
        super().__init__(reader)
        self.consumer = threading.get_ident()
        self.consumer_raises = consumer_raises
        self.consumer_read = threading.Event()
        self.worker_read = threading.Event()
        self.readers: list[int] = []

    def get_batch(self, indices, *, out=None):
        if threading.get_ident() == self.consumer:
            if self.consumer_read.is_set():
                self.worker_read.wait(timeout=10)
            self.consumer_read.set()
            if self.consumer_raises is not None:
                raise self.consumer_raises
        else:
            self.consumer_read.wait(timeout=10)
            self.worker_read.set()
        self.readers.append(threading.get_ident())
        return super().get_batch(indices, out=out)


@pytest.mark.timeout(60)
def test_a_consumer_that_reads_delivers_the_same_batches_reading_some_itself(memmap_raw,
                                                                           batches):
    dataset = ConsumerGatedDataset(memmap_raw)
    threads_before = set(threading.enumerate())
    with ThreadPrefetcher(dataset, batches, workers=1, consumer_reads=True) as tp:
        assert tp.depth == 4  # the consumer counts as one more worker
        for epoch in (0, 1):
            tp.set_epoch(epoch)
            assert_same(collected(tp), serial(LazyDataset(memmap_raw), batches))
    assert set(threading.enumerate()) <= threads_before
    assert dataset.readers.count(dataset.consumer) >= 1
    assert len(set(dataset.readers)) == 2  # the worker read too
    assert len(dataset.readers) == 2 * len(batches)


@pytest.mark.timeout(60)
def test_the_consumer_reads_loader_path_is_one_worker_and_a_reading_consumer(memmap_raw):
    """The prefetch study's ``thread_consumer_reads`` path: what one thread delivers, in
    its order, read by one worker and the consumer."""
    from storebench.loaders.paths import PathOptions, get_loader_path

    sampler = ShuffleSampler(len(memmap_raw), seed=7)
    dataset = ConsumerGatedDataset(memmap_raw)
    threads_before = set(threading.enumerate())
    loader, close = get_loader_path("thread_consumer_reads").open(
        dataset, sampler, PathOptions(batch_size=48, workers=1))
    try:
        assert loader.consumer_reads and loader.workers == 1
        got = collected(loader)
    finally:
        close()
    assert_same(got, serial(LazyDataset(memmap_raw), BatchSampler(sampler, 48)))
    assert dataset.readers.count(dataset.consumer) >= 1
    assert len(set(dataset.readers)) == 2
    assert set(threading.enumerate()) <= threads_before


@pytest.mark.timeout(60)
def test_a_batch_the_consumer_fails_on_raises_as_a_workers_does(memmap_raw, batches):
    dataset = ConsumerGatedDataset(memmap_raw, consumer_raises=ValueError("boom here"))
    threads_before = set(threading.enumerate())
    tp = ThreadPrefetcher(dataset, batches, workers=1, consumer_reads=True)
    with pytest.raises(WorkerError, match=r"^prefetch consumer 1 failed on batch \d+ "
                                          r"\(sample indices \[") as raised:
        collected(tp)
    assert "ValueError: boom here" in raised.value.worker_traceback
    assert raised.value.worker == 1
    assert tp.closed
    assert set(threading.enumerate()) <= threads_before


@pytest.mark.timeout(60)
def test_a_keyboard_interrupt_in_the_consumers_read_raises_and_closes(memmap_raw, batches):
    dataset = ConsumerGatedDataset(memmap_raw, consumer_raises=KeyboardInterrupt())
    threads_before = set(threading.enumerate())
    tp = ThreadPrefetcher(dataset, batches, workers=1, consumer_reads=True)
    with pytest.raises(KeyboardInterrupt):
        collected(tp)
    assert tp.closed
    assert set(threading.enumerate()) <= threads_before


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


@pytest.mark.timeout(120)
def test_repeated_open_close_and_gc_leave_nothing_behind(memmap_raw, batches):
    dataset = LazyDataset(memmap_raw)
    with ProcessPrefetcher(dataset, batches, start_method="fork") as pf:
        next(iter(pf))  # starts the resource tracker, which lives as long as we do
    children, threads = our_children(), set(threading.enumerate())
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
    assert set(threading.enumerate()) <= threads


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["thread", "process"])
def test_keyboard_interrupt_while_waiting_cleans_up(memmap_raw, batches, kind):
    dataset = SlowDataset(memmap_raw, delay=2.0)
    threads, children = set(threading.enumerate()), our_children()
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
    assert set(threading.enumerate()) <= threads


@pytest.mark.timeout(60)
def test_baselines_deliver_the_same_batches(memmap_raw, batches):
    dataset = LazyDataset(memmap_raw)
    want = serial(dataset, batches)
    with BaselineLockedListPrefetcher(dataset, batches) as baseline:
        assert_same(collected(baseline), want)
    with BaselinePickledQueuePrefetcher(dataset, batches, start_method="fork") as baseline:
        assert_same(collected(baseline), want)
        assert_same(collected(baseline), want)


@pytest.mark.timeout(60)
def test_the_locked_list_baseline_reraises_a_producer_exception(memmap_raw, batches):
    dataset = FailingDataset(memmap_raw, bad=300)
    bad_batch = next(k for k, b in enumerate(batches) if 300 in b)
    threads = set(threading.enumerate())
    delivered = 0
    with pytest.raises(WorkerError) as caught:
        for _ in BaselineLockedListPrefetcher(dataset, batches):
            delivered += 1
    assert delivered == bad_batch
    message = str(caught.value)
    assert "boom at sample 300" in message and "Traceback" in message and "get_batch" in message
    assert set(threading.enumerate()) <= threads


@pytest.mark.timeout(60)
def test_the_locked_list_baseline_stops_its_thread_when_the_loop_is_left(memmap_raw, batches):
    dataset = LazyDataset(memmap_raw)
    threads = set(threading.enumerate())
    baseline = BaselineLockedListPrefetcher(dataset, batches, depth=2)
    never_started = iter(baseline)
    assert set(threading.enumerate()) <= threads  # nothing runs before the first next()
    del never_started
    for k, _ in enumerate(baseline):
        if k == 1:
            break
    assert set(threading.enumerate()) <= threads
    with pytest.raises(KeyboardInterrupt):
        for k, _ in enumerate(baseline):
            if k == 2:
                raise KeyboardInterrupt
    assert set(threading.enumerate()) <= threads
    old = iter(baseline)
    next(old)
    assert_same(collected(baseline), serial(dataset, batches))
    with pytest.raises(RuntimeError, match="newer pass"):
        next(old)
    assert set(threading.enumerate()) <= threads


# -- arguments -----------------------------------------------------------------------------
COUNTS = [
    (ThreadPrefetcher, "workers"),
    (ThreadPrefetcher, "depth"),
    (ThreadPrefetcher, "batch_size"),
    (ProcessPrefetcher, "workers"),
    (ProcessPrefetcher, "depth"),
    (ProcessPrefetcher, "batch_size"),
    (BaselinePickledQueuePrefetcher, "workers"),
    (BaselinePickledQueuePrefetcher, "depth"),
    (BaselineLockedListPrefetcher, "depth"),
]
BAD_COUNTS = [
    (0, ValueError, "must be >= 1, got 0"),
    (-2, ValueError, "must be >= 1, got -2"),
    (True, TypeError, r"must be a positive int, got True \(bool\)"),
    (2.0, TypeError, r"must be a positive int, got 2.0 \(float\)"),
    ("2", TypeError, r"must be a positive int, got '2' \(str\)"),
]


def start_method_for(cls) -> dict:
    return (
        {"start_method": "fork"}
        if cls in (ProcessPrefetcher, BaselinePickledQueuePrefetcher)
        else {}
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("value", "error", "message"), BAD_COUNTS)
@pytest.mark.parametrize(("cls", "argument"), COUNTS)
def test_counts_must_be_positive_ints(memmap_raw, batches, cls, argument, value, error, message):
    children = our_children()
    with pytest.raises(error, match=rf"^{argument} {message}"):
        cls(LazyDataset(memmap_raw), batches, **{argument: value}, **start_method_for(cls))
    assert our_children() == children  # refused before any worker started


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cls", [ThreadPrefetcher, ProcessPrefetcher])
def test_a_batch_sampler_batch_size_is_checked_too(memmap_raw, cls):
    class Batches(list):
        batch_size = 0

    with pytest.raises(ValueError, match=r"^batches.batch_size must be >= 1"):
        cls(LazyDataset(memmap_raw), Batches(), **start_method_for(cls))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "cls", [ThreadPrefetcher, ProcessPrefetcher, BaselinePickledQueuePrefetcher]
)
def test_numpy_integers_are_counts(memmap_raw, batches, cls):
    dataset = LazyDataset(memmap_raw)
    with cls(
        dataset, batches, workers=np.int64(1), depth=np.int32(2), **start_method_for(cls)
    ) as pf:
        assert (pf.workers, pf.depth) == (1, 2) and type(pf.workers) is int
        assert_same(collected(pf), serial(dataset, batches))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("value", "error"), [(0, ValueError), (-1.0, ValueError), ("1", TypeError)]
)
def test_the_poll_interval_must_be_a_positive_number(memmap_raw, batches, value, error):
    with pytest.raises(error, match="poll_interval"):
        BaselineLockedListPrefetcher(LazyDataset(memmap_raw), batches, poll_interval=value)


# -- starting workers ------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_a_failing_worker_init_is_reported_as_a_start_failure(memmap_raw, batches):
    dataset = LazyDataset(memmap_raw)
    pf = ProcessPrefetcher(dataset, batches, start_method="fork", worker_init=refuse)
    with pytest.raises(WorkerError, match=r"prefetch worker \d failed while starting") as caught:
        list(pf)
    assert not isinstance(caught.value, WorkerDiedError)
    assert "worker_init refused worker" in str(caught.value)
    assert pf.closed and not segment_exists(pf.shm_name)


def refuse(worker: int) -> None:
    raise RuntimeError(f"worker_init refused worker {worker}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cls", [ProcessPrefetcher, BaselinePickledQueuePrefetcher])
def test_what_does_not_pickle_is_refused_before_any_worker_starts(memmap_raw, batches, cls):
    dataset = LazyDataset(memmap_raw, transform=lambda image: image)
    children = our_children()
    with pytest.raises(WorkerStartError, match=r"do not pickle: .*lambda.*start_method='fork'"):
        cls(dataset, batches, start_method="spawn")
    assert our_children() == children


SCRIPT_DATASET = """
import sys
import numpy as np
from storebench.loaders import {cls}, Batch, BatchSampler, SequentialSampler

{indent}class Counting:
{indent}    sample_shape = (4,)
{indent}    sample_dtype = np.dtype(np.uint8)
{indent}    def get_batch(self, indices, *, out=None):
{indent}        indices = np.asarray(indices)
{indent}        images = np.repeat(indices[:, None], 4, axis=1).astype(np.uint8)
{indent}        if out is not None:
{indent}            out[: len(indices)] = images
{indent}            images = out[: len(indices)]
{indent}        return Batch(images, indices, indices)
"""
SCRIPT_RUN = """
{indent}pf = {cls}(
{indent}    Counting(),
{indent}    BatchSampler(SequentialSampler(64), 8),
{indent}    start_method={method!r},
{indent}    workers={workers},
{indent})
{indent}print("delivered", sum(len(b) for b in pf))
"""
GUARD = 'if __name__ == "__main__":\n    pass\n'
SCRIPT_CASES = [
    ("ProcessPrefetcher", "spawn"),
    ("ProcessPrefetcher", "forkserver"),
    ("BaselinePickledQueuePrefetcher", "spawn"),
]


def run_script(tmp_path: Path, source: str, *, as_file: bool = True):
    """Run ``source`` with this interpreter (the venv's), as a file or with ``-c`` (like the
    REPL or a notebook: ``__main__`` has no file then); it must end, not hang."""
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(source)
    argv = [sys.executable, str(script)] if as_file else [sys.executable, "-c", source]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("cls", "method"), SCRIPT_CASES)
def test_a_script_without_the_main_guard_fails_fast_with_the_fix(tmp_path, cls, method):
    # One worker: two would write their tracebacks to the shared stderr at once, interleaved.
    source = SCRIPT_DATASET.format(cls=cls, indent="") + SCRIPT_RUN.format(
        cls=cls, method=method, indent="", workers=1
    )
    done = run_script(tmp_path, source)
    assert done.returncode != 0 and "delivered" not in done.stdout
    # The worker says what happened; the parent raises WorkerDiedError with the fix.
    assert f"WorkerStartError: {cls} was created while a spawn/forkserver worker" in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("storebench.loaders.window.WorkerDiedError: ")
    assert "exited during start-up" in last
    assert f"A {method} worker first re-runs the main module '{tmp_path / 'script.py'}'" in last
    assert 'without an `if __name__ == "__main__":` guard' in last


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("cls", "method"), SCRIPT_CASES)
@pytest.mark.parametrize("how", ["defined under the guard", "run with -c"])
def test_a_dataset_class_workers_cannot_find_is_named_with_the_fix(tmp_path, cls, method, how):
    if how == "run with -c":  # __main__ has no file, as in a notebook or the REPL
        source = SCRIPT_DATASET.format(cls=cls, indent="") + GUARD
        source += SCRIPT_RUN.format(cls=cls, method=method, indent="    ", workers=2)
    else:
        source = SCRIPT_DATASET.format(cls=cls, indent="    ").replace(
            "\n    class", f"\n{GUARD}    class", 1
        ) + SCRIPT_RUN.format(cls=cls, method=method, indent="    ", workers=2)
    done = run_script(tmp_path, source, as_file=how != "run with -c")
    assert done.returncode != 0 and "delivered" not in done.stdout
    last = [line for line in done.stderr.splitlines() if "WorkerDiedError: " in line][-1]
    assert "could not load the dataset and worker_init" in last
    assert "Can't get attribute 'Counting'" in last
    assert "define them in an importable module, or use start_method='fork'" in last


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("cls", "method"), SCRIPT_CASES)
def test_a_guarded_script_with_a_module_level_dataset_runs(tmp_path, cls, method):
    source = SCRIPT_DATASET.format(cls=cls, indent="") + GUARD
    source += SCRIPT_RUN.format(cls=cls, method=method, indent="    ", workers=2)
    done = run_script(tmp_path, source)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["delivered", "64"]


class LoggedDataset(LazyDataset):
    """Sleeps ``delay`` seconds per batch and appends (first index, time.monotonic() at the
    start) of every batch it reads to the file ``log`` (workers may be processes)."""

    def __init__(self, reader, log: Path, delay: float = 0.0) -> None:
        super().__init__(reader)
        self.log, self.delay = log, delay

    def get_batch(self, indices, *, out=None):
        with open(self.log, "a") as f:
            f.write(f"{int(indices[0])} {time.monotonic()!r}\n")
        time.sleep(self.delay)
        return super().get_batch(indices, out=out)


def reads(log: Path) -> list[tuple[int, float]]:
    return [(int(a), float(b)) for a, b in (line.split() for line in log.read_text().splitlines())]


def prefetcher(kind: str, dataset, batches):
    if kind == "thread":
        return ThreadPrefetcher(dataset, batches, workers=2, depth=4)
    if kind == "thread_consumer_reads":  # the consumer's reads keep the deadlines too
        return ThreadPrefetcher(dataset, batches, workers=1, depth=4, consumer_reads=True)
    return ProcessPrefetcher(dataset, batches, workers=2, depth=4, start_method="fork")


DEADLINE_KINDS = ["thread", "thread_consumer_reads", "process"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", DEADLINE_KINDS)
def test_a_pass_past_its_deadline_reads_only_its_first_batch(memmap_raw, batches, tmp_path,
                                                             kind):
    log = tmp_path / "reads.log"
    want = serial(LazyDataset(memmap_raw), batches)
    with prefetcher(kind, LoggedDataset(memmap_raw, log), batches) as pf:
        assert_same(collected(pf.iter_until(time.monotonic() - 1.0)), want[:1])
        assert [first for first, _ in reads(log)] == [int(next(iter(batches))[0])]
        # The next pass runs whole, in order, on fresh workers.
        assert_same(collected(pf), want)
    assert our_children() == set()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", DEADLINE_KINDS)
def test_a_pass_cut_short_starts_no_batch_after_its_deadline(memmap_raw, batches, tmp_path,
                                                             kind):
    log = tmp_path / "reads.log"
    want = serial(LazyDataset(memmap_raw), batches)
    firsts = [int(b[0]) for b in batches]
    with prefetcher(kind, LoggedDataset(memmap_raw, log, delay=0.2), batches) as pf:
        deadline = time.monotonic() + 0.3  # the epoch's 11 batches take at least 1.1 s
        got = collected(pf.iter_until(deadline))
        assert 1 <= len(got) < len(want)
        assert_same(got, want[: len(got)])
        started = reads(log)
        # A read is logged just after its worker checked the deadline, so a preempted
        # worker may log it a little late; one that ignored the deadline would start its
        # next 0.2 s batch at least 0.1 s past it.
        assert all(when <= deadline + 0.08 for first, when in started
                   if first != firsts[0])
        assert {first for first, _ in started} <= set(firsts)
    assert our_children() == set()


class PerSampleDelayDataset(LazyDataset):
    """Sleeps ``per_sample`` seconds per sample of every ``get_batch`` call."""

    def __init__(self, reader, per_sample: float) -> None:
        super().__init__(reader)
        self.per_sample = per_sample

    def get_batch(self, indices, *, out=None):
        time.sleep(self.per_sample * len(indices))
        return super().get_batch(indices, out=out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", DEADLINE_KINDS)
def test_a_pass_cut_in_slices_ends_with_a_prefix_of_the_batch_in_hand(memmap_raw, batches,
                                                                      kind):
    want = serial(LazyDataset(memmap_raw), batches)
    first = next(iter(batches))
    # 48-sample batches at 10 ms a sample: the first batch alone outlasts the deadline.
    with prefetcher(kind, PerSampleDelayDataset(memmap_raw, 0.01), batches) as pf:
        got = [(np.array(b.images), np.array(b.labels), np.array(b.indices))
               for b in pf.iter_until(time.monotonic() + 0.1, slice_samples=8)]
        assert len(got) == 1
        images, labels, indices = got[0]
        n = len(indices)
        assert 8 <= n < len(first) and n % 8 == 0
        np.testing.assert_array_equal(indices, first[:n])
        np.testing.assert_array_equal(images, want[0][0][:n])
        np.testing.assert_array_equal(labels, want[0][1][:n])
        # A cut pass leaves nothing behind: the next one runs whole, in order.
        assert_same(collected(pf), want)
    assert our_children() == set()


@pytest.mark.timeout(60)
def test_slices_with_a_deadline_far_ahead_read_whole_batches(memmap_raw, batches):
    dataset = LazyDataset(memmap_raw)
    with ThreadPrefetcher(dataset, batches, workers=2) as tp:
        assert_same(collected(tp.iter_until(time.monotonic() + 3600, slice_samples=8)),
                    serial(dataset, batches))
        with pytest.raises(ValueError, match="slice_samples must be >= 1, got 0"):
            tp.iter_until(time.monotonic() + 3600, slice_samples=0)


@pytest.mark.timeout(60)
def test_a_batch_that_ends_within_the_overrun_is_read_whole(memmap_raw, batches):
    want = serial(LazyDataset(memmap_raw), batches)
    with prefetcher("thread", PerSampleDelayDataset(memmap_raw, 0.01), batches) as pf:
        # 0.48 s a batch: past the deadline, within the overrun.
        got = collected(pf.iter_until(time.monotonic() + 0.1, slice_samples=8, overrun=5.0))
        assert_same(got, want[:1])
        with pytest.raises(ValueError, match="overrun must be >= 0 seconds, got -1"):
            pf.iter_until(time.monotonic(), slice_samples=8, overrun=-1)


class CallLog(LazyDataset):
    """Records the length of every ``get_batch`` call."""

    def __init__(self, reader) -> None:
        super().__init__(reader)
        self.calls: list[int] = []

    def get_batch(self, indices, *, out=None):
        self.calls.append(len(indices))
        return super().get_batch(indices, out=out)


def test_a_cut_reader_probes_its_pace_once_a_pass_and_cuts_encoded_batches(build_ci,
                                                                          encoded_format):
    with open_dataset(build_ci(encoded_format, "jpeg")) as reader:
        dataset = CallLog(reader)
        indices = np.array([5, 3, 40, 7, 11, 2, 9], dtype=np.int64)
        whole = LazyDataset(reader).get_batch(indices)
        reads = CutReader()
        ahead = Cut(time.monotonic() + 3600, 3)
        for _ in range(2):
            batch = reads.read(dataset, indices, None, ahead)
            assert batch.indices.tolist() == indices.tolist() and batch.images == whole.images
            assert batch.labels.tolist() == whole.labels.tolist()
        # The first batch of the pass probes the pace on a slice; the next is one call.
        assert dataset.calls == [3, 4, 7]
        dataset.calls.clear()
        cut = reads.read(dataset, indices, None, Cut(time.monotonic() - 1.0, 3))  # a new pass
        assert dataset.calls == [3]
        assert cut.indices.tolist() == [5, 3, 40] and cut.images == whole.images[:3]
        assert cut.labels.tolist() == whole.labels[:3].tolist()


@pytest.mark.timeout(60)
def test_a_deadline_far_ahead_changes_nothing(memmap_raw, batches):
    dataset = LazyDataset(memmap_raw)
    with ThreadPrefetcher(dataset, batches, workers=2) as tp:
        assert_same(collected(tp.iter_until(time.monotonic() + 3600)), serial(dataset, batches))


@pytest.mark.timeout(60)
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("cls", [ThreadPrefetcher, ProcessPrefetcher])
def test_a_prefetcher_asked_to_pin_its_slots_without_cuda_refuses_before_any_worker(
        memmap_raw, batches, cls):
    from storebench.bench.runner import shm_segments_of
    from storebench.loaders import AcceleratorUnavailableError
    from storebench.processes import SHM_PREFIX

    children, threads = our_children(), set(threading.enumerate())
    # This process's segments (others' studies may run beside this test): the ones it maps
    # or holds open, and the ones named for it, which it made.
    held = shm_segments_of([os.getpid()])
    segments = set(Path("/dev/shm").glob(f"{SHM_PREFIX}{os.getpid()}_*"))
    with pytest.raises(AcceleratorUnavailableError,
                       match=rf"^{cls.__name__}\(pin_memory=True\) page-locks its batch memory "
                             r"for CUDA copies, but torch \S+ reports "
                             r"torch.cuda.is_available\(\) == False on this machine; "
                             r"use pin_memory=False$"):
        cls(LazyDataset(memmap_raw), batches, pin_memory=True)
    assert our_children() == children and set(threading.enumerate()) == threads
    assert shm_segments_of([os.getpid()]) <= held
    assert set(Path("/dev/shm").glob(f"{SHM_PREFIX}{os.getpid()}_*")) <= segments


def test_a_loader_path_that_cannot_pin_its_batches_refuses_pin_memory_by_name(memmap_raw):
    from storebench.loaders.paths import LOADER_PATHS, PathOptions, get_loader_path

    able = [name for name, path in LOADER_PATHS.items() if path.pins_memory]
    assert sorted(able) == ["process", "thread", "thread_consumer_reads", "torch"]
    with pytest.raises(ValueError, match=r"^loader path 'none' cannot deliver batches in "
                                         r"page-locked memory \(pin_memory=True\); paths that "
                                         r"can: process, thread, thread_consumer_reads, torch$"):
        get_loader_path("none").open(LazyDataset(memmap_raw), ShuffleSampler(len(memmap_raw)),
                                     PathOptions(batch_size=16, pin_memory=True))


def test_a_thread_prefetcher_cannot_pin_batches_of_no_fixed_shape(build_ci):
    """Encoded bytes (no decoder) have no sample shape: no batch buffer to lock, said
    before anything else (CUDA or not) and before any thread starts."""
    with open_dataset(build_ci("lmdb", "jpeg")) as reader:
        dataset = LazyDataset(reader)
        assert dataset.sample_shape is None
        threads = set(threading.enumerate())
        with pytest.raises(ValueError, match=r"^ThreadPrefetcher\(pin_memory=True\) page-locks "
                                             r"batch buffers of one sample shape, and "
                                             r"LazyDataset does not know its samples' shape"):
            ThreadPrefetcher(dataset, BatchSampler(ShuffleSampler(len(reader)), 16),
                             pin_memory=True)
        assert set(threading.enumerate()) <= threads
