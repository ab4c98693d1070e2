"""Memory budgets: run a process in a child memory cgroup with a limit, and say what it cost.

A memory cgroup caps a process group's anonymous memory and its page cache together, so a
dataset larger than the budget behaves as one larger than RAM: pages beyond the budget are
reclaimed and read again from the device. ``MemoryBudget`` creates a child cgroup
``storebench-<owner pid>-<name>`` under the cgroup the process runs in (v1 or v2, whichever
holds the memory controller), moves the process in, sets the limit, and on exit moves it back
and removes the cgroup. A case killed before its exit leaves its cgroup behind;
``remove_stale_budgets()`` removes those whose owner is dead (the runner calls it after a
case is killed and before a run).

Pages charged before the move stay with the old cgroup (v2 never moves charges; v1 moves them
only with the deprecated ``move_charge_at_immigrate``, which is left off), so the limit
bounds what the process charges *after* entering: a case that wants "its baseline plus X"
sets ``charged_bytes() + X`` once it has made its loader.

Where no writable memory cgroup exists (an ordinary user, a read-only cgroupfs in a
container, no memory controller), entering raises ``BudgetUnavailable`` with the reason: a
case must then be reported as skipped, never run unconstrained. ``cgroup_root=`` (or the
environment variable ``STOREBENCH_CGROUP_ROOT``) names the directory to create budgets under
instead of the process's own cgroup: a real cgroup directory, or (in tests) a directory that
is not one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from storebench.cgroups import MemoryCgroup, mount_of, own_memory_cgroup

ENV_CGROUP_ROOT = "STOREBENCH_CGROUP_ROOT"
NAME_PREFIX = "storebench-"
_BUDGET_NAME = re.compile(r"^storebench-(\d+)-[A-Za-z0-9_.-]+$")
_SUFFIX = re.compile(r"^[A-Za-z0-9_.-]+$")
# rmdir fails with EBUSY while a moved-out or killed task is still being released.
_RMDIR_SECONDS = 2.0
_PEAK_INTERVAL_S = 0.02
HOW_TO = ("memory budgets need a writable memory cgroup: run as root, inside a delegated "
          "cgroup, or under `systemd-run --user --scope -p Delegate=yes ...`")


class BudgetUnavailable(RuntimeError):
    """No writable memory cgroup here; ``reason`` says why (and what would give one)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class BudgetError(RuntimeError):
    """A budget's cgroup exists but could not be set or removed as asked."""


@dataclass(frozen=True)
class BudgetStats:
    """What a budget's cgroup has seen since it was created.

    ``peak_bytes``: highest charge (kernel-kept where it exists, else sampled every 20 ms);
    ``file_cache_bytes``: page cache charged now; ``major_faults``: page faults that waited
    for the device; ``device_read_bytes``: bytes its processes made the kernel read from the
    device (``/proc/<pid>/io``, reaped children included).
    """

    limit_bytes: int | None
    usage_bytes: int
    peak_bytes: int
    file_cache_bytes: int
    major_faults: int
    device_read_bytes: int


def _write(path: Path, value: str) -> None:
    # A cgroup file takes one value per write(2); buffered text writes could split it.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _v2_controllers(path: Path, name: str) -> list[str]:
    try:
        return (path / name).read_text().split()
    except OSError:
        return []


def _budget_parent(cgroup_root: Path | str | None) -> MemoryCgroup:
    """The cgroup to create budgets under, checked; raises BudgetUnavailable."""
    root = cgroup_root if cgroup_root is not None else os.environ.get(ENV_CGROUP_ROOT)
    if root:
        directory = Path(root)
        if not directory.is_dir():
            raise BudgetUnavailable(f"{directory}: no such directory to create memory cgroups "
                                    f"under; {HOW_TO}")
        fstype, point, _ = mount_of(directory)
        if fstype not in ("cgroup", "cgroup2"):
            raise BudgetUnavailable(f"{directory} is on a {fstype} filesystem, not a cgroup "
                                    f"filesystem; {HOW_TO}")
        version = 2 if fstype == "cgroup2" else 1
        if version == 1 and not (directory / "memory.limit_in_bytes").exists():
            raise BudgetUnavailable(f"{directory}: this cgroup hierarchy has no memory "
                                    f"controller; {HOW_TO}")
        if version == 2 and "memory" not in _v2_controllers(directory, "cgroup.controllers"):
            raise BudgetUnavailable(f"{directory}: the memory controller is not available in "
                                    f"this cgroup; {HOW_TO}")
        parent = MemoryCgroup(version, directory, point)
    else:
        parent = own_memory_cgroup()
        if parent is None:
            raise BudgetUnavailable(f"no memory cgroup controller is mounted where this "
                                    f"process can see it; {HOW_TO}")
        if parent.version == 2:
            parent = _v2_parent(parent)
    if mount_of(parent.path)[2]:
        raise BudgetUnavailable(f"{parent.path}: the cgroup filesystem is mounted read-only "
                                f"(usual inside containers); {HOW_TO}")
    if not os.access(parent.path, os.W_OK):
        raise BudgetUnavailable(f"{parent.path}: not writable by uid {os.geteuid()}; {HOW_TO}")
    return parent


def _v2_parent(own: MemoryCgroup) -> MemoryCgroup:
    """v2 gives a child the memory controller only where its parent lists it in
    ``cgroup.subtree_control``, and a non-root cgroup holding processes (this one holds this
    process) may not list it. So: this cgroup if it already delegates memory (or is the
    root and can be told to), else budgets become siblings of it, under its parent."""
    if "memory" in _v2_controllers(own.path, "cgroup.subtree_control"):
        return own
    if own.path == own.top:
        with contextlib.suppress(OSError):
            _write(own.path / "cgroup.subtree_control", "+memory")
            return own
    parent = own.path.parent
    if own.top in (parent, *parent.parents) and "memory" in _v2_controllers(
            parent, "cgroup.subtree_control"):
        return MemoryCgroup(2, parent, own.top)
    raise BudgetUnavailable(
        f"cgroup v2: {own.path} holds processes, so it cannot give a child the memory "
        f"controller, and its parent does not delegate it either; {HOW_TO}"
    )


def budget_available(*, cgroup_root: Path | str | None = None) -> str | None:
    """None when budgets can be made here, else the reason they cannot (no cgroup is made)."""
    try:
        _budget_parent(cgroup_root)
    except BudgetUnavailable as err:
        return err.reason
    return None


def _pid_alive(pid: int) -> bool:
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X")


def _members(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _proc_cgroup_dir(pid: int, version: int) -> Path | None:
    """The directory of the memory cgroup ``pid`` is in now, if in a ``version`` tree."""
    own = own_memory_cgroup(pid)
    return own.path if own is not None and own.version == version else None


def _remove(path: Path, *, version: int, return_to: Path, empty: bool = True) -> None:
    """Move whatever is still in ``path`` to ``return_to`` and remove the cgroup, with the
    budgets nested in it (a killed case's, inside the case's own cgroup)."""
    with contextlib.suppress(OSError):
        for child in sorted(path.iterdir()):
            if _BUDGET_NAME.match(child.name) and child.is_dir():
                _remove(child, version=version, return_to=return_to)
    deadline = time.monotonic() + _RMDIR_SECONDS
    while True:
        for pid in _members(path):
            with contextlib.suppress(OSError):  # gone meanwhile
                _write(return_to / "cgroup.procs", str(pid))
        if version == 1 and empty:
            # Reclaim the page cache charged here first, so no offline cgroup lingers
            # holding it; busy while a task is still leaving, hence the retry.
            with contextlib.suppress(OSError):
                _write(path / "memory.force_empty", "0")
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as err:
            if err.errno != errno.EBUSY or time.monotonic() > deadline:
                raise BudgetError(f"{path}: cannot remove the budget's cgroup: "
                                  f"{err.strerror}; processes left: {_members(path)}") from err
            time.sleep(0.02)


def remove_stale_budgets(*, cgroup_root: Path | str | None = None) -> list[Path]:
    """Remove the budget cgroups (``storebench-<pid>-*``) under the budget parent whose owner
    process is dead; returns those removed. Nothing to do where budgets cannot be made.
    A stale cgroup that still holds live processes (a killed case's workers) is kept, so
    they are never moved out from under their cap silently."""
    try:
        parent = _budget_parent(cgroup_root)
    except BudgetUnavailable:
        return []
    removed = []
    for entry in sorted(parent.path.iterdir()):
        match = _BUDGET_NAME.match(entry.name)
        if not match or not entry.is_dir() or _pid_alive(int(match.group(1))):
            continue
        if any(_pid_alive(pid) for pid in _members(entry)):
            continue
        _remove(entry, version=parent.version, return_to=parent.path)
        removed.append(entry)
    return removed


def oom_killed_budgets(owner: int, *, cgroup_root: Path | str | None = None
                       ) -> list[tuple[str, int | None]]:
    """``(name, limit in bytes)`` of process ``owner``'s budget cgroups in which the kernel's
    OOM killer has killed a process: what the budget held outgrew its limit. Read before
    ``remove_stale_budgets`` removes them; empty where budgets cannot be made."""
    try:
        parent = _budget_parent(cgroup_root)
    except BudgetUnavailable:
        return []
    killed = []
    for entry in sorted(parent.path.glob(f"{NAME_PREFIX}{int(owner)}-*")):
        if not (_BUDGET_NAME.match(entry.name) and entry.is_dir()):
            continue
        cgroup = MemoryCgroup(parent.version, entry, parent.top)
        with contextlib.suppress(OSError):
            if cgroup.oom_kills():
                killed.append((entry.name, cgroup.limit_bytes()))
    return killed


def _device_read_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in (Path("/proc") / str(pid) / "io").read_text().splitlines():
                if line.startswith("read_bytes:"):
                    total += int(line.split()[1])
    return total


class MemoryBudget:
    """A child memory cgroup holding ``pid`` (default: this process) for the ``with`` block.

    ``limit_bytes=None`` makes the cgroup without a limit (its counters still measure, and
    ``set_limit`` can cap it later). The limit covers swap too (v1 ``memsw``, v2
    ``memory.swap.max = 0``), so anonymous memory cannot escape the cap by being swapped out.
    Processes the member starts inside the block are members too. ``stats()`` reads the
    cgroup's counters; the ``with`` block must still be open.
    """

    def __init__(
        self,
        limit_bytes: int | None,
        *,
        name: str | None = None,
        pid: int | None = None,
        cgroup_root: Path | str | None = None,
        empty_on_exit: bool = True,
    ) -> None:
        if limit_bytes is not None and limit_bytes <= 0:
            raise ValueError(f"limit_bytes must be positive or None, got {limit_bytes}")
        suffix = name if name is not None else uuid.uuid4().hex[:8]
        if not _SUFFIX.match(suffix):
            raise ValueError(f"budget name {suffix!r} may hold only letters, digits, _ . -")
        self.pid = os.getpid() if pid is None else int(pid)
        self.name = f"{NAME_PREFIX}{os.getpid()}-{suffix}"
        self.initial_limit = limit_bytes
        self.cgroup_root = cgroup_root
        # v1: reclaim the page cache charged to the cgroup as it goes (False: leave it
        # cached, for a cgroup that only measures; the pages outlive it).
        self.empty_on_exit = empty_on_exit
        self.cgroup: MemoryCgroup | None = None
        self._parent: MemoryCgroup | None = None
        self._return_to: Path | None = None
        self._read_start = 0
        self._peak_thread: threading.Thread | None = None
        self._peak_stop = threading.Event()
        self._sampled_peak = 0

    @property
    def path(self) -> Path:
        return self._open().path

    def _open(self) -> MemoryCgroup:
        if self.cgroup is None:
            raise RuntimeError(f"budget {self.name} is not entered")
        return self.cgroup

    def __enter__(self) -> MemoryBudget:
        if self.cgroup is not None:
            raise RuntimeError(f"budget {self.name} entered twice")
        parent = _budget_parent(self.cgroup_root)
        path = parent.path / self.name
        try:
            path.mkdir()
        except OSError as err:
            if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise BudgetError(f"{path}: cannot create the budget's cgroup: "
                                  f"{err.strerror}") from err
            raise BudgetUnavailable(f"cannot create a cgroup under {parent.path}: "
                                    f"{err.strerror}; {HOW_TO}") from err
        self._parent = parent
        self.cgroup = MemoryCgroup(parent.version, path, parent.top)
        self._return_to = _proc_cgroup_dir(self.pid, parent.version) or parent.path
        try:
            if parent.version == 2:
                with contextlib.suppress(FileNotFoundError):  # no swap accounting
                    _write(path / "memory.swap.max", "0")
            if self.initial_limit is not None:
                self.set_limit(self.initial_limit)
            self._read_start = _device_read_bytes([self.pid])
            _write(path / "cgroup.procs", str(self.pid))
        except BaseException:
            self._close()
            raise
        if self.cgroup.peak_bytes() is None:
            self._peak_thread = threading.Thread(target=self._sample_peak, daemon=True,
                                                 name=f"{self.name}-peak")
            self._peak_thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._close()

    def _close(self) -> None:
        if self._peak_thread is not None:
            self._peak_stop.set()
            self._peak_thread.join()
            self._peak_thread = None
        cgroup, self.cgroup = self.cgroup, None
        if cgroup is not None:
            _remove(cgroup.path, version=cgroup.version, return_to=self._return_to,
                    empty=self.empty_on_exit)

    def _sample_peak(self) -> None:
        cgroup = self.cgroup
        while cgroup is not None and not self._peak_stop.wait(_PEAK_INTERVAL_S):
            with contextlib.suppress(OSError):
                self._sampled_peak = max(self._sampled_peak, cgroup.usage_bytes())

    def set_limit(self, limit_bytes: int | None) -> None:
        """Cap (or, with None, uncap) the cgroup; raises BudgetError where the kernel cannot
        reclaim enough to get under a new, lower limit."""
        cgroup = self._open()
        if limit_bytes is not None and limit_bytes <= 0:
            raise ValueError(f"limit_bytes must be positive or None, got {limit_bytes}")
        try:
            if cgroup.version == 2:
                _write(cgroup.path / "memory.max",
                       "max" if limit_bytes is None else str(int(limit_bytes)))
                return
            value = "-1" if limit_bytes is None else str(int(limit_bytes))
            memsw = cgroup.path / "memory.memsw.limit_in_bytes"
            # memsw may never be below the memory limit: raise it first, lower it last.
            current = cgroup.limit_bytes()
            raising = limit_bytes is None or (current is not None and limit_bytes > current)
            if raising and memsw.exists():
                _write(memsw, value)
            _write(cgroup.path / "memory.limit_in_bytes", value)
            if not raising and memsw.exists():
                _write(memsw, value)
        except OSError as err:
            raise BudgetError(f"{cgroup.path}: cannot set the memory limit to "
                              f"{limit_bytes} bytes: {err.strerror} (usage now "
                              f"{cgroup.usage_bytes()} bytes)") from err

    def reset_peak(self) -> None:
        """Start the peak over from now (e.g. once the cap is set, so that an uncapped
        set-up phase does not count). v1 resets the kernel's counter; v2's ``memory.peak``
        resets only for the file handle that asks, so from here it is sampled instead."""
        cgroup = self._open()
        self._sampled_peak = cgroup.usage_bytes()
        if cgroup.version == 1:
            _write(cgroup.path / "memory.max_usage_in_bytes", "0")
        elif self._peak_thread is None:
            self._peak_thread = threading.Thread(target=self._sample_peak, daemon=True,
                                                 name=f"{self.name}-peak")
            self._peak_thread.start()

    def charged_bytes(self) -> int:
        """Memory charged to the cgroup now (what its members allocated or read since they
        moved in, page cache included)."""
        return self._open().usage_bytes()

    def stats(self) -> BudgetStats:
        cgroup = self._open()
        stat = cgroup.stat()
        usage = cgroup.usage_bytes()
        peak = cgroup.peak_bytes() if self._peak_thread is None else None
        if peak is None:
            self._sampled_peak = max(self._sampled_peak, usage)
            peak = self._sampled_peak
        members = _members(cgroup.path)
        read = _device_read_bytes(members) - (self._read_start if self.pid in members else 0)
        return BudgetStats(
            limit_bytes=cgroup.limit_bytes(),
            usage_bytes=usage,
            peak_bytes=peak,
            file_cache_bytes=cgroup.file_cache_bytes(stat),
            major_faults=stat.get("pgmajfault", 0),
            device_read_bytes=max(read, 0),
        )
