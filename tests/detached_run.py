"""A command run detached from the test session, its output and exit status kept in files.

``python tests/detached_run.py FOLDER OWNER_PID -- COMMAND...`` returns at once: a
grandchild in a session of its own runs COMMAND in a process group of its own, writing
``pid`` (COMMAND's, also its group's) into FOLDER, then ``stdout``, ``stderr`` and
``returncode``. Its parent has exited, so it is no descendant of the caller: the tests that
count their session's child processes, or Ray's, never see it or what it starts. Should the
owner (the test session) die first, COMMAND's group is stopped: nothing outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.5
STOP_GRACE_S = 10.0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_group(group: int, reap=lambda: None) -> None:
    """Stops process group ``group``: SIGINT first (a Python process unwinds its ``with``
    blocks, stopping the servers it started), SIGTERM after ``STOP_GRACE_S``, then SIGKILL.
    ``reap`` collects the exit of a member that is this process's child (until then a
    zombie, it keeps the group)."""
    for sig, grace in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGTERM, 5.0),
                       (signal.SIGKILL, 5.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            reap()
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def main(folder: Path, owner: int, command: list[str]) -> None:
    if os.fork():
        os._exit(0)
    os.setsid()
    # A session started in the background may ignore SIGINT, and an exec keeps an ignored
    # signal ignored: COMMAND gets the default, so that ``stop_group``'s SIGINT reaches it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with open(folder / "stdout", "wb") as out, open(folder / "stderr", "wb") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        (folder / "pid.part").write_text(str(process.pid))
        (folder / "pid.part").rename(folder / "pid")
        while True:
            try:
                returncode = process.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                if not alive(owner):
                    stop_group(process.pid, reap=process.poll)
    (folder / "returncode.part").write_text(str(returncode))
    (folder / "returncode.part").rename(folder / "returncode")


class DetachedRun:
    """``command`` started detached (module doc), with ``env`` and ``cwd``; ``wait`` reads
    its result, ``stop`` ends it and what it started in its process group."""

    def __init__(self, command: list[str], folder: Path, *, env: dict[str, str], cwd: Path):
        self.command, self.folder = command, folder
        folder.mkdir(parents=True, exist_ok=True)
        launcher = subprocess.run([sys.executable, __file__, str(folder), str(os.getpid()),
                                   "--", *command],
                                  env=env, cwd=cwd, timeout=60, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL)
        if launcher.returncode != 0:
            raise RuntimeError(f"could not start {command[:3]} detached")
        self.started = time.monotonic()

    def done(self) -> bool:
        return (self.folder / "returncode").exists()

    def wait(self, timeout_s: float) -> subprocess.CompletedProcess:
        """The finished run; one still running ``timeout_s`` after its start is stopped and
        raises ``subprocess.TimeoutExpired``."""
        while not self.done():
            if time.monotonic() - self.started > timeout_s:
                self.stop()
                raise subprocess.TimeoutExpired(self.command, timeout_s)
            time.sleep(POLL_S)
        read = lambda name: (self.folder / name).read_text(errors="replace")  # noqa: E731
        return subprocess.CompletedProcess(self.command, int(read("returncode")),
                                           read("stdout"), read("stderr"))

    def stop(self) -> None:
        """Ends the command and what it started in its process group (``stop_group``);
        nothing if it is done."""
        pid_file = self.folder / "pid"
        deadline = time.monotonic() + 10
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.done() and pid_file.exists():
            stop_group(int(pid_file.read_text()))


if __name__ == "__main__":
    separator = sys.argv.index("--")
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[separator + 1:])
