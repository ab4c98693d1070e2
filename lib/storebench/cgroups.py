"""Where a process's memory cgroup is and how much memory it leaves: read-only, stdlib only.

A memory cgroup caps anonymous memory and page cache together, so "RAM available" to a
process inside one is not what ``/proc/meminfo`` says: it is the smallest headroom of its
cgroup and every ancestor that has a limit. Two kernel interfaces exist:

- v1 (``cgroup`` filesystem with the ``memory`` controller): ``memory.limit_in_bytes``,
  ``memory.usage_in_bytes``, ``memory.max_usage_in_bytes``, ``memory.stat`` (``cache``,
  hierarchical ``total_*`` fields);
- v2 (``cgroup2``): ``memory.max``, ``memory.current``, ``memory.peak``, ``memory.stat``
  (``file``, hierarchical by nature).

The memory controller is bound to at most one of them, so a hybrid mount (v1 memory beside a
v2 tree without it) is read as v1. Creating and removing cgroups is ``bench.memory_budget``'s
job; this module only reads, so that ``PreloadedDataset`` can ask it without pulling in the
benchmark harness.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
# v1 reports "no limit" as PAGE_COUNTER_MAX pages (close to 2**63 bytes); anything this large
# is no limit in practice.
NO_LIMIT = 1 << 62


@dataclass(frozen=True)
class CgroupMount:
    """One cgroup or cgroup2 mount from ``/proc/<pid>/mountinfo``.

    ``root`` is the path inside the hierarchy that is mounted at ``point`` (``/`` on a host,
    a sub-path for a bind mount or a container's view).
    """

    root: str
    point: Path
    fstype: str
    read_only: bool
    super_options: frozenset[str]

    @property
    def version(self) -> int:
        return 2 if self.fstype == "cgroup2" else 1

    def directory_of(self, cgroup_path: str) -> Path | None:
        """The directory of ``cgroup_path`` (as ``/proc/<pid>/cgroup`` names it) under this
        mount, or None when the mount does not show that part of the hierarchy."""
        root = self.root.rstrip("/")
        if cgroup_path != root and not cgroup_path.startswith(root + "/"):
            return None
        return self.point / cgroup_path[len(root):].lstrip("/")


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup and cgroup2 mounts in a ``mountinfo`` text, in its order."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append(CgroupMount(
            root=_unescape(fields[3]),
            point=Path(_unescape(fields[4])),
            fstype=tail[0],
            read_only="ro" in fields[5].split(","),
            super_options=frozenset(tail[2].split(",")),
        ))
    return mounts


def cgroup_mounts(pid: int | str = "self") -> list[CgroupMount]:
    return parse_mountinfo((PROC / str(pid) / "mountinfo").read_text())


def mount_of(path: Path | str, pid: int | str = "self") -> tuple[str, Path, bool]:
    """(filesystem type, mount point, read-only) of the mount holding ``path``: the mount
    with the longest mount point that contains it (the last one, where mounts stack)."""
    path = Path(os.path.realpath(path))
    best: tuple[str, Path, bool] | None = None
    for line in (PROC / str(pid) / "mountinfo").read_text().splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or not tail:
            continue
        point = Path(_unescape(fields[4]))
        contains = path == point or point in path.parents
        if contains and (best is None or len(point.parts) >= len(best[1].parts)):
            best = (tail[0], point, "ro" in fields[5].split(","))
    if best is None:  # "/" is always mounted; only a broken /proc gets here
        raise OSError(f"{path}: no mount in /proc/{pid}/mountinfo holds it")
    return best


def _read_counters(path: Path) -> dict[str, int]:
    """A cgroup file of ``name value`` lines (``memory.stat``, ``memory.events``) as a dict of
    its integer counters."""
    counters = {}
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            counters[name] = int(value)
    return counters


def _read_int(path: Path) -> int | None:
    """An integer file of a cgroup, None for v2's ``max`` (no limit)."""
    text = path.read_text().strip()
    return None if text == "max" else int(text)


@dataclass(frozen=True)
class MemoryCgroup:
    """A memory cgroup directory and its interface version (1 or 2). ``top`` is the highest
    directory of the hierarchy visible here (its mount point): ancestors stop there."""

    version: int
    path: Path
    top: Path

    def _file(self, v1: str, v2: str) -> Path:
        return self.path / (v1 if self.version == 1 else v2)

    def limit_bytes(self) -> int | None:
        """The memory limit, or None when there is none."""
        limit = _read_int(self._file("memory.limit_in_bytes", "memory.max"))
        return None if limit is None or limit >= NO_LIMIT else limit

    def usage_bytes(self) -> int:
        """Memory charged now: anonymous memory and page cache (and kernel memory)."""
        return int(_read_int(self._file("memory.usage_in_bytes", "memory.current")) or 0)

    def peak_bytes(self) -> int | None:
        """Highest usage since the cgroup was created, where the kernel keeps it (v1 always;
        v2 from Linux 5.19, ``memory.peak``)."""
        path = self._file("memory.max_usage_in_bytes", "memory.peak")
        return _read_int(path) if path.exists() else None

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer has killed in this cgroup for reaching its limit
        (v1 ``memory.oom_control``, v2 ``memory.events``: ``oom_kill``; 0 where the kernel
        does not count them)."""
        with contextlib.suppress(OSError):
            return _read_counters(self._file("memory.oom_control", "memory.events")).get(
                "oom_kill", 0)
        return 0

    def stat(self) -> dict[str, int]:
        """``memory.stat`` as a dict of counters."""
        return _read_counters(self.path / "memory.stat")

    def file_cache_bytes(self, stat: dict[str, int] | None = None) -> int:
        """Page cache charged to this cgroup (v1 ``cache``, v2 ``file``)."""
        stat = self.stat() if stat is None else stat
        return stat.get("cache" if self.version == 1 else "file", 0)

    def reclaimable_bytes(self, stat: dict[str, int] | None = None) -> int:
        """Inactive page cache, which the kernel drops before refusing memory (hierarchical
        in both versions, as ``MemAvailable`` counts it)."""
        stat = self.stat() if stat is None else stat
        return stat.get("total_inactive_file" if self.version == 1 else "inactive_file",
                        stat.get("inactive_file", 0))

    def ancestors(self) -> list[MemoryCgroup]:
        """This cgroup and every parent up to ``top``."""
        chain = [self]
        path = self.path
        while path != self.top and self.top in path.parents:
            path = path.parent
            chain.append(MemoryCgroup(self.version, path, self.top))
        return chain

    def headroom_bytes(self) -> int | None:
        """How much more memory a process here can get before a cgroup limit (its own or an
        ancestor's) makes the kernel reclaim or kill: the smallest ``limit - usage +
        inactive page cache`` over the limited ones; None when none is limited."""
        headroom = None
        for cgroup in self.ancestors():
            try:
                limit = cgroup.limit_bytes()
                if limit is None:
                    continue
                room = limit - cgroup.usage_bytes() + cgroup.reclaimable_bytes()
            except (FileNotFoundError, PermissionError):
                continue  # an ancestor without the files (v2's root) limits nothing
            headroom = room if headroom is None else min(headroom, room)
        return None if headroom is None else max(headroom, 0)


def own_memory_cgroup(pid: int | str = "self") -> MemoryCgroup | None:
    """The memory cgroup ``pid`` is in, or None when no memory controller is mounted where
    this process can see it."""
    try:
        lines = (PROC / str(pid) / "cgroup").read_text().splitlines()
        mounts = cgroup_mounts(pid)
    except OSError:
        return None
    v1_path = v2_path = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            v1_path = path
        elif controllers == "":
            v2_path = path
    for mount in mounts:
        if v1_path is not None and mount.version == 1 and "memory" in mount.super_options:
            directory = mount.directory_of(v1_path)
            if directory is not None and directory.is_dir():
                return MemoryCgroup(1, directory, mount.point)
    for mount in mounts:
        if v2_path is not None and mount.version == 2:
            directory = mount.directory_of(v2_path)
            if directory is not None and (directory / "memory.current").exists():
                return MemoryCgroup(2, directory, mount.point)
    return None


def available_memory() -> tuple[int, str]:
    """(bytes this process can still get, where that figure comes from): the host's
    ``MemAvailable``, or less where the process's memory cgroup (or an ancestor) leaves
    less."""
    import psutil

    host = int(psutil.virtual_memory().available)
    cgroup = own_memory_cgroup()
    headroom = None
    if cgroup is not None:
        try:
            headroom = cgroup.headroom_bytes()
        except OSError:
            headroom = None
    if headroom is not None and headroom < host:
        return headroom, f"under the memory cgroup limit of {cgroup.path}"
    return host, "on this host"
