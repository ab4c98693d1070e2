"""One batch's gather split over threads.

A shuffled gather of 12 KiB rows is bound by memory latency, not bandwidth: each row starts
where the hardware prefetcher has no stream yet. Two threads each gathering half of the batch
keep two streams of misses in flight, where a single thread cannot (the targets study
measures one thread against one per core, both against the same run's copy bandwidth). The
copies release the GIL (``np.take``, ``pread``), so the parts run at once.

Two ways in: ``SplitGather.take`` hands bare ``np.take`` calls to the pool, for datasets
whose samples sit in one array (``PreloadedDataset``, the memmap reader); calling the
``SplitGather`` runs any reader's ``read_many`` per part. Every part writes straight into
its slice of the caller's buffer: no copy is added.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

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

    def __getstate__(self) -> dict:
        return {"threads": self.threads}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["threads"])

    def parts(self, count: int, nbytes: int) -> int:
        """How many parts a batch of ``count`` samples and ``nbytes`` bytes is split into."""
        return max(1, min(self.threads, count, nbytes // MIN_BYTES_PER_THREAD))

    def _executor(self) -> ThreadPoolExecutor:
        pid = os.getpid()
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
        ``out``, the parts handed to the pool as bare ``np.take`` calls: no Python runs
        between a worker picking a part up and the copy, which released the GIL (a
        reader's ``read_many`` per part runs enough Python, under the GIL, to give back
        much of what the split gains). Indices must be checked; every part has finished
        when this returns or raises."""
        count = len(indices)
        parts = self.parts(count, out.nbytes)
        bounds = [count * k // parts for k in range(parts + 1)]
        if parts == 1:
            np.take(rows, indices, axis=0, out=out, mode="clip")
            return
        pool = self._executor()
        futures = [pool.submit(np.take, rows, indices[bounds[k]:bounds[k + 1]], 0,
                               out[bounds[k]:bounds[k + 1]], "clip") for k in range(1, parts)]
        try:
            np.take(rows, indices[:bounds[1]], axis=0, out=out[:bounds[1]], mode="clip")
        finally:
            for future in futures:
                future.exception()
        for future in futures:
            future.result()

    def close(self) -> None:
        """Stop this process's pool (a later call starts another)."""
        if self._pool is not None and self._pool_pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool = self._pool_pid = None

    def __repr__(self) -> str:
        return f"SplitGather(threads={self.threads})"
