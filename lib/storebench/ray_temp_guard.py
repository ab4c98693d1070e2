"""Run as a script (``python ray_temp_guard.py DIR``, without importing storebench) beside a
local Ray: when the driver goes without writing "done" to this script's stdin (a SIGKILL
leaves it no chance to clean up), wait until no process holds a file under DIR open (Ray's
raylet and workers, dying with the driver), then remove DIR."""

import os
import shutil
import sys
import time

# Ray's processes exit within seconds of the driver; this bounds the wait on a loaded host.
MAX_WAIT_S = 120
POLL_S = 0.2


def held_open(root: str) -> bool:
    """Whether any process this user can see has a file under ``root`` open."""
    prefix = root.rstrip("/") + "/"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                    return True
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return False


def main(root: str) -> None:
    if sys.stdin.buffer.read() == b"done":
        return
    deadline = time.monotonic() + MAX_WAIT_S
    while held_open(root) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1])
