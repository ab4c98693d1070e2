"""Process lifetimes: whether a process is still there (how every clean-up of a killed run's
leftovers tells theirs from a live run's), a child that dies with its parent, and where
processes' shared-memory segments live (what a killed process leaves behind), and waiting
for a child to exit without polling."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

SHM_DIR = Path("/dev/shm")
# Our segments are named SHM_PREFIX + creator pid + "_" + random hex: short enough for macOS's
# 31-character limit, recognisable when looking for leaks, and orphans are told by the pid.
SHM_PREFIX = "storebench_"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists (another user's process included), zombies too."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def wait_for_exit(process: subprocess.Popen, timeout_s: float | None) -> int:
    """``process.wait(timeout=timeout_s)`` that returns as the process exits.

    ``Popen.wait`` with a timeout polls, sleeping up to 50 ms between looks: a case of a
    quarter second would wait a tenth of its time for nothing. A pidfd (Linux 5.3) becomes
    readable when the process exits; elsewhere this is ``Popen.wait``."""
    if timeout_s is None or process.returncode is not None:
        return process.wait(timeout=timeout_s)
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # not Linux, an old kernel, or the pid is gone
        return process.wait(timeout=timeout_s)
    try:
        exited, _, _ = select.select([pidfd], [], [], max(timeout_s, 0.0))
    finally:
        os.close(pidfd)
    if not exited:
        raise subprocess.TimeoutExpired(process.args, timeout_s)
    return process.wait()


def die_with_parent(parent_pid: int) -> None:
    """Be SIGKILLed as soon as the process that started this one ends (Linux), and end now
    if it already has: it may have died before the request was made, and then the kernel
    would never send the signal.

    The kernel signals when the parent *thread* that started this process exits, so the
    parent must start it from a thread that outlives it (``run_case`` and ``run_ranks``
    wait in theirs).
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


def remove_orphaned_shm_segments(directory: Path | str = SHM_DIR) -> list[str]:
    """Unlink our shared-memory segments (``SHM_PREFIX<pid>_<hex>`` in ``directory``) whose
    creator ``pid`` is no longer running. The creator's resource tracker unlinks them when
    the creator is SIGKILLed, but a kill of the whole session (tracker included) leaves
    them, each up to a batch ring of RAM, until reboot. Only the creator's own workers
    attach a segment, and they die with it, so nothing live uses an orphan. Returns the names
    removed."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(SHM_PREFIX):
            continue
        pid, sep, _ = name[len(SHM_PREFIX):].partition("_")
        if not (sep and pid.isdigit()) or pid_alive(int(pid)):
            continue
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            continue
        removed.append(name)
    return sorted(removed)
