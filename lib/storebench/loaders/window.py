"""The ordered, bounded prefetch window, written once for every windowed prefetcher.

``OrderedWindow`` keeps a prefetcher's reorder bookkeeping in one place, as PyTorch's
``_MultiProcessingDataLoaderIter`` does: ``_send_idx`` (the next batch to submit),
``_rcvd_idx`` (the next batch to hand out), ``_task_info`` (batches submitted and not yet
handed out), ``_results`` (batches that finished ahead of their turn) and
``_try_put_index`` (submit one more). A *transport* moves the work to workers and back:

- threads (``ThreadPrefetcher``): results are batches written into preallocated buffers;
- processes with shared memory (``ProcessPrefetcher``): workers write into a slot of a
  shared segment and send back a few bytes;
- processes with pickled arrays (``BaselinePickledQueuePrefetcher``): the naive baseline.

What the window guarantees whatever the transport:

- **order**: batches come out in the order of ``batches``;
- **backpressure**: batch ``s`` goes to slot ``s % depth`` and is submitted only once the
  consumer has let go of batch ``s - depth`` (asked for the next one);
- **errors**: a worker's exception is raised in the consumer as ``WorkerError`` carrying the
  worker's traceback; any exception raised inside ``next()`` (a worker error, a dead worker,
  a ``KeyboardInterrupt`` while waiting) closes the prefetcher;
- **deadlines**: ``iter_until(t)`` is a pass cut short at ``time.monotonic()`` ``t``: it
  ends after the first batch handed out past ``t``, and workers that honour deadlines (the
  thread and shared-memory transports) read no batch but the pass's first that they take
  after ``t``, so the stop waits only for batches begun before it (a thrashing read takes
  seconds per batch). With ``slice_samples``, those workers also cut the batches in hand
  that would end more than ``overrun`` past ``t`` (``CutReader``): the pass then ends
  within one slice or ``overrun`` of ``t``, not one batch, and its last batch may hold a
  prefix of its indices;
- **no leaks**: a pass left before its end (``break``, an exception or ``KeyboardInterrupt``
  in the loop body, an iterator dropped) stops the workers and frees the transport's memory
  in the generator's ``close()``, which CPython runs as soon as the loop unwinds. The next
  pass starts fresh workers; a pass that runs to its end keeps them.
"""

from __future__ import annotations

import numbers
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, Self

import numpy as np

from .batching import Batch
from .resume import Delivered


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
    """A prefetch worker process ended without being asked to (killed, crashed, or unable
    to start)."""


class WorkerStartError(WorkerError):
    """Workers could not be started: what they need does not pickle, or the prefetcher was
    created while a spawn/forkserver worker re-ran the main module."""


@dataclass(frozen=True)
class WorkerFailure:
    """A worker's exception on one batch, as a transport hands it to the window."""

    label: str  # "prefetch thread", "prefetch worker", ...
    worker: int
    traceback: str
    cause: BaseException | None = None


@dataclass(frozen=True)
class NotStarted:
    """A batch a worker took after its pass's deadline and did not read."""


@dataclass(frozen=True)
class Cut:
    """Where a worker cuts the batches of a pass: at ``time.monotonic()`` ``at``, on a
    boundary of ``slice_samples`` samples, for a batch that would otherwise end more than
    ``overrun`` seconds past ``at`` (see ``CutReader``)."""

    at: float
    slice_samples: int
    overrun: float = 0.0


class CutReader:
    """One worker's batch reads in a pass with a ``Cut``. A batch that, at the worker's pace
    (seconds a sample, measured on its reads in this pass), would end within ``overrun`` of
    the cut is read in one ``get_batch`` call. Any other is read slice by slice and ends at
    the first slice boundary past the cut, holding a prefix of its indices (at least one
    slice). The pace is measured on a batch's first slice when there is none yet (one
    extra call per worker and pass)."""

    def __init__(self) -> None:
        self._cut: Cut | None = None
        self._pace: float | None = None

    def read(self, dataset, indices: np.ndarray, out: np.ndarray | None, cut: Cut | None
             ) -> Batch:
        if cut != self._cut:  # a new pass
            self._cut, self._pace = cut, None
        n = len(indices)
        if cut is None or n <= cut.slice_samples:
            return dataset.get_batch(indices, out=out)
        began = time.monotonic()
        if self._pace is not None and began + self._pace * n <= cut.at + cut.overrun:
            batch = dataset.get_batch(indices, out=out)
            self._pace = (time.monotonic() - began) / n
            return batch
        step = cut.slice_samples
        parts = [dataset.get_batch(indices[:step], out=_rows(out, 0, step))]
        now = time.monotonic()
        self._pace = (now - began) / step
        if now + self._pace * (n - step) <= cut.at + cut.overrun:
            parts.append(dataset.get_batch(indices[step:], out=_rows(out, step, n)))
        else:
            for begin in range(step, n, step):
                if time.monotonic() > cut.at:
                    break
                stop = min(begin + step, n)
                parts.append(dataset.get_batch(indices[begin:stop], out=_rows(out, begin, stop)))
        return _joined(parts, out)


def _rows(out: np.ndarray | None, start: int, stop: int) -> np.ndarray | None:
    return None if out is None else out[start:stop]


def _joined(parts: list[Batch], out: np.ndarray | None) -> Batch:
    """One batch of consecutive ``parts`` (read into consecutive rows of ``out``, if given)."""
    if len(parts) == 1:
        return parts[0]
    count = sum(len(part) for part in parts)
    labels = np.concatenate([part.labels for part in parts])
    indices = np.concatenate([part.indices for part in parts])
    if all(part.is_array for part in parts):
        if out is not None and all(np.shares_memory(part.images, out) for part in parts):
            images = out[:count]
        else:
            images = np.concatenate([part.images for part in parts])
    else:
        images = [image for part in parts for image in part.images]
    return Batch(images, labels, indices)


class Transport(Protocol):
    """How one kind of worker pool takes batches and gives them back."""

    def start(self) -> None:
        """Start the workers (and allocate their memory); a no-op while they run."""

    def stop(self) -> None:
        """Stop the workers and free their memory; ``start()`` may follow. Idempotent."""

    def submit(self, seq: int, slot: int, indices: np.ndarray) -> None:
        """Have a worker read batch ``seq`` (sample ``indices``) into slot ``slot``. A
        transport that honours deadlines has attributes ``not_after`` (a
        ``time.monotonic()`` value or None) and ``cut`` (a ``Cut`` or None), set by the window
        for each pass: a worker that takes a batch after ``not_after`` reports
        ``NotStarted()`` instead of reading it, and reads the batches it does take with its
        ``CutReader``; its result then says how many samples it read."""

    def wait(self) -> list[tuple[int, object]]:
        """Block until workers report; return the ``(seq, result)`` pairs that arrived
        (possibly none), ``result`` being a ``WorkerFailure`` when the batch failed. Raises
        ``WorkerDiedError`` when a worker is gone."""

    def batch(self, slot: int, indices: np.ndarray, result) -> Batch:
        """The batch to hand out for a successful ``result`` read into ``slot``."""


def positive_int(value, name: str) -> int:
    """``value`` as an int, refusing bools, floats, strings and values below 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def failure_message(label: str, worker: int, batch: int, indices, tb: str) -> str:
    shown = ", ".join(str(i) for i in list(indices)[:8]) + (", ..." if len(indices) > 8 else "")
    return f"{label} {worker} failed on batch {batch} (sample indices [{shown}]):\n\n{tb.rstrip()}"


class OrderedWindow:
    """An ordered window of at most ``depth`` batches over ``transport``."""

    def __init__(self, transport: Transport, *, depth: int, copy: bool, name: str) -> None:
        self.transport = transport
        self.depth = depth
        self.copy = copy
        self.name = name
        self.closed = False
        self._send_idx = 0  # sequence numbers run on across passes: stale results never match
        self._rcvd_idx = 0
        self._task_info: dict[int, np.ndarray] = {}
        self._results: dict[int, object] = {}
        self._pass = 0
        self.suspended = False

    def close(self) -> None:
        """Stop the workers for good and free their memory."""
        self.closed = True
        self._forget()
        self.transport.stop()

    def run(
        self, batches: Iterable, *, owner: object, until: float | None = None,
        slice_samples: int | None = None, overrun: float = 0.0, delivered=None,
    ) -> Iterator[Batch]:
        """One pass over ``batches``, cut short at ``time.monotonic()`` ``until`` if given,
        the batches in hand then too with ``slice_samples`` (see the module docstring).
        ``owner`` (the prefetcher) is held by the generator so that ``for b in
        Prefetcher(...)`` does not finalise the prefetcher mid-loop. ``delivered(n)``, if
        given, is called with each batch's sample count as it is handed out."""
        self._pass += 1
        token = self._pass
        try:
            if self.closed:  # closed between iter() and the first next()
                raise RuntimeError(f"this {self.name} is closed")
            self._drain()
            self.transport.start()
            if hasattr(self.transport, "epoch"):  # for seeded transforms in the workers
                self.transport.epoch = getattr(getattr(batches, "sampler", batches), "epoch", 0)
            if hasattr(self.transport, "cut"):
                self.transport.cut = (
                    Cut(until, slice_samples, overrun)
                    if until is not None and slice_samples else None)
            tasks = iter(batches)
            first = self._send_idx
            exhausted = False
            while True:
                while not exhausted and self._send_idx < self._rcvd_idx + self.depth:
                    # A pass's first batch is always read, whatever its deadline.
                    not_after = until if self._send_idx > first else None
                    exhausted = not self._try_put_index(tasks, not_after)
                if self._rcvd_idx == self._send_idx:
                    return
                seq = self._rcvd_idx
                while seq not in self._results:
                    self._collect()
                result = self._results.pop(seq)
                indices = self._task_info.pop(seq)
                if isinstance(result, NotStarted):
                    self._cut_short()
                    return
                if isinstance(result, WorkerFailure):
                    raise WorkerError(
                        failure_message(
                            result.label, result.worker, seq - first, indices, result.traceback
                        ),
                        worker=result.worker,
                        batch=seq - first,
                        worker_traceback=result.traceback,
                    ) from result.cause
                batch = self.transport.batch(seq % self.depth, indices, result)
                if delivered is not None:
                    delivered(len(batch))
                self.suspended = True  # the consumer holds a batch of this pass
                try:
                    yield batch.copy() if self.copy else batch
                finally:
                    self.suspended = False
                if self._pass != token:
                    raise RuntimeError(f"a newer pass over this {self.name} was started")
                self._rcvd_idx += 1
                if until is not None and time.monotonic() > until:
                    self._cut_short()
                    return
        except GeneratorExit:
            # Left early: the consumer broke out, raised (KeyboardInterrupt included) or
            # dropped the iterator. Stop now rather than when the prefetcher is collected.
            if self._pass == token:
                self._cut_short()
            raise
        except BaseException:
            if self._pass == token:  # a stale pass must not close the one that replaced it
                self.close()
            raise

    def _cut_short(self) -> None:
        """End a pass before its end: stop the workers (they finish the batch in hand) and
        drop what is in flight; the next pass starts fresh workers."""
        self._forget()
        self.transport.stop()

    def _try_put_index(self, tasks: Iterator, not_after: float | None = None) -> bool:
        """Submit the next batch of ``tasks`` (not to be started after ``not_after`` where
        the transport honours deadlines); False when there is none."""
        indices = next(tasks, None)
        if indices is None:
            return False
        indices = np.asarray(indices, dtype=np.int64)
        seq = self._send_idx
        if hasattr(self.transport, "not_after"):
            self.transport.not_after = not_after
        self.transport.submit(seq, seq % self.depth, indices)
        self._task_info[seq] = indices
        self._send_idx += 1
        return True

    def _collect(self) -> None:
        for seq, result in self.transport.wait():
            if seq in self._task_info:
                self._results[seq] = result

    def _drain(self) -> None:
        """Wait out batches that a pass still suspended in a ``for`` left in flight: their
        workers may still be writing into slots this pass is about to reuse."""
        while any(seq not in self._results for seq in self._task_info):
            self._collect()
        self._forget()

    def _forget(self) -> None:
        self._task_info.clear()
        self._results.clear()
        self._rcvd_idx = self._send_idx


class WindowedPrefetcher:
    """Lifecycle shared by the windowed prefetchers: a pass per ``iter()``, ``close()``, the
    context manager, and clean-up when the prefetcher is garbage collected."""

    batches: Iterable
    _window: OrderedWindow
    _finalizer: weakref.finalize

    def _open_window(self, transport: Transport, *, depth: int, copy: bool) -> None:
        self._window = OrderedWindow(transport, depth=depth, copy=copy, name=type(self).__name__)
        # The finaliser holds the window, never the prefetcher: dropping the last reference
        # to the prefetcher stops its workers without waiting for the cycle collector.
        self._finalizer = weakref.finalize(self, self._window.close)

    @property
    def closed(self) -> bool:
        return self._window.closed

    def set_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)

    def _counted(self) -> Delivered:
        # Made on first use: subclasses set self.batches before opening the window.
        if getattr(self, "_delivered", None) is None:
            self._delivered = Delivered(self.batches)
        return self._delivered

    def state_dict(self) -> dict:
        """The epoch, seed and position of the samples *delivered* (batches read ahead and
        not yet handed out are not counted: a resume delivers them), and the dataset's size
        and content digest. Needs ``batches`` to be a ``BatchSampler`` over a storebench
        sampler; see ``storebench.loaders.samplers`` for what a resume delivers."""
        return self._counted().loader_state(getattr(self, "dataset", None))

    def load_state_dict(self, state_dict: dict) -> None:
        """Make the next pass deliver the rest of the state's epoch, whatever ``workers``
        and ``depth`` (ValueError for a state over another dataset or sampler). Between
        passes only: a RuntimeError in the middle of one."""
        if self._window.suspended:
            raise RuntimeError(
                f"load_state_dict in the middle of a pass over this {type(self).__name__}: "
                "finish the pass or leave it (break) first, or load into a new loader")
        self._counted().load(state_dict, getattr(self, "dataset", None))

    def __iter__(self) -> Iterator[Batch]:
        if self._window.closed:
            raise RuntimeError(f"this {type(self).__name__} is closed")
        return self._window.run(self.batches, owner=self, delivered=self._delivery_hook())

    def _delivery_hook(self):
        if not getattr(self.batches, "resumable", False):
            return None
        return self._counted().add

    def iter_until(self, deadline: float, *, slice_samples: int | None = None,
                   overrun: float = 0.0) -> Iterator[Batch]:
        """A pass cut short at ``time.monotonic()`` ``deadline``: it ends after the first
        batch handed out past it (or at the pass's end), and no worker starts a batch after
        it but the pass's first, so stopping waits only for batches begun before it. For
        time-boxed epochs (a thrashing pass, a training budget in minutes).

        ``slice_samples``: workers also cut a batch in hand that, at their pace, would end
        more than ``overrun`` seconds past the deadline, on a boundary of that many samples
        (``CutReader``), so the pass ends within one slice or ``overrun`` of it even where
        one batch takes longer than the whole budget; its last batch may then hold a prefix
        of its indices. A batch that ends within ``overrun`` is read whole, in one call."""
        if self._window.closed:
            raise RuntimeError(f"this {type(self).__name__} is closed")
        if slice_samples is not None:
            slice_samples = positive_int(slice_samples, "slice_samples")
        if not overrun >= 0:
            raise ValueError(f"overrun must be >= 0 seconds, got {overrun!r}")
        return self._window.run(self.batches, owner=self, until=float(deadline),
                                slice_samples=slice_samples, overrun=float(overrun),
                                delivered=self._delivery_hook())

    def close(self) -> None:
        """Stop the workers and free their memory. Batches already handed out stay
        readable until dropped."""
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
