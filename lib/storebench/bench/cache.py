"""Page-cache control and measurement: evict, pre-warm, and ask the kernel what is resident.

Cold means every data page of the dataset has been dropped from the page cache with
``posix_fadvise(POSIX_FADV_DONTNEED)`` (no root needed, but only clean pages go, hence the
fsync first); warm means every byte is resident: each file that ``mincore`` does not show
wholly resident is read whole (re-reading a resident set, such as 20,000 small raw files, before
every warm repeat took time and changed nothing). Neither state is assumed: the kernel is
asked which pages are really resident, by ``cachestat(2)`` (Linux 6.5: a count of the file's
cached pages, one call on its descriptor) and, for a file that is only partly resident or
where ``cachestat`` is missing, by ``mincore(2)`` on a read-only mapping of it (which pages,
so that a partly resident last page counts only the file's bytes). A file with none or all
of its pages cached needs no mapping: a cold or warm set of 20,000 raw files is measured in
about half the time.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import mmap
import os
import stat
from collections.abc import Iterable
from pathlib import Path

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
DROP_CACHES_PATH = Path("/proc/sys/vm/drop_caches")
_READ_CHUNK = 8 << 20


class CacheState(enum.StrEnum):
    """The page-cache state a case starts each timed repeat in."""

    COLD = "cold"
    WARM = "warm"


def expand_files(paths: Iterable[Path | str]) -> list[str]:
    """The regular files named by ``paths``, directories expanded recursively (each
    directory's files sorted), as strings: one ``stat`` per named path, because a study's
    cache control walks 20,000 raw files before every repeat."""
    files: list[str] = []
    for path in map(os.fspath, paths):
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            mode = 0
        if stat.S_ISDIR(mode):
            found = []
            for root, _, names in os.walk(path):
                found.extend(os.path.join(root, name) for name in names)
            files.extend(sorted(f for f in found if os.path.isfile(f)))
        elif stat.S_ISREG(mode):
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or directory to control caching of")
    return files


def _fadvise_dontneed(path: Path, *, sync: bool) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if sync:
            os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evict(paths: Iterable[Path | str]) -> None:
    """Drop the files' pages from the page cache.

    DONTNEED drops clean pages only. An fsync per file would clean the rest, but costs a
    device flush even on a clean file (1-2 ms here: seconds for a directory of small files),
    so only the files that ``mincore`` still shows resident after a first pass are fsynced
    and advised again.
    """
    _evict_files(expand_files(paths), _Libc())


def _evict_files(files: list[str], libc: _Libc) -> float:
    """Evict, then measure each file once more (again after an fsync where it was still
    resident): the resident fraction afterwards, without another pass over every file."""
    for path in files:
        _fadvise_dontneed(path, sync=False)
    resident = total = 0
    for path in files:
        got, size = resident_bytes(path, libc=libc)
        if got:
            _fadvise_dontneed(path, sync=True)
            got = resident_bytes(path, libc=libc)[0]
        resident += got
        total += size
    return resident / total if total else 1.0


def drop_caches() -> None:
    """Drop the whole page cache (and dentries/inodes are left alone): root only.

    Raises PermissionError for other users; callers that merely prefer it should check
    whether the process may write it first.
    """
    os.sync()
    try:
        DROP_CACHES_PATH.write_text("1\n")
    except OSError as err:
        raise PermissionError(
            f"{DROP_CACHES_PATH}: cannot write ({err.strerror}); dropping the whole page cache "
            "needs root; per-file eviction with posix_fadvise works without it"
        ) from err


# The keyword ``drop_caches`` of ``prepare`` shadows the function inside it.
_drop_whole_page_cache = drop_caches


def prewarm(paths: Iterable[Path | str]) -> int:
    """Read every byte of the files so that they are resident; returns the bytes read."""
    return _prewarm_files(expand_files(paths))


def _prewarm_files(files: list[str]) -> int:
    buffer = bytearray(_READ_CHUNK)
    view = memoryview(buffer)
    total = 0
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while True:
                got = f.readinto(view)
                if not got:
                    break
                total += got
    return total


class _Libc:
    """mmap/mincore/munmap through ctypes: Python's mmap object does not expose its address
    for a read-only map, and touching pages to get one would make them resident. Holds one
    page vector, grown as needed, reused file after file."""

    def __init__(self) -> None:
        # The interpreter's own symbols, libc's among them: find_library("c") would run
        # ldconfig in a subprocess, in every case worker.
        libc = ctypes.CDLL(None, use_errno=True)
        self.mmap = libc.mmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = (
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.c_long,
        )
        self.munmap = libc.munmap
        self.munmap.restype = ctypes.c_int
        self.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        self.mincore = libc.mincore
        self.mincore.restype = ctypes.c_int
        self.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        self._vector = bytearray(0)
        self._address = 0
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._range = _CachestatRange(0, 0)  # from offset 0 to the end of the file
        self._stat = _Cachestat()
        self._range_ref, self._stat_ref = ctypes.byref(self._range), ctypes.byref(self._stat)
        self.has_cachestat = True

    def cached_pages(self, fd: int) -> int | None:
        """Pages of the open file ``fd`` in the page cache (``cachestat``), or None where the
        kernel has no ``cachestat`` (it is then not asked again)."""
        if not self.has_cachestat:
            return None
        # Every argument as a long: syscall(2) is variadic and reads each as one.
        if self._syscall(_SYS_CACHESTAT_NR, ctypes.c_long(fd), self._range_ref,
                         self._stat_ref, _NO_FLAGS) == 0:
            return self._stat.nr_cache
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EPERM, errno.EOPNOTSUPP):
            self.has_cachestat = False  # an older kernel, or a sandbox that filters it
            return None
        raise OSError(err, f"cachestat failed: {os.strerror(err)}")

    def vector(self, pages: int) -> tuple[memoryview, int]:
        """(a view of ``pages`` bytes, its address) in the reused page vector."""
        if len(self._vector) < pages:
            self._vector = bytearray(max(pages, 2 * len(self._vector)))
            holder = (ctypes.c_char * len(self._vector)).from_buffer(self._vector)
            self._address = ctypes.addressof(holder)
        return memoryview(self._vector)[:pages], self._address


# cachestat(2)'s number in the generic syscall table (x86-64 and arm64 alike), and its
# structures (include/uapi/linux/mman.h).
_SYS_CACHESTAT_NR = ctypes.c_long(451)
_NO_FLAGS = ctypes.c_long(0)


class _CachestatRange(ctypes.Structure):
    _fields_ = (("off", ctypes.c_uint64), ("len", ctypes.c_uint64))


class _Cachestat(ctypes.Structure):
    _fields_ = tuple((name, ctypes.c_uint64) for name in (
        "nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted"))


_MAP_FAILED = ctypes.c_void_p(-1).value
# mincore sets the lowest bit of a page's byte when it is resident; the others are reserved.
_RESIDENT_BIT = bytes(i & 1 for i in range(256))


def resident_bytes(path: Path | str, *, libc: _Libc | None = None) -> tuple[int, int]:
    """(bytes resident in the page cache, file size) for one file: from ``cachestat(2)``
    when none or all of its pages are cached, else from ``mincore(2)``."""
    libc = libc or _Libc()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        pages = (size + PAGE_SIZE - 1) // PAGE_SIZE
        cached = libc.cached_pages(fd)
        if cached == 0:
            return 0, size
        if cached is not None and cached >= pages:
            return size, size
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"{path}: mmap for mincore failed: {os.strerror(err)}")
        try:
            vector, vector_address = libc.vector(pages)
            if libc.mincore(address, size, vector_address) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"{path}: mincore failed: {os.strerror(err)}")
            resident = bytes(vector).translate(_RESIDENT_BIT)
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)
    count = resident.count(1)
    # The last page is only partly the file's: count the bytes it really holds.
    tail = pages * PAGE_SIZE - size
    return count * PAGE_SIZE - (tail if resident[-1] else 0), size


def resident_fraction(paths: Iterable[Path | str]) -> float:
    """Fraction of the files' bytes resident in the page cache, weighted by file size.

    Files of zero bytes carry no weight; a set with no bytes at all is fully resident (1.0):
    reading it needs no I/O.
    """
    return _resident_fraction_of(expand_files(paths), _Libc())


def _resident_fraction_of(files: list[str], libc: _Libc) -> float:
    resident = total = 0
    for path in files:
        got, size = resident_bytes(path, libc=libc)
        resident += got
        total += size
    return resident / total if total else 1.0


def prepare(
    paths: Iterable[Path | str], state: CacheState | str, *, drop_caches: bool = False
) -> float:
    """Put the files into ``state`` and return the resident fraction measured afterwards.

    ``drop_caches=True`` also drops the whole page cache for cold runs (root only; it evicts
    library code too, so callers should have done an untimed pass first).
    """
    state = CacheState(state)
    files = expand_files(paths)  # once: the steps below take the expanded list
    libc = _Libc()
    if state is CacheState.COLD:
        fraction = _evict_files(files, libc)
        if drop_caches:
            _drop_whole_page_cache()
            return _resident_fraction_of(files, libc)
        return fraction
    return _warm_files(files, libc)


def _warm_files(files: list[str], libc: _Libc) -> float:
    """Read whole every file not wholly resident; the resident fraction afterwards, from one
    ``mincore`` pass over every file and another over the files read."""
    resident = total = 0
    unread = []
    for path in files:
        got, size = resident_bytes(path, libc=libc)
        if got < size:
            unread.append(path)
        else:
            resident += got
        total += size
    _prewarm_files(unread)
    for path in unread:
        resident += resident_bytes(path, libc=libc)[0]
    return resident / total if total else 1.0
