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

import numpy as np

from .gpu import AcceleratorUnavailableError


def require_cuda(owner: str) -> None:
    """Refuse ``pin_memory=True`` where torch sees no CUDA device."""
    import torch

    if not torch.cuda.is_available():
        raise AcceleratorUnavailableError(
            f"{owner}(pin_memory=True) page-locks its batch memory for CUDA copies, but torch "
            f"{torch.__version__} reports torch.cuda.is_available() == False on this machine; "
            "use pin_memory=False")


class PageLocks:
    """Host memory ranges page-locked for CUDA until ``release()`` (idempotent). The memory
    stays owned, and freed, by whoever made it; it must outlive its registration."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._addresses: list[int] = []

    @property
    def locked(self) -> int:
        """How many ranges are registered now."""
        return len(self._addresses)

    def lock(self, address: int, nbytes: int) -> None:
        import torch

        cudart = torch.cuda.cudart()
        error = cudart.cudaHostRegister(address, nbytes, 0)  # cudaHostRegisterDefault
        if error != cudart.cudaError.success:
            raise RuntimeError(
                f"{self.owner}: cudaHostRegister of {nbytes} bytes at {address:#x} failed "
                f"({error}); use pin_memory=False")
        self._addresses.append(address)

    def lock_array(self, array: np.ndarray) -> None:
        """The memory of a C-contiguous ``array`` (a batch buffer)."""
        if not array.flags.c_contiguous:
            raise ValueError(f"{self.owner}: only contiguous memory can be page-locked")
        self.lock(array.ctypes.data, array.nbytes)

    def release(self) -> None:
        if not self._addresses:
            return
        import torch

        cudart = torch.cuda.cudart()
        # Whatever the DMA engine was reading from these ranges must be done first.
        torch.cuda.synchronize()
        while self._addresses:
            cudart.cudaHostUnregister(self._addresses.pop())
