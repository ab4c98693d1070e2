"""BASELINES ONLY: the two naive prefetchers that tutorials teach, kept for comparison.

Do not use these in training code; use ``ThreadPrefetcher`` / ``ProcessPrefetcher``. They are
correct (ordered, complete, clean shutdown, errors re-raised) but deliberately naive in the
ways the comparison is about:

- ``BaselineLockedListPrefetcher``: one producer thread appends freshly allocated batches to
  a list guarded by a lock; the consumer (and the producer, when the list is full) polls it
  with ``time.sleep``. Costs: sleep latency and a new allocation per batch.
- ``BaselinePickledQueuePrefetcher``: worker processes put decoded batches on a
  ``multiprocessing.Queue``, which pickles every array and pushes it through a pipe. Cost:
  pickling and copying every byte twice (measured at ~300 MB/s on the reference machine).

The pickled baseline is the shared ``OrderedWindow`` (order, backpressure, errors, clean-up)
over a queue transport, so that it differs from ``ProcessPrefetcher`` only in how batches
travel. The locked list keeps its own loop: it is not a window at all (one producer, batches
in production order, no sequence numbers, slots or reordering), and its sleep-polling is the
thing being measured; a condition variable would remove exactly the cost it stands for.
"""

from __future__ import annotations

import contextlib
import numbers
import queue
import signal
import threading
import time
import traceback
from collections.abc import Iterable, Iterator

import numpy as np

from .batching import Batch
from .prefetch import (
    RUNNING,
    START_FAILED,
    capture_exception,
    check_not_bootstrapping,
    died_error,
    failure_from,
    load_in_worker,
    pack_for_workers,
    start_failure,
)
from .window import WindowedPrefetcher, WorkerDiedError, WorkerError, positive_int


class BaselineLockedListPrefetcher:
    """BASELINE: a list guarded by a lock, filled by one thread, polled with ``time.sleep``.

    The producer thread runs only while a pass is being consumed: leaving the loop early
    (``break``, an exception, dropping the iterator) stops it."""

    def __init__(
        self, dataset, batches: Iterable, *, depth: int = 4, poll_interval: float = 0.001
    ) -> None:
        self.dataset = dataset
        self.batches = batches
        self.depth = positive_int(depth, "depth")
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, numbers.Real):
            raise TypeError(f"poll_interval must be a number of seconds, got {poll_interval!r}")
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval}")
        self.poll_interval = float(poll_interval)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._pass = 0

    def set_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)

    def __iter__(self) -> Iterator[Batch]:
        return self._consume()

    def _produce(self, ready: list, lock: threading.Lock, state: dict, stop) -> None:
        try:
            for indices in self.batches:
                while True:  # the naive backpressure: poll until there is room
                    if stop.is_set():
                        return
                    with lock:
                        if len(ready) < self.depth:
                            break
                    time.sleep(self.poll_interval)
                batch = self.dataset.get_batch(indices)
                with lock:
                    ready.append(batch)
        except BaseException:  # handed to the consumer
            state["error"] = traceback.format_exc()
        finally:
            state["finished"] = True

    def _consume(self) -> Iterator[Batch]:
        self.close()  # one pass at a time: a new pass stops the previous one's producer
        self._pass += 1
        token = self._pass
        ready: list = []
        lock = threading.Lock()
        state = {"finished": False, "error": None}
        stop = self._stop = threading.Event()
        thread = self._thread = threading.Thread(
            target=self._produce, args=(ready, lock, state, stop), name="baseline-locked-list"
        )
        thread.daemon = True
        try:
            thread.start()
            while True:
                with lock:
                    batch = ready.pop(0) if ready else None
                if batch is not None:
                    yield batch
                    if self._pass != token:
                        raise RuntimeError(
                            "a newer pass over this BaselineLockedListPrefetcher was started"
                        )
                    continue
                if state["finished"]:
                    with lock:
                        if ready:
                            continue
                    if state["error"] is not None:
                        raise WorkerError(
                            f"baseline producer thread failed:\n\n{state['error']}",
                            worker_traceback=state["error"],
                        )
                    return
                time.sleep(self.poll_interval)
        finally:  # this pass's producer only: a newer pass may be running
            stop.set()
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def __enter__(self) -> BaselineLockedListPrefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pickling_worker(tasks, results, cargo, inherited, worker: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    results.put((RUNNING, worker, True, None))
    try:
        (dataset,) = load_in_worker(inherited, cargo)
    except BaseException as exc:  # reported, not printed: the consumer raises it
        results.put((START_FAILED, worker, False, ("loading", capture_exception(exc))))
        return
    while True:
        task = tasks.get()
        if task is None:
            return
        seq, indices = task
        try:
            batch = dataset.get_batch(indices)
            results.put((seq, worker, True, (batch.images, batch.labels)))
        except BaseException as exc:  # handed to the consumer
            results.put((seq, worker, False, capture_exception(exc)))


class _PickledQueueTransport:
    """Worker processes sharing one task queue and returning pickled arrays on another; the
    consumer waits with a one-second timeout to notice dead workers (the tutorial version
    hangs instead)."""

    label = "baseline worker"

    def __init__(self, dataset, *, context, workers: int) -> None:
        self.dataset = dataset
        self.context = context
        self.workers = workers
        self.pids: list[int] = []
        self._processes: list = []

    def start(self) -> None:
        if self._processes:
            return
        objects = (self.dataset,)
        packed = pack_for_workers("BaselinePickledQueuePrefetcher", self.start_method, objects)
        inherited = objects if packed is None else None
        self._tasks = self.context.Queue()
        self._results = self.context.Queue()
        self._running = [False] * self.workers
        self._in_flight = 0
        cargo = [self.context.Pipe(duplex=False) for _ in range(self.workers)]
        self._processes = [
            self.context.Process(
                target=_pickling_worker,
                args=(self._tasks, self._results, reader, inherited, i),
                name=f"baseline-pickled-{i}",
                daemon=True,
            )
            for i, (reader, _) in enumerate(cargo)
        ]
        try:
            for process, (reader, _) in zip(self._processes, cargo):
                process.start()
                reader.close()  # so that sending to a worker that died fails at once
            self.pids = [p.pid for p in self._processes]
            for i, (_, writer) in enumerate(cargo if packed is not None else ()):
                try:
                    writer.send_bytes(packed)
                except OSError:  # it died before reading: re-running __main__, most likely
                    raise self._died(i) from None
        except BaseException:
            self.stop()
            raise
        finally:
            for reader, writer in cargo:
                reader.close()
                writer.close()

    def stop(self) -> None:
        if not self._processes:
            return
        processes = self._processes
        for _ in processes:
            with contextlib.suppress(OSError, ValueError):
                self._tasks.put(None)
        deadline = time.monotonic() + 5.0
        # Workers cannot exit while their queue feeder still holds unsent results: drain.
        while any(p.is_alive() for p in processes) and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty, OSError, ValueError, EOFError):
                self._results.get(timeout=0.05)
        for process in processes:
            with contextlib.suppress(ValueError, AssertionError):  # never started, or closed
                if process.is_alive():
                    process.kill()
                process.join()
                process.close()
        for q in (self._tasks, self._results):
            q.close()
            q.join_thread()
        self._processes = []

    def submit(self, seq: int, slot: int, indices: np.ndarray) -> None:
        self._tasks.put((seq, indices))
        self._in_flight += 1

    def wait(self) -> list[tuple[int, object]]:
        try:
            seq, worker, ok, payload = self._results.get(timeout=1.0)
        except queue.Empty:
            for worker, process in enumerate(self._processes):
                if process.exitcode is not None:
                    raise self._died(worker) from None
            return []
        if seq == RUNNING:
            self._running[worker] = True
            return []
        if seq == START_FAILED:
            stage, captured = payload
            raise start_failure(
                self.label, worker, self.pids[worker], self.start_method, stage, captured
            )
        self._in_flight -= 1
        return [(seq, payload if ok else failure_from(self.label, worker, payload))]

    @property
    def start_method(self) -> str:
        return self.context.get_start_method()

    def _died(self, worker: int) -> WorkerDiedError:
        return died_error(
            self.label,
            worker,
            self.pids[worker],
            self._processes[worker].exitcode,
            running=self._running[worker],
            start_method=self.start_method,
            outstanding=self._in_flight,
        )

    def batch(self, slot: int, indices: np.ndarray, result) -> Batch:
        images, labels = result
        return Batch(images, labels, indices)


class BaselinePickledQueuePrefetcher(WindowedPrefetcher):
    """BASELINE: worker processes return batches through a ``multiprocessing.Queue``
    (pickled arrays), ordered and bounded by the same window as ``ProcessPrefetcher``."""

    def __init__(
        self,
        dataset,
        batches: Iterable,
        *,
        workers: int = 2,
        depth: int | None = None,
        start_method: str | None = None,
    ) -> None:
        import multiprocessing

        check_not_bootstrapping(type(self).__name__)
        self.dataset = dataset
        self.batches = batches
        self.workers = positive_int(workers, "workers")
        self.depth = positive_int(depth, "depth") if depth is not None else max(2 * self.workers, 2)
        context = multiprocessing.get_context(start_method)
        self.start_method = context.get_start_method()
        self._transport = _PickledQueueTransport(dataset, context=context, workers=self.workers)
        self._open_window(self._transport, depth=self.depth, copy=False)
        try:
            self._transport.start()
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """Process ids of the current (or last) workers."""
        return list(self._transport.pids)
