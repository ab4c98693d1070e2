"""Cache control against the kernel's own account (real files, fadvise and mincore)."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from storebench.bench import cache

PAGE = cache.PAGE_SIZE


def write_synced(path, nbytes: int, seed: int = 0) -> None:
    data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def test_cold_then_warm_is_measured_by_mincore(tmp_path):
    files = [tmp_path / "a.bin", tmp_path / "b.bin"]
    write_synced(files[0], 3 << 20)
    write_synced(files[1], 1 << 20, seed=1)
    assert cache.prepare(files, "cold") < 0.01
    assert cache.prepare(files, cache.CacheState.WARM) > 0.99
    assert cache.prepare(files, cache.CacheState.COLD) < 0.01


def test_resident_fraction_counts_exactly_the_pages_read(tmp_path):
    path = tmp_path / "pages.bin"
    write_synced(path, 64 * PAGE)
    cache.evict([path])
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead beyond what we read
        for page in (0, 10, 11, 40):
            os.pread(fd, PAGE, page * PAGE)
    finally:
        os.close(fd)
    resident, size = cache.resident_bytes(path)
    assert size == 64 * PAGE
    assert resident == 4 * PAGE
    assert cache.resident_fraction([path]) == pytest.approx(4 / 64)


def test_resident_fraction_is_weighted_by_bytes_and_agrees_with_fincore(tmp_path):
    big, small = tmp_path / "big.bin", tmp_path / "small.bin"
    write_synced(big, 3 << 20)
    write_synced(small, 1 << 20, seed=1)
    cache.evict([big])
    cache.prewarm([small])
    assert cache.resident_fraction([big, small]) == pytest.approx(0.25, abs=0.01)
    fincore = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES",
                              str(small)], capture_output=True, text=True)
    if fincore.returncode == 0:
        assert int(fincore.stdout.split()[0]) == cache.resident_bytes(small)[0]


def test_partial_last_page_counts_only_the_file_bytes(tmp_path):
    path = tmp_path / "odd.bin"
    write_synced(path, PAGE + 100)
    cache.prewarm([path])
    assert cache.resident_bytes(path) == (PAGE + 100, PAGE + 100)


def test_empty_files_and_directories(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    assert cache.resident_bytes(tmp_path / "empty") == (0, 0)
    assert cache.resident_fraction([tmp_path / "empty"]) == 1.0
    sub = tmp_path / "sub"
    sub.mkdir()
    write_synced(sub / "data.bin", 1 << 20)
    assert cache.expand_files([tmp_path]) == [str(tmp_path / "empty"), str(sub / "data.bin")]
    assert cache.prepare([tmp_path], "cold") < 0.01
    assert cache.prewarm([tmp_path]) == 1 << 20


def test_bad_state_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="tepid"):
        cache.prepare([], "tepid")
    with pytest.raises(FileNotFoundError, match="nowhere.bin"):
        cache.evict([tmp_path / "nowhere.bin"])


def test_drop_caches_refused_without_root(tmp_path, monkeypatch):
    if os.geteuid() == 0:
        pytest.skip("as root drop_caches would work; not dropping the whole cache in a test")
    with pytest.raises(PermissionError, match="needs root"):
        cache.drop_caches()


def test_evict_also_drops_pages_that_were_still_dirty(tmp_path):
    # Written without fsync: DONTNEED alone leaves dirty pages, so evict must sync those.
    path = tmp_path / "dirty.bin"
    path.write_bytes(np.random.default_rng(2).integers(0, 256, 2 << 20, dtype=np.uint8)
                     .tobytes())
    cache.evict([path])
    assert cache.resident_fraction([path]) < 0.01


def test_warm_reads_exactly_the_files_not_wholly_resident(tmp_path, monkeypatch):
    whole, part, evicted = (tmp_path / name for name in ("whole.bin", "part.bin", "gone.bin"))
    for seed, path in enumerate((whole, part, evicted)):
        write_synced(path, 4 << 20, seed=seed)
    cache.prepare([whole, part, evicted], "cold")
    cache.prewarm([whole])
    with open(part, "rb") as f:  # its first pages (and the kernel's readahead) only
        f.read(4 * PAGE)
    assert 0 < cache.resident_bytes(part)[0] < 4 << 20
    read = []
    real = cache._prewarm_files

    def recording(files):
        read.extend(files)
        return real(files)

    monkeypatch.setattr(cache, "_prewarm_files", recording)
    assert cache.prepare([whole, part, evicted], "warm") == 1.0
    assert read == [str(part), str(evicted)]
    read.clear()
    assert cache.prepare([tmp_path], "warm") == 1.0  # a resident set is not read again
    assert read == []


def _residency_both_ways(paths) -> tuple[list, list]:
    """Each file's (resident bytes, size) by cachestat (mincore for partly cached files),
    and by mincore alone."""
    either = cache._Libc()
    mincore_only = cache._Libc()
    mincore_only.has_cachestat = False
    return ([cache.resident_bytes(p, libc=either) for p in paths],
            [cache.resident_bytes(p, libc=mincore_only) for p in paths])


def test_cachestat_and_mincore_agree_on_cold_warm_and_partly_read_files(tmp_path):
    fd = os.open(__file__, os.O_RDONLY)
    try:
        has_cachestat = cache._Libc().cached_pages(fd) is not None
    finally:
        os.close(fd)
    if not has_cachestat:
        pytest.skip("this kernel has no cachestat(2) (Linux 6.5+): mincore measures alone")
    cold, warm, part, tail = (tmp_path / f"{name}.bin" for name in ("cold", "warm", "part",
                                                                    "tail"))
    for seed, path in enumerate((cold, warm, part)):
        write_synced(path, 16 * PAGE, seed=seed)
    write_synced(tail, 5 * PAGE + 123, seed=9)  # a partial last page
    cache.evict([cold, warm, part, tail])
    cache.prewarm([warm, tail])
    fd = os.open(part, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        os.pread(fd, PAGE, 3 * PAGE)
    finally:
        os.close(fd)
    by_cachestat, by_mincore = _residency_both_ways([cold, warm, part, tail])
    assert by_cachestat == by_mincore
    assert by_cachestat == [(0, 16 * PAGE), (16 * PAGE, 16 * PAGE), (PAGE, 16 * PAGE),
                            (5 * PAGE + 123, 5 * PAGE + 123)]


def test_a_kernel_without_cachestat_is_measured_by_mincore(tmp_path, monkeypatch):
    path = tmp_path / "warm.bin"
    write_synced(path, 8 * PAGE)
    cache.prewarm([path])
    libc = cache._Libc()
    calls = []

    def no_such_syscall(*args):
        calls.append(args)
        return -1

    monkeypatch.setattr(libc, "_syscall", no_such_syscall)
    monkeypatch.setattr(cache.ctypes, "get_errno", lambda: cache.errno.ENOSYS)
    assert cache.resident_bytes(path, libc=libc) == (8 * PAGE, 8 * PAGE)
    assert cache.resident_bytes(path, libc=libc) == (8 * PAGE, 8 * PAGE)
    assert len(calls) == 1 and libc.has_cachestat is False  # asked once, then not again
