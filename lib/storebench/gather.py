"""The row gather under every raw batch: ``take_rows(rows, indices, out)``.

A shuffled batch is a gather of rows from random places (256 rows of 12 KiB on the default
profile). NumPy's ``take`` copies one row at a time, a ``memmove`` each, and each row starts
where no hardware prefetch stream runs yet: a thread spends much of every row waiting on
memory, one row's misses in flight. ``take_rows`` (C, ``storebench._rows``) copies a group
of eight rows 64 bytes at a time, interleaved, which keeps eight rows' misses in flight.

Rows that come from the device are the exception: where the batch's first eight rows (copied
one after the other) took a major fault, a file map being read from disk or memory swapped
out, the rest are copied one after the other too. The kernel reads around each faulting
page, and eight rows faulting at once put eight such windows in flight: under the
out_of_core study's memory limits that evicted pages before their rows were copied, and a
memmap epoch read twice the bytes and more from the device.

``python -m storebench.gather`` times both against a plain copy of as many bytes, one and two
threads, interleaved, and prints the medians: the measurements behind this module come from
it, and the targets study records the same comparison in every run
(``<path>.numpy_take_fraction_of_dram_copy`` against ``<path>.bare_take_fraction_of_dram_copy``).
"""

from __future__ import annotations

import numpy as np

from ._rows import take_rows as _take_rows


def take_rows(rows: np.ndarray, indices: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[k] = rows[indices[k]]`` for each k, and return ``out``.

    ``rows`` is an (N, ...) array, ``out`` a writable (len(indices), ...) array of the same
    dtype and row size, ``indices`` int64 in [0, N): an index outside is an IndexError raised
    before anything is written (negative ones are not wrapped: callers normalise them, as
    ``check_indices`` does). C-contiguous ``rows`` and ``out`` take the interleaved copy, with
    the GIL released; any other layout takes ``np.take``."""
    if rows.dtype != out.dtype or rows.dtype.hasobject:
        raise TypeError(f"take_rows: rows are {rows.dtype} and out is {out.dtype}; both must "
                        f"be one plain dtype")
    if out.shape[:1] != (len(indices),):
        raise ValueError(f"take_rows: out has shape {out.shape}, {len(indices)} rows asked")
    if rows.flags.c_contiguous and out.flags.c_contiguous:
        _take_rows(rows, np.ascontiguousarray(indices, dtype=np.int64), out)
        return out
    indices = np.asarray(indices, dtype=np.int64)
    if indices.size and (indices.min() < 0 or indices.max() >= len(rows)):
        bad = indices[(indices < 0) | (indices >= len(rows))][0]
        raise IndexError(f"take_rows: row index {int(bad)} out of range for {len(rows)} rows")
    np.take(rows, indices, axis=0, out=out)
    return out


def _rates(rows: int = 4000, row_bytes: int = 12_288, batch: int = 256, rounds: int = 40
           ) -> dict[str, float]:
    """GB/s of a shuffled ``batch``-row gather by ``np.take`` and by ``take_rows``, and of a
    copy of an epoch's bytes, with one thread and two (each taking every other batch),
    interleaved round by round; medians over ``rounds`` (a diagnostic, not a test)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from .buffers import batch_empty

    source = np.ones((rows, row_bytes), np.uint8)
    batches = rows // batch
    outs = [batch_empty((batch, row_bytes)) for _ in range(2)]
    copy_from = np.ones(batches * batch * row_bytes, np.uint8)
    copy_to = np.ones_like(copy_from)

    # Each way as run(batches, k, of): the k-th of ``of`` threads' share of one epoch.
    def numpy_take(order, k, of):
        for idx in order[k::of]:
            np.take(source, idx, axis=0, out=outs[k], mode="clip")

    def interleaved(order, k, of):
        for idx in order[k::of]:
            _take_rows(source, idx, outs[k])

    def copy(order, k, of):
        share = len(copy_from) // of
        np.copyto(copy_to[share * k:share * (k + 1)], copy_from[share * k:share * (k + 1)])

    rng = np.random.default_rng(0)
    seconds: dict[str, list[float]] = {}
    with ThreadPoolExecutor(1) as pool:
        for _ in range(rounds + 1):
            order = list(rng.permutation(rows)[:batches * batch].reshape(batches, batch))
            for name, run in (("copy", copy), ("np.take", numpy_take),
                              ("take_rows", interleaved)):
                started = time.perf_counter()
                run(order, 0, 1)
                seconds.setdefault(f"{name}, 1 thread", []).append(
                    time.perf_counter() - started)
                started = time.perf_counter()
                helper = pool.submit(run, order, 1, 2)
                run(order, 0, 2)
                helper.result()
                seconds.setdefault(f"{name}, 2 threads", []).append(
                    time.perf_counter() - started)
    nbytes = batches * batch * row_bytes
    return {name: nbytes / float(np.median(spent[1:])) / 1e9 for name, spent in seconds.items()}


if __name__ == "__main__":
    for name, rate in _rates().items():
        print(f"{name:22s} {rate:6.2f} GB/s")
