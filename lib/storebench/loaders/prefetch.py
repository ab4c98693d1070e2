"""Prefetchers: read and decode upcoming batches in threads or processes, in sampler order.

Both prefetchers take a dataset (``LazyDataset`` / ``PreloadedDataset``) and ``batches``, a
re-iterable of index arrays (a ``BatchSampler``); each ``for batch in prefetcher`` is one pass
over ``batches``, and workers persist between passes until ``close()``.

Common behaviour:

- **bounded depth, backpressure**: at most ``depth`` batches are in flight or held; batch
  ``s`` is started only once the consumer has let go of batch ``s - depth``;
- **order**: batches come out in the order of ``batches``, whichever worker finishes first;
- **no polling**: the consumer blocks on a condition variable (threads) or on
  ``multiprocessing.connection.wait`` over the workers' pipes and process sentinels;
- **errors**: an exception in a worker is raised in the consumer as ``WorkerError`` whose
  message carries the worker's traceback (and whose ``__cause__`` is the original exception
  when it could be transferred); a process worker that dies (SIGKILL, segfault, OOM killer)
  raises ``WorkerDiedError`` as soon as its sentinel fires. Either closes the prefetcher;
- **cleanup**: ``close()``, the context manager, garbage collection of the prefetcher and a
  ``KeyboardInterrupt`` in the consumer stop every thread and child process and unlink the
  shared memory.

Buffers are reused: with ``copy=False`` (the default) a batch's arrays are views that stay
valid until the consumer asks for the next batch; pass ``copy=True`` (or ``batch.copy()``) to
keep them longer.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import pickle
import queue
import signal
import threading
import traceback
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing import connection, shared_memory
from pathlib import Path

import numpy as np

from .batching import Batch, batch_buffer

SHM_DIR = Path("/dev/shm")


class WorkerError(RuntimeError):
    """A prefetch worker raised; the message holds the worker's traceback."""

    def __init__(
        self,
        message: str,
        *,
        worker: int | None = None,
        batch: int | None = None,
        worker_traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.worker = worker
        self.batch = batch
        self.worker_traceback = worker_traceback


class WorkerDiedError(WorkerError):
    """A prefetch worker process ended without being asked to (killed, crashed)."""


def _batch_size_of(batches, batch_size: int | None) -> int:
    if batch_size is not None:
        return int(batch_size)
    size = getattr(batches, "batch_size", None)
    if size is None:
        raise TypeError("cannot tell the batch size: pass batch_size= or a BatchSampler as batches")
    return int(size)


def _failure_message(kind: str, worker: int, batch: int, indices, tb: str) -> str:
    shown = ", ".join(str(i) for i in list(indices)[:8]) + (", ..." if len(indices) > 8 else "")
    return f"{kind} {worker} failed on batch {batch} (sample indices [{shown}]):\n\n{tb.rstrip()}"


# ---------------------------------------------------------------------------------------
# Threads
# ---------------------------------------------------------------------------------------
class _ThreadPool:
    """The threads and the state they share; deliberately holds no reference to the
    prefetcher, so that garbage-collecting the prefetcher can stop the threads."""

    def __init__(self, dataset, workers: int, buffers: list[np.ndarray] | None) -> None:
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.results: dict[int, tuple] = {}
        self.done = threading.Condition()
        self.stopping = threading.Event()
        self.buffers = buffers
        self.threads = [
            threading.Thread(
                target=self._run,
                args=(dataset.for_thread(), i),
                name=f"storebench-prefetch-{i}",
                daemon=True,
            )
            for i in range(workers)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self, dataset, worker: int) -> None:
        while True:
            task = self.tasks.get()
            if task is None or self.stopping.is_set():
                return
            seq, slot, indices = task
            try:
                out = self.buffers[slot] if self.buffers is not None else None
                outcome = (dataset.get_batch(indices, out=out), None)
            except BaseException as exc:  # everything goes to the consumer
                outcome = (None, (exc, worker, traceback.format_exc()))
            with self.done:
                self.results[seq] = outcome
                self.done.notify_all()

    def shutdown(self) -> None:
        self.stopping.set()
        for _ in self.threads:
            self.tasks.put(None)
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join()


class ThreadPrefetcher:
    """Prefetch batches with ``workers`` threads.

    Threads share the process, so this scales only with work that releases the GIL: file
    reads, ``np.take`` copies, simplejpeg decoding. Threads share the dataset's reader
    (``dataset.for_thread()``). Fixed-size batches are written into ``depth`` preallocated
    buffers.
    """

    def __init__(
        self,
        dataset,
        batches: Iterable,
        *,
        workers: int = 2,
        depth: int | None = None,
        batch_size: int | None = None,
        copy: bool = False,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.dataset = dataset
        self.batches = batches
        self.workers = int(workers)
        self.depth = int(depth) if depth is not None else max(2 * self.workers, 2)
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")
        self.copy = bool(copy)
        buffers = None
        shape = dataset.sample_shape
        if shape is not None:
            size = _batch_size_of(batches, batch_size)
            buffers = [batch_buffer(size, shape, dataset.sample_dtype) for _ in range(self.depth)]
        self._pool = _ThreadPool(dataset, self.workers, buffers)
        self._finalizer = weakref.finalize(self, self._pool.shutdown)
        self._seq = 0
        self._in_flight: dict[int, np.ndarray] = {}
        self._iteration = 0

    def set_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __iter__(self) -> Iterator[Batch]:
        if self.closed:
            raise RuntimeError("this ThreadPrefetcher is closed")
        self._iteration += 1
        self._drain()
        return self._epoch(self._iteration)

    def _drain(self) -> None:
        """Wait for (and discard) batches a previous, abandoned pass left in flight."""
        pool = self._pool
        with pool.done:
            while not set(self._in_flight).issubset(pool.results):
                pool.done.wait()
            for seq in self._in_flight:
                pool.results.pop(seq)
        self._in_flight.clear()

    def _epoch(self, token: int) -> Iterator[Batch]:
        pool = self._pool
        tasks = iter(self.batches)
        first = self._seq
        next_yield = first
        exhausted = False
        try:
            while True:
                while not exhausted and self._seq < next_yield + self.depth:
                    indices = next(tasks, None)
                    if indices is None:
                        exhausted = True
                        break
                    indices = np.asarray(indices, dtype=np.int64)
                    pool.tasks.put((self._seq, self._seq % self.depth, indices))
                    self._in_flight[self._seq] = indices
                    self._seq += 1
                if exhausted and next_yield == self._seq:
                    return
                with pool.done:
                    while next_yield not in pool.results:
                        pool.done.wait()
                    batch, failure = pool.results.pop(next_yield)
                indices = self._in_flight.pop(next_yield)
                if failure is not None:
                    exc, worker, tb = failure
                    raise WorkerError(
                        _failure_message(
                            "prefetch thread", worker, next_yield - first, indices, tb
                        ),
                        worker=worker,
                        batch=next_yield - first,
                        worker_traceback=tb,
                    ) from exc
                yield batch.copy() if self.copy else batch
                if self._iteration != token:
                    raise RuntimeError("a newer pass over this prefetcher was started")
                next_yield += 1
        except GeneratorExit:
            return  # abandoned early: the next pass drains what is still in flight
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the threads (each finishes the batch it is on) and wait for them."""
        self._finalizer()

    def __enter__(self) -> ThreadPrefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SlotLayout:
    """Where each batch slot lives in the shared segment: images then labels, 64-byte aligned."""

    name: str
    slots: int
    batch_size: int
    sample_shape: tuple[int, ...]
    dtype: str

    @property
    def image_bytes(self) -> int:
        return _align(
            self.batch_size * math.prod(self.sample_shape) * np.dtype(self.dtype).itemsize
        )

    @property
    def slot_bytes(self) -> int:
        return self.image_bytes + _align(8 * self.batch_size)

    @property
    def total_bytes(self) -> int:
        return self.slots * self.slot_bytes

    def views(self, buffer) -> list[tuple[np.ndarray, np.ndarray]]:
        base = np.frombuffer(buffer, dtype=np.uint8, count=self.total_bytes)
        out = []
        for slot in range(self.slots):
            at = slot * self.slot_bytes
            images = base[at : at + self.image_bytes].view(self.dtype)
            images = images[: self.batch_size * math.prod(self.sample_shape)]
            labels = base[at + self.image_bytes : at + self.image_bytes + 8 * self.batch_size]
            out.append((images.reshape(self.batch_size, *self.sample_shape), labels.view(np.int64)))
        return out

    def attach(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Map the segment in this process and return each slot's (images, labels) views."""
        return self.views(_map_segment(self.name, self.total_bytes))


def _align(n: int, to: int = 64) -> int:
    return (n + to - 1) // to * to


def _map_segment(name: str, size: int):
    # Mapping the /dev/shm file ourselves (rather than through SharedMemory) has two uses:
    # the views we hand out keep the mapping alive after unlink without SharedMemory's
    # BufferError on close, and workers do not register the segment with the resource
    # tracker (which would report it leaked, or unlink it, when a worker exits).
    path = SHM_DIR / name
    if path.exists():
        with open(path, "r+b") as fh:
            return mmap.mmap(fh.fileno(), size)
    return shared_memory.SharedMemory(name=name).buf  # platforms without /dev/shm


class _SharedSlots:
    """Creates the segment (registered with the resource tracker, which unlinks it even if
    this process is SIGKILLed) and unlinks it on ``unlink()``."""

    def __init__(self, *, slots: int, batch_size: int, sample_shape, dtype) -> None:
        probe = SlotLayout("", slots, batch_size, tuple(sample_shape), np.dtype(dtype).str)
        self._shm = shared_memory.SharedMemory(create=True, size=max(probe.total_bytes, 1))
        self.layout = SlotLayout(
            self._shm.name, slots, batch_size, tuple(sample_shape), np.dtype(dtype).str
        )
        try:
            self.views = self.layout.attach()
            if (SHM_DIR / self._shm.name).exists():
                self._shm.close()  # our own mapping serves; the name stays until unlink
        except BaseException:
            self.unlink()
            raise

    def unlink(self) -> None:
        if self._shm is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self._shm.unlink()
        self._shm = None


def _process_worker(conn, dataset, layout: SlotLayout, worker: int, worker_init) -> None:
    # Ctrl-C reaches the whole process group; the consumer handles it and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import multiprocessing

    parent = multiprocessing.parent_process()
    watched = [conn] if parent is None else [conn, parent.sentinel]
    try:
        slots = layout.attach()
        if worker_init is not None:
            worker_init(worker)
    except BaseException as exc:  # report start-up failures too
        conn.send((-1, _capture(exc)))
        return
    try:
        while True:
            if conn not in connection.wait(watched):
                return  # the parent is gone
            task = conn.recv()
            if task is None:
                return
            seq, slot, indices = task
            images, labels = slots[slot]
            try:
                batch = dataset.get_batch(indices, out=images)
                n = len(batch)
                if not (
                    isinstance(batch.images, np.ndarray) and np.shares_memory(batch.images, images)
                ):
                    _copy_into_slot(batch, images, layout)
                labels[:n] = batch.labels
                conn.send((seq, None))
            except BaseException as exc:  # everything goes to the consumer
                conn.send((seq, _capture(exc)))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return
    finally:
        close = getattr(dataset, "close", None)
        if close is not None:
            close()


def _copy_into_slot(batch: Batch, images: np.ndarray, layout: SlotLayout) -> None:
    stacked = batch.images
    if isinstance(stacked, list) and all(
        isinstance(x, np.ndarray) and x.shape == layout.sample_shape for x in stacked
    ):
        for k, x in enumerate(stacked):
            images[k] = x
        return
    if isinstance(stacked, np.ndarray) and stacked.shape[1:] == layout.sample_shape:
        images[: len(stacked)] = stacked
        return
    shapes = sorted({getattr(x, "shape", type(x).__name__) for x in stacked}, key=str)
    raise ValueError(
        f"ProcessPrefetcher slots hold {layout.dtype} samples of shape {layout.sample_shape}; "
        f"this batch has {shapes}. Pass output_shape= to the dataset, or use ThreadPrefetcher "
        "for variable-size samples"
    )


def _capture(exc: BaseException) -> tuple[bytes | None, str]:
    text = traceback.format_exc()
    try:
        payload = pickle.dumps(exc)
        pickle.loads(payload)  # some exceptions pickle but cannot be rebuilt
    except Exception:  # the text is enough then
        payload = None
    return payload, text


def _shutdown_processes(processes: list, conns: list, slots: _SharedSlots) -> None:
    for conn in conns:
        with contextlib.suppress(OSError, ValueError):
            conn.send(None)
    for process in processes:
        try:
            process.join(timeout=2.0)
            if process.is_alive():
                process.terminate()
                process.join(timeout=2.0)
            if process.is_alive():
                process.kill()
                process.join()
            process.close()
        except (ValueError, AssertionError):  # already closed, or never started
            pass
    for conn in conns:
        conn.close()
    slots.unlink()


class ProcessPrefetcher:
    """Prefetch batches with ``workers`` processes that write into shared-memory slots.

    The workers run ``dataset.get_batch(indices, out=slot)`` and send back only a few bytes;
    the consumer receives numpy views of the slot, never a pickled array. Samples must have
    one fixed shape: ``dataset.sample_shape`` when known, else sample 0 is read once here to
    find it. ``start_method`` is ``"fork"``, ``"spawn"``, ``"forkserver"`` or None (the
    platform default); under spawn and forkserver the dataset is pickled to each worker.

    ``worker_init(worker_index)`` runs in each worker after start-up (seed RNGs there).
    """

    def __init__(
        self,
        dataset,
        batches: Iterable,
        *,
        workers: int = 2,
        depth: int | None = None,
        batch_size: int | None = None,
        start_method: str | None = None,
        copy: bool = False,
        worker_init: Callable[[int], None] | None = None,
    ) -> None:
        import multiprocessing

        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.dataset = dataset
        self.batches = batches
        self.workers = int(workers)
        self.depth = int(depth) if depth is not None else max(2 * self.workers, 2)
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")
        self.batch_size = _batch_size_of(batches, batch_size)
        self.copy = bool(copy)
        self.context = multiprocessing.get_context(start_method)
        self.start_method = self.context.get_start_method()
        if dataset.sample_shape is not None:
            shape, dtype = dataset.sample_shape, dataset.sample_dtype
        else:
            shape, dtype = dataset.probe()
        self._slots = _SharedSlots(
            slots=self.depth, batch_size=self.batch_size, sample_shape=shape, dtype=dtype
        )
        self._processes: list = []
        self._conns: list = []
        self._finalizer = weakref.finalize(
            self, _shutdown_processes, self._processes, self._conns, self._slots
        )
        try:
            for i in range(self.workers):
                parent_end, child_end = self.context.Pipe(duplex=True)
                process = self.context.Process(
                    target=_process_worker,
                    args=(child_end, dataset, self._slots.layout, i, worker_init),
                    name=f"storebench-prefetch-{i}",
                    daemon=True,
                )
                self._conns.append(parent_end)
                self._processes.append(process)
                process.start()
                child_end.close()  # so that the worker's death shows as EOF here too
        except BaseException:
            self.close()
            raise
        self._pids = [p.pid for p in self._processes]
        self._outstanding = [0] * self.workers
        self._task_info: dict[int, tuple[int, np.ndarray]] = {}
        self._results: dict[int, tuple | None] = {}
        self._seq = 0
        self._iteration = 0

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (for tests and monitoring)."""
        return list(self._pids)

    @property
    def shm_name(self) -> str:
        return self._slots.layout.name

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def set_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)

    def __iter__(self) -> Iterator[Batch]:
        if self.closed:
            raise RuntimeError("this ProcessPrefetcher is closed")
        self._iteration += 1
        try:
            self._drain()
        except BaseException:
            self.close()
            raise
        return self._epoch(self._iteration)

    # -- the consumer's side ------------------------------------------------------------
    def _submit(self, seq: int, indices: np.ndarray) -> None:
        if len(indices) > self.batch_size:
            raise ValueError(
                f"batch {seq} has {len(indices)} indices, slots hold {self.batch_size}"
            )
        worker = min(range(self.workers), key=self._outstanding.__getitem__)
        self._conns[worker].send((seq, seq % self.depth, indices))
        self._outstanding[worker] += 1
        self._task_info[seq] = (worker, indices)

    def _collect(self) -> None:
        """Block until at least one result arrives or a worker dies."""
        sentinels = {p.sentinel: i for i, p in enumerate(self._processes)}
        ready = connection.wait([*self._conns, *sentinels])
        for obj in ready:
            if obj in sentinels:
                continue
            worker = self._conns.index(obj)
            self._receive(worker)
        for obj in ready:
            if obj in sentinels:
                worker = sentinels[obj]
                while self._conns[worker].poll():  # keep what it sent before dying
                    self._receive(worker)
                self._raise_died(worker)

    def _receive(self, worker: int) -> None:
        try:
            seq, failure = self._conns[worker].recv()
        except (EOFError, OSError):
            self._processes[worker].join(timeout=5.0)
            self._raise_died(worker)
        if seq < 0:
            self._raise_failure(worker, -1, failure, np.empty(0, np.int64), "starting")
        self._outstanding[worker] -= 1
        self._results[seq] = failure

    def _raise_died(self, worker: int) -> None:
        process = self._processes[worker]
        process.join(timeout=5.0)  # the sentinel fires before the exit status is collected
        code = process.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            how = f"signal {signal.Signals(-code).name}"
        pending = sorted(
            s for s, (w, _) in self._task_info.items() if w == worker and s not in self._results
        )
        raise WorkerDiedError(
            f"prefetch worker {worker} (pid {self._pids[worker]}) "
            f"ended unexpectedly ({how}) with {len(pending)} batch(es) outstanding; "
            "the prefetcher is closed",
            worker=worker,
        )

    def _raise_failure(self, worker: int, seq: int, failure, indices, what: str = "") -> None:
        payload, tb = failure
        cause = None
        if payload is not None:
            try:
                cause = pickle.loads(payload)
            except Exception:  # the traceback text still says what happened
                cause = None
        message = _failure_message("prefetch worker", worker, seq, indices, tb)
        if what:
            message = f"prefetch worker {worker} failed while {what}:\n\n{tb.rstrip()}"
        raise WorkerError(message, worker=worker, batch=seq, worker_traceback=tb) from cause

    def _drain(self) -> None:
        """Wait for (and discard) batches a previous, abandoned pass left in flight."""
        while any(self._outstanding):
            self._collect()
        self._results.clear()
        self._task_info.clear()

    def _epoch(self, token: int) -> Iterator[Batch]:
        tasks = iter(self.batches)
        first = self._seq
        next_yield = first
        exhausted = False
        try:
            while True:
                while not exhausted and self._seq < next_yield + self.depth:
                    indices = next(tasks, None)
                    if indices is None:
                        exhausted = True
                        break
                    self._submit(self._seq, np.asarray(indices, dtype=np.int64))
                    self._seq += 1
                if exhausted and next_yield == self._seq:
                    return
                while next_yield not in self._results:
                    self._collect()
                failure = self._results.pop(next_yield)
                worker, indices = self._task_info.pop(next_yield)
                if failure is not None:
                    self._raise_failure(worker, next_yield - first, failure, indices)
                images, labels = self._slots.views[next_yield % self.depth]
                n = len(indices)
                batch = Batch(images[:n], labels[:n], indices)
                yield batch.copy() if self.copy else batch
                if self._iteration != token:
                    raise RuntimeError("a newer pass over this prefetcher was started")
                next_yield += 1
        except GeneratorExit:
            return  # abandoned early: the next pass drains what is still in flight
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the workers (asking first, then terminate, then kill) and unlink the
        shared memory. Batches already handed out stay readable until dropped."""
        self._finalizer()

    def __enter__(self) -> ProcessPrefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
