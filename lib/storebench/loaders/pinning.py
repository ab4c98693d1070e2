"""Page-locking memory a prefetcher already owns, so that a CUDA copy reads it in place.

A pinned copy (``GpuFeeder(pinned=True)``) of a pageable batch first copies it into a
page-locked staging buffer: a second host copy of every byte. A prefetcher built with
``pin_memory=True`` page-locks its own batch slots instead (``cudaHostRegister``, through
torch's binding of the CUDA runtime), and the feeder, finding a batch in page-locked memory,
has the DMA engine read it where the worker wrote it. Registration changes no byte and no
address: without CUDA nothing can be page-locked, and asking is refused with
``AcceleratorUnavailableError`` before any worker starts.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence

import numpy as np

from ..buffers import BATCH_BUFFER_OFFSET, PAGE
from .gpu import AcceleratorUnavailableError


def require_cuda(owner: str) -> None:
    """Refuse ``pin_memory=True`` where torch sees no CUDA device."""
    import torch

    if not torch.cuda.is_available():
        raise AcceleratorUnavailableError(
            f"{owner}(pin_memory=True) page-locks its batch memory for CUDA copies, but torch "
            f"{torch.__version__} reports torch.cuda.is_available() == False on this machine; "
            "use pin_memory=False")


def lockable_batch_buffer(batch_size: int, sample_shape: Sequence[int],
                          dtype=np.uint8) -> np.ndarray:
    """A pre-faulted batch buffer, as ``batching.batch_buffer`` makes (starting half a page
    past a page boundary), in an anonymous mapping of its own: CUDA registers whole pages,
    and a heap buffer shares its first and last pages with other allocations, whose pages
    would then be locked, and hidden from a process forked later, with it."""
    dtype = np.dtype(dtype)
    nbytes = batch_size * math.prod(sample_shape) * dtype.itemsize
    mapping = mmap.mmap(-1, BATCH_BUFFER_OFFSET + nbytes + PAGE)
    buffer = np.frombuffer(mapping, dtype=np.uint8, count=nbytes, offset=BATCH_BUFFER_OFFSET)
    buffer[::PAGE] = 0
    return buffer.view(dtype).reshape(batch_size, *sample_shape)


def mapping_of(array: np.ndarray) -> tuple[int, int]:
    """(address, length) of the ``mmap`` an array made by ``lockable_batch_buffer`` lies in."""
    base = array
    while not isinstance(base, mmap.mmap):
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
        if base is None:
            raise ValueError("the array does not lie in a mapping of its own")
    start = np.frombuffer(base, dtype=np.uint8, count=1).ctypes.data
    return start, len(base)


class PageLocks:
    """Host memory ranges page-locked for CUDA until ``release()`` (idempotent). The memory
    stays owned, and freed, by whoever made it; it must outlive its registration."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._addresses: list[int] = []

    def lock(self, address: int, nbytes: int) -> None:
        import torch

        cudart = torch.cuda.cudart()
        error = cudart.cudaHostRegister(address, nbytes, 0)  # cudaHostRegisterDefault
        if error != cudart.cudaError.success:
            raise RuntimeError(
                f"{self.owner}: cudaHostRegister of {nbytes} bytes at {address:#x} failed "
                f"({error}); use pin_memory=False")
        self._addresses.append(address)

    def lock_mapping(self, array: np.ndarray) -> None:
        """The whole mapping of a ``lockable_batch_buffer``."""
        self.lock(*mapping_of(array))

    def release(self) -> None:
        """Unregister every range, once the device's queued work is done (a copy may still
        be reading one)."""
        if not self._addresses:
            return
        import torch

        cudart = torch.cuda.cudart()
        torch.cuda.synchronize()
        while self._addresses:
            cudart.cudaHostUnregister(self._addresses.pop())
