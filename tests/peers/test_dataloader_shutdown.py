"""Stopping a torch DataLoader's workers, as every DataLoader-based peer path does on close: a
worker that dies on its way out does not fail the close, any other error does, and nothing is
left running."""

from __future__ import annotations

import multiprocessing.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from peer_support import children_left, worker_children

from storebench.loaders import peers
from storebench.loaders.peers import shut_down_dataloader_workers

pytestmark = [pytest.mark.peers, pytest.mark.timeout(120)]
torch_data = pytest.importorskip("torch.utils.data")
torch_utils = pytest.importorskip("torch.utils.data._utils")


@pytest.fixture(autouse=True)
def _temporary_files_in_tmp_path(tmp_path, monkeypatch):
    """These tests kill and abort DataLoader workers on purpose, and a worker that sent a
    batch made itself a ``pymp-*`` directory (for the descriptors it shares) that only its
    clean exit removes: theirs go into the test's ``tmp_path`` (forked workers inherit
    ``tempfile.tempdir``, the subprocess ``TMPDIR``), not into the machine's /tmp."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


class Numbers(torch_data.Dataset):
    def __len__(self) -> int:
        return 1_000

    def __getitem__(self, index: int) -> int:
        return index


def _exit_after(seconds: float, abort: bool) -> None:
    time.sleep(seconds)
    if abort:
        os.abort()


def slow_exit_then_abort_on_exit(worker_id: int) -> None:
    """Worker 0 takes 2 s to exit; worker 1 dies of SIGABRT 0.2 s into its exit, as LitData's
    spawned workers sometimes do ("terminate called without an active exception"). So the
    parent is inside its join of worker 0 when worker 1's death arrives."""
    seconds, abort = (2.0, False) if worker_id == 0 else (0.2, True)
    multiprocessing.util.Finalize(None, _exit_after, args=(seconds, abort), exitpriority=100)


def ignore_sigterm_and_hang_on_exit(worker_id: int) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    multiprocessing.util.Finalize(None, _exit_after, args=(120.0, False), exitpriority=100)


def started_iterator(worker_init_fn=None):
    loader = torch_data.DataLoader(Numbers(), batch_size=10, num_workers=2,
                                   multiprocessing_context="fork",
                                   worker_init_fn=worker_init_fn)
    iterator = iter(loader)
    assert next(iterator).tolist() == list(range(10))
    return iterator


def test_a_worker_dying_on_its_way_out_does_not_fail_the_shutdown_and_both_are_reaped():
    before = frozenset(worker_children())
    iterator = started_iterator(slow_exit_then_abort_on_exit)
    workers = list(iterator._workers)
    assert {w.pid for w in workers} <= worker_children() - before
    shut_down_dataloader_workers(iterator)
    # Joined, not terminated: worker 0 finished its slow exit, worker 1's abort is its own.
    assert [w.exitcode for w in workers] == [0, -signal.SIGABRT]
    assert not set(workers) & set(multiprocessing.active_children())
    assert not children_left(before=before)


_TORCH_ALONE = textwrap.dedent("""
    from test_dataloader_shutdown import slow_exit_then_abort_on_exit, started_iterator
    iterator = started_iterator(slow_exit_then_abort_on_exit)
    try:
        iterator._shutdown_workers()
    except RuntimeError as error:
        print("raised:", error)
""")


def test_without_the_helper_the_same_death_raises():
    """The case above is real: torch's own shutdown raises it. (In a subprocess: the raise
    can land between a join's waitpid and its bookkeeping, leaving a reaped worker that
    multiprocessing counts as alive for as long as the interpreter lives.)"""
    done = subprocess.run([sys.executable, "-c", _TORCH_ALONE], capture_output=True,
                          text=True, timeout=100, cwd=Path(__file__).parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^raised: DataLoader worker \(pid \d+\) is killed by signal: Aborted",
                     done.stdout, re.MULTILINE), done.stdout


def test_other_errors_from_the_shutdown_still_raise():
    class Failing:
        def _shutdown_workers(self):
            raise RuntimeError("the pin-memory thread hung")

    with pytest.raises(RuntimeError, match="pin-memory thread hung"):
        shut_down_dataloader_workers(Failing())


def test_none_and_an_iterator_without_workers_are_no_ops():
    shut_down_dataloader_workers(None)
    shut_down_dataloader_workers(iter(torch_data.DataLoader(Numbers(), batch_size=10)))


def test_a_worker_that_ignores_its_stop_is_killed(monkeypatch):
    monkeypatch.setattr(torch_utils, "MP_STATUS_CHECK_INTERVAL", 0.5)  # torch's join timeout
    monkeypatch.setattr(peers, "WORKER_REAP_TIMEOUT_S", 0.5)
    before = frozenset(worker_children())
    iterator = started_iterator(ignore_sigterm_and_hang_on_exit)
    workers = list(iterator._workers)
    shut_down_dataloader_workers(iterator)
    assert [w.exitcode for w in workers] == [-signal.SIGKILL] * 2
    assert not children_left(before=before)
