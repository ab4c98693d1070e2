"""What a timed region costs: wall time, CPU time and peak memory of the whole process tree.

Memory is PSS and USS summed over a process and every descendant, from
``/proc/<pid>/smaps_rollup``: RSS double-counts pages that workers share with their parent
(a forked DataLoader worker "has" the parent's whole heap in RSS), PSS divides shared pages
among their users and USS (Private_Clean + Private_Dirty) counts only what each owns.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

_KIB = 1024


@dataclass(frozen=True)
class TreeMemory:
    """Memory of a process tree at one instant, in bytes."""

    pss_bytes: int
    uss_bytes: int
    processes: int


def tree_pids(pid: int) -> list[int]:
    """``pid`` and all its live descendants."""
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def smaps_rollup(pid: int) -> dict[str, int] | None:
    """``/proc/<pid>/smaps_rollup`` as bytes per field (``Pss``, ``Private_Dirty``...), or
    None if the process is gone, unreadable or a zombie (whose rollup is empty)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name] = int(parts[0]) * _KIB
    return fields if "Pss" in fields else None


def process_memory(pid: int) -> tuple[int, int] | None:
    """(PSS, USS) in bytes of one process, or None if it is gone or unreadable."""
    fields = smaps_rollup(pid)
    if fields is None:
        return None
    return fields["Pss"], fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)


def tree_memory(pid: int) -> TreeMemory:
    """PSS and USS summed over ``pid`` and its descendants."""
    pss = uss = count = 0
    for member in tree_pids(pid):
        got = process_memory(member)
        if got is not None:
            pss += got[0]
            uss += got[1]
            count += 1
    return TreeMemory(pss, uss, count)


def tree_cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid`` and its live descendants, each including its
    already-reaped children, so that a worker that exits between two readings still counts
    (its time moves into its parent's children totals when it is reaped)."""
    user = system = 0.0
    members = tree_pids(pid)
    if pid == os.getpid() and members:
        # getrusage has microsecond resolution; /proc/<pid>/stat counts 10 ms ticks.
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            usage = resource.getrusage(who)
            user += usage.ru_utime
            system += usage.ru_stime
        members = members[1:]
    for member in members:
        try:
            times = psutil.Process(member).cpu_times()
        except psutil.NoSuchProcess:
            continue
        user += times.user + times.children_user
        system += times.system + times.children_system
    return user, system


# The share of one core the memory sampler may take. Reading smaps_rollup walks the page
# tables: milliseconds a sample for a process holding hundreds of megabytes, which at a fixed
# 50 ms took a sizeable share of the core a two-thread case runs its second thread on.
MAX_SAMPLER_DUTY = 0.05


def sampler_wait(interval: float, sample_seconds: float,
                 max_duty: float = MAX_SAMPLER_DUTY) -> float:
    """Seconds to wait before the next sample: ``interval``, or longer when one sample costs
    more than ``max_duty`` of the time between two."""
    return max(interval, sample_seconds / max_duty)


class PeakMemorySampler:
    """Samples a process tree's PSS and USS in a background thread and keeps the peaks.

    Peaks are maxima of the *sums* at each sampling instant, taken every ``interval``
    seconds (longer where a sample is costly: ``sampler_wait``) and once at start and at
    stop; a spike shorter than the wait can be missed. ``samples`` and ``longest_wait``
    say how closely it looked.
    """

    def __init__(self, pid: int | None = None, *, interval: float = 0.05) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.pid = os.getpid() if pid is None else pid
        self.interval = interval
        self.peak_pss_bytes = 0
        self.peak_uss_bytes = 0
        self.samples = 0
        self.longest_wait = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        memory = tree_memory(self.pid)
        self.peak_pss_bytes = max(self.peak_pss_bytes, memory.pss_bytes)
        self.peak_uss_bytes = max(self.peak_uss_bytes, memory.uss_bytes)
        self.samples += 1

    def _loop(self) -> None:
        wait = self.interval
        while not self._stop.wait(wait):
            started = time.perf_counter()
            self._sample()
            wait = sampler_wait(self.interval, time.perf_counter() - started)
            self.longest_wait = max(self.longest_wait, wait)

    def start(self) -> PeakMemorySampler:
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="peak-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._sample()

    def __enter__(self) -> PeakMemorySampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class RegionMeasurement:
    """Wall seconds, CPU seconds (user + system over the process tree) and peak PSS/USS of
    the block it wraps::

        with RegionMeasurement() as m:
            work()
        m.wall_seconds, m.cpu_seconds, m.peak_pss_bytes
    """

    def __init__(self, pid: int | None = None, *, interval: float = 0.05) -> None:
        self.pid = os.getpid() if pid is None else pid
        self._sampler = PeakMemorySampler(self.pid, interval=interval)
        self._started: float | None = None
        self._cpu_start = (0.0, 0.0)
        self.wall_seconds = float("nan")
        self.cpu_user_seconds = float("nan")
        self.cpu_system_seconds = float("nan")

    @property
    def cpu_seconds(self) -> float:
        return self.cpu_user_seconds + self.cpu_system_seconds

    @property
    def peak_pss_bytes(self) -> int:
        return self._sampler.peak_pss_bytes

    @property
    def peak_uss_bytes(self) -> int:
        return self._sampler.peak_uss_bytes

    @property
    def finished(self) -> bool:
        return self._started is None and self.wall_seconds == self.wall_seconds

    def __enter__(self) -> RegionMeasurement:
        self._sampler.start()
        self._cpu_start = tree_cpu_seconds(self.pid)
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.wall_seconds = time.perf_counter() - self._started
        user, system = tree_cpu_seconds(self.pid)
        self._sampler.stop()
        self._started = None
        self.cpu_user_seconds = max(0.0, user - self._cpu_start[0])
        self.cpu_system_seconds = max(0.0, system - self._cpu_start[1])

    def metrics(self) -> dict[str, tuple[float, str]]:
        """The measurement as named metrics with units, for result rows."""
        if not self.finished:
            raise RuntimeError("RegionMeasurement.metrics() before the measured block finished")
        return {
            "wall_seconds": (self.wall_seconds, "s"),
            "cpu_seconds": (self.cpu_seconds, "s"),
            "cpu_user_seconds": (self.cpu_user_seconds, "s"),
            "cpu_system_seconds": (self.cpu_system_seconds, "s"),
            "peak_pss_bytes": (float(self.peak_pss_bytes), "bytes"),
            "peak_uss_bytes": (float(self.peak_uss_bytes), "bytes"),
            # How closely the peaks were looked for: the longest gap between two samples.
            "peak_memory_sample_gap_s": (
                max(self._sampler.interval, self._sampler.longest_wait), "s"),
        }
