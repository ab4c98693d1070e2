"""Memory budgets on the real kernel: the cap holds, nothing is left after a kill, the
fallback is a skipped row with its reason, a preload refuses under a cap, and the
out_of_core case runs on the ci profile.

Budgets are made in child processes so that this test process never moves between cgroups.
Tests that need a writable memory cgroup skip (with the reason) where there is none.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from bench_support import wait_gone

from storebench.bench.cache import evict
from storebench.bench.case import Case
from storebench.bench.memory_budget import (
    ENV_CGROUP_ROOT,
    BudgetUnavailable,
    MemoryBudget,
    budget_available,
    remove_stale_budgets,
)
from storebench.bench.runner import case_rows, run_case
from storebench.bench.schema import ResultsWriter, read_results
from storebench.cgroups import own_memory_cgroup, parse_mountinfo
from storebench.studies.out_of_core.cases import MIN_ROOM_BYTES
from storebench.studies.out_of_core.study import out_of_core_grid

HERE = Path(__file__).resolve().parent
MiB = 1 << 20
UNAVAILABLE = budget_available()
needs_cgroup = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"{UNAVAILABLE}")


def _run_child(code: str, *args: str, timeout: float = 120) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object last."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _budget_dirs() -> set[str]:
    parent = own_memory_cgroup()
    return {p.name for p in parent.path.iterdir() if p.name.startswith("storebench-")}


@pytest.fixture
def big_file(tmp_path) -> Path:
    path = tmp_path / "data.bin"
    with open(path, "wb") as f:
        f.write(np.random.default_rng(0).bytes(64 * MiB))
        f.flush()
        os.fsync(f.fileno())
    evict([path])
    return path


CAP_CHILD = """
    import json, sys
    from storebench.bench.cache import evict, resident_bytes
    from storebench.bench.memory_budget import MemoryBudget

    path, room = sys.argv[1], int(sys.argv[2])

    def read_all():
        with open(path, "rb", buffering=0) as f:
            while f.read(1 << 20):
                pass

    with MemoryBudget(None) as budget:
        limit = budget.charged_bytes() + room
        budget.set_limit(limit)
        read_all()
        capped = resident_bytes(path)[0]
        stats = budget.stats()
        where = str(budget.path)
    evict([path])
    read_all()  # the same read, uncapped: the control
    print(json.dumps({"capped": capped, "uncapped": resident_bytes(path)[0], "limit": limit,
                      "peak": stats.peak_bytes, "read": stats.device_read_bytes,
                      "path": where}))
"""


@needs_cgroup
@pytest.mark.timeout(120)
def test_the_cap_holds_on_a_file_four_times_the_budget(big_file):
    room = 16 * MiB
    got = _run_child(CAP_CHILD, str(big_file), str(room))
    # Tolerance: the limit covers everything charged after the move (a few hundred KiB of
    # interpreter memory besides the page cache), so resident file bytes stay under it;
    # 1 MiB above the room allows for that baseline.
    assert got["capped"] <= got["limit"]
    assert got["capped"] <= room + 1 * MiB
    assert got["capped"] >= room // 2  # the cache was used up to the cap, not bypassed
    assert got["uncapped"] == 64 * MiB  # without the cap the whole file stays
    assert got["peak"] <= got["limit"]
    assert got["read"] >= 64 * MiB  # every byte came from the device at least once
    assert not Path(got["path"]).exists()


HOLD_CHILD = """
    import sys, time
    from storebench.bench.memory_budget import MemoryBudget

    with MemoryBudget(None, name=sys.argv[1]) as budget:
        print(budget.path, flush=True)
        time.sleep(600)
"""


def _start_holder(name: str) -> tuple[subprocess.Popen, Path]:
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLD_CHILD), name],
                             stdout=subprocess.PIPE, text=True)
    return child, Path(child.stdout.readline().strip())


@needs_cgroup
@pytest.mark.timeout(60)
def test_a_killed_owner_leaves_a_cgroup_that_remove_stale_budgets_removes():
    killed, killed_path = _start_holder("killed")
    alive, alive_path = _start_holder("alive")
    try:
        assert killed_path.name == f"storebench-{killed.pid}-killed"
        assert killed.pid in [int(p) for p in (killed_path / "cgroup.procs").read_text().split()]
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        assert killed_path.is_dir()  # nothing ran its exit
        removed = remove_stale_budgets()  # others' stale budgets may go too
        assert killed_path in removed and alive_path not in removed
        assert not killed_path.exists()
        assert alive_path.is_dir()  # a live owner's budget is kept
    finally:
        alive.terminate()
        alive.wait()
        killed.kill()
        killed.wait()
    remove_stale_budgets()
    assert not alive_path.exists()


def hanging_budget_case(case: Case, trial) -> dict:
    """Enters a budget and hangs, so that the runner must kill it."""
    with MemoryBudget(None):
        Path(case.param("pid_file")).write_text(str(os.getpid()))
        time.sleep(600)
    return {}


@needs_cgroup
@pytest.mark.timeout(120)
def test_no_cgroup_is_left_after_the_runner_kills_a_case(tmp_path):
    data = tmp_path / "x.bin"
    data.write_bytes(b"x" * 4096)
    pid_file = tmp_path / "pid"
    before = _budget_dirs()
    case = Case(study="budget", function="test_memory_budget:hanging_budget_case",
                cache="cold", cache_files=(str(data),), repeats=1, warmup=False,
                timeout_s=8, params={"pid_file": str(pid_file)})
    outcome = run_case(case, python_path=[HERE])
    assert outcome.status == "timeout"
    pid = int(pid_file.read_text())
    assert wait_gone(pid)
    assert not any(name.startswith(f"storebench-{pid}-") for name in _budget_dirs() - before)
    assert _budget_dirs() <= before


def outgrowing_budget_case(case: Case, trial) -> dict:
    """Caps its budget 16 MiB above what it holds, then touches 64 MiB of anonymous memory,
    which no reclaim can free (no swap): the kernel's OOM killer ends it."""
    with MemoryBudget(None, name="outgrown") as budget:
        budget.set_limit(budget.charged_bytes() + 16 * MiB)
        Path(case.param("pid_file")).write_text(str(os.getpid()))
        held = np.ones(64 * MiB, dtype=np.uint8)
        time.sleep(30)  # not reached: the touch above is killed
    return {"samples": (int(held[0]), "count")}


@needs_cgroup
@pytest.mark.timeout(120)
def test_a_case_killed_for_outgrowing_its_budget_says_so(tmp_path):
    pid_file = tmp_path / "pid"
    before = _budget_dirs()
    case = Case(study="budget", function="test_memory_budget:outgrowing_budget_case",
                repeats=1, warmup=False, timeout_s=60, params={"pid_file": str(pid_file)})
    outcome = run_case(case, python_path=[HERE])
    pid = int(pid_file.read_text())
    assert outcome.status == "failed"
    limit = re.search(rf"memory budget storebench-{pid}-outgrown \(limit ([\d,]+) bytes\)",
                      outcome.error)
    assert outcome.error.startswith("worker was killed by SIGKILL during repeat 1 of 1 "
                                    "without reporting: the kernel's OOM killer killed a "
                                    "process of its memory budget"), outcome.error
    assert limit and 16 * MiB < int(limit.group(1).replace(",", "")) < 64 * MiB
    assert _budget_dirs() <= before  # removed once read


def killed_in_budget_case(case: Case, trial) -> dict:
    with MemoryBudget(None, name="not-outgrown"):
        Path(case.param("pid_file")).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return {}


@needs_cgroup
@pytest.mark.timeout(120)
def test_a_case_killed_otherwise_does_not_blame_its_budget(tmp_path):
    pid_file = tmp_path / "pid"
    case = Case(study="budget", function="test_memory_budget:killed_in_budget_case",
                repeats=1, warmup=False, params={"pid_file": str(pid_file)})
    outcome = run_case(case, python_path=[HERE])
    assert outcome.status == "failed"
    assert outcome.error.splitlines()[0] == ("worker was killed by SIGKILL during repeat 1 "
                                             "of 1 without reporting")


def test_a_directory_that_is_not_a_cgroup_gives_budget_unavailable(tmp_path):
    with pytest.raises(BudgetUnavailable) as err, MemoryBudget(64 * MiB, cgroup_root=tmp_path):
        pass
    assert str(tmp_path) in err.value.reason
    assert "not a cgroup filesystem" in err.value.reason
    assert "systemd-run" in err.value.reason  # it says what would give one
    assert list(tmp_path.iterdir()) == []  # nothing made
    assert budget_available(cgroup_root=tmp_path) == err.value.reason
    assert remove_stale_budgets(cgroup_root=tmp_path) == []


READ_ONLY_CHILD = """
    import json, sys
    from storebench.bench.memory_budget import BudgetUnavailable, MemoryBudget

    try:
        with MemoryBudget(None, cgroup_root=sys.argv[1]):
            result = "entered"
    except BudgetUnavailable as err:
        result = err.reason
    print(json.dumps({"result": result}))
"""


@needs_cgroup
@pytest.mark.timeout(60)
def test_a_read_only_cgroup_filesystem_gives_budget_unavailable(tmp_path):
    """The real kernel's refusal: this process's memory cgroup bind-mounted read-only in a
    private mount namespace (as a container sees its cgroupfs)."""
    own = own_memory_cgroup()
    before = _budget_dirs()
    mount_point = tmp_path / "cgroup"
    mount_point.mkdir()
    script = (f"mount --bind {own.path} {mount_point} && "
              f"mount -o remount,bind,ro {mount_point} && "
              f"exec {sys.executable} -c '{textwrap.dedent(READ_ONLY_CHILD)}' {mount_point}")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0 and "mount" in done.stderr:
        pytest.skip(f"cannot make a read-only bind mount here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    reason = json.loads(done.stdout.strip().splitlines()[-1])["result"]
    assert "read-only" in reason and str(mount_point) in reason
    assert _budget_dirs() == before


def _ci_case(ci_data_root, *, loader: str, access: str, k: int) -> Case:
    """The ci grid's memmap raw case of ``loader``, ``access`` and ``k``, default knobs."""
    (case,) = [c for c in out_of_core_grid(profile="ci", data_dir=ci_data_root)
               if c.format == "memmap" and c.loader == loader and c.access == access
               and c.param("k") == k and not c.param("open_madvise_random")]
    return case


@pytest.mark.timeout(120)
def test_without_a_cgroup_the_case_is_a_skipped_row_with_the_reason(
        ci_data_root, tmp_path, monkeypatch):
    case = _ci_case(ci_data_root, loader="lazy", access="shuffle", k=5)
    monkeypatch.setenv(ENV_CGROUP_ROOT, str(tmp_path))
    outcome = run_case(case)
    assert outcome.status == "skipped"
    assert outcome.records == ()
    assert "no memory budget" in outcome.error and "not a cgroup filesystem" in outcome.error
    results = tmp_path / "out_of_core.csv"
    with ResultsWriter(results) as writer:
        writer.write_rows(case_rows(case, outcome, run_id="r", profile="ci"))
    (row,) = read_results(results).to_dict("records")
    assert row["status"] == "skipped" and row["error"] == outcome.error


PRELOAD_CHILD = """
    import json, sys
    import psutil, tqdm.auto  # imported before the cap, as a case has them
    from storebench.bench.memory_budget import MemoryBudget
    from storebench.formats import open_dataset
    from storebench.loaders import InsufficientMemoryError, PreloadedDataset

    reader = open_dataset(sys.argv[1], verify=False)
    needed = PreloadedDataset.estimate_bytes(reader)
    with MemoryBudget(None) as budget:
        budget.set_limit(budget.charged_bytes() + needed // 2)
        try:
            PreloadedDataset(reader, progress=False)
            refusal = ""
        except InsufficientMemoryError as err:
            refusal = str(err)
        where = str(budget.path)
    fits = PreloadedDataset(reader, progress=False).footprint_bytes  # uncapped: the control
    print(json.dumps({"refusal": refusal, "path": where, "needed": needed, "fits": fits}))
"""


@needs_cgroup
@pytest.mark.timeout(120)
def test_preloaded_dataset_refuses_under_a_cap(ci_dataset):
    got = _run_child(PRELOAD_CHILD, str(ci_dataset("memmap", "raw")))
    assert got["refusal"].startswith("preloading needs ")
    assert f"({got['needed']} bytes)" in got["refusal"]
    assert f"under the memory cgroup limit of {got['path']}" in got["refusal"]
    assert got["fits"] >= got["needed"] - 16


PRIMED_CHILD = """
    import json
    import numpy as np
    from storebench.bench.memory_budget import MemoryBudget
    from storebench.studies.out_of_core.cases import _cap, held_besides_page_cache

    MiB = 1 << 20
    with MemoryBudget(None) as budget:
        budget.reset_peak()  # as _primed_loader does before its first loader reads
        held = np.ones(48 * MiB, dtype=np.uint8)  # what a loader holds while it reads
        primed = held_besides_page_cache(budget)
        del held  # handed back when the loader closes (a mapping of its own: unmapped)
        charged = budget.charged_bytes()
        more = _cap(budget, k=4, dataset_bytes=64 * MiB, baseline_rss=0, min_room=0,
                    primed_bytes=primed)
        limit = budget.stats().limit_bytes
        less = _cap(budget, k=4, dataset_bytes=64 * MiB, baseline_rss=0, min_room=0,
                    primed_bytes=charged // 2)
        print(json.dumps({"primed": primed, "charged": charged, "limit": limit,
                          "more": {k: v for k, (v, _) in more.items()},
                          "less": {k: v for k, (v, _) in less.items()}}))
"""


@needs_cgroup
@pytest.mark.timeout(60)
def test_a_cap_leaves_room_above_what_the_loader_held_while_priming_not_after():
    """The memory a loader holds while it reads and hands back when closed (its batch slots,
    a reader's buffers) is part of the baseline: a cap set on what the budget held after the
    primer closed left the next loader less than its room for page cache."""
    got = _run_child(PRIMED_CHILD)
    assert got["primed"] >= 48 * MiB > got["charged"] + 40 * MiB
    more = got["more"]
    assert more["baseline_bytes"] == got["primed"] == more["primed_peak_bytes"]
    assert more["baseline_charged_bytes"] == got["charged"]
    assert more["cgroup_limit_bytes"] == got["limit"] == got["primed"] + 16 * MiB
    less = got["less"]  # the budget holds more than the primer's figure: that is the baseline
    assert less["baseline_bytes"] == less["baseline_charged_bytes"] >= got["charged"]
    assert less["cgroup_limit_bytes"] == less["baseline_bytes"] + 16 * MiB


def _metrics(outcome) -> dict[str, float]:
    return {r["metric"]: r["value"] for r in outcome.records}


@needs_cgroup
def test_a_reader_loading_whole_blocks_is_primed_through_as_many_as_its_loader_holds(
        ci_data_root):
    """Two batches of a block-shuffled read stay inside one big Parquet row group, and the
    baseline missed the groups the loader held afterwards: the primer reads through one
    block per worker and two more (the cached one, the one loading)."""
    from storebench.formats import open_dataset
    from storebench.studies.out_of_core.cases import BASELINE_BATCHES, priming_batches

    case = Case(study="out_of_core", function="m:f", workers=2, batch_size=64)
    with open_dataset(ci_data_root / "parquet-raw") as parquet:
        largest = int(np.diff(parquet.blocks()).max())
        assert parquet.loads_whole_blocks and largest > 64
        assert priming_batches(case, parquet) == -(-4 * largest // 64)
        assert priming_batches(Case(study="out_of_core", function="m:f", workers=2,
                                    batch_size=100_000), parquet) == BASELINE_BATCHES
    with open_dataset(ci_data_root / "memmap-raw") as memmap:
        assert not memmap.loads_whole_blocks
        assert priming_batches(case, memmap) == BASELINE_BATCHES


@pytest.mark.timeout(240)
@needs_cgroup
def test_the_out_of_core_case_runs_on_ci_with_and_without_a_cap(ci_data_root):
    """The ci grid's case with its wall-clock cut removed: a pass cut short after a second
    (the grid's bound on thrashing paths) would make whole epochs depend on the machine's
    speed."""
    results = {}
    for k in (0, 5):
        case = _ci_case(ci_data_root, loader="lazy", access="shuffle", k=k)
        assert case.cache == "cold" and case.prefetcher == "thread"
        assert case.param("epoch_seconds_limit")
        case = replace(case, params={**dict(case.params), "epoch_seconds_limit": None})
        outcome = run_case(case)
        assert outcome.status == "ok", outcome.error
        results[k] = _metrics(outcome)
    size = results[0]["dataset_bytes"]
    for k, m in results.items():
        assert m["k"] == k and m["samples"] == 512
        assert "epoch3.samples_per_s" not in m  # DEFAULT_EPOCHS: two
        for epoch in (1, 2):
            assert m[f"epoch{epoch}.samples_per_s"] > 0
            assert 0 <= m[f"epoch{epoch}.resident_end"] <= 1
            assert m[f"epoch{epoch}.complete"] == 1 and m[f"epoch{epoch}.samples"] == 512
        assert m["epoch1.resident_start"] < 0.05  # cold
        assert m["epoch1.device_read_bytes"] >= 0.9 * size  # read from the device
        assert m["epoch2.resident_start"] > 0.95  # 1.5 MB fits even the ci "cap"
        assert m["epoch2.device_read_bytes"] == 0
        assert m["epoch2_over_epoch1"] > 0
        assert {"cgroup_peak_bytes", "file_cache_bytes", "major_faults", "budget_bytes",
                "baseline_bytes", "baseline_rss_bytes"} <= set(m)
    assert "cgroup_limit_bytes" not in results[0]
    capped = results[5]
    room = max(int(size) // 5, MIN_ROOM_BYTES)
    assert capped["cgroup_limit_bytes"] == capped["baseline_bytes"] + room
    assert 0 < capped["primed_peak_bytes"] <= capped["baseline_bytes"]
    assert capped["baseline_charged_bytes"] <= capped["baseline_bytes"]
    assert capped["baseline_bytes"] in (capped["primed_peak_bytes"],
                                        capped["baseline_charged_bytes"])
    assert capped["effective_k"] == pytest.approx(size / room)
    assert capped["cgroup_peak_bytes"] <= capped["cgroup_limit_bytes"]


@needs_cgroup
@pytest.mark.timeout(120)
def test_an_epoch_past_its_time_limit_is_cut_short_and_the_next_one_starts_afresh(
        ci_data_root):
    """A limit every batch passes: each epoch delivers the first slice of its first batch
    only (the batch in hand is cut at the limit), without a sample twice, and says it is
    incomplete; the loader is stopped and opened again."""
    from dataclasses import replace

    from storebench.studies.out_of_core.cases import CUT_SLICE_SAMPLES

    case = _ci_case(ci_data_root, loader="lazy", access="shuffle", k=5)
    assert case.batch_size > CUT_SLICE_SAMPLES
    params = {**dict(case.params), "epoch_seconds_limit": 1e-9}
    outcome = run_case(replace(case, params=params))
    assert outcome.status == "ok", outcome.error
    m = _metrics(outcome)
    for epoch in (1, 2):
        assert m[f"epoch{epoch}.complete"] == 0
        assert m[f"epoch{epoch}.samples"] == CUT_SLICE_SAMPLES < m["samples"]
        assert m[f"epoch{epoch}.samples_per_s"] == pytest.approx(
            CUT_SLICE_SAMPLES / m[f"epoch{epoch}.seconds"])


@needs_cgroup
@pytest.mark.timeout(120)
def test_a_preload_that_does_not_fit_its_budget_is_a_row_not_a_crash(ci_data_root):
    case = _ci_case(ci_data_root, loader="preloaded", access="block_shuffle", k=5)
    outcome = run_case(case)
    assert outcome.status == "ok", outcome.error
    m = _metrics(outcome)
    assert m["does_not_fit"] == 1
    assert m["preload_needed_bytes"] > m["cgroup_limit_bytes"] - m["baseline_bytes"]
    assert not any(name.startswith("epoch") for name in m)


def test_the_ci_grid_covers_every_k_order_and_the_preload(ci_data_root):
    cases = out_of_core_grid(profile="ci", data_dir=ci_data_root)
    ids = [c.case_id for c in cases]
    assert len(ids) == len(set(ids))
    assert {c.cache for c in cases} == {"cold"} and not any(c.warmup for c in cases)
    assert {c.param("k") for c in cases} == {0, 2, 5}
    raw = [c for c in cases if c.encoding == "raw" and c.loader == "lazy"]
    assert {c.access for c in raw} == {"sequential", "shuffle", "block_shuffle"}
    assert {c.param("k") for c in cases if c.loader == "preloaded"} == {0, 2, 5}
    assert any(c.encoding == "jpeg" and c.param("decode") == "simplejpeg" for c in cases)


def test_mountinfo_maps_a_containers_cgroup_path_to_its_directory():
    text = ("30 25 0:26 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup "
            "rw,memory\n"
            "31 25 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
            "32 25 8:1 / /data\\040set rw - ext4 /dev/sda1 rw\n")
    v1, v2 = parse_mountinfo(text)
    assert (v1.version, v1.read_only, "memory" in v1.super_options) == (1, True, True)
    assert v1.directory_of("/docker/abc/job") == Path("/sys/fs/cgroup/memory/job")
    assert v1.directory_of("/other") is None
    assert v2.directory_of("/user.slice") == Path("/sys/fs/cgroup/unified/user.slice")
