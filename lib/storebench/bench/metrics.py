"""What a timed region costs: wall time, CPU time and peak memory of the whole process tree.

Memory is PSS and USS summed over a process and every descendant, from
``/proc/<pid>/smaps_rollup``: RSS double-counts pages that workers share with their parent
(a forked DataLoader worker "has" the parent's whole heap in RSS), PSS divides shared pages
among their users and USS (Private_Clean + Private_Dirty) counts only what each owns.
Those are sampled, so a region shorter than a few sampling periods shows noise, not its
peak: the per-worker breakdown. The peak itself comes from the kernel (``KernelPeak``): the
case's memory cgroup's high-water mark where the runner gave the case one, else the sum of
each process's high-water RSS.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

_KIB = 1024
# The runner names the memory cgroup it puts a case's process tree in with this variable
# (``bench.runner``); a process outside any such cgroup sums high-water RSS instead.
CASE_CGROUP_ENV = "STOREBENCH_CASE_CGROUP"
# A sampled peak needs this many sampling periods inside its region to mean anything.
MIN_PEAK_SAMPLES = 5


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


def high_water_rss(pid: int) -> int | None:
    """The kernel's high-water mark of a process's RSS (``VmHWM``), in bytes; None when it
    is gone, a zombie or unreadable."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * _KIB
    return None


def reset_high_water(pid: int) -> None:
    """Start ``pid``'s ``VmHWM`` over from its RSS now (``clear_refs`` 5, Linux 4.0+), so
    that a region's peak is the region's; a process that cannot be reset keeps its older
    mark (an over-estimate, never an under-estimate)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def case_cgroup():
    """The memory cgroup the runner made for this case's process tree (this process's, or
    an ancestor of it: a budget a case makes is nested in it), or None."""
    from storebench.cgroups import own_memory_cgroup

    name = os.environ.get(CASE_CGROUP_ENV)
    own = own_memory_cgroup() if name else None
    if own is None:
        return None
    return next((c for c in own.ancestors() if c.path.name == name), None)


class KernelPeak:
    """The peak memory of a process tree over a region, from the kernel, not sampled.

    - In the case's memory cgroup (``case_cgroup``): its high-water mark, reset when the
      region starts (v1 ``memory.max_usage_in_bytes``; v2 ``memory.peak``, reset per open
      file from Linux 6.12). The cgroup counts anonymous memory and the page cache the
      case's processes brought in, every process of the tree once.
    - Otherwise: the sum of each process's high-water RSS (``VmHWM``, reset at the start;
      processes seen by ``sampler``), at least this process's plus the largest reaped
      child's (``RUSAGE_CHILDREN``). Shared pages count once per process that maps them:
      an upper bound for forked workers.
    """

    def __init__(self, pid: int, sampler: PeakMemorySampler) -> None:
        self.pid = pid
        self._sampler = sampler
        self._cgroup = None
        self._peak_file = None
        self._children_before = 0
        self.from_cgroup = False
        self.peak_bytes = 0

    def start(self) -> None:
        cgroup = case_cgroup() if self.pid == os.getpid() else None
        if cgroup is not None and cgroup.version == 1:
            with contextlib.suppress(OSError):
                (cgroup.path / "memory.max_usage_in_bytes").write_text("0")
                self._cgroup = cgroup
        elif cgroup is not None:
            with contextlib.suppress(OSError):
                peak_file = open(cgroup.path / "memory.peak", "r+")  # noqa: SIM115
                try:
                    peak_file.write("reset\n")
                    peak_file.flush()
                except OSError:
                    peak_file.close()
                    raise
                self._cgroup, self._peak_file = cgroup, peak_file
        for member in tree_pids(self.pid):
            reset_high_water(member)
        self._children_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss

    def stop(self) -> None:
        if self._cgroup is not None:
            try:
                if self._peak_file is not None:
                    self._peak_file.seek(0)
                    self.peak_bytes = int(self._peak_file.read().strip())
                else:
                    self.peak_bytes = int(self._cgroup.peak_bytes() or 0)
                self.from_cgroup = True
                return
            except (OSError, ValueError):
                pass
            finally:
                if self._peak_file is not None:
                    self._peak_file.close()
                    self._peak_file = None
        summed = sum(self._sampler.high_water_bytes.values())
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        own = self._sampler.high_water_bytes.get(self.pid, 0)
        reaped = children * _KIB if children > self._children_before else 0
        self.peak_bytes = max(summed, own + reaped)


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
        # Each process's high-water RSS when last seen: summed, the tree's peak where no
        # memory cgroup gives it (``KernelPeak``).
        self.high_water_bytes: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        pss = uss = 0
        for member in tree_pids(self.pid):  # one walk of the tree for both figures
            got = process_memory(member)
            high = high_water_rss(member)
            if got is not None:
                pss, uss = pss + got[0], uss + got[1]
            if high is not None:
                self.high_water_bytes[member] = max(high, self.high_water_bytes.get(member, 0))
        self.peak_pss_bytes = max(self.peak_pss_bytes, pss)
        self.peak_uss_bytes = max(self.peak_uss_bytes, uss)
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
    """Wall seconds, CPU seconds (user + system over the process tree), the tree's peak
    memory from the kernel (``KernelPeak``) and its sampled peak PSS/USS over the block it
    wraps::

        with RegionMeasurement() as m:
            work()
        m.wall_seconds, m.cpu_seconds, m.peak_pss_bytes
    """

    def __init__(self, pid: int | None = None, *, interval: float = 0.05) -> None:
        self.pid = os.getpid() if pid is None else pid
        self._sampler = PeakMemorySampler(self.pid, interval=interval)
        self._kernel = KernelPeak(self.pid, self._sampler)
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

    @property
    def kernel_peak_bytes(self) -> int:
        return self._kernel.peak_bytes

    @property
    def sample_gap_s(self) -> float:
        """The longest wait between two samples of the peaks so far."""
        return max(self._sampler.interval, self._sampler.longest_wait)

    @property
    def peak_memory_reliable(self) -> bool:
        """Whether the region lasted at least ``MIN_PEAK_SAMPLES`` sampling periods: a
        shorter region's sampled PSS/USS is no peak."""
        return self.wall_seconds >= MIN_PEAK_SAMPLES * self.sample_gap_s

    def __enter__(self) -> RegionMeasurement:
        self._kernel.start()  # first: the sampler's first look must see reset marks
        self._sampler.start()
        self._cpu_start = tree_cpu_seconds(self.pid)
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.wall_seconds = time.perf_counter() - self._started
        user, system = tree_cpu_seconds(self.pid)
        self._sampler.stop()
        self._kernel.stop()
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
            "peak_memory_sample_gap_s": (self.sample_gap_s, "s"),
            # The tree's peak from the kernel, and where from (1: the case's memory cgroup,
            # 0: summed high-water RSS); whether the sampled peaks above mean a peak.
            "kernel_peak_bytes": (float(self._kernel.peak_bytes), "bytes"),
            "kernel_peak_from_cgroup": (float(self._kernel.from_cgroup), "count"),
            "peak_memory_reliable": (float(self.peak_memory_reliable), "count"),
        }
