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
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
import traceback
from collections.abc import Iterable, Iterator

import numpy as np

from .batching import Batch
from .prefetch import WorkerDiedError, WorkerError


class BaselineLockedListPrefetcher:
    """BASELINE: a list guarded by a lock, filled by one thread, polled with ``time.sleep``."""

    def __init__(
        self, dataset, batches: Iterable, *, depth: int = 4, poll_interval: float = 0.001
    ) -> None:
        self.dataset = dataset
        self.batches = batches
        self.depth = int(depth)
        self.poll_interval = float(poll_interval)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def set_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)

    def __iter__(self) -> Iterator[Batch]:
        self.close()
        self._stop = threading.Event()
        ready: list = []
        lock = threading.Lock()
        state = {"finished": False, "error": None}
        stop = self._stop

        def produce() -> None:
            try:
                for indices in self.batches:
                    while True:  # the naive backpressure: poll until there is room
                        with lock:
                            if len(ready) < self.depth:
                                break
                        if stop.is_set():
                            return
                        time.sleep(self.poll_interval)
                    batch = self.dataset.get_batch(indices)
                    with lock:
                        ready.append(batch)
            except BaseException:  # handed to the consumer
                state["error"] = traceback.format_exc()
            finally:
                state["finished"] = True

        self._thread = threading.Thread(target=produce, name="baseline-locked-list", daemon=True)
        self._thread.start()
        return self._consume(ready, lock, state)

    def _consume(self, ready: list, lock: threading.Lock, state: dict) -> Iterator[Batch]:
        try:
            while True:
                with lock:
                    batch = ready.pop(0) if ready else None
                if batch is not None:
                    yield batch
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
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def __enter__(self) -> BaselineLockedListPrefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pickling_worker(tasks, results, dataset) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        task = tasks.get()
        if task is None:
            return
        seq, indices = task
        try:
            batch = dataset.get_batch(indices)
            results.put((seq, batch.images, batch.labels, None))
        except BaseException:  # handed to the consumer
            results.put((seq, None, None, traceback.format_exc()))


class BaselinePickledQueuePrefetcher:
    """BASELINE: worker processes return batches through a ``multiprocessing.Queue``
    (pickled arrays). Ordered by a reorder buffer; the consumer waits on the queue with a
    one-second timeout to notice dead workers (the tutorial version hangs instead)."""

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

        self.dataset = dataset
        self.batches = batches
        self.workers = int(workers)
        self.depth = int(depth) if depth is not None else max(2 * self.workers, 2)
        context = multiprocessing.get_context(start_method)
        self._tasks = context.Queue()
        self._results = context.Queue()
        self._processes = [
            context.Process(
                target=_pickling_worker,
                args=(self._tasks, self._results, dataset),
                name=f"baseline-pickled-{i}",
                daemon=True,
            )
            for i in range(self.workers)
        ]
        for process in self._processes:
            process.start()
        self._closed = False
        self._outstanding = 0

    def set_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)

    def __iter__(self) -> Iterator[Batch]:
        if self._closed:
            raise RuntimeError("this BaselinePickledQueuePrefetcher is closed")
        while self._outstanding:  # discard what an abandoned pass left in flight
            self._get()
        return self._epoch()

    def _get(self) -> tuple:
        while True:
            try:
                item = self._results.get(timeout=1.0)
                self._outstanding -= 1
                return item
            except queue.Empty:
                dead = [p for p in self._processes if not p.is_alive()]
                if dead:
                    self.close()
                    raise WorkerDiedError(
                        f"baseline worker pid {dead[0].pid} ended unexpectedly "
                        f"(exit code {dead[0].exitcode})"
                    ) from None

    def _epoch(self) -> Iterator[Batch]:
        tasks = iter(self.batches)
        submitted = next_yield = 0
        pending: dict[int, tuple] = {}
        index_of: dict[int, np.ndarray] = {}
        exhausted = False
        try:
            while True:
                while not exhausted and submitted < next_yield + self.depth:
                    indices = next(tasks, None)
                    if indices is None:
                        exhausted = True
                        break
                    index_of[submitted] = np.asarray(indices, dtype=np.int64)
                    self._tasks.put((submitted, index_of[submitted]))
                    self._outstanding += 1
                    submitted += 1
                if exhausted and next_yield == submitted:
                    return
                while next_yield not in pending:
                    seq, images, labels, error = self._get()
                    pending[seq] = (images, labels, error)
                images, labels, error = pending.pop(next_yield)
                if error is not None:
                    raise WorkerError(
                        f"baseline worker failed on batch {next_yield}:\n\n{error}",
                        batch=next_yield,
                        worker_traceback=error,
                    )
                yield Batch(images, labels, index_of.pop(next_yield))
                next_yield += 1
        except GeneratorExit:
            return
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._processes:
            self._tasks.put(None)
        deadline = time.monotonic() + 5.0
        # Workers cannot exit while their queue feeder still holds unsent results: drain.
        while any(p.is_alive() for p in self._processes) and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty, OSError, ValueError):
                self._results.get(timeout=0.05)
        for process in self._processes:
            if process.is_alive():
                process.kill()
            process.join()
            process.close()
        for q in (self._tasks, self._results):
            q.close()
            q.join_thread()

    def __enter__(self) -> BaselinePickledQueuePrefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown may have torn down modules
            self.close()
