"""Stopping a torch DataLoader's workers, as every DataLoader-based peer path does on close: a
worker that dies on its way out does not fail the close, any other error does, and nothing is
left running."""

from __future__ import annotations

import multiprocessing.util
import os
import time

import pytest
from peer_support import children_left, worker_children

from storebench.loaders.peers import shut_down_dataloader_workers

pytestmark = [pytest.mark.peers, pytest.mark.timeout(120)]
torch_data = pytest.importorskip("torch.utils.data")


class Numbers(torch_data.Dataset):
    def __len__(self) -> int:
        return 1_000

    def __getitem__(self, index: int) -> int:
        return index


def _slow_abort() -> None:
    time.sleep(0.3)  # well inside torch's join, so its SIGCHLD check sees the death
    os.abort()


def abort_on_exit(worker_id: int) -> None:
    """Make the worker die of SIGABRT when it exits, as LitData's spawned workers sometimes
    do ("terminate called without an active exception")."""
    multiprocessing.util.Finalize(None, _slow_abort, exitpriority=100)


def started_iterator(worker_init_fn=None):
    loader = torch_data.DataLoader(Numbers(), batch_size=10, num_workers=2,
                                   multiprocessing_context="fork",
                                   worker_init_fn=worker_init_fn)
    iterator = iter(loader)
    assert next(iterator).tolist() == list(range(10))
    return iterator


def test_a_worker_dying_on_its_way_out_does_not_fail_the_shutdown():
    before = frozenset(worker_children())
    iterator = started_iterator(abort_on_exit)
    assert worker_children() - before
    shut_down_dataloader_workers(iterator)
    assert not children_left(before=before)


def test_without_the_helper_the_same_death_raises():
    """The case above is real: torch's own shutdown raises it (what the helper absorbs)."""
    before = frozenset(worker_children())
    iterator = started_iterator(abort_on_exit)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid \d+\) is killed by signal"):
        iterator._shutdown_workers()
    assert not children_left(before=before)


def test_other_errors_from_the_shutdown_still_raise():
    class Failing:
        def _shutdown_workers(self):
            raise RuntimeError("the pin-memory thread hung")

    with pytest.raises(RuntimeError, match="pin-memory thread hung"):
        shut_down_dataloader_workers(Failing())


def test_none_and_an_iterator_without_workers_are_no_ops():
    shut_down_dataloader_workers(None)
    shut_down_dataloader_workers(iter(torch_data.DataLoader(Numbers(), batch_size=10)))


@pytest.mark.parametrize("message", [
    "DataLoader worker (pid 4242) is killed by signal: Aborted.",
    "DataLoader worker (pid(s) 4242, 4243) exited unexpectedly",
])
def test_each_wording_of_a_worker_death_is_absorbed(message):
    class Dying:
        def _shutdown_workers(self):
            raise RuntimeError(message)

    shut_down_dataloader_workers(Dying())
