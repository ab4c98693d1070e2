"""Where a batch buffer starts in memory, and why it matters.

A row copy (``np.take`` of 12 KiB rows, which is glibc's ``memmove`` per row) runs several
times slower on this project's machine when the destination starts 1 to 31 bytes past the
source modulo 4 KiB (``python -m storebench.buffers`` prints the rate at a few offsets).
Allocators put large buffers at or just past a page boundary (a ``malloc``'d mapping at +16,
Arrow's buffers at +0 or +64, a ``.npy`` map's data at +128), so a batch buffer that also
starts near a page boundary lands in or beside that zone for every row of a page-strided
source. Starting batch buffers half a page past a boundary keeps them about 2 KiB away from
all of those.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PAGE = 4096
BATCH_BUFFER_OFFSET = PAGE // 2


def batch_empty(shape: Sequence[int] | int, dtype=np.uint8) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts ``BATCH_BUFFER_OFFSET`` bytes
    past a page boundary (the array keeps its slightly larger allocation alive)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + 2 * PAGE, dtype=np.uint8)
    start = (BATCH_BUFFER_OFFSET - raw.ctypes.data) % PAGE
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _copy_rate_by_offset(rows: int = 20_000, row_bytes: int = 12_288, batch: int = 256,
                         offsets: Sequence[int] = (0, 16, 64, 2048), rounds: int = 10) -> dict:
    """Microseconds per shuffled ``batch``-row gather from a page-aligned source into a
    destination ``offset`` bytes past the source modulo 4 KiB (a diagnostic, not a test)."""
    import time

    source_raw = np.ones(rows * row_bytes + PAGE, np.uint8)
    start = (-source_raw.ctypes.data) % PAGE
    source = source_raw[start:start + rows * row_bytes].reshape(rows, row_bytes)
    target_raw = np.zeros(batch * row_bytes + 2 * PAGE, np.uint8)
    rng = np.random.default_rng(0)
    orders = [rng.permutation(rows)[: rows // batch * batch].reshape(-1, batch)
              for _ in range(rounds)]
    spent = dict.fromkeys(offsets, 0.0)
    for order in orders:
        for offset in offsets:
            begin = (offset - target_raw.ctypes.data) % PAGE
            out = target_raw[begin:begin + batch * row_bytes].reshape(batch, row_bytes)
            started = time.perf_counter()
            for idx in order:
                np.take(source, idx, axis=0, out=out, mode="clip")
            spent[offset] += time.perf_counter() - started
    return {offset: seconds / (rounds * len(orders[0])) * 1e6 for offset, seconds in
            spent.items()}


if __name__ == "__main__":
    for offset, micros in _copy_rate_by_offset().items():
        print(f"destination {offset:4d} B past the source (mod 4 KiB): {micros:7.1f} us a batch")
