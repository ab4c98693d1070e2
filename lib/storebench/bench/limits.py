"""The machine's own limits, measured in the same run as the results they put in proportion.

Every figure is the median of ``repeats`` timed repetitions after an untimed one (first touch
of fresh memory is ~10x slower than reuse, so buffers are pre-faulted). Bandwidths are bytes
moved per second in GB/s (1e9), one thread.
"""

from __future__ import annotations

import errno
import mmap
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from . import cache

_CHUNK = 8 << 20
_BLOCK = 4096


@dataclass(frozen=True)
class LimitSizes:
    """How much each limit measurement moves; small sizes finish in seconds, large ones are
    closer to the truth (a scratch file smaller than the disk cache of a virtual disk's host
    overstates cold reads)."""

    dram_bytes: int = 1 << 30
    file_bytes: int = 1 << 30
    random_reads: int = 4000
    repeats: int = 5

    def __post_init__(self) -> None:
        for name in ("dram_bytes", "file_bytes", "random_reads", "repeats"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.file_bytes < _BLOCK * self.random_reads:
            raise ValueError(
                f"file_bytes={self.file_bytes} holds fewer than random_reads={self.random_reads} "
                "distinct 4 KiB blocks"
            )


# Profiles not named here use the defaults (1 GiB).
LIMIT_SIZES: dict[str, LimitSizes] = {
    "ci": LimitSizes(dram_bytes=64 << 20, file_bytes=64 << 20, random_reads=2000, repeats=3),
}

LIMIT_UNITS: dict[str, str] = {
    "dram_copy_GBps": "GB/s",
    "dram_read_GBps": "GB/s",
    "page_cache_read_GBps": "GB/s",
    "cold_seq_read_GBps": "GB/s",
    "cold_random_4k_iops": "IOPS",
}


def limit_sizes_for(profile: str) -> LimitSizes:
    return LIMIT_SIZES.get(profile, LimitSizes())


def _median_rate(amount: float, seconds: list[float]) -> float:
    return amount / statistics.median(seconds)


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def dram_copy_GBps(nbytes: int, repeats: int) -> float:
    source = np.ones(nbytes, dtype=np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)  # pre-fault the target
    times = [_timed(lambda: np.copyto(target, source)) for _ in range(repeats)]
    return _median_rate(nbytes, times) / 1e9


def dram_read_GBps(nbytes: int, repeats: int) -> float:
    words = np.ones(nbytes // 8, dtype=np.uint64)
    words.sum()
    times = [_timed(words.sum) for _ in range(repeats)]
    return _median_rate(words.nbytes, times) / 1e9


def write_scratch_file(path: Path, nbytes: int) -> None:
    """A file of ``nbytes`` incompressible bytes, fsynced so that it can be evicted."""
    block = np.random.default_rng(0).integers(0, 256, size=_CHUNK, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        remaining = nbytes
        while remaining > 0:
            f.write(block[: min(remaining, len(block))])
            remaining -= min(remaining, len(block))
        f.flush()
        os.fsync(f.fileno())


def _read_whole(path: Path, view: memoryview) -> int:
    total = 0
    with open(path, "rb", buffering=0) as f:
        while got := f.readinto(view):
            total += got
    return total


def page_cache_read_GBps(path: Path, repeats: int) -> float:
    view = memoryview(bytearray(_CHUNK))
    cache.prewarm([path])
    nbytes = _read_whole(path, view)
    times = [_timed(lambda: _read_whole(path, view)) for _ in range(repeats)]
    return _median_rate(nbytes, times) / 1e9


def cold_seq_read_GBps(
    path: Path, repeats: int, *, drop_caches: bool = False
) -> tuple[float, float]:
    """(GB/s, the worst resident fraction seen just before a timed read)."""
    view = memoryview(bytearray(_CHUNK))
    nbytes = path.stat().st_size
    times, residency = [], []
    for _ in range(repeats):
        residency.append(cache.prepare([path], cache.CacheState.COLD, drop_caches=drop_caches))
        times.append(_timed(lambda: _read_whole(path, view)))
    return _median_rate(nbytes, times) / 1e9, max(residency)


def _random_offsets(nbytes: int, count: int, seed: int) -> np.ndarray:
    blocks = np.random.default_rng(seed).choice(nbytes // _BLOCK, size=count, replace=False)
    return blocks.astype(np.int64) * _BLOCK


def _direct_reads(path: Path, offsets: np.ndarray) -> float:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        # An anonymous map is page-aligned, as O_DIRECT requires of the buffer.
        with mmap.mmap(-1, _BLOCK) as buffer:
            started = time.perf_counter()
            for offset in offsets:
                os.preadv(fd, [buffer], int(offset))
            return time.perf_counter() - started
    finally:
        os.close(fd)


def _buffered_random_reads(path: Path, offsets: np.ndarray) -> float:
    cache.evict([path])
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead around each read
        buffer = bytearray(_BLOCK)
        started = time.perf_counter()
        for offset in offsets:
            os.preadv(fd, [buffer], int(offset))
        return time.perf_counter() - started
    finally:
        os.close(fd)


def cold_random_4k_iops(path: Path, reads: int, repeats: int) -> tuple[float, str]:
    """(reads per second at queue depth 1, method): O_DIRECT where the filesystem allows it,
    else buffered reads of distinct, freshly evicted blocks with readahead disabled."""
    nbytes = path.stat().st_size
    method = "o_direct"
    times = []
    for repeat in range(repeats):
        offsets = _random_offsets(nbytes, reads, seed=repeat)
        if method == "o_direct":
            try:
                times.append(_direct_reads(path, offsets))
                continue
            except OSError as err:
                if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                    raise
                method = "buffered_fadvise_random"
        times.append(_buffered_random_reads(path, offsets))
    return _median_rate(reads, times), method


def measure_limits(
    scratch_dir: Path | str, *, sizes: LimitSizes | None = None, drop_caches: bool = False
) -> dict:
    """Measure every limit; ``scratch_dir`` should be on the datasets' filesystem (a scratch
    file of ``sizes.file_bytes`` is written there and removed).

    Returns numbers under the ``LIMIT_UNITS`` keys plus how they were measured:
    ``cold_random_4k_method``, ``cold_seq_resident_fraction`` (residency just before the cold
    reads: near 0 proves they were cold) and ``sizes``.
    """
    sizes = sizes or LimitSizes()
    scratch_dir = Path(scratch_dir)
    scratch_dir.mkdir(parents=True, exist_ok=True)
    path = scratch_dir / f".storebench-limits-{os.getpid()}.bin"
    try:
        write_scratch_file(path, sizes.file_bytes)
        cold_seq, cold_residency = cold_seq_read_GBps(
            path, sizes.repeats, drop_caches=drop_caches
        )
        iops, method = cold_random_4k_iops(path, sizes.random_reads, sizes.repeats)
        page_cache = page_cache_read_GBps(path, sizes.repeats)
    finally:
        path.unlink(missing_ok=True)
    return {
        "dram_copy_GBps": dram_copy_GBps(sizes.dram_bytes, sizes.repeats),
        "dram_read_GBps": dram_read_GBps(sizes.dram_bytes, sizes.repeats),
        "page_cache_read_GBps": page_cache,
        "cold_seq_read_GBps": cold_seq,
        "cold_random_4k_iops": iops,
        "cold_random_4k_method": method,
        "cold_seq_resident_fraction": cold_residency,
        "sizes": asdict(sizes),
    }
