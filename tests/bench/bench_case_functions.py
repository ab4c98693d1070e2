"""Case functions for the runner tests, importable by the worker through ``python_path``.

Each does real work or really fails: raises, exits, is killed, or hangs past its timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def checksum_file_case(case, trial):
    """Read the case's files and return how many bytes it read (a real, checkable number)."""
    with trial.measure():
        total = 0
        for path in case.cache_files:
            total += int(np.fromfile(path, dtype=np.uint8).size)
    return {"samples": (total, "count")}


def _allocate(megabytes: int) -> None:
    block = np.ones(megabytes << 20, dtype=np.uint8)
    assert int(block[::4096].sum()) == block[::4096].size


def allocating_child_case(case, trial):
    """Inside the timed region, a spawned child touches ``megabytes`` MiB and exits."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with trial.measure():
        child = context.Process(target=_allocate, args=(int(case.param("megabytes")),))
        child.start()
        child.join()
    return {"samples": (float(child.exitcode == 0), "count")}


def raising_case(case, trial):
    raise ValueError(f"boom in repeat {trial.repeat}")


def exiting_case(case, trial):
    sys.stdout.flush()
    os._exit(3)


def self_killing_case(case, trial):
    os.kill(os.getpid(), signal.SIGKILL)


def temp_leaving_case(case, trial):
    """Leave what libraries put in the temporary directory and remove only at a clean exit
    (a directory of its own, a forkserver's ``pymp-*`` socket directory) and the semaphores
    a forkserver pool's queues make in /dev/shm (its resource tracker would unlink them),
    record them in param ``where_file``, then die by SIGKILL."""
    import multiprocessing
    import tempfile

    mine = tempfile.mkdtemp(prefix="left-by-case-")
    Path(mine, "data").write_bytes(b"x" * 4096)
    before = set(os.listdir("/dev/shm"))
    context = multiprocessing.get_context("forkserver")
    with context.Pool(1) as pool:
        assert pool.apply(os.getpid) != os.getpid()
        from multiprocessing import util

        semaphores = sorted(set(os.listdir("/dev/shm")) - before)
        Path(case.param("where_file")).write_text(
            "\n".join([mine, util.get_temp_dir(), *semaphores]))
        os.kill(os.getpid(), signal.SIGKILL)


def residency_case(case, trial):
    """Append ``<repeat> <resident fraction of the case's files>`` to the file param
    ``seen_file`` names, the warm-up's (repeat -1, which has no rows) included."""
    from storebench.bench.cache import resident_fraction

    with open(case.param("seen_file"), "a") as seen:
        seen.write(f"{trial.repeat} {resident_fraction(case.cache_files)}\n")
    with trial.measure():
        pass
    return {"samples": (1, "count")}


def wrong_unit_case(case, trial):
    return {"samples_per_s": (1.0, "MB/s")}


def hanging_case(case, trial):
    """Start a grandchild (as a loader would start workers), record its pid, then hang."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(case.param("pid_file")).write_text(f"{os.getpid()} {child.pid}")
    time.sleep(600)


def _held_prefetch_pass(case):
    """Start a ProcessPrefetcher (shared-memory slots, worker processes) over the case's
    dataset, take one batch and record its segment and worker pids in param ``pid_file``;
    returns the prefetcher and its pass. Hold the pass: an iterator dropped at once would stop
    its workers and unlink the segment itself, leaving the runner nothing to clean up."""
    from storebench.formats import open_dataset
    from storebench.loaders import BatchSampler, LazyDataset, ProcessPrefetcher, ShuffleSampler

    reader = open_dataset(case.dataset, verify=False)
    dataset = LazyDataset(reader)
    prefetcher = ProcessPrefetcher(dataset, BatchSampler(ShuffleSampler(len(dataset)), 16),
                                   workers=2, start_method=case.param("start_method"))
    batches = iter(prefetcher)
    next(batches)
    Path(case.param("pid_file")).write_text(
        " ".join([prefetcher.shm_name, *map(str, prefetcher.pids)]))
    return prefetcher, batches


def hanging_prefetch_case(case, trial):
    """Hold a prefetch pass (``_held_prefetch_pass``), then hang until the runner kills the
    group."""
    held = _held_prefetch_pass(case)  # noqa: F841 - held until the kill
    time.sleep(600)


def leaving_prefetch_case(case, trial):
    """Hold a prefetch pass (``_held_prefetch_pass``) and return with it still held, an exit
    handler registered (it writes param ``atexit_file``) and an object in this module that
    writes param ``finalized_file`` when the interpreter's teardown finalises it."""
    import atexit

    prefetcher, batches = _held_prefetch_pass(case)
    atexit.register(Path(case.param("atexit_file")).write_text, "exit handlers ran")
    _held.extend([prefetcher, batches, _WritesWhenFinalized(case.param("finalized_file"))])
    return {"samples": (16, "count")}


class _WritesWhenFinalized:
    def __init__(self, path: str) -> None:
        self.path = path

    def __del__(self) -> None:
        Path(self.path).write_text("finalized")


_held: list = []


def summarised_checksum_case(case, trial):
    """Like ``checksum_file_case``, with a per-repeat figure for ``total_of_repeats``."""
    return checksum_file_case(case, trial)


def total_of_repeats(case, records):
    return {"samples_total": (sum(r["value"] for r in records if r["metric"] == "samples"),
                              "count")}


def scripted_rate_case(case, trial):
    """Reports the ``rates`` param's value for this repeat (comma-separated) as its
    samples_per_s, after real work: what adaptive repeats judge, made predictable. Param
    ``sleep_s``: each repeat also takes at least that long (what a repeat budget counts)."""
    import time

    rates = [float(x) for x in case.param("rates").split(",")]
    time.sleep(float(case.param("sleep_s", 0.0)))
    with trial.measure():
        np.ones(1 << 16).sum()
    return {"samples_per_s": (rates[max(trial.repeat, 0) % len(rates)], "samples/s")}


def environment_value_case(case, trial):
    """The value of the environment variable the case's param ``variable`` names: what a
    study's services told the case."""
    return {"samples": (int(os.environ[case.param("variable")]), "count")}


def interpreter_case(case, trial):
    """Which interpreter runs the case: 1 when it is the one the param ``python`` names."""
    import sys

    return {"samples": (int(sys.executable == case.param("python")), "count")}


class LoggedService:
    """A stand-in for a service a case talks to (a proxy): logs when it starts and stops."""

    def __init__(self, log: Path, name: str) -> None:
        self.log, self.name = log, name

    def __enter__(self):
        with open(self.log, "a") as f:
            f.write(f"start {self.name}\n")
        return self

    def __exit__(self, *exc):
        with open(self.log, "a") as f:
            f.write(f"stop {self.name}\n")


def kept_service_case(case, trial):
    """Each trial uses a service kept for the case (one per ``link`` param value), and logs
    which object it got."""
    log = Path(case.param("log"))
    link = "warm-up" if trial.warmup else case.param("link")
    with trial.kept(("service", link), lambda: LoggedService(log, link)) as service, \
            open(log, "a") as f:
        f.write(f"trial {trial.repeat} {service.name}|{id(service)}\n")
    return {"samples": (1, "count")}
