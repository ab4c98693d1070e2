"""Process lifetimes: whether a process is still there (how every clean-up of a killed run's
leftovers tells theirs from a live run's), a child that dies with its parent, and where
processes' shared-memory segments live (what a killed process leaves behind)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

SHM_DIR = Path("/dev/shm")
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
