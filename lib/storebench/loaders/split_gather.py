"""One batch's gather split over threads.

A shuffled gather of 12 KiB rows is bound by memory latency, not bandwidth: each row starts
where the hardware prefetcher has no stream yet. ``take_rows`` keeps a group of rows' misses
in flight in one thread (``storebench.gather``); threads each gathering a part of the batch
add their own (the targets study measures one thread against one per core, both against the
same run's copy bandwidth). The copies release the GIL (``take_rows``, ``pread``), so the
parts run at once.

Two ways in: ``SplitGather.take`` hands bare ``take_rows`` calls to helper threads, for
datasets whose samples sit in one array (``PreloadedDataset``, the memmap reader); calling
the ``SplitGather`` runs any reader's ``read_many`` per part in a thread pool. Every part
writes straight into its slice of the caller's buffer: no copy is added.

A 3 MiB batch takes a few hundred microseconds, so the hand-off is a visible part of it.
``take`` parks each helper on a lock of its own (no queue, no future: a release wakes it),
and the calling thread, which starts its part at once while a helper still wakes up, gets
the larger share: the one that would have made every part finish together in the batches
before (``_balanced_share``). An even split left the caller waiting for a helper that had
started late, for about a fifth of each batch on this project's machine.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..gather import take_rows

# A part smaller than this costs more in the hand-off (tens of microseconds) than it saves.
MIN_BYTES_PER_THREAD = 256 * 1024


class SplitGather:
    """Runs ``gather(indices, out)`` over ``threads`` contiguous parts of a batch at once:
    the calling thread takes the first part, a pool of ``threads - 1`` threads the rest.

    The pool is started on first use in each process (a pool inherited through fork has no
    threads) and is not pickled; ``close`` stops it. ``threads=1`` calls ``gather`` once,
    in the calling thread.
    """

    def __init__(self, threads: int = 1) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"gather_threads must be a positive int, got {threads!r}")
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid: int | None = None
        self._helpers: _TakeHelpers | None = None
        # Two threads' first calls must not each start helpers: one set would never stop.
        self._starting = threading.Lock()
        self._starting_pid = os.getpid()

    def __getstate__(self) -> dict:
        return {"threads": self.threads}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["threads"])

    def parts(self, count: int, nbytes: int) -> int:
        """How many parts a batch of ``count`` samples and ``nbytes`` bytes is split into."""
        return max(1, min(self.threads, count, nbytes // MIN_BYTES_PER_THREAD))

    def _executor(self) -> ThreadPoolExecutor:
        pid = os.getpid()
        with self._start_lock(pid):
            if self._pool is None or self._pool_pid != pid:
                self._pool = ThreadPoolExecutor(self.threads - 1,
                                                thread_name_prefix="storebench-gather")
                self._pool_pid = pid
            return self._pool

    def __call__(
        self,
        gather: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
        indices: np.ndarray,
        out: np.ndarray,
    ) -> np.ndarray:
        """Fill ``out`` (``len(indices)`` samples) with ``gather`` over the parts and return
        the labels in ``indices`` order. Every part has finished when this returns or raises;
        the first part's error (in batch order) is the one raised."""
        count = len(indices)
        parts = self.parts(count, out.nbytes)
        # Plain ints and one result call per part: at 3 MiB a batch takes ~0.3 ms, so the
        # hand-off's own overhead (linspace, concurrent.futures.wait) showed up in the rate.
        bounds = [count * k // parts for k in range(parts + 1)]

        def run(start: int, stop: int) -> np.ndarray:
            part = out[start:stop]
            images, labels = gather(indices[start:stop], part)
            if images is not part:  # a reader that did not write into the part given
                part[...] = images
            return labels

        if parts == 1:
            return np.asarray(run(0, count), dtype=np.int64)
        pool = self._executor()
        futures = [pool.submit(run, bounds[k], bounds[k + 1]) for k in range(1, parts)]
        try:
            first = run(bounds[0], bounds[1])
        finally:
            for future in futures:  # no part may still write into ``out`` once it is back
                future.exception()
        return np.concatenate([first, *(future.result() for future in futures)]).astype(
            np.int64, copy=False)

    def take(self, rows: np.ndarray, indices: np.ndarray, out: np.ndarray) -> None:
        """``out[k] = rows[indices[k]]`` for a 2-D ``rows`` array and a 2-D C-contiguous
        ``out``, the helpers' parts as bare ``take_rows`` calls: no Python runs between a
        helper waking and its copy, which releases the GIL (a reader's ``read_many`` per part
        runs enough Python, under the GIL, to give back much of what the split gains).
        Indices must be checked; every part has finished when this returns or raises, and
        the first failing part in batch order is the error raised. A call made while another
        thread's call holds the helpers gathers alone, in the calling thread."""
        count = len(indices)
        parts = 1 if self.threads == 1 else self.parts(count, out.nbytes)
        helpers = self._take_helpers() if parts > 1 else None
        if helpers is None or not helpers.busy.acquire(blocking=False):
            take_rows(rows, indices, out)
            return
        try:
            helpers.take(rows, indices, out, parts)
        finally:
            helpers.busy.release()

    def _start_lock(self, pid: int) -> threading.Lock:
        if self._starting_pid != pid:  # forked while another thread may have held it
            self._starting, self._starting_pid = threading.Lock(), pid
        return self._starting

    def _take_helpers(self) -> _TakeHelpers:
        pid = os.getpid()
        helpers = self._helpers
        if helpers is not None and helpers.pid == pid:
            return helpers
        with self._start_lock(pid):
            if self._helpers is None or self._helpers.pid != pid:
                # A forked child has none of the parent's threads: its own helpers, lock
                # and share.
                self._helpers = _TakeHelpers(self.threads - 1)
            return self._helpers

    def close(self) -> None:
        """Stop this process's pool and helper threads (a later call starts others)."""
        if self._pool is not None and self._pool_pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool = self._pool_pid = None
        helpers, self._helpers = self._helpers, None
        if helpers is not None and helpers.pid == os.getpid():
            with helpers.busy:  # not under another thread's batch
                helpers.stop()

    def __repr__(self) -> str:
        return f"SplitGather(threads={self.threads})"


# The calling thread's share of a batch stays within these (of the whole batch), and moves
# a fifth of the way to each batch's balanced share: one slow batch does not swing it.
_SHARE_LIMITS = (0.1, 0.9)
_SHARE_SMOOTHING = 0.2


def _balanced_share(parts: int, rows: int, first_rows: int, first_s: float,
                    helpers_s: float) -> float:
    """The calling thread's share of ``rows`` that would have made every part finish at
    once, given that its ``first_rows`` took ``first_s`` and the last helper finished
    ``helpers_s`` after the start. A helper's part costs what the same rows cost the
    calling thread plus a fixed wake-up latency L, so with ``t`` seconds per row the
    balance is ``s n t = L + (1 - s) n t / (parts - 1)``, that is
    ``s = (1 + (parts - 1) L / (n t)) / parts``."""
    per_row = first_s / first_rows
    helper_rows = (rows - first_rows) / (parts - 1)
    latency = helpers_s - helper_rows * per_row
    return (1 + (parts - 1) * latency / (rows * per_row)) / parts


class _Helper:
    """One thread parked on its ``go`` lock; a release wakes it for one ``take_rows``, and it
    releases ``done`` when that has finished (or failed)."""

    def __init__(self, name: str) -> None:
        self._go = threading.Lock()
        self._go.acquire()
        self._done = threading.Lock()
        self._done.acquire()
        self._task: tuple | None = None
        self._error: BaseException | None = None
        self.finished_at = 0.0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._go.acquire()
            task, self._task = self._task, None
            if task is None:  # stop
                self._done.release()
                return
            rows, indices, out = task
            try:
                take_rows(rows, indices, out)
            except BaseException as err:  # handed to the caller, which raises it
                self._error = err
            self.finished_at = time.perf_counter()
            self._done.release()

    def start(self, rows: np.ndarray, indices: np.ndarray, out: np.ndarray) -> None:
        self._task = (rows, indices, out)
        self._go.release()

    def wait(self) -> tuple[BaseException | None, BaseException | None]:
        """Block until the part has finished, even through a Ctrl-C (the part takes
        microseconds; leaving it running would let it write into a buffer handed back):
        (the part's error, the interrupt that came while waiting), each None if none."""
        interrupt = None
        while True:
            try:
                self._done.acquire()
                break
            except BaseException as err:
                interrupt = interrupt or err
        error, self._error = self._error, None
        return error, interrupt

    def signal_stop(self) -> None:
        """Let the thread end once it is idle, without waiting for it."""
        self._task = None
        self._go.release()

    def stop(self) -> None:
        self.signal_stop()
        self._done.acquire()
        self._thread.join()


class _TakeHelpers:
    """``count`` helpers of this process, the lock that gives one caller at a time the use
    of them, and the calling thread's current share of a batch."""

    def __init__(self, count: int) -> None:
        self.pid = os.getpid()
        self.busy = threading.Lock()
        self.share: dict[int, float] = {}  # per number of parts
        self.helpers = [_Helper(f"storebench-gather-{k}") for k in range(count)]
        # A dataset dropped without close() must not leave its helpers parked for good (a
        # helper's thread holds the helper, not this object). Signal only: the collection
        # may run in any thread, a helper's own among them.
        self._finalizer = weakref.finalize(self, _signal_stop, self.helpers, self.pid)

    def take(self, rows: np.ndarray, indices: np.ndarray, out: np.ndarray, parts: int) -> None:
        count = len(indices)
        share = self.share.get(parts, 1 / parts)
        first = min(max(1, round(share * count)), count - (parts - 1))
        rest = count - first
        bounds = [first + rest * k // (parts - 1) for k in range(parts)]
        started = time.perf_counter()
        used = self.helpers[:parts - 1]
        for k, helper in enumerate(used):
            helper.start(rows, indices[bounds[k]:bounds[k + 1]], out[bounds[k]:bounds[k + 1]])
        errors: list[BaseException | None] = [None]
        try:
            take_rows(rows, indices[:first], out[:first])
        except BaseException as err:
            errors[0] = err
        first_s = time.perf_counter() - started
        # Every part has finished before anything is raised or returned.
        interrupt = None
        for helper in used:
            error, interrupted = helper.wait()
            errors.append(error)
            interrupt = interrupt or interrupted
        error = next((e for e in errors if e is not None), interrupt)
        if error is not None:
            raise error
        helpers_s = max(helper.finished_at for helper in used) - started
        if first_s <= 0:  # a clock too coarse to time the part: keep the share
            return
        balanced = _balanced_share(parts, count, first, first_s, helpers_s)
        low, high = _SHARE_LIMITS
        self.share[parts] = min(high, max(low, share + _SHARE_SMOOTHING * (balanced - share)))

    def stop(self) -> None:
        self._finalizer.detach()
        for helper in self.helpers:
            helper.stop()


def _signal_stop(helpers: list[_Helper], pid: int) -> None:
    if os.getpid() != pid:  # a forked child's copy: the threads were never there
        return
    for helper in helpers:
        helper.signal_stop()
