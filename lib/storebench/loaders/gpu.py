"""Feeding the accelerator: host-to-device copies, and an emulated accelerator for CPU machines.

``GpuFeeder`` turns batches (``Batch`` or ``(images, labels)`` arrays) into torch tensors in
one of two preallocated device buffers (a double buffer), with one of three copy modes:

- pageable, synchronous: ``device_buffer.copy_(host)``; the host thread waits for each copy
  (CUDA first stages pageable memory through a driver buffer, so this is two copies);
- ``pinned=True``: the batch is first copied into one of two page-locked staging buffers,
  from which the DMA engine reads directly; a batch that is already page-locked (torch
  tensors from ``DataLoader(pin_memory=True)``, the arrays of a ``ThreadPrefetcher`` or
  ``ProcessPrefetcher`` made with ``pin_memory=True``) is read where it is, with no staging
  copy;
- ``non_blocking=True`` (with ``pinned=True``): the copy is queued on a side CUDA stream and
  the host goes on at once; CUDA events order it after the consumer's last use of the
  buffer and before the consumer's first use of the batch.

Without CUDA the device is the CPU: the "transfer" is one host memcpy into a preallocated
tensor, and asking for pinned memory or asynchronous copies raises
``AcceleratorUnavailableError``.

``run_feed`` drives an ``EmulatedAccelerator`` (a fixed compute time per batch, as MLPerf
Storage does) the way a real accelerator runs: a step is *launched* and computes on the
accelerator's own clock while the host fetches and copies the next batch; the host blocks
only when it must reuse a device buffer whose step has not finished. Accelerator
utilisation ``AU = compute / wall`` after warm-up, and every moment the accelerator sat idle
is charged to what the host was doing then: waiting for data, copying, or its own overhead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from .batching import Batch

BUFFERS = 2  # device buffers: the step on one overlaps the copy into the other


class AcceleratorUnavailableError(RuntimeError):
    """A feed option needs CUDA and this machine (or this torch build) has none."""


def _as_arrays(batch) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(batch, Batch):
        images, labels = batch.images, batch.labels
    else:
        images, labels = batch
    if not isinstance(images, np.ndarray):
        try:
            images = images.numpy()  # a CPU tensor from a DataLoader
        except AttributeError:
            raise TypeError(
                "GpuFeeder needs fixed-size image arrays; got "
                f"{type(images).__name__} (decode the samples first; give images of different "
                "sizes a transform with a fixed output, such as storebench.loaders.Resize)"
            ) from None
    labels = labels if isinstance(labels, np.ndarray) else labels.numpy()
    return images, labels


def _page_locked(batch) -> tuple | None:
    """``(images, labels)`` as torch tensors when the images lie contiguous in page-locked
    memory: torch tensors from ``DataLoader(pin_memory=True)``, or the arrays of a
    prefetcher made with ``pin_memory=True``. The DMA engine can read them in place. The
    labels (8 bytes a sample; a thread prefetcher's are not in its locked buffers) are
    copied from wherever they are."""
    import torch

    images, labels = (batch.images, batch.labels) if isinstance(batch, Batch) else batch
    if isinstance(images, np.ndarray):
        if not (images.flags.c_contiguous and images.flags.writeable):
            return None  # torch.from_numpy warns on read-only arrays
        images = torch.from_numpy(images)
    if not (isinstance(images, torch.Tensor) and images.is_pinned()
            and images.is_contiguous()):
        return None
    if not (isinstance(labels, torch.Tensor) and labels.dtype == torch.int64
            and labels.is_contiguous()):
        labels = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
    return images, labels


def _batch_length(batch) -> int:
    if isinstance(batch, Batch):
        return len(batch)
    return len(batch[1])


@dataclass(frozen=True)
class _Fed:
    """One batch on its way to the device, with the host's timestamps (``perf_counter``):
    ``asked``..``got`` waiting for the batch, ``copy_started``..``copied`` copying it."""

    images: object
    labels: object
    slot: int
    samples: int
    nbytes: int
    asked: float
    got: float
    copy_started: float
    copied: float
    ready: object = None  # CUDA: the event recorded when the copy has landed


def _no_wait(slot: int) -> None:
    """A synchronous consumer is done with a batch once it asks for the next one."""


class GpuFeeder:
    """Move each batch to ``device`` (default: ``"cuda"`` when available, else ``"cpu"``).

    Yields ``(images, labels)`` torch tensors living in one of two device buffers: a tensor
    is valid until two more batches have been requested (the double buffer). ``stats()``
    reports batches, bytes and copy seconds of the last pass: ``copy_seconds`` is the whole
    way from the loader's memory into the device buffer, ``staging_seconds`` (``pinned=True``)
    the host copy into the page-locked buffer within it and ``device_copy_seconds`` the rest
    (the DMA, by CUDA events). ``run_feed`` accepts a ``GpuFeeder`` and then owns the buffer
    reuse itself (its accelerator runs ahead).
    """

    def __init__(
        self,
        batches: Iterable,
        *,
        device: str | None = None,
        pinned: bool = False,
        non_blocking: bool = False,
    ) -> None:
        import torch

        has_cuda = torch.cuda.is_available()
        self.device = torch.device(
            device if device is not None else ("cuda" if has_cuda else "cpu")
        )
        wanted = [
            name
            for name, on in (("pinned=True", pinned), ("non_blocking=True", non_blocking))
            if on
        ]
        if self.device.type == "cuda" and not has_cuda:
            wanted.insert(0, f"device={str(self.device)!r}")
        if wanted and not has_cuda:
            raise AcceleratorUnavailableError(
                f"{', '.join(wanted)} need(s) a CUDA device, but torch {torch.__version__} "
                "reports torch.cuda.is_available() == False on this machine. Use device='cpu' "
                "with pinned=False, non_blocking=False, and EmulatedAccelerator for the feed study."
            )
        if wanted and self.device.type != "cuda":
            raise AcceleratorUnavailableError(
                f"{', '.join(wanted)} only apply to copies to a CUDA device, not {self.device}"
            )
        self.batches = batches
        self.pinned = bool(pinned)
        self.non_blocking = bool(non_blocking)
        self.uses_cuda = self.device.type == "cuda"
        self._buffer_kind: tuple | None = None  # (sample shape, dtype) of the buffers
        self._capacity = 0
        self._device_images: list = []
        self._device_labels: list = []
        self._host_views: list = []  # numpy views of CPU device buffers
        self._staging: list = []
        self._staging_seconds = 0.0
        self._device_copy_seconds = 0.0
        self._bytes = 0
        self._batches = 0

    @property
    def timing(self) -> str:
        return "cuda-events" if self.uses_cuda else "perf_counter"

    def stats(self) -> dict:
        return {
            "device": str(self.device),
            "pinned": self.pinned,
            "non_blocking": self.non_blocking,
            "batches": self._batches,
            "bytes": self._bytes,
            # A pinned copy's host staging is part of moving the batch: without it the
            # pinned rate would count only the DMA and flatter pinned against pageable.
            "copy_seconds": self._staging_seconds + self._device_copy_seconds,
            "staging_seconds": self._staging_seconds,
            "device_copy_seconds": self._device_copy_seconds,
            "timing": self.timing,
        }

    def _buffers(self, images: np.ndarray) -> None:
        import torch

        shape, capacity = images.shape[1:], images.shape[0]
        if self._buffer_kind == (shape, images.dtype) and self._capacity >= capacity:
            return
        if self.uses_cuda and self._device_images:
            # A copy may still be writing the old buffers (or reading the old staging).
            torch.cuda.synchronize(self.device)
        self._buffer_kind, self._capacity = (shape, images.dtype), capacity
        dtype = torch.from_numpy(images[:0]).dtype
        self._device_images = [
            torch.empty((capacity, *shape), dtype=dtype, device=self.device)
            for _ in range(BUFFERS)
        ]
        self._device_labels = [
            torch.empty(capacity, dtype=torch.int64, device=self.device) for _ in range(BUFFERS)
        ]
        if not self.uses_cuda:
            # Copying through NumPy views keeps the memcpy on this thread: torch's copy_
            # splits a 3 MB copy over its intra-op threads, which then queue behind the
            # prefetch workers for the same cores.
            self._host_views = [
                (i.numpy(), lab.numpy())
                for i, lab in zip(self._device_images, self._device_labels, strict=True)
            ]
            for host_images, _ in self._host_views:
                host_images.fill(0)  # fault the pages in now, not inside the first copies
        if self.pinned:
            self._staging = [
                (
                    torch.empty((capacity, *shape), dtype=dtype).pin_memory(),
                    torch.empty(capacity, dtype=torch.int64).pin_memory(),
                )
                for _ in range(BUFFERS)
            ]

    def __iter__(self) -> Iterator[tuple]:
        if not self.uses_cuda:
            for fed in self._fed():
                yield fed.images, fed.labels
            return
        import torch

        compute = torch.cuda.current_stream(self.device)
        released = [torch.cuda.Event() for _ in range(BUFFERS)]
        for fed in self._fed(released=released):
            compute.wait_event(fed.ready)
            yield fed.images, fed.labels
            # The consumer asked for the next batch, so everything it does with this one is
            # queued on the compute stream: the copy that reuses the buffer waits for it.
            released[fed.slot].record(compute)

    def _fed(
        self,
        *,
        wait_for_slot: Callable[[int], None] = _no_wait,
        released: list | None = None,
        synchronous: bool = False,
    ) -> Iterator[_Fed]:
        """The one copy loop. ``wait_for_slot(slot)`` blocks the host until the consumer
        has finished with the buffer; ``released`` (CUDA) are events the copy waits for on
        the device; ``synchronous=True`` waits for each CUDA copy before handing it over."""
        self._staging_seconds = self._device_copy_seconds = 0.0
        self._bytes = self._batches = 0
        timings: list[tuple] = []
        cuda = self._cuda_streams() if self.uses_cuda else None
        source = iter(self.batches)
        k = 0
        try:
            while True:
                asked = time.perf_counter()
                batch = next(source, None)
                got = time.perf_counter()
                if batch is None:
                    return
                images, labels = _as_arrays(batch)
                self._buffers(images)
                n, slot = len(labels), k % BUFFERS
                wait_for_slot(slot)
                copy_started = time.perf_counter()
                if self.uses_cuda:
                    ready = self._copy_cuda(slot, images, labels, cuda, released, timings,
                                            page_locked=_page_locked(batch) if self.pinned
                                            else None)
                    if synchronous:
                        ready.synchronize()
                else:
                    host_images, host_labels = self._host_views[slot]
                    np.copyto(host_images[:n], images)
                    np.copyto(host_labels[:n], labels)
                    ready = None
                copied = time.perf_counter()
                if not self.uses_cuda:
                    self._device_copy_seconds += copied - copy_started
                nbytes = images.nbytes + labels.nbytes
                self._bytes += nbytes
                self._batches += 1
                yield _Fed(
                    self._device_images[slot][:n], self._device_labels[slot][:n],
                    slot, n, nbytes, asked, got, copy_started, copied, ready,
                )
                k += 1
        finally:
            if self.uses_cuda and timings:
                import torch

                torch.cuda.synchronize(self.device)
                self._device_copy_seconds = sum(
                    s.elapsed_time(e) for s, e in timings) / 1000.0

    def _cuda_streams(self) -> tuple:
        """(copy stream, one "staging buffer free again" event per buffer) for one pass."""
        import torch

        compute = torch.cuda.current_stream(self.device)
        copier = torch.cuda.Stream(self.device) if self.non_blocking else compute
        return copier, [torch.cuda.Event() for _ in range(BUFFERS)]

    def _copy_cuda(self, slot: int, images, labels, cuda: tuple, released, timings: list,
                   *, page_locked: tuple | None = None):
        import torch

        copier, staged = cuda
        n = len(labels)
        in_place = self.pinned and page_locked is not None
        if in_place:
            host_images, host_labels = page_locked
        elif self.pinned:
            # The staging buffer's previous copy must have left it before it is refilled.
            staged[slot].synchronize()
            host_images, host_labels = self._staging[slot][0][:n], self._staging[slot][1][:n]
            staging_started = time.perf_counter()
            np.copyto(host_images.numpy(), images)
            np.copyto(host_labels.numpy(), labels)
            self._staging_seconds += time.perf_counter() - staging_started
        else:
            host_images = torch.from_numpy(images)
            host_labels = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if released is not None:
            copier.wait_event(released[slot])
        with torch.cuda.stream(copier):
            start.record(copier)
            self._device_images[slot][:n].copy_(host_images, non_blocking=self.non_blocking)
            self._device_labels[slot][:n].copy_(host_labels, non_blocking=self.non_blocking)
            end.record(copier)
            staged[slot].record(copier)
        timings.append((start, end))
        if in_place:
            # The loader may reuse the batch's memory once asked for the next one, so the
            # DMA must have read it by then: the host waits for this copy (instead of
            # making a staging copy of its own).
            end.synchronize()
        return end


@dataclass(frozen=True)
class EmulatedAccelerator:
    """A stand-in for the model's step: every batch takes ``seconds_per_batch`` (plus
    ``seconds_per_sample`` per sample) of accelerator time.

    The compute happens on the accelerator's own clock (see ``run_feed``): like a real
    accelerator it uses no host core, so it neither spins nor competes with the pipeline.
    """

    seconds_per_batch: float
    seconds_per_sample: float = 0.0

    def __post_init__(self) -> None:
        if not (self.seconds_per_batch >= 0 and self.seconds_per_sample >= 0):
            raise ValueError(
                "compute times must be >= 0, got seconds_per_batch="
                f"{self.seconds_per_batch}, seconds_per_sample={self.seconds_per_sample}"
            )

    @classmethod
    def for_throughput(cls, samples_per_second: float) -> EmulatedAccelerator:
        """An accelerator that can consume ``samples_per_second`` when never starved."""
        return cls(0.0, seconds_per_sample=1.0 / samples_per_second)

    @property
    def description(self) -> str:
        return "emulated (asynchronous steps)"

    def step_seconds(self, num_samples: int) -> float:
        """How long one step on ``num_samples`` samples keeps the accelerator busy."""
        return self.seconds_per_batch + self.seconds_per_sample * num_samples


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(left)


class _DeviceClock:
    """The emulated accelerator's timeline. A launched step starts when the accelerator is
    free (or at once if it is idle) and ends ``seconds`` later, without the host waiting;
    the host sleeps only in ``wait_for_slot`` (a buffer's last step must end before the
    buffer is refilled) and ``synchronize``. Like CUDA's stream, at most ``BUFFERS`` steps
    are queued or running, because the host cannot fill a third buffer."""

    def __init__(self) -> None:
        self.busy_until = -math.inf
        self.slot_free_at = [-math.inf] * BUFFERS

    def launch(self, slot: int, seconds: float, now: float) -> tuple[float, float]:
        start = max(now, self.busy_until)
        self.busy_until = start + seconds
        self.slot_free_at[slot] = self.busy_until
        return start, self.busy_until

    def wait_for_slot(self, slot: int) -> None:
        _sleep_until(self.slot_free_at[slot])

    def synchronize(self) -> None:
        _sleep_until(self.busy_until)


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


@dataclass(frozen=True)
class FeedResult:
    """One feed run after warm-up, from the accelerator's point of view.

    ``wall_seconds`` runs from the end of the last warm-up step to the end of the last
    step, and splits exactly into ``compute_seconds`` (the accelerator busy) and the time it
    sat idle, charged to what the host was doing meanwhile: ``wait_for_data_seconds``
    (inside ``next()`` on the loader), ``host_copy_seconds`` (copying into the device
    buffer) and ``host_overhead_seconds`` (everything else: launching, Python between
    steps). ``transfer_seconds`` / ``transfer_bytes`` count every copy, overlapped or not.
    """

    batches: int
    samples: int
    wall_seconds: float
    compute_seconds: float
    wait_for_data_seconds: float
    host_copy_seconds: float
    host_overhead_seconds: float
    transfer_seconds: float
    transfer_bytes: int
    accelerator: str
    emulated: bool
    device: str

    def _fraction(self, seconds: float) -> float:
        return seconds / self.wall_seconds if self.wall_seconds > 0 else float("nan")

    @property
    def au(self) -> float:
        """Accelerator utilisation: compute / wall."""
        return self._fraction(self.compute_seconds)

    @property
    def stall_seconds(self) -> float:
        return self.wait_for_data_seconds + self.host_copy_seconds + self.host_overhead_seconds

    @property
    def stall_fraction(self) -> float:
        return self._fraction(self.stall_seconds)

    @property
    def wait_for_data_fraction(self) -> float:
        return self._fraction(self.wait_for_data_seconds)

    @property
    def host_copy_fraction(self) -> float:
        return self._fraction(self.host_copy_seconds)

    @property
    def host_overhead_fraction(self) -> float:
        return self._fraction(self.host_overhead_seconds)

    @property
    def samples_per_second(self) -> float:
        return self._fraction(self.samples)

    @property
    def transfer_bytes_per_second(self) -> float:
        if self.transfer_seconds <= 0:
            return float("nan")
        return self.transfer_bytes / self.transfer_seconds


def _in_place(batches: Iterable, clock: _DeviceClock) -> Iterator[_Fed]:
    """Batches the accelerator reads where they are (no copy). A loader may reuse a batch's
    memory once asked for the next one, so the host waits for each step first."""
    source = iter(batches)
    while True:
        clock.synchronize()
        asked = time.perf_counter()
        batch = next(source, None)
        got = time.perf_counter()
        if batch is None:
            return
        yield _Fed(batch, None, 0, _batch_length(batch), 0, asked, got, got, got)


def read_ahead_batches(batches) -> int:
    """How many batches ``batches`` may read ahead of the consumer: a prefetcher's
    ``depth``, a torch DataLoader's ``prefetch_factor`` x workers, 0 for anything else.
    Until that many are consumed, a feed can be served from batches read before it began:
    ``run_feed``'s warm-up must cover them for a slow loader's steady state to be timed."""
    depth = getattr(batches, "depth", None)
    if isinstance(depth, int):
        return depth
    workers = getattr(batches, "num_workers", 0)
    factor = getattr(batches, "prefetch_factor", None)
    return int(workers) * int(factor) if workers and factor else 0


def run_feed(
    batches: Iterable,
    accelerator: EmulatedAccelerator,
    *,
    warmup_batches: int = 2,
    max_batches: int | None = None,
) -> FeedResult:
    """Drive ``accelerator`` and measure AU after ``warmup_batches``.

    With a ``GpuFeeder`` the host copies batch ``k + 1`` into one device buffer while step
    ``k`` computes on the other, as a real accelerator allows; the host blocks only to
    refill a buffer whose step has not ended. Any other iterable of batches (a prefetcher,
    a DataLoader) is computed on in place, so each step must end before the next batch is
    asked for: no overlap.
    """
    if warmup_batches < 0:
        raise ValueError(f"warmup_batches must be >= 0, got {warmup_batches}")
    clock = _DeviceClock()
    if isinstance(batches, GpuFeeder):
        fed_batches = batches._fed(wait_for_slot=clock.wait_for_slot, synchronous=True)
        device = str(batches.device)
    else:
        fed_batches = _in_place(batches, clock)
        device = "host (in place)"
    done = samples = nbytes = 0
    compute = waiting = copying = overhead = transferring = 0.0
    measured_from = previous_end = None
    try:
        for fed in fed_batches:
            start, end = clock.launch(
                fed.slot, accelerator.step_seconds(fed.samples), time.perf_counter()
            )
            if done == warmup_batches:
                measured_from = fed.asked if previous_end is None else previous_end
                previous_end = measured_from
            if done >= warmup_batches:
                # The accelerator was idle from the previous step's end to this start: the
                # host was waiting for the batch, copying it, or in between.
                idle_from, idle_to = previous_end, max(start, previous_end)
                data = _overlap(idle_from, idle_to, fed.asked, fed.got)
                copy = _overlap(idle_from, idle_to, fed.copy_started, fed.copied)
                waiting += data
                copying += copy
                overhead += (idle_to - idle_from) - data - copy
                compute += end - start
                transferring += fed.copied - fed.copy_started
                samples += fed.samples
                nbytes += fed.nbytes
            previous_end = end
            done += 1
            if max_batches is not None and done >= warmup_batches + max_batches:
                break
    finally:
        fed_batches.close()
    clock.synchronize()
    if measured_from is None:
        raise ValueError(f"only {done} batches: not more than warmup_batches={warmup_batches}")
    return FeedResult(
        batches=done - warmup_batches,
        samples=samples,
        wall_seconds=previous_end - measured_from,
        compute_seconds=compute,
        wait_for_data_seconds=waiting,
        host_copy_seconds=copying,
        host_overhead_seconds=overhead,
        transfer_seconds=transferring,
        transfer_bytes=nbytes,
        accelerator=accelerator.description,
        emulated=True,
        device=device,
    )
