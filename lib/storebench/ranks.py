"""Data-parallel ranks on this machine: N processes joined by ``torch.distributed`` (gloo).

``run_ranks(function, world_size)`` starts one process per rank, joins them into one gloo
process group, runs ``function(rank, world_size, *args)`` in each and returns the ranks'
results to the caller, in rank order::

    def read_share(rank, world_size, root):          # at module level: see below
        sampler = ShuffleSampler(n, rank=rank, world_size=world_size)
        ...
        return {"samples": count, "seconds": elapsed}

    per_rank = run_ranks(read_share, 2, args=(root,), timeout_s=120)

Inside ``function`` the default process group is initialised, so samplers, prefetchers and
``torch.utils.data.DistributedSampler`` see ``dist.get_rank()`` / ``get_world_size()``, and
collectives work (``dist.barrier()`` to start a timed section together,
``gather_across_ranks(value)`` for every rank's value on every rank).

- **The function must be importable**: a module-level function of an importable module
  (not a lambda, a nested function, or a function defined in a notebook or the REPL),
  because spawned ranks import it by name. ``args`` and the results must pickle. A script
  that calls ``run_ranks`` needs the ``if __name__ == "__main__":`` guard, as any spawn user.
- **Rendezvous**: a ``file://`` store in a private temporary directory (no port to pick, so
  none to race for); gloo's own connections use the loopback interface
  (``GLOO_SOCKET_IFNAME``, unless already set), since every rank is on this machine.
- **Failures**: a rank that raises makes ``run_ranks`` raise ``RankFailedError`` naming the
  rank, with its traceback text (and the original exception as ``__cause__`` when it
  pickles); a rank that dies without reporting raises ``RankDiedError``; not finishing within
  ``timeout_s`` raises ``RankTimeoutError``. In each case, and when the caller is
  interrupted (Ctrl-C), every rank still running is stopped: SIGTERM (which a rank turns into
  ``SystemExit``, so its ``with`` blocks close prefetchers and shared memory), then SIGKILL
  after ``grace_s`` for the rank and any process it started. The temporary directory is
  removed. Ranks also die with the caller: they ask the kernel for SIGKILL when it ends.
- ``start_method`` is ``"spawn"`` (the default: a fresh interpreter per rank, safe after
  torch or TensorFlow has started threads in the caller) or ``"fork"`` (faster to start,
  safe only in a caller that has started no threads). ``"forkserver"`` is refused: its ranks
  would be children of the fork server, not of the caller, and could not die with it.

Importing this module does not import torch; the ranks do.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import connection
from pathlib import Path

from .processes import die_with_parent

__all__ = [
    "RankDiedError",
    "RankError",
    "RankFailedError",
    "RankTimeoutError",
    "gather_across_ranks",
    "run_ranks",
]

START_METHODS = ("spawn", "fork")
# What a rank sends: that it runs our code, then its result or its failure.
_RUNNING, _OK, _FAILED = "running", "ok", "failed"


class RankError(RuntimeError):
    """A data-parallel run did not complete; every rank has been stopped."""


class RankFailedError(RankError):
    """A rank raised: ``rank`` says which, ``rank_traceback`` holds its traceback text."""

    def __init__(self, message: str, *, rank: int, rank_traceback: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.rank_traceback = rank_traceback


class RankDiedError(RankError):
    """A rank process ended without reporting a result (killed, crashed, or unable to
    start); ``exitcode`` is the process's (negative: the signal that ended it)."""

    def __init__(self, message: str, *, rank: int, exitcode: int | None) -> None:
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode


class RankTimeoutError(RankError, TimeoutError):
    """Ranks were still running after ``timeout_s``; ``pending`` lists them."""

    def __init__(self, message: str, *, pending: list[int]) -> None:
        super().__init__(message)
        self.pending = pending


def gather_across_ranks(value) -> list:
    """In a rank: every rank's ``value`` (any picklable object), in rank order, on every
    rank. A collective (``torch.distributed.all_gather_object``): all ranks must call it."""
    import torch.distributed as dist

    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


@dataclass
class _Rank:
    """The caller's handle on one rank: its process and the pipe it reports on."""

    rank: int
    process: object  # multiprocessing.Process
    conn: object  # the read end of the rank's pipe
    running: bool = False  # it got past start-up, into _rank_main
    reported: bool = False
    result: object = None


def run_ranks(
    function: Callable,
    world_size: int,
    *,
    args: Sequence = (),
    timeout_s: float = 300.0,
    start_method: str = "spawn",
    grace_s: float = 2.0,
) -> list:
    """Run ``function(rank, world_size, *args)`` in ``world_size`` processes joined into one
    gloo process group; return their results, rank 0's first.

    ``timeout_s`` bounds the whole run, start-up included (and gloo's collectives, which
    then fail in the ranks rather than wait forever). ``grace_s`` is how long a rank being
    stopped gets between SIGTERM and SIGKILL. Raises ``RankFailedError``,
    ``RankDiedError`` or ``RankTimeoutError`` (all ``RankError``) after stopping every rank.
    """
    import multiprocessing

    if not callable(function):
        raise TypeError(f"function must be callable, got {function!r}")
    world_size = _positive_int(world_size, "world_size")
    if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if start_method not in START_METHODS:
        raise ValueError(
            f"start_method must be one of {START_METHODS}, got {start_method!r} (forkserver "
            "ranks are the fork server's children, so they cannot be tied to this process)"
        )
    args = tuple(args)
    if start_method == "spawn":
        _check_importable(function, args)
    context = multiprocessing.get_context(start_method)
    deadline = time.monotonic() + timeout_s
    ranks: list[_Rank] = []
    with tempfile.TemporaryDirectory(prefix="storebench-ranks-") as rendezvous:
        store = Path(rendezvous) / "store"
        try:
            for rank in range(world_size):
                reader, writer = context.Pipe(duplex=False)
                process = context.Process(
                    target=_rank_main,
                    args=(
                        function,
                        rank,
                        world_size,
                        args,
                        str(store),
                        timeout_s,
                        writer,
                        os.getpid(),
                    ),
                    name=f"storebench-rank-{rank}",
                )
                process.start()
                writer.close()  # the rank holds the only write end: EOF means it is gone
                ranks.append(_Rank(rank, process, reader))
            _collect(ranks, deadline, timeout_s, start_method)
            _join_finished(ranks, deadline, grace_s)
            return [r.result for r in ranks]
        finally:
            _stop(ranks, grace_s)


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _check_importable(function: Callable, args: tuple) -> None:
    """Refuse, before starting anything, what a spawned rank could not load."""
    module = getattr(function, "__module__", None)
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if module == "__main__" and main_file is None:
        raise ValueError(
            f"{function.__qualname__} is defined in a notebook or the REPL, which spawned "
            "ranks cannot import: define it in a module (a .py file) and import it"
        )
    try:
        pickle.dumps((function, args))
    except Exception as exc:
        raise TypeError(
            f"run_ranks sends the function and args to each rank by pickling, and that "
            f"failed ({exc}): use a module-level function (not a lambda or a nested "
            "function) and picklable args"
        ) from exc


def _collect(ranks: list[_Rank], deadline: float, timeout_s: float, start_method: str) -> None:
    """Wait for every rank's report; raise at the first failure, death or the deadline."""
    while True:
        pending = [r for r in ranks if not r.reported]
        if not pending:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RankTimeoutError(
                f"rank(s) {[r.rank for r in pending]} of {len(ranks)} still running after "
                f"{timeout_s:g} s; every rank was stopped",
                pending=[r.rank for r in pending],
            )
        watched = {r.conn: r for r in pending} | {r.process.sentinel: r for r in pending}
        ready = {
            watched[obj].rank: watched[obj]
            for obj in connection.wait(list(watched), timeout=remaining)
        }
        failures = [_receive(rank, start_method) for rank in ready.values()]
        failures = [f for f in failures if f is not None]
        if failures:
            # One rank's failure makes others fail (gloo: a peer closed the connection).
            # Blame a rank that died without a word (a crash, a kill: the others can only
            # have followed), else the rank that raised first.
            first = min(failures, key=lambda f: (not isinstance(f[1], RankDiedError), f[0]))
            raise first[1] from first[2]


def _receive(rank: _Rank, start_method: str) -> tuple[float, RankError, object] | None:
    """Take the rank's report; a failure (or no report at all: the rank died) comes back as
    ``(when, error, cause)``, the time being when the rank failed."""
    try:
        # A rank that exited may still have left its report in the pipe.
        message = rank.conn.recv() if rank.conn.poll() else None
    except EOFError:
        message = None
    if message is None:
        rank.process.join(1.0)
        return math.inf, _died(rank, start_method), None
    kind, payload = message
    if kind == _RUNNING:
        rank.running = True
        return None
    if kind == _FAILED:
        failed_at, text, exception_bytes = payload
        error = RankFailedError(
            f"rank {rank.rank} failed; every rank was stopped. Its traceback:\n\n{text.rstrip()}",
            rank=rank.rank,
            rank_traceback=text,
        )
        cause = None
        if exception_bytes is not None:
            with contextlib.suppress(Exception):  # the traceback text says what happened
                cause = pickle.loads(exception_bytes)
        return failed_at, error, cause
    rank.reported, rank.result = True, payload
    return None


def _died(rank: _Rank, start_method: str) -> RankDiedError:
    exitcode = rank.process.exitcode
    if exitcode is None:
        how = "closed its pipe but is still running"
    elif exitcode < 0:
        how = f"was killed by {signal.Signals(-exitcode).name}"
    else:
        how = f"exited with code {exitcode}"
    hint = ""
    if not rank.running and start_method == "spawn":
        hint = (
            ". It died while starting (its traceback is on stderr): a spawned rank re-runs "
            'the main script, which needs the `if __name__ == "__main__":` guard, and '
            "imports the function by name"
        )
    return RankDiedError(
        f"rank {rank.rank} (pid {rank.process.pid}) {how} without reporting a result; every "
        f"rank was stopped{hint}",
        rank=rank.rank,
        exitcode=exitcode,
    )


def _join_finished(ranks: list[_Rank], deadline: float, grace_s: float) -> None:
    """Every rank has reported: let the processes exit, and check that they did cleanly."""
    for rank in ranks:
        rank.process.join(max(deadline - time.monotonic(), grace_s))
        code = rank.process.exitcode
        if code is None:
            raise RankTimeoutError(
                f"rank {rank.rank} reported its result but did not exit; every rank was stopped",
                pending=[rank.rank],
            )
        if code != 0:
            raise RankDiedError(
                f"rank {rank.rank} reported its result, then exited with code {code}",
                rank=rank.rank,
                exitcode=code,
            )


def _stop(ranks: list[_Rank], grace_s: float) -> None:
    """Stop what is still running: SIGTERM, then SIGKILL after ``grace_s``, for each rank
    and each process it started; close the pipes. Runs on every way out of ``run_ranks``."""
    import psutil

    alive = [r.process for r in ranks if r.process.exitcode is None]
    descendants: list[psutil.Process] = []
    for process in alive:
        with contextlib.suppress(psutil.Error):
            descendants += psutil.Process(process.pid).children(recursive=True)
        with contextlib.suppress(OSError):
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in alive:
        process.join(max(deadline - time.monotonic(), 0))
        if process.exitcode is None:
            with contextlib.suppress(OSError):
                process.kill()
            process.join()
    # A rank's helpers (prefetch workers, its resource tracker) end on their own once the
    # rank is gone, the tracker after unlinking what the rank left: give them the grace.
    left = _still_running(descendants, deadline=max(deadline, time.monotonic() + 0.5))
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    _still_running(left, deadline=time.monotonic() + 5)
    for rank in ranks:
        rank.conn.close()
        with contextlib.suppress(ValueError):
            rank.process.close()


def _still_running(processes: list, *, deadline: float) -> list:
    """Wait until ``deadline`` for ``processes`` (psutil) to end; those still running.
    A zombie counts as ended: an orphan waits for init to reap it, which may take a while."""
    import psutil

    def running(process) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    left = [p for p in processes if running(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left = [p for p in left if running(p)]
    return left


# -- in the rank -------------------------------------------------------------------------
def _rank_main(
    function: Callable,
    rank: int,
    world_size: int,
    args: tuple,
    store: str,
    timeout_s: float,
    conn,
    parent_pid: int,
) -> None:
    """A rank's life: tie it to the caller, join the group, run, report, leave the group."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    conn.send((_RUNNING, None))
    joined = False
    try:
        import datetime

        import torch.distributed as dist

        os.environ.setdefault("GLOO_SOCKET_IFNAME", _loopback_interface())
        # What torchrun sets on one node: libraries that read their rank from the
        # environment (MosaicML Streaming, WebDataset, LitData) see the group's.
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0")
        dist.init_process_group(
            "gloo",
            init_method=f"file://{store}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        joined = True
        result = function(rank, world_size, *args)
        dist.destroy_process_group()
        joined = False
        try:
            report = pickle.dumps((_OK, result))
        except Exception as exc:
            raise TypeError(
                f"rank {rank}: {getattr(function, '__qualname__', function)} returned a "
                f"{type(result).__name__} that does not pickle, so it cannot be sent back "
                f"({exc}): return plain data (dicts, lists, numbers, NumPy arrays)"
            ) from exc
        conn.send_bytes(report)
    except SystemExit:
        raise  # stopped by the caller (SIGTERM), which no longer listens
    except BaseException as exc:
        with contextlib.suppress(OSError):
            conn.send((_FAILED, _captured(exc)))
    finally:
        if joined:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        conn.close()


def _captured(exc: BaseException) -> tuple[float, str, bytes | None]:
    """When it failed, the traceback text, and the exception pickled when it survives a
    round trip."""
    failed_at = time.time()  # the wall clock: comparable between the ranks
    text = traceback.format_exc()
    try:
        payload = pickle.dumps(exc)
        pickle.loads(payload)  # some exceptions pickle but cannot be rebuilt
    except Exception:
        payload = None
    return failed_at, text, payload


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _loopback_interface() -> str:
    """The name of the interface holding 127.0.0.1 ("lo" on Linux, "lo0" on macOS)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addresses):
            return name
    return "lo"
