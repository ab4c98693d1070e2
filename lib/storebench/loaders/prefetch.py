"""Prefetchers: read and decode upcoming batches in threads or processes, in sampler order.

Both prefetchers take a dataset (``LazyDataset`` / ``PreloadedDataset``) and ``batches``, a
re-iterable of index arrays (a ``BatchSampler``); each ``for batch in prefetcher`` is one pass
over ``batches``. Both are an ``OrderedWindow`` (``window.py``: order, backpressure, errors,
clean-up, written once) over a transport defined here: threads writing into preallocated
buffers, or processes writing into a ring of shared-memory slots.

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
- **start-up**: under spawn and forkserver the dataset and ``worker_init`` are pickled once
  here; if that fails, ``WorkerStartError`` says what and how to fix it. A worker that cannot
  find what it was sent (a class defined in a notebook, the REPL or under the
  ``if __name__ == "__main__":`` guard), or that dies while re-running a main module that
  lacks that guard, raises ``WorkerDiedError`` saying so, instead of hanging;
- **clean-up**: a pass left early (``break``, an exception or ``KeyboardInterrupt`` anywhere
  in the loop body, the iterator dropped) stops every worker and unlinks the shared memory
  as the loop unwinds, and the next pass starts fresh workers; a pass run to its end keeps
  them. ``close()``, the context manager, and dropping the last reference to the prefetcher
  stop them too; none of this waits for the garbage collector.

Buffers are reused: with ``copy=False`` (the default) a batch's arrays are views that stay
valid until the consumer asks for the next batch; pass ``copy=True`` (or ``batch.copy()``) to
keep them longer.

``pin_memory=True`` (CUDA only; refused without it) page-locks the buffers or shared-memory
slots the batches are written into (``pinning.PageLocks``) for as long as the workers run,
so that ``GpuFeeder(pinned=True)`` copies each batch to the device from where it lies,
without a staging copy of its own (``DataLoader(pin_memory=True)`` instead copies every
batch once more, into pinned memory).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import pickle
import queue
import secrets
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing import connection, shared_memory

import numpy as np

from ..processes import SHM_DIR, SHM_PREFIX
from .batching import Batch, batch_buffer
from .pinning import PageLocks, lockable_batch_buffer, require_cuda
from .window import (
    Cut,
    CutReader,
    NotStarted,
    WindowedPrefetcher,
    WorkerDiedError,
    WorkerError,
    WorkerFailure,
    WorkerStartError,
    positive_int,
)

__all__ = [
    "SHM_DIR",
    "SHM_PREFIX",
    "ProcessPrefetcher",
    "SlotLayout",
    "ThreadPrefetcher",
    "WorkerDiedError",
    "WorkerError",
    "WorkerStartError",
]



def _batch_size_of(batches, batch_size: int | None) -> int:
    if batch_size is not None:
        return positive_int(batch_size, "batch_size")
    size = getattr(batches, "batch_size", None)
    if size is None:
        raise TypeError("cannot tell the batch size: pass batch_size= or a BatchSampler as batches")
    return positive_int(size, "batches.batch_size")


def default_depth(workers: int) -> int:
    """Batches a prefetcher with ``workers`` workers (its consumer counted, where it reads)
    holds in flight or ready when no ``depth`` is given."""
    return max(2 * workers, 2)


def _depth_of(depth: int | None, workers: int) -> int:
    return positive_int(depth, "depth") if depth is not None else default_depth(workers)


# ---------------------------------------------------------------------------------------
# Threads
# ---------------------------------------------------------------------------------------
class _ThreadPool:
    """The threads and the state they share; holds no reference to the prefetcher."""

    def __init__(self, dataset, workers: int, buffers: list[np.ndarray] | None) -> None:
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.results: dict[int, object] = {}
        self.done = threading.Condition()
        self.stopping = threading.Event()
        self.buffers = buffers
        self.abandon_reads = getattr(dataset, "abandon_reads", None)
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
        reads = CutReader()
        while True:
            task = self.tasks.get()
            if task is None or self.stopping.is_set():
                return
            # Everything goes to the consumer: a thread has no one else to raise to.
            self.run_task(task, dataset, reads, "prefetch thread", worker)

    def run_task(self, task: tuple, dataset, reads: CutReader, label: str, worker: int, *,
                 posts: type[BaseException] = BaseException) -> None:
        """Read one submitted batch in the calling thread and post its outcome; an exception
        of type ``posts`` is posted as the batch's failure, any other raised here."""
        seq, slot, indices, not_after, cut, epoch = task
        set_epoch(dataset, epoch)
        if not_after is not None and time.monotonic() > not_after:
            outcome = NotStarted()
        else:
            try:
                out = self.buffers[slot] if self.buffers is not None else None
                outcome = reads.read(dataset, indices, out, cut)
            except posts as exc:
                outcome = WorkerFailure(label, worker, traceback.format_exc(), exc)
        with self.done:
            self.results[seq] = outcome
            self.done.notify_all()

    def shutdown(self) -> None:
        self.stopping.set()
        for _ in self.threads:
            self.tasks.put(None)
        # The batches in hand are dropped: a reader that can (an object store) fails the
        # requests these threads asked for and it has not sent, so a thread ends its batch
        # after the requests in flight, not after all of them (at 20 ms and 64 in flight,
        # half a second over 512 GETs). Another loader on the same dataset reads on.
        abandon = (self.abandon_reads(self.threads) if self.abandon_reads is not None
                   else contextlib.nullcontext())
        with abandon:
            for thread in self.threads:
                if thread is not threading.current_thread():
                    thread.join()


class _ThreadTransport:
    """Threads of this process; a result is the batch itself, written into buffer ``slot``."""

    def __init__(self, dataset, *, workers: int, buffers: list[np.ndarray] | None,
                 consumer_reads: bool = False, page_locks: PageLocks | None = None) -> None:
        self.dataset = dataset
        self.workers = workers
        self.buffers = buffers
        self.consumer_reads = consumer_reads
        self.page_locks = page_locks
        self.not_after: float | None = None
        self.cut: Cut | None = None
        self.epoch = 0
        self._consumer: tuple[object, CutReader] | None = None  # the consumer's own reader
        self._pool: _ThreadPool | None = None

    def start(self) -> None:
        if self._pool is None:
            if self.page_locks is not None:  # stop() released them
                for buffer in self.buffers:
                    self.page_locks.lock_mapping(buffer)
            self._pool = _ThreadPool(self.dataset, self.workers, self.buffers)

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self.page_locks is not None:
            self.page_locks.release()

    def submit(self, seq: int, slot: int, indices: np.ndarray) -> None:
        self._pool.tasks.put((seq, slot, indices, self.not_after, self.cut, self.epoch))

    def wait(self) -> list[tuple[int, object]]:
        pool = self._pool
        if self.consumer_reads:
            self._read_one_here(pool)
        with pool.done:
            while not pool.results:
                pool.done.wait()
            arrived = list(pool.results.items())
            pool.results.clear()
        return arrived

    def _read_one_here(self, pool: _ThreadPool) -> None:
        """With nothing arrived, read the first batch no worker has taken yet in this
        (the consumer's) thread rather than sleep until a worker hands one over."""
        with pool.done:
            if pool.results:
                return
        try:
            task = pool.tasks.get(block=False)
        except queue.Empty:
            return
        if task is None:  # a shutdown's: it belongs to a worker
            pool.tasks.put(None)
            return
        if self._consumer is None:
            self._consumer = (self.dataset.for_thread(), CutReader())
        # Reported as worker number ``workers`` (the threads are 0 .. workers - 1). A
        # KeyboardInterrupt here is the consumer's own: it raises, and the window closes.
        pool.run_task(task, *self._consumer, "prefetch consumer", self.workers,
                      posts=Exception)

    def batch(self, slot: int, indices: np.ndarray, result) -> Batch:
        return result


class ThreadPrefetcher(WindowedPrefetcher):
    """Prefetch batches with ``workers`` threads.

    Threads share the process, so this scales only with work that releases the GIL: file
    reads, ``np.take`` copies, simplejpeg decoding. Threads share the dataset's reader
    (``dataset.for_thread()``). Fixed-size batches are written into ``depth`` preallocated
    buffers. A thread cannot be killed: stopping waits for the batches being read to finish.

    ``consumer_reads``: where the next batch has not arrived, the consuming thread reads the
    first submitted batch that no worker has taken yet, then looks again, instead of
    sleeping until a worker hands one over. Its reads count as one more worker (the default
    ``depth`` is 2 x (workers + 1)), so ``workers`` = cores - 1 keeps every core reading
    without a third thread per two cores; a batch it fails on raises as a worker's does,
    from "prefetch consumer". Where the loop body is the slow part (a training step), the
    workers read ahead as usual and the consumer seldom finds nothing arrived.

    ``pin_memory``: page-lock the batch buffers while the threads run (CUDA only; samples of
    one fixed shape), for ``GpuFeeder(pinned=True)`` to copy from in place.
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
        consumer_reads: bool = False,
        pin_memory: bool = False,
    ) -> None:
        if pin_memory and dataset.sample_shape is None:
            raise ValueError(
                "ThreadPrefetcher(pin_memory=True) page-locks batch buffers of one sample "
                f"shape, and {type(dataset).__name__} does not know its samples' shape "
                "(images of different sizes need a transform with a fixed output)")
        if pin_memory:
            require_cuda(type(self).__name__)
        self.dataset = dataset
        self.batches = batches
        self.workers = positive_int(workers, "workers")
        self.consumer_reads = bool(consumer_reads)
        self.depth = _depth_of(depth, self.workers + self.consumer_reads)
        self.copy = bool(copy)
        if batch_size is not None:
            positive_int(batch_size, "batch_size")
        buffers = None
        shape = dataset.sample_shape
        if shape is not None:
            size = _batch_size_of(batches, batch_size)
            make = lockable_batch_buffer if pin_memory else batch_buffer
            buffers = [make(size, shape, dataset.sample_dtype) for _ in range(self.depth)]
        self.pin_memory = bool(pin_memory)
        transport = _ThreadTransport(dataset, workers=self.workers, buffers=buffers,
                                     consumer_reads=self.consumer_reads,
                                     page_locks=PageLocks(type(self).__name__)
                                     if pin_memory else None)
        self._open_window(transport, depth=self.depth, copy=self.copy)
        transport.start()


# ---------------------------------------------------------------------------------------
# Processes: shared-memory slots
# ---------------------------------------------------------------------------------------
_HEADER_BYTES = 64  # byte 0: the consumer sets it to ask workers to stop at once
_STOP = 0
# What a worker sends for a batch it took after the pass's deadline (a failure is a tuple).
_NOT_STARTED = "not started"


@dataclass(frozen=True)
class SlotLayout:
    """Where each batch slot lives in the shared segment: a 64-byte control header, then per
    slot images then labels, 64-byte aligned."""

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
        return _HEADER_BYTES + self.slots * self.slot_bytes

    def views(self, buffer) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """The control header and each slot's (images, labels) views of ``buffer``."""
        base = np.frombuffer(buffer, dtype=np.uint8, count=self.total_bytes)
        out = []
        for slot in range(self.slots):
            at = _HEADER_BYTES + slot * self.slot_bytes
            images = base[at : at + self.image_bytes].view(self.dtype)
            images = images[: self.batch_size * math.prod(self.sample_shape)]
            labels = base[at + self.image_bytes : at + self.image_bytes + 8 * self.batch_size]
            out.append((images.reshape(self.batch_size, *self.sample_shape), labels.view(np.int64)))
        return base[:_HEADER_BYTES], out

    def attach(self) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """Map the segment in this process: its control header and slot views."""
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


def _create_segment(size: int) -> shared_memory.SharedMemory:
    while True:
        name = f"{SHM_PREFIX}{os.getpid()}_{secrets.token_hex(4)}"
        with contextlib.suppress(FileExistsError):
            return shared_memory.SharedMemory(name=name, create=True, size=size)


class _SharedSlots:
    """Creates the segment (registered with the resource tracker, which unlinks it even if
    this process is SIGKILLed) and unlinks it on ``unlink()``."""

    def __init__(self, *, slots: int, batch_size: int, sample_shape, dtype) -> None:
        shape, dtype = tuple(sample_shape), np.dtype(dtype).str
        probe = SlotLayout("", slots, batch_size, shape, dtype)
        self._shm = _create_segment(probe.total_bytes)
        self.layout = SlotLayout(self._shm.name, slots, batch_size, shape, dtype)
        try:
            self.control, self.views = self.layout.attach()
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


# -- starting worker processes (shared with the pickled baseline) ---------------------------
# Messages a worker sends before any batch: it runs our code (so a death before this
# message happened in multiprocessing's own bootstrap), or it could not start.
RUNNING = -1
START_FAILED = -2


def check_not_bootstrapping(owner: str) -> None:
    """Refuse to start workers from a spawn/forkserver worker that is still importing the
    main module: that is a script without the ``__main__`` guard, re-run by its workers."""
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise WorkerStartError(
            f"{owner} was created while a spawn/forkserver worker process was starting: "
            f"the worker re-ran the main module {_main_path()}, which creates the prefetcher "
            'at top level. Put that code under `if __name__ == "__main__":`, or use '
            "start_method='fork'"
        )


def _main_path() -> str:
    # While a spawn worker re-runs the script, runpy has it in sys.modules as __mp_main__.
    module = sys.modules.get("__mp_main__") or sys.modules.get("__main__")
    path = getattr(module, "__file__", None)
    return repr(path) if path else "(a notebook or the REPL)"


def _main_from_stdin() -> bool:
    return getattr(sys.modules.get("__main__"), "__file__", None) == "<stdin>"


def pack_for_workers(owner: str, start_method: str, objects: tuple) -> memoryview | None:
    """``objects`` pickled for spawn/forkserver workers; None under fork, where they travel
    with the forked process. Transports pickle at each start and send the bytes down a pipe
    once the process runs, rather than as a ``Process`` argument: a failure to pickle is
    reported here, a worker that cannot unpickle reports why (spawn would fail before any of
    our code ran), and no more than one pickled copy of a preloaded dataset exists at a time."""
    if start_method == "fork":
        return None
    from multiprocessing.reduction import ForkingPickler

    try:
        return ForkingPickler.dumps(objects)  # a view of the pickle's buffer: no copy
    except Exception as exc:
        raise WorkerStartError(
            f"{owner}(start_method={start_method!r}) sends the dataset and worker_init to "
            f"each worker by pickling, and they do not pickle: {type(exc).__name__}: {exc}. "
            "Define their classes and functions at module level in an importable module "
            "(not lambdas, local functions, or a notebook), or use start_method='fork'"
        ) from exc


def load_in_worker(inherited: tuple | None, conn) -> tuple:
    """In the worker: the objects inherited through fork, or else unpickled from ``conn``."""
    return inherited if inherited is not None else pickle.loads(conn.recv_bytes())


def capture_exception(exc: BaseException) -> tuple[bytes | None, str]:
    """The exception (pickled, when it survives a round trip) and its traceback text."""
    text = traceback.format_exc()
    try:
        payload = pickle.dumps(exc)
        pickle.loads(payload)  # some exceptions pickle but cannot be rebuilt
    except Exception:  # the text is enough then
        payload = None
    return payload, text


def failure_from(label: str, worker: int, captured: tuple[bytes | None, str]) -> WorkerFailure:
    payload, text = captured
    cause = None
    if payload is not None:
        with contextlib.suppress(Exception):  # the traceback text still says what happened
            cause = pickle.loads(payload)
    return WorkerFailure(label, worker, text, cause)


def start_failure(
    label: str, worker: int, pid: int, start_method: str, stage: str, captured
) -> WorkerError:
    """The error for a worker that reported it could not start."""
    failure = failure_from(label, worker, captured)
    tb = failure.traceback.rstrip()
    if stage != "loading":  # worker_init or the shared memory: the worker's own problem
        error = WorkerError(
            f"{label} {worker} failed while starting:\n\n{tb}",
            worker=worker,
            worker_traceback=failure.traceback,
        )
    else:
        last = tb.splitlines()[-1] if tb else "unknown error"
        if "__main__" in tb or "__mp_main__" in tb:
            advice = (
                "Objects defined in __main__ (a notebook, the REPL, or code under "
                '`if __name__ == "__main__":`) cannot be found by a spawn or forkserver '
                "worker: define them in an importable module, or use start_method='fork'"
            )
        else:
            advice = (
                "Define what the dataset needs in an importable module, or use start_method='fork'"
            )
        error = WorkerDiedError(
            f"{label} {worker} (pid {pid}) could not load the dataset and worker_init sent "
            f"to it under start_method={start_method!r}: {last}. {advice}. The prefetcher "
            f"is closed.\n\nWorker traceback:\n{tb}",
            worker=worker,
            worker_traceback=failure.traceback,
        )
    error.__cause__ = failure.cause
    return error


def died_error(
    label: str,
    worker: int,
    pid: int,
    exitcode: int | None,
    *,
    running: bool,
    start_method: str,
    outstanding: int,
) -> WorkerDiedError:
    """The error for a worker process that ended without being asked to."""
    how = f"exit code {exitcode}"
    if exitcode is not None and exitcode < 0:
        how = f"signal {signal.Signals(-exitcode).name}"
    if running:
        message = (
            f"{label} {worker} (pid {pid}) ended unexpectedly ({how}) with {outstanding} "
            "batch(es) outstanding; the prefetcher is closed"
        )
    elif start_method != "fork" and _main_from_stdin():
        message = (
            f"{label} {worker} (pid {pid}) exited during start-up ({how}): a {start_method} "
            "worker re-runs the main program from its file, and a program read from stdin "
            "has none. Run it from a file, or use start_method='fork'. The prefetcher is closed"
        )
    elif start_method != "fork" and exitcode is not None and exitcode > 0:
        message = (
            f"{label} {worker} (pid {pid}) exited during start-up ({how}), before running "
            f"any prefetch code. A {start_method} worker first re-runs the main module "
            f"{_main_path()}, and that failed: most often because the script creates the "
            'prefetcher at top level, without an `if __name__ == "__main__":` guard (the '
            "worker's traceback is on stderr). Put that code under the guard, or use "
            "start_method='fork'. The prefetcher is closed"
        )
    else:
        message = (
            f"{label} {worker} (pid {pid}) ended during start-up ({how}); the prefetcher is closed"
        )
    return WorkerDiedError(message, worker=worker)


def _process_worker(conn, inherited, layout: SlotLayout, worker: int) -> None:
    # Ctrl-C reaches the whole process group; the consumer handles it and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import multiprocessing

    parent = multiprocessing.parent_process()
    watched = [conn] if parent is None else [conn, parent.sentinel]
    dataset = None
    stage = "loading"
    try:
        conn.send((RUNNING, None))
        dataset, worker_init = load_in_worker(inherited, conn)
        stage = "starting"
        control, slots = layout.attach()
        if worker_init is not None:
            worker_init(worker)
    except BaseException as exc:  # report start-up failures too
        with contextlib.suppress(OSError):
            conn.send((START_FAILED, (stage, capture_exception(exc))))
        return
    reads = CutReader()
    try:
        while True:
            if conn not in connection.wait(watched):
                return  # the parent is gone
            task = conn.recv()
            if task is None or control[_STOP]:
                return
            seq, slot, indices, not_after, cut, epoch = task
            set_epoch(dataset, epoch)
            if not_after is not None and time.monotonic() > not_after:
                conn.send((seq, _NOT_STARTED))
                continue
            images, labels = slots[slot]
            try:
                batch = reads.read(dataset, indices, images, cut)
                n = len(batch)
                if not (
                    isinstance(batch.images, np.ndarray) and np.shares_memory(batch.images, images)
                ):
                    _copy_into_slot(batch, images, layout)
                labels[:n] = batch.labels
                # How many samples it read: fewer than asked when the pass's cut fell in it.
                conn.send((seq, n))
            except BaseException as exc:  # everything goes to the consumer
                conn.send((seq, capture_exception(exc)))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return
    finally:
        close = getattr(dataset, "close", None)
        if close is not None:
            close()


def set_epoch(dataset, epoch: int) -> None:
    """Tell a worker's dataset the pass's epoch, for a seeded transform's crops."""
    if getattr(dataset, "epoch", epoch) != epoch:
        dataset.set_epoch(epoch)


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
        f"this batch has {shapes}. Pass a transform with a fixed output "
        "(storebench.loaders.Resize) or output_shape= to the dataset, or use ThreadPrefetcher "
        "for variable-size samples"
    )


def _shutdown_processes(processes: list, conns: list) -> None:
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


class _SharedMemoryTransport:
    """Worker processes writing into a ring of ``depth`` shared-memory slots; a result is
    ``None`` (the slot holds the batch) and travels as a few pickled bytes."""

    label = "prefetch worker"

    def __init__(
        self,
        dataset,
        worker_init,
        *,
        context,
        workers: int,
        depth: int,
        batch_size: int,
        sample_shape,
        dtype,
        page_locks: PageLocks | None = None,
    ) -> None:
        self.dataset = dataset
        self.worker_init = worker_init
        self.page_locks = page_locks
        self.context = context
        self.workers = workers
        self.depth = depth
        self.batch_size = batch_size
        self.sample_shape = sample_shape
        self.dtype = dtype
        self.pids: list[int] = []
        self.shm_name = ""
        self.not_after: float | None = None
        self.cut: Cut | None = None
        self.epoch = 0
        self._slots: _SharedSlots | None = None
        self._processes: list = []
        self._conns: list = []

    @property
    def start_method(self) -> str:
        return self.context.get_start_method()

    def start(self) -> None:
        if self._slots is not None:
            return
        objects = (self.dataset, self.worker_init)
        packed = pack_for_workers("ProcessPrefetcher", self.start_method, objects)
        inherited = objects if packed is None else None
        self._slots = _SharedSlots(
            slots=self.depth,
            batch_size=self.batch_size,
            sample_shape=self.sample_shape,
            dtype=self.dtype,
        )
        self.shm_name = self._slots.layout.name
        self._processes, self._conns = [], []
        self._running = [False] * self.workers
        self._outstanding = [0] * self.workers
        self._assigned: dict[int, int] = {}
        try:
            for i in range(self.workers):
                parent_end, child_end = self.context.Pipe(duplex=True)
                process = self.context.Process(
                    target=_process_worker,
                    args=(child_end, inherited, self._slots.layout, i),
                    name=f"storebench-prefetch-{i}",
                    daemon=True,
                )
                self._conns.append(parent_end)
                self._processes.append(process)
                process.start()
                child_end.close()  # so that the worker's death shows as EOF here too
            self.pids = [p.pid for p in self._processes]
            for i, conn in enumerate(self._conns if packed is not None else ()):
                try:
                    conn.send_bytes(packed)
                except OSError:  # it died before reading: re-running __main__, most likely
                    raise self._died(i) from None
            if self.page_locks is not None:
                # Once the workers are forked: a fork after it would carry locked pages into
                # a process that has no CUDA.
                self.page_locks.lock(self._slots.control.ctypes.data,
                                     self._slots.layout.total_bytes)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self._slots is None:
            return
        self._slots.control[_STOP] = 1  # skip the tasks still queued in the pipes
        _shutdown_processes(self._processes, self._conns)
        if self.page_locks is not None:
            self.page_locks.release()
        self._slots.unlink()
        self._slots = None
        self._processes, self._conns = [], []

    def submit(self, seq: int, slot: int, indices: np.ndarray) -> None:
        if len(indices) > self.batch_size:
            raise ValueError(
                f"batch {seq} has {len(indices)} indices, slots hold {self.batch_size}"
            )
        worker = min(range(self.workers), key=self._outstanding.__getitem__)
        try:
            self._conns[worker].send((seq, slot, indices, self.not_after, self.cut, self.epoch))
        except OSError:  # it is gone: raise what it said before it went, if anything
            while self._conns[worker].poll():
                self._receive(worker)
            raise self._died(worker) from None
        self._outstanding[worker] += 1
        self._assigned[seq] = worker

    def wait(self) -> list[tuple[int, object]]:
        sentinels = {p.sentinel: i for i, p in enumerate(self._processes)}
        ready = connection.wait([*self._conns, *sentinels])
        arrived = []
        for obj in ready:
            if obj not in sentinels:
                arrived += self._receive(self._conns.index(obj))
        for obj in ready:
            if obj in sentinels:
                worker = sentinels[obj]
                while self._conns[worker].poll():  # keep what it sent before dying
                    arrived += self._receive(worker)
                raise self._died(worker)
        return arrived

    def _receive(self, worker: int) -> list[tuple[int, object]]:
        try:
            seq, info = self._conns[worker].recv()
        except (EOFError, OSError):
            raise self._died(worker) from None
        if seq == RUNNING:
            self._running[worker] = True
            return []
        if seq == START_FAILED:
            stage, captured = info
            raise start_failure(
                self.label, worker, self.pids[worker], self.start_method, stage, captured
            )
        self._outstanding[worker] -= 1
        self._assigned.pop(seq, None)
        if isinstance(info, int):
            return [(seq, info)]
        if info == _NOT_STARTED:
            return [(seq, NotStarted())]
        return [(seq, failure_from(self.label, worker, info))]

    def _died(self, worker: int) -> WorkerDiedError:
        process = self._processes[worker]
        process.join(timeout=5.0)  # the sentinel fires before the exit status is collected
        return died_error(
            self.label,
            worker,
            self.pids[worker],
            process.exitcode,
            running=self._running[worker],
            start_method=self.start_method,
            outstanding=sum(w == worker for w in self._assigned.values()),
        )

    def batch(self, slot: int, indices: np.ndarray, result) -> Batch:
        images, labels = self._slots.views[slot]
        return Batch(images[:result], labels[:result], indices[:result])


class ProcessPrefetcher(WindowedPrefetcher):
    """Prefetch batches with ``workers`` processes that write into shared-memory slots.

    The workers run ``dataset.get_batch(indices, out=slot)`` and send back only a few bytes;
    the consumer receives numpy views of the slot, never a pickled array. Samples must have
    one fixed shape: ``dataset.sample_shape`` when known, else sample 0 is read once here to
    find it. A dataset of images of different sizes decoded without a transform
    (``dataset.is_ragged``) is refused: give it a ``Resize`` (or ``CenterCrop``) transform.
    ``start_method`` is ``"fork"``, ``"spawn"``, ``"forkserver"`` or None (the
    platform default); under spawn and forkserver the dataset is pickled to each worker.

    ``worker_init(worker_index)`` runs in each worker after start-up (seed RNGs there).

    ``pin_memory``: page-lock the shared-memory slots while the workers run (CUDA only), for
    ``GpuFeeder(pinned=True)`` to copy from in place.
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
        pin_memory: bool = False,
    ) -> None:
        import multiprocessing

        check_not_bootstrapping(type(self).__name__)
        if pin_memory:
            require_cuda(type(self).__name__)
        self.pin_memory = bool(pin_memory)
        self.dataset = dataset
        self.batches = batches
        self.workers = positive_int(workers, "workers")
        self.depth = _depth_of(depth, self.workers)
        self.batch_size = _batch_size_of(batches, batch_size)
        self.copy = bool(copy)
        if worker_init is not None and not callable(worker_init):
            raise TypeError(f"worker_init must be callable or None, got {worker_init!r}")
        self.context = multiprocessing.get_context(start_method)
        self.start_method = self.context.get_start_method()
        if dataset.sample_shape is not None:
            shape, dtype = dataset.sample_shape, dataset.sample_dtype
        elif getattr(dataset, "is_ragged", False):
            raise ValueError(
                f"ProcessPrefetcher writes batches into shared-memory slots of one shape, and "
                f"the images of {dataset.reader.root} differ in size: give the dataset a "
                "transform with a fixed output (transform=storebench.loaders.Resize(h, w), or "
                "Compose(ResizeShorter(s), CenterCrop(h, w))), or use ThreadPrefetcher for "
                "batches that are lists of differently shaped arrays"
            )
        else:
            shape, dtype = dataset.probe()
        self._transport = _SharedMemoryTransport(
            dataset,
            worker_init,
            context=self.context,
            workers=self.workers,
            depth=self.depth,
            batch_size=self.batch_size,
            sample_shape=shape,
            dtype=dtype,
            page_locks=PageLocks(type(self).__name__) if pin_memory else None,
        )
        self._open_window(self._transport, depth=self.depth, copy=self.copy)
        try:
            self._transport.start()
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """Process ids of the current (or last) workers, for tests and monitoring."""
        return list(self._transport.pids)

    @property
    def shm_name(self) -> str:
        """Name of the current (or last) shared-memory segment under ``SHM_DIR``."""
        return self._transport.shm_name
