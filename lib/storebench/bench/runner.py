"""Cases and the runner: every case in a fresh subprocess, its rows appended as it finishes.

A study is a list of frozen ``Case`` objects. Each names its case function by an importable
path (``"storebench.studies.formats.cases:sequential_read_case"``), so that a fresh interpreter
(``python -m storebench.bench.worker``) can run it with nothing inherited from the parent:
no imported TensorFlow, no warm allocator, no open handles. The worker puts the dataset
into the case's cache state before every repeat and measures its residency, runs an untimed
warm-up where the case asks for one, then the timed repeats (see ``worker.py``).

A case function has the signature ``fn(case: Case, trial: Trial) -> {metric: (value, unit)}``
and wraps the part to be timed in ``with trial.measure():``; wall time, CPU time and peak
PSS/USS of that region are added to its metrics.

A case may also name a ``summarise`` function, ``fn(case, records) -> {metric: (value,
unit)}``, run in the worker after the last repeat: its metrics become whole-case rows
(``repeat`` -1), e.g. a target's median ratio, threshold and whether it was met.

Failures do not stop a run: a case that raises, crashes, or outlives its timeout becomes one
row with ``status`` ``failed`` or ``timeout`` and the error text. Ctrl-C kills the running
case's whole process group, keeps every finished case on disk and re-raises; running the
same study again skips the cases already in the results file. A killed case cannot clean up
after itself, so the runner removes the ``/dev/shm`` segments its processes still had open
(shared-memory prefetch slots) as it kills them.

A SIGKILLed runner leaves nothing either: its case worker dies with it (a parent-death
signal, see ``processes.die_with_parent``), and a watcher process started beside each case
kills what the case started and removes the case's temporary directory once the runner is
gone (``storebench.bench.watcher``). Case directories are named ``storebench-case-<runner pid>-*``;
a runner removes those whose runner is dead before each case, in case a watcher was killed
too.

A case's temporary files live in its case directory: the worker's ``TMPDIR`` is
``<case dir>/tmp``, so what a case's libraries write there and remove only at a clean exit
(multiprocessing's ``pymp-*`` socket directories, TensorFlow autograph's generated modules,
MDS's lock files, LitData's cache) goes with the case directory however the case ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ..processes import SHM_DIR, pid_alive, remove_orphaned_shm_segments, wait_for_exit
from .case import Case, CaseOutcome
from .memory_budget import (
    NAME_PREFIX,
    BudgetError,
    BudgetUnavailable,
    MemoryBudget,
    budget_available,
    oom_killed_budgets,
    remove_stale_budgets,
)
from .metrics import CASE_CGROUP_ENV
from .plan import DEFAULT_TIMEOUT_S
from .schema import (
    CASE_REPEAT,
    ResultsWriter,
    SchemaError,
    finished_case_ids,
    recorded_epoch_samples,
)
from .watcher import CASE_DIR_ENV, WATCH_DONE

_ERROR_TAIL_CHARS = 4000
CASE_DIR_PREFIX = "storebench-case-"
CASE_TMP_NAME = "tmp"
# A Unix socket's path holds at most 107 bytes, and multiprocessing puts its forkserver's
# at $TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX (32 more): a case gets its own TMPDIR only
# where that fits (a temporary directory deep enough to leave no room keeps the runner's).
_CASE_TMP_MAX_CHARS = 107 - len("/pymp-12345678/listener-12345678")


@dataclass
class StudyRun:
    """Summary of one ``run_study`` call."""

    results_path: Path
    run_id: str
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0


def new_run_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:6]


def case_rows(case: Case, outcome: CaseOutcome, *, run_id: str, profile: str) -> list[dict]:
    """The outcome as result rows: the worker's records, then one whole-case row."""
    common = {
        "run_id": run_id,
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "profile": profile,
        "study": case.study,
        "case_id": case.case_id,
        "format": case.format,
        "encoding": case.encoding,
        "loader": case.loader,
        "prefetcher": case.prefetcher,
        "workers": case.workers,
        "batch_size": case.batch_size,
        "access": case.access,
        "cache": case.cache,
        "params": json.dumps(dict(case.params), sort_keys=True),
    }
    rows = [
        {**common, **record, "status": "ok", "error": ""} for record in outcome.records
    ]
    rows.append({
        **common,
        "repeat": CASE_REPEAT,
        "metric": "case_seconds",
        "value": outcome.seconds,
        "unit": "s",
        "status": outcome.status,
        "error": outcome.error,
    })
    return rows


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-_ERROR_TAIL_CHARS:]


def group_pids(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (from ``/proc/<pid>/stat``)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def _shm_held_by(pids: Sequence[int]) -> Iterator[tuple[str, int]]:
    """(path, inode) of every ``/dev/shm`` file that ``pids`` have mapped or open; a path
    unlinked since reads ``<path> (deleted)``."""
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith(f"{SHM_DIR}/"):
                    yield parts[5], int(parts[4])
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith(f"{SHM_DIR}/"):
                        yield target, os.stat(fd.path).st_ino


def shm_segments_of(pids: Sequence[int]) -> set[Path]:
    """The ``/dev/shm`` files that ``pids`` have mapped or open (unlinked ones excluded)."""
    return {Path(path) for path, _ in _shm_held_by(pids) if not path.endswith(" (deleted)")}


# The named objects multiprocessing makes under spawn and forkserver: semaphores (its locks and
# queues) and ``SharedMemory`` segments. The creator's resource tracker unlinks them, and a
# tracker killed with the case's group leaves them in /dev/shm until reboot.
_MULTIPROCESSING_SHM_PREFIXES = ("sem.mp-", "psm_")
_GROUP_EXIT_WAIT_S = 2.0


def remove_unheld_multiprocessing_shm(pgid: int, shm_before: set[str]) -> list[str]:
    """Once the case's group ``pgid`` is killed: unlink the multiprocessing semaphores and
    segments that appeared during the case (not in ``shm_before``) and that no live process
    holds (the case's processes are gone; another program's, made meanwhile, are still
    mapped by their creator). Returns the names removed."""
    new = sorted(name for name in _shm_names() - shm_before
                 if name.startswith(_MULTIPROCESSING_SHM_PREFIXES))
    if not new:
        return []
    deadline = time.monotonic() + _GROUP_EXIT_WAIT_S
    while group_pids(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)  # SIGKILLed processes hold their mappings until they have exited
    live = [int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()]
    held = held_shm_inodes(live)
    removed = []
    for name in new:
        with contextlib.suppress(FileNotFoundError):
            if os.stat(SHM_DIR / name).st_ino in held:
                continue
            (SHM_DIR / name).unlink()
            removed.append(name)
    return removed


def held_shm_inodes(pids: Sequence[int]) -> set[int]:
    """The inodes of every ``/dev/shm`` file that ``pids`` have mapped or open. By inode, not
    name: glibc's ``sem_open`` maps a temporary file and then links it under the semaphore's
    name, so a live process's semaphore shows in its maps under the temporary, deleted name."""
    return {inode for _, inode in _shm_held_by(pids)}


def _shm_names() -> set[str]:
    try:
        return set(os.listdir(SHM_DIR))
    except OSError:
        return set()


def _kill_group(pgid: int, *, shm_before: set[str] | None = None) -> list[str]:
    """SIGKILL the group; first (with the group stopped, so that nothing new appears)
    collect the ``/dev/shm`` segments its processes hold that did not exist before the case
    (``shm_before``), and unlink them after. Returns the names removed."""
    pids = group_pids(pgid)
    if not pids:
        return []
    segments: set[Path] = set()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGSTOP)
        if shm_before is not None:
            segments = {p for p in shm_segments_of(group_pids(pgid)) if p.name not in shm_before}
        os.killpg(pgid, signal.SIGKILL)
    removed = []
    for path in sorted(segments):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path.name)
    return removed


def _oom_text(killed: Sequence[tuple[str, int | None]]) -> str:
    if not killed:
        return ""
    where = ", ".join(f"{name} (limit {limit:,} bytes)" if limit is not None else name
                      for name, limit in killed)
    return (f": the kernel's OOM killer killed a process of its memory budget {where}, "
            "for the memory it could not reclaim outgrowing the limit")


def _removed_text(removed: Sequence[str]) -> str:
    if not removed:
        return ""
    return f"\nremoved {len(removed)} shared-memory segment(s) it left: {', '.join(removed)}"


def remove_stale_temp_dirs(prefix: str, directory: Path | str | None = None) -> list[Path]:
    """Remove the ``<prefix><pid>-*`` directories in ``directory`` (default: the system's
    temporary directory) whose owner ``pid`` is no longer running: what a SIGKILLed owner
    left. Returns the paths removed."""
    directory = Path(directory or tempfile.gettempdir())
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        pid, sep, _ = entry.name[len(prefix):].partition("-")
        if not (sep and pid.isdigit()) or pid_alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
                removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def _case_watcher(case_dir: Path, env: dict):
    """Start ``storebench.bench.watcher`` for ``case_dir`` in its own session; yield a function
    that tells it the case worker's pid. On leaving, tell it the runner cleaned up itself.

    The runner holds the only write end of the watcher's stdin, so the watcher sees end of
    file without ``done`` exactly when the runner dies without unwinding (SIGKILL, a crash).
    """
    read_end, write_end = os.pipe()  # not inherited by the case worker (PEP 446)
    try:
        watcher = subprocess.Popen(
            [sys.executable, "-m", "storebench.bench.watcher", str(case_dir)],
            stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    pipe = os.fdopen(write_end, "wb", buffering=0)

    def tell(pid: int) -> None:
        with contextlib.suppress(OSError):  # a dead watcher must not fail the case
            pipe.write(b"%d\n" % pid)

    try:
        yield tell
    finally:
        with contextlib.suppress(OSError):
            pipe.write(WATCH_DONE + b"\n")
        with contextlib.suppress(OSError):
            pipe.close()
        try:
            wait_for_exit(watcher, 10)
        except subprocess.TimeoutExpired:
            watcher.kill()
            watcher.wait()


CASE_CGROUP_SUFFIX = "case"


@contextlib.contextmanager
def _case_memory_cgroup(pid: int) -> Iterator[MemoryBudget | None]:
    """Move the just-started case worker ``pid`` into a memory cgroup of its own, without a
    limit, for the case's life: its kernel peak is the case's process tree's
    (``metrics.KernelPeak``). None where no cgroup can be made (the case then sums
    high-water RSS). The worker starts it at once: what it charged before the move (the
    first instants of the interpreter) stays with the runner's cgroup."""
    try:
        # Without emptying: the page cache the case read stays cached for the next case.
        budget = MemoryBudget(None, name=CASE_CGROUP_SUFFIX, pid=pid,
                              empty_on_exit=False).__enter__()
    except (BudgetUnavailable, BudgetError, OSError):
        yield None
        return
    try:
        yield budget
    finally:
        budget.__exit__(None, None, None)


def _case_cgroup_env() -> dict[str, str]:
    """The worker's name for its case cgroup (``metrics.case_cgroup``), where one can be
    made."""
    if budget_available() is not None:
        return {}
    return {CASE_CGROUP_ENV: f"{NAME_PREFIX}{os.getpid()}-{CASE_CGROUP_SUFFIX}"}


def run_case(
    case: Case,
    *,
    drop_caches: bool = False,
    timeout_s: float | None = None,
    python_path: Sequence[Path | str] = (),
    env: Mapping[str, str] | None = None,
) -> CaseOutcome:
    """Run one case in a fresh ``python -m storebench.bench.worker`` process group, with
    ``env`` added to this process's environment (what the study's services say, e.g. the
    object store's endpoint).

    The interpreter is this one, or the one of the case's ``environment`` param (``peers``:
    ``storebench.environments``); where that environment is not installed the case is
    ``skipped`` with the reason.

    The group is killed when the case ends (so no worker process of the case outlives it),
    when it times out, and on KeyboardInterrupt (which is re-raised).
    """
    from ..environments import EnvironmentUnavailableError, python_for
    from .stats import forced_repeat_rule

    forced_repeat_rule()  # a bad STOREBENCH_REPEAT_RULE is one clear error, not a failed case
    timeout_s = case.timeout_s or timeout_s or DEFAULT_TIMEOUT_S
    try:
        python = python_for(case.param("environment", ""))
    except EnvironmentUnavailableError as err:
        return CaseOutcome("skipped", 0.0, error=str(err))
    remove_stale_temp_dirs(CASE_DIR_PREFIX)
    remove_orphaned_shm_segments()
    with tempfile.TemporaryDirectory(prefix=f"{CASE_DIR_PREFIX}{os.getpid()}-") as tmp:
        tmp = Path(tmp)
        job = tmp / "job.json"
        result = tmp / "result.json"
        phase = tmp / "phase.txt"
        log = tmp / "worker.log"
        case_tmp = tmp / CASE_TMP_NAME
        case_tmp.mkdir()
        job.write_text(json.dumps({
            "case": case.to_dict(),
            "drop_caches": drop_caches,
            "result_path": str(result),
            "phase_path": str(phase),
            "runner_pid": os.getpid(),
            "spawned_at": time.time(),
        }))
        env = _worker_env(env, python_path)
        own_tmp = {"TMPDIR": str(case_tmp)} if len(str(case_tmp)) <= _CASE_TMP_MAX_CHARS else {}
        shm_before = _shm_names()
        started = time.perf_counter()
        with _case_watcher(tmp, env) as watch, open(log, "wb") as log_file, \
                contextlib.ExitStack() as case_memory:
            process = subprocess.Popen(
                [str(python), "-m", "storebench.bench.worker", str(job)],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                env={**env, **own_tmp, **_case_cgroup_env(), CASE_DIR_ENV: str(tmp)},
                start_new_session=True,
            )
            watch(process.pid)
            cgroup = case_memory.enter_context(_case_memory_cgroup(process.pid))
            try:
                returncode = wait_for_exit(process, timeout_s)
            except subprocess.TimeoutExpired:
                removed = _kill_group(process.pid, shm_before=shm_before)
                process.wait()
                where = phase.read_text() if phase.exists() else "start-up"
                return CaseOutcome(
                    "timeout", time.perf_counter() - started,
                    error=(f"timed out after {timeout_s:g} s during {where}"
                           f"{_removed_text(removed)}\n{_tail(log)}").strip(),
                )
            except BaseException:
                _kill_group(process.pid, shm_before=shm_before)
                process.wait()
                raise
            finally:
                # Whatever the case started (loader workers, pools) dies with it, and so do
                # the shared-memory segments they held, those its exited worker created and
                # no process of the group holds any more (a worker skips the end of its
                # teardown, and its resource tracker may be killed before it unlinks them),
                # and for the same reason multiprocessing's semaphores that nothing holds.
                _kill_group(process.pid, shm_before=shm_before)
                remove_orphaned_shm_segments()
                remove_unheld_multiprocessing_shm(process.pid, shm_before)
                # A killed case cannot remove its memory-budget cgroup itself; whether the OOM
                # killer was what killed it is read first.
                killed = (process.returncode or 0) < 0
                oom_killed = oom_killed_budgets(process.pid) if killed else []
                if killed and cgroup is not None:  # a case's budgets nest in its cgroup (v1)
                    oom_killed += oom_killed_budgets(process.pid, cgroup_root=cgroup.path)
                remove_stale_budgets()
        return _outcome(time.perf_counter() - started, result=result, phase=phase, log=log,
                        returncode=returncode, oom_killed=oom_killed)

def _worker_env(env: Mapping[str, str] | None,
                python_path: Sequence[Path | str]) -> dict[str, str]:
    """This process's environment plus ``env``, with ``python_path`` first on PYTHONPATH."""
    merged = {**os.environ, **(env or {})}
    extra = [str(Path(p).resolve()) for p in python_path]
    if extra:
        merged["PYTHONPATH"] = os.pathsep.join([*extra, merged.get("PYTHONPATH", "")]).rstrip(
            os.pathsep)
    return merged


def _outcome(seconds: float, *, result: Path, phase: Path, log: Path, returncode: int,
             oom_killed) -> CaseOutcome:
    """The outcome of a worker that exited: what it reported, or how it died and where."""
    if result.exists():
        report = json.loads(result.read_text())
        if report["status"] == "ok":
            return CaseOutcome("ok", seconds, tuple(report["records"]))
        if report["status"] == "skipped":
            return CaseOutcome("skipped", seconds, error=report["error"])
        return CaseOutcome("failed", seconds, error=report["error"])
    where = phase.read_text() if phase.exists() else "start-up"
    if returncode < 0:
        how = f"was killed by {signal.Signals(-returncode).name}"
    else:
        how = f"exited with code {returncode}"
    return CaseOutcome(
        "failed", seconds,
        error=(f"worker {how} during {where} without reporting{_oom_text(oom_killed)}"
               f"\n{_tail(log)}").strip(),
    )


def byte_compile_package() -> list[Path]:
    """Write the bytecode of storebench and data_gen where it is missing or stale; returns
    the package directories it could write into.

    Every case is a fresh interpreter that imports both. Where ``PYTHONDONTWRITEBYTECODE``
    is set (or the first import raced another), each one would compile their sources again;
    an interpreter still reads bytecode that exists. A read-only install is left as it is."""
    import compileall

    import data_gen

    written = []
    for package in (Path(__file__).resolve().parents[1], Path(data_gen.__file__).parent):
        if os.access(package, os.W_OK) and compileall.compile_dir(
                package, quiet=2, workers=1):
            written.append(package)
    return written


def run_cases(
    cases: Sequence[Case],
    results_path: Path | str,
    *,
    profile: str = "",
    run_id: str | None = None,
    resume: bool = True,
    drop_caches: bool = False,
    timeout_s: float | None = None,
    python_path: Sequence[Path | str] = (),
    progress: bool = True,
    on_case_done: Callable[[Case, CaseOutcome], None] | None = None,
    eta: Callable[[], str] | None = None,
    services: Callable | None = None,
) -> StudyRun:
    """Run every case not already in ``results_path`` and append its rows there.

    ``resume=False`` refuses to append to an existing file instead of skipping its cases.
    ``on_case_done(case, outcome)`` is called after each case's rows are written; ``eta()``
    (the whole run's remaining time, as text) is shown beside the progress bar.
    ``services(cases)``, when given and some case is left to run, is a context manager
    entered around them (an S3 server, say) whose mapping is added to every case's
    environment.
    """
    ids = [case.case_id for case in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"case ids must be unique within a study; repeated: {duplicates}")
    results_path = Path(results_path)
    if not resume and results_path.exists() and results_path.stat().st_size:
        raise FileExistsError(f"{results_path}: exists; remove it or resume")
    _require_same_epochs(results_path, cases)
    from tqdm.auto import tqdm

    summary = StudyRun(results_path, run_id or new_run_id())
    remove_stale_budgets()  # left by a case killed in an earlier, killed run
    started = time.perf_counter()
    with ResultsWriter(results_path) as writer:
        done = finished_case_ids(results_path)
        todo = [case for case in cases if case.case_id not in done]
        summary.skipped = [case.case_id for case in cases if case.case_id in done]
        if todo:
            byte_compile_package()
        study = cases[0].study if cases else results_path.stem
        bar = tqdm(total=len(cases), initial=len(summary.skipped), desc=study, unit="case",
                   disable=not progress, dynamic_ncols=True)
        try:
            with contextlib.ExitStack() as stack:
                case_env = stack.enter_context(services(todo)) if services and todo else {}
                for case in todo:
                    _run_one(case, writer, summary, bar, profile=profile,
                             drop_caches=drop_caches, timeout_s=timeout_s,
                             python_path=python_path, on_case_done=on_case_done, eta=eta,
                             env=case_env)
        finally:
            bar.close()
            summary.seconds = time.perf_counter() - started
    return summary


def _require_same_epochs(results_path: Path, cases: Sequence[Case]) -> None:
    """A resumed run keeps earlier rows only where they were read under the same epoch size:
    rows of whole epochs beside capped ones (or another cap) would compare unlike things."""
    recorded = recorded_epoch_samples(results_path)
    for case in cases:
        if case.case_id in recorded and recorded[case.case_id] != case.epoch_samples:
            def size(cap):
                return "whole epochs" if cap is None else f"epochs of {cap} samples"

            raise ValueError(
                f"{results_path}: case {case.case_id} was measured with "
                f"{size(recorded[case.case_id])}, this plan reads {size(case.epoch_samples)}; "
                "rerun with --fresh or write to another --results directory")


def _run_one(case: Case, writer, summary: StudyRun, bar, *, profile, drop_caches, timeout_s,
             python_path, on_case_done, eta, env) -> None:
    left = f"{eta()}; " if eta is not None else ""
    bar.set_postfix_str(f"{left}{case.case_id}", refresh=True)
    outcome = run_case(case, drop_caches=drop_caches, timeout_s=timeout_s,
                       python_path=python_path, env=env)
    rows = case_rows(case, outcome, run_id=summary.run_id, profile=profile)
    try:
        writer.write_rows(rows)
    except SchemaError as err:
        # The case itself broke the schema: keep that as its failure.
        outcome = CaseOutcome("failed", outcome.seconds, error=f"results rejected: {err}")
        writer.write_rows(case_rows(case, outcome, run_id=summary.run_id, profile=profile))
    summary.ran.append(case.case_id)
    if outcome.status not in ("ok", "skipped"):
        summary.failed.append(case.case_id)
    if outcome.status != "ok":
        first_line = outcome.error.splitlines()[0] if outcome.error else ""
        bar.write(f"{case.case_id}: {outcome.status}: {first_line}")
    if on_case_done is not None:
        on_case_done(case, outcome)
    bar.update(1)
