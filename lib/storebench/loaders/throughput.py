"""Measurement functions for loader paths: run a pipeline, count samples and bytes, time it.

These only measure (no files are written); the benchmark harness turns the returned
``Measurement`` objects into result rows. Every function excludes start-up (worker launch,
imports, first-touch page faults) by discarding ``warmup_batches`` batches before the clock
starts. Open readers with ``verify=False`` to time the loader rather than CRC32C checks.

The ``targets`` study's measure functions (``studies.targets.cases``) are built from these.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..gather import take_rows
from .batching import Batch, batch_buffer
from .samplers import BatchSampler, ShuffleSampler


@dataclass(frozen=True)
class Measurement:
    """What one timed run delivered: ``samples`` and image ``bytes`` in ``seconds``."""

    name: str
    samples: int
    bytes: int
    seconds: float
    batches: int

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")

    @property
    def bytes_per_second(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else float("nan")


def _sizes(batch) -> tuple[int, int]:
    """(samples, image bytes) of a Batch, an (images, labels) pair of arrays or tensors, or
    a TensorFlow batch."""
    if isinstance(batch, Batch):
        return len(batch), batch.nbytes
    images, labels = batch
    n = int(labels.shape[0])
    if hasattr(images, "nbytes"):
        return n, int(images.nbytes)
    if hasattr(images, "element_size"):  # torch tensor
        return n, int(images.numel() * images.element_size())
    if hasattr(images, "numpy"):  # tf.Tensor
        return n, int(images.numpy().nbytes)
    return n, int(sum(len(x) for x in images))


def measure(
    batches: Iterable,
    *,
    name: str,
    warmup_batches: int = 1,
    max_batches: int | None = None,
) -> Measurement:
    """Iterate ``batches`` and time everything after the first ``warmup_batches``."""
    source = iter(batches)
    for _ in range(warmup_batches):
        if next(source, None) is None:
            raise ValueError(f"{name}: fewer batches than warmup_batches={warmup_batches}")
    samples = nbytes = count = 0
    started = time.perf_counter()
    for batch in source:
        n, b = _sizes(batch)
        samples, nbytes, count = samples + n, nbytes + b, count + 1
        if max_batches is not None and count >= max_batches:
            break
    seconds = time.perf_counter() - started
    return Measurement(name, samples, nbytes, seconds, count)


def dram_read_bandwidth(*, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes/s of a sequential read of ``nbytes`` of pre-faulted RAM (``np.sum`` over a
    uint64 view; one thread), the median of ``repeats`` runs after one warm-up."""
    buffer = np.ones(max(nbytes // 8, 1), dtype=np.uint64)  # written once: pre-faulted
    buffer.sum()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        buffer.sum()
        seconds.append(time.perf_counter() - started)
    return buffer.nbytes / float(np.median(seconds))


def _assembly_buffers(dataset, batch_size: int, seed: int):
    """(one preallocated (B, H, W, C) batch buffer, full shuffled batches) for timing batch
    assembly from ``dataset``; fixed-size samples and at least one batch required."""
    shape = dataset.sample_shape
    if shape is None:
        raise ValueError("batch assembly needs fixed-size samples (raw, or decode=...)")
    out = batch_buffer(batch_size, shape, dataset.sample_dtype)
    batches = BatchSampler(ShuffleSampler(len(dataset), seed=seed), batch_size, drop_last=True)
    if len(batches) == 0:
        raise ValueError(f"{len(dataset)} samples make no batch of {batch_size}")
    return out, batches


def gather_against_copy(datasets: Mapping[str, object], *, batch_size: int = 256,
                        rounds: int = 20, seed: int = 0, rows: np.ndarray | None = None,
                        copy_threads: int = 1,
                        epochs: Mapping[str, Callable[[list[np.ndarray]], object]] | None = None,
                        ) -> dict[str, Measurement]:
    """Shuffled batch assembly into one preallocated buffer from each of ``datasets``
    (``{name: dataset}``, the same samples: one configured per way of gathering) and a plain
    copy of as many bytes between two pre-faulted buffers, interleaved: ``rounds`` x (the
    copies, one epoch of gathers per dataset), each timed on its own and summed. One epoch of
    a small set is a few ms, so back-to-back alternation is what keeps all of them under the
    same machine state (clock, neighbours); a copy measured once, apart, swings by a quarter
    on a shared machine.

    The copy is timed with one thread and, with ``copy_threads`` k > 1, also split over k
    threads: ``"copy"`` is the faster of the two, the machine's copy bandwidth as far as k
    threads reach it (a gather split over k threads is then held to the same limit).
    With ``rows`` (the samples as one (N, H, W, C) array: what the datasets gather from),
    each round also times a bare one-thread ``take_rows`` of the same batches from it
    (``bare_take``): the gather without the loader around it, which says how much of a
    shortfall is the loader and how much the access pattern itself; and NumPy's own
    ``np.take`` of them (``numpy_take``), what the loaders gathered with before
    ``storebench.gather``. With k > 1 copy threads too, ``bare_take`` runs
    free over k threads as well: each takes every k-th batch whole into a buffer of its
    own, and they meet once a round, not once a batch. That is the pattern's own limit at k
    threads, the mark for a gather split over k threads, whose parts hand off at every
    batch.

    ``epochs`` (``{name: run_epoch}``) are other ways through the same batches, timed as the
    datasets are: ``run_epoch(order)`` is given a round's batches (index arrays) and must
    deliver every one of them before it returns, and do nothing between calls (a loader that
    reads ahead into the next round would be timed in the copies' turn).

    Returns a measurement per dataset and epoch name, ``"copy_1_thread"``,
    ``"copy_<k>_threads"``, ``"copy"``, ``"bare_take"``, ``"numpy_take"`` and
    ``"bare_take_<k>_threads"`` (with ``rows``); a ``bytes_per_second`` ratio to ``copy`` is
    a fraction of the DRAM copy bandwidth."""
    reserved = {"copy", "copy_1_thread", "bare_take", "numpy_take"}
    if copy_threads > 1:
        reserved |= {f"copy_{copy_threads}_threads", f"bare_take_{copy_threads}_threads"}
    epochs = dict(epochs or {})
    if not datasets or reserved & {*datasets, *epochs} or set(datasets) & set(epochs):
        raise ValueError(f"datasets and epochs must be named apart and not "
                         f"{sorted(reserved)}, got {sorted(datasets)} and {sorted(epochs)}")
    if copy_threads < 1:
        raise ValueError(f"copy_threads must be positive, got {copy_threads}")
    first = next(iter(datasets.values()))
    out, batches = _assembly_buffers(first, batch_size, seed)
    epoch_bytes = len(batches) * out.nbytes
    source = np.ones(epoch_bytes, dtype=np.uint8)  # written once: pre-faulted
    target = np.zeros_like(source)
    target[:] = 1
    orders = []
    for epoch in range(rounds + 1):
        batches.set_epoch(epoch)
        orders.append([np.asarray(idx) for idx in batches])
    flat_rows = rows.reshape(len(rows), -1) if rows is not None else None
    flat_out = out.reshape(batch_size, -1)
    copiers, free_takes, pool = _copy_ways(source, target, copy_threads=copy_threads,
                                           rows=flat_rows, out=flat_out)
    free_name = f"bare_take_{copy_threads}_threads"
    # Every timed way through a round's batches, in the order the rounds time them.
    ways: dict[str, Callable[[list[np.ndarray]], object]] = {
        name: (lambda order, copy=copy: copy()) for name, copy in copiers.items()}
    for name, dataset in datasets.items():
        ways[name] = lambda order, dataset=dataset: _gather_batches(dataset, order, out)
    ways.update(epochs)
    if flat_rows is not None:
        ways["bare_take"] = lambda order: _take_batches(flat_rows, order, flat_out)
        ways["numpy_take"] = lambda order: _numpy_take_batches(flat_rows, order, flat_out)
    if free_takes is not None:
        ways[free_name] = free_takes
    gathers = [name for name in ways if name not in copiers]
    seconds = dict.fromkeys(ways, 0.0)
    try:
        for epoch, order in enumerate(orders):  # the first round warms up, untimed
            for name, way in ways.items():
                started = time.perf_counter()
                way(order)
                if epoch:
                    seconds[name] += time.perf_counter() - started
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    count = rounds * len(batches)
    total = rounds * epoch_bytes
    measured = {name: Measurement(name, 0, total, seconds[name], rounds) for name in copiers}
    measured["copy"] = min(measured.values(), key=lambda m: m.seconds)
    for name in gathers:
        measured[name] = Measurement(name, count * batch_size, total, seconds[name], count)
    return measured


def interleaved_passes(passes: Mapping[str, Callable[[list[np.ndarray]], tuple[int, int]]],
                       order: Sequence[np.ndarray], *, rounds: int, warmup_batches: int = 0,
                       multiple: int = 1) -> dict[str, Measurement]:
    """Several ways through the same batches, interleaved: ``passes`` is ``{name: run}``,
    where ``run(batches)`` reads the given batches (index arrays) whole and returns the
    ``(samples, image bytes)`` it delivered.

    Each pass first runs over ``order``'s first ``warmup_batches``, untimed (workers start,
    decoders load). The batches after those are cut into ``rounds`` slices of equal length,
    a multiple of ``multiple`` batches (the workers of the widest loader, so that no pass
    ends with a worker idle for want of a batch; what does not fill a slice is left out),
    and every pass runs every slice, each timed on its own and summed; which pass goes first
    rotates from round to round. A machine whose speed drifts (a neighbour, the clock) then
    drifts for every pass alike, as a ratio between them needs: timed one after the other,
    whole, the passes of one case saw different machines."""
    if not passes:
        raise ValueError("no passes to time")
    if rounds < 1 or multiple < 1 or warmup_batches < 0:
        raise ValueError(f"rounds and multiple must be positive and warmup_batches not "
                         f"negative, got {rounds}, {multiple} and {warmup_batches}")
    order = list(order)
    timed_batches = order[warmup_batches:]
    per_round = len(timed_batches) // rounds // multiple * multiple
    if per_round == 0:
        raise ValueError(f"{len(order)} batches leave no slice of {multiple} for each of "
                         f"{rounds} rounds after {warmup_batches} warm-up batches")
    names = list(passes)
    seconds = dict.fromkeys(names, 0.0)
    samples = dict.fromkeys(names, 0)
    nbytes = dict.fromkeys(names, 0)
    if warmup_batches:
        for run in passes.values():
            run(order[:warmup_batches])
    for k in range(rounds):
        batches = timed_batches[k * per_round:(k + 1) * per_round]
        for name in names[k % len(names):] + names[:k % len(names)]:
            started = time.perf_counter()
            delivered, size = passes[name](batches)
            seconds[name] += time.perf_counter() - started
            samples[name] += delivered
            nbytes[name] += size
    return {name: Measurement(name, samples[name], nbytes[name], seconds[name],
                              rounds * per_round) for name in names}


def pinned_pass(dataset, cpu: int, usable: Sequence[int], out: np.ndarray | None
                ) -> Callable[[list[np.ndarray]], tuple[int, int]]:
    """A pass for ``interleaved_passes``: ``dataset.get_batch`` of each given batch into
    ``out`` (a shorter batch into its head), in the calling thread pinned to core ``cpu``
    and let go to ``usable`` afterwards, so that one core's rate is timed, not whichever
    core the scheduler gave the thread. Returns (samples, image bytes)."""

    def run(batches: list[np.ndarray]) -> tuple[int, int]:
        # pid 0: this thread only; let go before a prefetcher starts a thread or forks a
        # worker, which would inherit the pin.
        os.sched_setaffinity(0, {cpu})
        try:
            samples = nbytes = 0
            for idx in batches:
                n, size = _sizes(dataset.get_batch(
                    idx, out=None if out is None else out[:len(idx)]))
                samples, nbytes = samples + n, nbytes + size
            return samples, nbytes
        finally:
            os.sched_setaffinity(0, usable)
    return run


def _copy_ways(source: np.ndarray, target: np.ndarray, *, copy_threads: int,
               rows: np.ndarray | None, out: np.ndarray):
    """``(copiers, free_takes, pool)`` for ``gather_against_copy``: the copy of ``source``
    into ``target`` by one thread and, with ``copy_threads`` k > 1, split over k; with
    ``rows`` and k > 1, the bare take run free over k threads (None otherwise); the pool
    of k - 1 helper threads they share (None for one), which the caller shuts down."""
    flat_rows, flat_out, epoch_bytes = rows, out, source.nbytes
    copiers = {"copy_1_thread": lambda: np.copyto(target, source)}
    pool = None
    if copy_threads > 1:
        pool = ThreadPoolExecutor(copy_threads - 1)
        bounds = np.linspace(0, epoch_bytes, copy_threads + 1).astype(int).tolist()
        spans = list(zip(bounds[:-1], bounds[1:], strict=True))

        def split_copy() -> None:
            parts = [pool.submit(np.copyto, target[a:b], source[a:b]) for a, b in spans[1:]]
            np.copyto(target[spans[0][0]:spans[0][1]], source[spans[0][0]:spans[0][1]])
            for part in parts:
                part.result()

        copiers[f"copy_{copy_threads}_threads"] = split_copy
    free_takes = None
    if flat_rows is not None and pool is not None:
        outs = [flat_out] + [np.zeros_like(flat_out) for _ in range(copy_threads - 1)]

        def free_takes(order: list[np.ndarray]) -> None:
            parts = [pool.submit(_take_batches, flat_rows, order[k::copy_threads], outs[k])
                     for k in range(1, copy_threads)]
            _take_batches(flat_rows, order[0::copy_threads], outs[0])
            for part in parts:
                part.result()

    return copiers, free_takes, pool


def _gather_batches(dataset, order: list[np.ndarray], out: np.ndarray) -> None:
    for idx in order:
        dataset.get_batch(idx, out=out)


def _numpy_take_batches(rows: np.ndarray, order: list[np.ndarray], out: np.ndarray) -> None:
    for idx in order:
        np.take(rows, idx, axis=0, out=out, mode="clip")


def _take_batches(rows: np.ndarray, order: Sequence[np.ndarray], out: np.ndarray) -> None:
    """``take_rows`` of each batch of ``order`` from ``rows`` into ``out``, in this
    thread."""
    for idx in order:
        take_rows(rows, idx, out)


def shuffled_batch_assembly(
    dataset,
    *,
    batch_size: int = 256,
    num_batches: int | None = None,
    seed: int = 0,
    warmup_batches: int = 2,
    name: str = "shuffled batch assembly",
) -> Measurement:
    """Gather shuffled batches into one preallocated (B, H, W, C) buffer, in this thread."""
    out, batches = _assembly_buffers(dataset, batch_size, seed)
    wanted = (num_batches if num_batches is not None else len(batches)) + warmup_batches

    def assembled():
        # Epoch after epoch (reshuffled) until enough batches: a short dataset would
        # otherwise give a run too short to time.
        done, epoch = 0, 0
        while done < wanted:
            batches.set_epoch(epoch)
            for idx in batches:
                yield dataset.get_batch(idx, out=out)
                done += 1
                if done == wanted:
                    return
            epoch += 1

    return measure(assembled(), name=name, warmup_batches=warmup_batches, max_batches=num_batches)
