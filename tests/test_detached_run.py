"""The test session's detached runs (``detached_run``, how the ci study runs beside the
other tests): not a descendant of the session, its output and status read back, and
stopped with what it started."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
from detached_run import DetachedRun


def run(tmp_path, code: str) -> DetachedRun:
    return DetachedRun([sys.executable, "-c", code], tmp_path / "run", env=dict(os.environ),
                       cwd=tmp_path)


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def started_pid(tmp_path) -> int:
    pid_file = tmp_path / "run" / "pid"
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return int(pid_file.read_text())


def test_a_detached_run_is_no_descendant_and_its_result_reads_back(tmp_path):
    detached = run(tmp_path, "import sys, time; time.sleep(3); print('out'); "
                             "print('err', file=sys.stderr); sys.exit(3)")
    pid = started_pid(tmp_path)
    assert psutil.pid_exists(pid) and pid not in descendants()
    done = detached.wait(60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_stop_ends_the_run_and_its_children_and_a_late_wait_times_out(tmp_path):
    detached = run(tmp_path, "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; "
                             "time.sleep(300)']); time.sleep(300)")
    group = started_pid(tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):
        detached.wait(0.5)
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)


def test_a_run_whose_session_dies_is_stopped(tmp_path):
    owner = subprocess.run([sys.executable, "-c", f"""
import sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
from pathlib import Path
from detached_run import DetachedRun
DetachedRun([sys.executable, "-c", "import time; time.sleep(300)"], Path({str(tmp_path)!r}) / "run",
            env={{}}, cwd=Path({str(tmp_path)!r}))
"""], timeout=60)
    assert owner.returncode == 0
    group = started_pid(tmp_path)
    deadline = time.monotonic() + 60
    while psutil.pid_exists(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not psutil.pid_exists(group)
