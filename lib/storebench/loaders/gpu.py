"""Feeding the accelerator: host-to-device copies, and an emulated accelerator for CPU machines.

``GpuFeeder`` turns batches (``Batch`` or ``(images, labels)`` arrays) into torch tensors on a
device, with one of three copy modes:

- pageable, synchronous: ``device_buffer.copy_(host)``; the host thread waits for each copy;
- pinned: the batch is first copied into one of two page-locked staging buffers, from which
  the DMA engine copies asynchronously;
- ``non_blocking=True``: the copy of batch ``i + 1`` is issued on a side CUDA stream while the
  consumer computes on batch ``i`` (two device buffers, events order the streams).

Copy time is measured with CUDA events when CUDA is present, else with ``perf_counter``.
Without CUDA the device is the CPU, the "transfer" is a memcpy into a preallocated tensor,
and asking for pinned memory or asynchronous copies raises ``AcceleratorUnavailableError``.

``EmulatedAccelerator`` stands in for the model, as MLPerf Storage does: each batch "takes"
a fixed compute time, and ``run_feed`` reports accelerator utilisation
``AU = compute time / wall time`` after warm-up. Results carry ``emulated=True``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from .batching import Batch


class AcceleratorUnavailableError(RuntimeError):
    """A feed option needs CUDA and this machine (or this torch build) has none."""


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


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
                f"{type(images).__name__} (decode the samples first)"
            ) from None
    labels = labels if isinstance(labels, np.ndarray) else labels.numpy()
    return images, labels


class GpuFeeder:
    """Move each batch to ``device`` (default: ``"cuda"`` when available, else ``"cpu"``).

    Yields ``(images, labels)`` torch tensors living in one of two device buffers: a tensor
    is valid until two more batches have been requested (the double buffer). ``stats()``
    reports batches, bytes and copy seconds of the last pass.
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
        self._device_images: list = []
        self._device_labels: list = []
        self._staging: list = []
        self._copy_seconds = 0.0
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
            "copy_seconds": self._copy_seconds,
            "timing": self.timing,
        }

    def _buffers(self, images: np.ndarray, labels: np.ndarray) -> None:
        import torch

        shape = images.shape[1:]
        capacity = images.shape[0]
        if self._device_images and (
            tuple(self._device_images[0].shape[1:]) == shape
            and self._device_images[0].shape[0] >= capacity
        ):
            return
        dtype = torch.from_numpy(images[:0]).dtype
        self._device_images = [
            torch.empty((capacity, *shape), dtype=dtype, device=self.device) for _ in range(2)
        ]
        self._device_labels = [
            torch.empty(capacity, dtype=torch.int64, device=self.device) for _ in range(2)
        ]
        if self.pinned:
            self._staging = [
                (
                    torch.empty((capacity, *shape), dtype=dtype).pin_memory(),
                    torch.empty(capacity, dtype=torch.int64).pin_memory(),
                )
                for _ in range(2)
            ]

    def __iter__(self) -> Iterator[tuple]:
        self._copy_seconds, self._bytes, self._batches = 0.0, 0, 0
        return self._iter_cuda() if self.uses_cuda else self._iter_host()

    def _iter_host(self) -> Iterator[tuple]:
        import torch

        for k, batch in enumerate(self.batches):
            images, labels = _as_arrays(batch)
            self._buffers(images, labels)
            n = len(labels)
            slot = k % 2
            started = time.perf_counter()
            dev_images = self._device_images[slot][:n]
            dev_images.copy_(torch.from_numpy(images))
            dev_labels = self._device_labels[slot][:n]
            dev_labels.copy_(torch.from_numpy(np.ascontiguousarray(labels)))
            self._copy_seconds += time.perf_counter() - started
            self._bytes += images.nbytes + labels.nbytes
            self._batches += 1
            yield dev_images, dev_labels

    def _iter_cuda(self) -> Iterator[tuple]:
        import torch

        compute = torch.cuda.current_stream(self.device)
        copier = torch.cuda.Stream(self.device) if self.non_blocking else compute
        released = [torch.cuda.Event(), torch.cuda.Event()]  # consumer done with buffer k
        staged = [torch.cuda.Event(), torch.cuda.Event()]  # pinned staging k free again
        timings: list[tuple] = []

        def issue(k: int, batch) -> tuple:
            images, labels = _as_arrays(batch)
            self._buffers(images, labels)
            n, slot = len(labels), k % 2
            if self.pinned:
                staged[slot].synchronize()  # its previous copy has left the staging buffer
                host_images, host_labels = self._staging[slot][0][:n], self._staging[slot][1][:n]
                host_images.numpy()[...] = images
                host_labels.numpy()[...] = labels
            else:
                host_images = torch.from_numpy(images)
                host_labels = torch.from_numpy(np.ascontiguousarray(labels))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            copier.wait_event(released[slot])
            with torch.cuda.stream(copier):
                start.record(copier)
                self._device_images[slot][:n].copy_(host_images, non_blocking=self.non_blocking)
                self._device_labels[slot][:n].copy_(host_labels, non_blocking=self.non_blocking)
                end.record(copier)
                staged[slot].record(copier)
            timings.append((start, end))
            self._bytes += images.nbytes + labels.nbytes
            self._batches += 1
            return slot, n, end

        source = iter(self.batches)
        first = next(source, None)
        if first is None:
            return
        current = issue(0, first)
        k = 1
        for batch in source:
            upcoming = issue(k, batch)  # overlaps with the consumer's work on `current`
            yield self._hand_out(current, compute)
            # The consumer asked for the next batch, so everything it does with `current`
            # is queued on the compute stream: the copy that reuses this buffer waits for it.
            released[current[0]].record(compute)
            current, k = upcoming, k + 1
        yield self._hand_out(current, compute)
        torch.cuda.synchronize(self.device)
        self._copy_seconds = sum(s.elapsed_time(e) for s, e in timings) / 1000.0

    def _hand_out(self, issued: tuple, compute) -> tuple:
        slot, n, copied = issued
        compute.wait_event(copied)
        return self._device_images[slot][:n], self._device_labels[slot][:n]


@dataclass(frozen=True)
class EmulatedAccelerator:
    """A stand-in for the model's step: every batch takes ``seconds_per_batch``
    (plus ``seconds_per_sample`` per sample).

    ``busy_wait=False`` (default) sleeps: a real accelerator computes without using a host
    core, and on a 2-core machine a spinning thread would take a core from the data
    pipeline. ``busy_wait=True`` spins on ``perf_counter`` for sub-millisecond steps, where
    ``time.sleep`` overshoots by tens of microseconds.
    """

    seconds_per_batch: float
    seconds_per_sample: float = 0.0
    busy_wait: bool = False

    def __post_init__(self) -> None:
        if self.seconds_per_batch < 0 or self.seconds_per_sample < 0:
            raise ValueError("compute times must be >= 0")

    @classmethod
    def for_throughput(cls, samples_per_second: float, **kwargs) -> EmulatedAccelerator:
        """An accelerator that can consume ``samples_per_second`` when never starved."""
        return cls(0.0, seconds_per_sample=1.0 / samples_per_second, **kwargs)

    @property
    def description(self) -> str:
        return f"emulated ({'busy-wait' if self.busy_wait else 'sleep'})"

    def step(self, num_samples: int) -> float:
        """Spend one batch's compute time; returns the seconds actually spent."""
        duration = self.seconds_per_batch + self.seconds_per_sample * num_samples
        started = time.perf_counter()
        if self.busy_wait:
            while time.perf_counter() - started < duration:
                pass
        elif duration > 0:
            time.sleep(duration)
        return time.perf_counter() - started


@dataclass(frozen=True)
class FeedResult:
    """One feed run after warm-up. ``au`` = compute / wall; ``stall_fraction`` = time the
    accelerator waited for data / wall."""

    batches: int
    samples: int
    wall_seconds: float
    compute_seconds: float
    wait_seconds: float
    accelerator: str
    emulated: bool
    device: str

    @property
    def au(self) -> float:
        return self.compute_seconds / self.wall_seconds if self.wall_seconds > 0 else float("nan")

    @property
    def stall_fraction(self) -> float:
        return self.wait_seconds / self.wall_seconds if self.wall_seconds > 0 else float("nan")

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.wall_seconds if self.wall_seconds > 0 else float("nan")


def _batch_length(batch) -> int:
    if isinstance(batch, Batch):
        return len(batch)
    return len(batch[1])


def run_feed(
    batches: Iterable,
    accelerator: EmulatedAccelerator,
    *,
    warmup_batches: int = 2,
    max_batches: int | None = None,
    device: str = "cpu",
) -> FeedResult:
    """Drive ``accelerator`` with ``batches`` (anything yielding batches: a prefetcher, a
    ``GpuFeeder``, a DataLoader) and measure AU after ``warmup_batches``."""
    source = iter(batches)
    done = samples = 0
    compute = wait = 0.0
    measured_from = None
    while max_batches is None or done < max_batches + warmup_batches:
        asked = time.perf_counter()
        batch = next(source, None)
        got = time.perf_counter()
        if batch is None:
            break
        if done == warmup_batches:
            measured_from = asked
        n = _batch_length(batch)
        spent = accelerator.step(n)
        if done >= warmup_batches:
            wait += got - asked
            compute += spent
            samples += n
        done += 1
    ended = time.perf_counter()
    if measured_from is None:
        raise ValueError(f"only {done} batches: not more than warmup_batches={warmup_batches}")
    return FeedResult(
        batches=done - warmup_batches,
        samples=samples,
        wall_seconds=ended - measured_from,
        compute_seconds=compute,
        wait_seconds=wait,
        accelerator=accelerator.description,
        emulated=True,
        device=device,
    )
