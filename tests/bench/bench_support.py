"""Shared by the harness tests: tiny limit sizes, and whether processes are really gone."""

from __future__ import annotations

import time

from storebench.bench.limits import LimitSizes

# Small enough for seconds, large enough that eviction and O_DIRECT are exercised.
TINY_LIMITS = LimitSizes(dram_bytes=16 << 20, file_bytes=8 << 20, random_reads=256, repeats=2)


def live(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not live(pid):
            return True
        time.sleep(0.05)
    return not live(pid)

