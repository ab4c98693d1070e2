"""The watcher beside each case: ``python -m storebench.bench.watcher CASE_DIR``.

The runner starts it in its own session next to every case worker and keeps the only write
end of its stdin. If the runner dies without unwinding (SIGKILL, a crash), the watcher sees
end of file without ``done``, kills every process the case started and removes the case's
temporary directory. It imports the standard library alone: one runs per case, and on a
2-core machine its start-up competes with the case's own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time

# Every process of a case inherits this variable (set to its temporary directory), so the
# watcher can find them even if one left the case's process group.
CASE_DIR_ENV = "STOREBENCH_CASE_DIR"
WATCH_DONE = b"done"


def _marked_pids(case_dir: str) -> list[int]:
    """Live processes (other than this one) whose environment carries ``case_dir``."""
    marker = f"{CASE_DIR_ENV}={case_dir}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry.name}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except OSError:  # gone meanwhile, or another user's
            continue
        if marker in environ and state != "Z":
            found.append(int(entry.name))
    return found


def kill_case_processes(case_dir: str, pgid: int | None, *, rounds: int = 100) -> None:
    """SIGKILL the case's process group and every process marked with ``case_dir``, until
    none is left (a process may fork while the others are being killed)."""
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for _ in range(rounds):
        pids = _marked_pids(case_dir)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def watch_case(case_dir: str, stream=None) -> int:
    """Wait on ``stream`` (stdin: a pipe whose only writer is the runner) for the runner's
    messages: the case worker's pid (its process group), then ``done`` when the runner has
    cleaned up itself. End of file without ``done`` means the runner died: kill the case's
    processes and remove ``case_dir``."""
    stream = stream if stream is not None else sys.stdin.buffer
    # Ctrl-C in the runner's terminal is the runner's to handle; this process must outlive it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pgid = None
    for line in stream:
        line = line.strip()
        if line == WATCH_DONE:
            return 0
        if line.isdigit():
            pgid = int(line)
    kill_case_processes(case_dir, pgid)
    shutil.rmtree(case_dir, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m storebench.bench.watcher CASE_DIR", file=sys.stderr)
        return 2
    return watch_case(argv[0])


if __name__ == "__main__":
    sys.exit(main())
