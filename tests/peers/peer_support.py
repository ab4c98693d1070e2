"""What the peer tests share: the processes a loader left behind."""

from __future__ import annotations

import time

import psutil

# multiprocessing's per-interpreter helpers: started once by whichever test first needs them
# (shared memory, spawn, forkserver), they live until the interpreter exits.
INTERPRETER_HELPERS = ("resource_tracker", "forkserver")


def worker_children() -> set[int]:
    """Live child processes (recursively) other than multiprocessing's helpers."""
    pids = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if not any(helper in cmdline for helper in INTERPRETER_HELPERS):
            pids.add(child.pid)
    return pids


def children_left(seconds: float = 5.0, *, before: frozenset[int] = frozenset()) -> set[int]:
    """The worker children (not in ``before``) still alive after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while (left := worker_children() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def damaged_memmap_copy(source, destination):
    """A copy of the memmap-raw set at ``source`` with one byte of ``images.npy`` flipped in
    the middle (a sample damaged after the build): (its root, the damaged file)."""
    import shutil
    from pathlib import Path

    root = Path(shutil.copytree(source, destination))
    images = root / "images.npy"
    data = bytearray(images.read_bytes())
    data[len(data) // 2] ^= 0xFF
    images.write_bytes(bytes(data))
    return root, images
