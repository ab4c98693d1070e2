"""The runner: fresh subprocess per case, cache state recorded, failures kept, resumable."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from bench_support import live, wait_gone

from storebench.bench.case import Case, Trial
from storebench.bench.runner import byte_compile_package, run_case, run_cases
from storebench.bench.schema import COLUMNS, read_results
from storebench.formats import open_dataset, read_manifest

HERE = Path(__file__).resolve().parent
FNS = "bench_case_functions"


def test_real_study_rows_follow_the_schema(formats_results, ci_data_dir):
    df = read_results(formats_results / "formats.csv")
    assert list(df.columns) == list(COLUMNS)
    assert set(df["status"]) == {"ok"}
    assert set(df["study"]) == {"formats"} and set(df["profile"]) == {"ci"}
    assert df["run_id"].nunique() == 1
    reads = df[df["loader"] == "reader"]
    assert set(reads["cache"]) == {"cold", "warm"}
    # Every timed metric exists for both repeats of every read case.
    for _, case in reads[reads["repeat"] >= 0].groupby("case_id"):
        per_metric = case.groupby("metric")["repeat"].apply(sorted)
        assert all(r == [0, 1] for r in per_metric)
        assert {"samples_per_s", "wall_seconds", "peak_pss_bytes", "peak_uss_bytes",
                "cpu_seconds", "time_to_first_batch_s"} <= set(per_metric.index)
    samples = reads.loc[(reads["metric"] == "samples"), "value"]
    assert (samples == 512).all()
    build = df[df["metric"] == "bytes_apparent"]
    manifest = read_manifest(ci_data_dir / "memmap-raw")
    assert build["value"].tolist() == [manifest["bytes_apparent"]]
    assert (df.groupby("case_id")["metric"].apply(lambda m: (m == "case_seconds").sum()) == 1).all()


def test_cold_rows_were_cold_and_warm_rows_warm(formats_results):
    df = read_results(formats_results / "formats.csv")
    timed = df[(df["repeat"] >= 0) & (df["cache"] != "")]
    cold = timed.loc[timed["cache"] == "cold", "resident_fraction"]
    warm = timed.loc[timed["cache"] == "warm", "resident_fraction"]
    assert len(cold) and len(warm)
    assert cold.max() < 0.05
    assert warm.min() > 0.95
    # Each cold repeat also records what it left in the page cache; a warm one does not.
    after = timed[timed["metric"] == "resident_fraction_after"]
    cold_repeats = timed.loc[timed["cache"] == "cold", ["case_id", "repeat"]].drop_duplicates()
    assert sorted(map(tuple, after[["case_id", "repeat"]].to_numpy())) == sorted(
        map(tuple, cold_repeats.to_numpy()))
    assert set(after["cache"]) == {"cold"}
    assert after["value"].between(0, 1).all()


def _file_case(tmp_path, name, **fields):
    data = tmp_path / f"{name}.bin"
    if not data.exists():
        data.write_bytes(np.arange(4096, dtype=np.uint8).tobytes())
    return Case(study="failures", function=f"{FNS}:{name}", format=name, cache="cold",
                cache_files=(str(data),), repeats=1, warmup=False, **fields)


@pytest.mark.timeout(120)
def test_failures_are_recorded_and_the_run_goes_on(tmp_path):
    pid_file = tmp_path / "pids.txt"
    cases = [
        _file_case(tmp_path, "raising_case"),
        _file_case(tmp_path, "exiting_case"),
        _file_case(tmp_path, "self_killing_case"),
        _file_case(tmp_path, "wrong_unit_case"),
        _file_case(tmp_path, "hanging_case", timeout_s=5, params={"pid_file": str(pid_file)}),
        _file_case(tmp_path, "checksum_file_case"),
    ]
    results = tmp_path / "failures.csv"
    summary = run_cases(cases, results, python_path=[HERE], progress=False)
    assert summary.ran == [c.case_id for c in cases]
    assert summary.failed == [c.case_id for c in cases[:5]]

    df = read_results(results)
    last = df[df["metric"] == "case_seconds"].set_index("format")
    assert last.loc["raising_case", "status"] == "failed"
    assert "ValueError: boom in repeat 0" in last.loc["raising_case", "error"]
    assert "during repeat 1 of 1" in last.loc["raising_case", "error"]
    assert "exited with code 3 during repeat 1 of 1" in last.loc["exiting_case", "error"]
    assert "killed by SIGKILL" in last.loc["self_killing_case", "error"]
    assert "'samples_per_s' has unit 'MB/s', expected samples/s" in (
        last.loc["wrong_unit_case", "error"])
    assert last.loc["hanging_case", "status"] == "timeout"
    assert "timed out after 5 s during repeat 1 of 1" in last.loc["hanging_case", "error"]
    assert last.loc["hanging_case", "value"] >= 5
    # The worker and the process it started were killed with their process group.
    worker_pid, grandchild_pid = map(int, pid_file.read_text().split())
    assert wait_gone(worker_pid) and wait_gone(grandchild_pid)
    # The case after the failures ran normally and read the whole file.
    ok = df[df["format"] == "checksum_file_case"]
    assert set(ok["status"]) == {"ok"}
    assert ok.loc[ok["metric"] == "samples", "value"].tolist() == [4096]
    residency = ok["resident_fraction"].dropna()
    assert len(residency) and (residency == 0).all()
    failed_rows = df[df["status"] != "ok"]
    assert (failed_rows["metric"] == "case_seconds").all()  # no partial measurements kept

    rerun = run_cases(cases, results, python_path=[HERE], progress=False)
    assert rerun.ran == [] and rerun.skipped == [c.case_id for c in cases]
    assert len(read_results(results)) == len(df)


@pytest.mark.timeout(120)
def test_ctrl_c_keeps_finished_cases_and_kills_the_running_one(tmp_path):
    pid_file = tmp_path / "pids.txt"
    results = tmp_path / "interrupted.csv"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from storebench.bench.case import Case
        from storebench.bench.runner import run_cases
        data = {str(tmp_path / "data.bin")!r}
        open(data, "wb").write(bytes(range(256)) * 16)
        cases = [
            Case(study="i", function="{FNS}:checksum_file_case", format="first",
                 cache="warm", cache_files=(data,), repeats=2),
            Case(study="i", function="{FNS}:hanging_case", format="second",
                 repeats=1, warmup=False, params={{"pid_file": {str(pid_file)!r}}}),
            Case(study="i", function="{FNS}:checksum_file_case", format="third",
                 cache="warm", cache_files=(data,), repeats=1),
        ]
        run_cases(cases, {str(results)!r}, python_path=[{str(HERE)!r}], progress=False)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid_file.exists(), "the hanging case never started"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0
    assert b"KeyboardInterrupt" in stderr
    df = read_results(results)
    assert set(df["format"]) == {"first"}
    assert set(df["status"]) == {"ok"}
    worker_pid, grandchild_pid = map(int, pid_file.read_text().split())
    assert wait_gone(worker_pid) and wait_gone(grandchild_pid)


def test_case_checks_and_round_trip(tmp_path):
    with pytest.raises(ValueError, match="module.path:function"):
        Case(study="s", function="no_colon")
    with pytest.raises(ValueError, match="needs cache_files"):
        Case(study="s", function="m:f", cache="cold")
    with pytest.raises(ValueError, match="tepid"):
        Case(study="s", function="m:f", cache="tepid", cache_files=("x",))
    with pytest.raises(TypeError, match="JSON scalar"):
        Case(study="s", function="m:f", params={"sizes": [1, 2]})
    with pytest.raises(ValueError, match=r"^case build:x: a quantity measured once is one "
                       r"repeat, got repeats=5, min_repeats=None$"):
        Case(study="s", function="m:build_case", format="x", measured_once=True, repeats=5)
    with pytest.raises(ValueError, match="measured once is one repeat"):
        Case(study="s", function="m:f", measured_once=True, repeats=1, min_repeats=1)
    assert Case(study="s", function="m:f", measured_once=True, repeats=1).measured_once
    case = Case(study="s", function="m:read_case", format="memmap", encoding="raw",
                loader="lazy", workers=2, batch_size=64, access="random", cache="cold",
                cache_files=(str(tmp_path / "a"),), params={"z": 1, "a": "x"})
    assert case.params == (("a", "x"), ("z", 1))
    assert case.case_id == "read:memmap-raw/lazy/w2/b64/random/cold/a=x/z=1"
    assert Case.from_dict(case.to_dict()) == case
    assert case.param("z") == 1 and case.param("missing", 7) == 7
    with pytest.raises(ValueError, match="unique"):
        run_cases([case, case], tmp_path / "dup.csv", progress=False)


def test_run_case_reports_an_unknown_function_as_a_failure(tmp_path):
    outcome = run_case(Case(study="s", function=f"{FNS}:no_such_case", repeats=1),
                       python_path=[HERE])
    assert outcome.status == "failed"
    assert "has no case function 'no_such_case'" in outcome.error


def test_sequential_read_case_reads_the_real_dataset(ci_data_dir):
    """The case function a study uses returns the dataset's real sample count and bytes."""
    from storebench.bench.case import Trial
    from storebench.studies.formats.cases import random_read_case, sequential_read_case
    from storebench.studies.grid import dataset_files

    path = ci_data_dir / "memmap-raw"
    case = Case(study="s", function="storebench.studies.formats.cases:sequential_read_case",
                format="memmap", encoding="raw", dataset=str(path), loader="reader",
                access="sequential", batch_size=100, cache="warm",
                cache_files=dataset_files(path), repeats=1)
    metrics = sequential_read_case(case, Trial(case, 0))
    with open_dataset(path) as reader:
        assert metrics["samples"] == (len(reader), "count")
        raw = len(reader) * reader.spec.raw_sample_bytes
    seconds = raw / (metrics["read_MBps"][0] * 1e6)
    assert metrics["samples_per_s"][0] == pytest.approx(len(reader) / seconds)
    # The verified pass reads the same samples: its rate and time ratio agree.
    ratio, unit = metrics["verify_time_ratio"]
    assert unit == "ratio" and ratio > 0
    assert metrics["verified.samples_per_s"][0] == pytest.approx(
        metrics["samples_per_s"][0] / ratio)
    # Only warm sequential reads get one (a cold read's second pass would find the files
    # cached).
    cold = replace(case, cache="cold")
    shuffled = replace(case, access="shuffle", params={"random_samples": 200})
    for other, read in ((cold, sequential_read_case), (shuffled, random_read_case)):
        metrics = read(other, Trial(other, 0))
        assert "verify_time_ratio" not in metrics and "verified.samples_per_s" not in metrics


def test_a_warm_read_cases_verified_pass_names_a_damaged_sample(ci_data_dir, tmp_path):
    """The timed pass reads without per-sample checksums (memmap has no others) and checks
    only its last batch; the verified pass after it checks every sample."""
    from storebench.bench.case import Trial
    from storebench.formats import CorruptSampleError
    from storebench.studies.formats.cases import sequential_read_case
    from storebench.studies.grid import dataset_files

    path = tmp_path / "memmap-raw"
    shutil.copytree(ci_data_dir / "memmap-raw", path)
    with open_dataset(path) as reader:
        sample_bytes, count = reader.spec.raw_sample_bytes, len(reader)
    (images,) = [path / name for name in read_manifest(path)["files"]
                 if (path / name).stat().st_size >= count * sample_bytes]
    victim = 5
    data = bytearray(images.read_bytes())
    at = images.stat().st_size - (count - victim) * sample_bytes + sample_bytes // 2
    data[at] ^= 0x5A
    images.write_bytes(bytes(data))
    case = Case(study="s", function="storebench.studies.formats.cases:sequential_read_case",
                format="memmap", encoding="raw", dataset=str(path), loader="reader",
                access="sequential", batch_size=100, cache="warm",
                cache_files=dataset_files(path), repeats=1)
    with pytest.raises(CorruptSampleError, match=f"sample {victim}"):
        sequential_read_case(case, Trial(case, 0))


@pytest.mark.timeout(120)
def test_a_killed_case_leaves_no_shared_memory_behind(tmp_path, ci_data_dir):
    # A case killed on its timeout never runs the ProcessPrefetcher's finaliser, and the
    # resource tracker that would unlink its segment dies with the same process group.
    pid_file = tmp_path / "prefetch.txt"
    case = Case(study="shm", function=f"{FNS}:hanging_prefetch_case", format="memmap",
                dataset=str(ci_data_dir / "memmap-raw"), repeats=1, warmup=False,
                timeout_s=10, params={"pid_file": str(pid_file), "start_method": "fork"})
    before = set(os.listdir("/dev/shm"))
    outcome = run_case(case, python_path=[HERE])
    assert outcome.status == "timeout", outcome.error
    name, *workers = pid_file.read_text().split()
    assert name not in before
    assert f"removed 1 shared-memory segment(s) it left: {name}" in outcome.error
    assert not (Path("/dev/shm") / name).exists()
    assert all(wait_gone(int(pid)) for pid in workers)
    assert len(workers) == 2


def test_a_worker_ends_at_its_report_after_its_exit_handlers_not_its_teardown(
        tmp_path, ci_data_dir):
    # Once its report is written the worker runs the exit handlers (libraries clean up
    # there: TensorFlow removes its generated files) and skips the rest of the interpreter's
    # teardown (finalising torch or TensorFlow took most of a second a case). The prefetcher
    # the case still held (workers, a segment) is gone when the case is.
    files = {name: tmp_path / f"{name}.txt" for name in ("pid", "atexit", "finalized")}
    case = Case(study="exit", function=f"{FNS}:leaving_prefetch_case", format="memmap",
                dataset=str(ci_data_dir / "memmap-raw"), repeats=1, warmup=False,
                params={"pid_file": str(files["pid"]), "atexit_file": str(files["atexit"]),
                        "finalized_file": str(files["finalized"]), "start_method": "fork"})
    before = set(os.listdir("/dev/shm"))
    outcome = run_case(case, python_path=[HERE])
    assert outcome.status == "ok", outcome.error
    assert [r["value"] for r in outcome.records if r["metric"] == "samples"] == [16]
    assert files["atexit"].read_text() == "exit handlers ran"
    assert not files["finalized"].exists()
    name, *workers = files["pid"].read_text().split()
    assert name not in before
    assert not (Path("/dev/shm") / name).exists()
    assert len(workers) == 2
    assert all(wait_gone(int(pid)) for pid in workers)


def test_a_tensorflow_case_leaves_no_generated_files_in_the_temporary_directory(tmp_path):
    # tf.data's map writes the code autograph generates into the temporary directory and
    # TensorFlow removes it in an exit handler: a worker that skipped its exit handlers left
    # four files per such case. The worker runs here without the runner, whose case
    # directory would take them away whatever the worker did.
    pytest.importorskip("tensorflow")
    from data_gen import PROFILES
    from storebench.formats import build_dataset

    build_dataset(PROFILES["ci"].spec_for("jpeg"), "tfrecord", tmp_path, workers=1)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    case = Case(study="s", function="storebench.studies.shared_cases:loader_epoch_case",
                format="tfrecord", encoding="jpeg", dataset=str(tmp_path / "tfrecord-jpeg"),
                loader="lazy", prefetcher="tf_data", batch_size=32, access="shuffle",
                params={"decode": "tf", "shuffle_buffer": 64}, repeats=1, warmup=False)
    job, result = tmp_path / "job.json", tmp_path / "result.json"
    job.write_text(json.dumps({"case": case.to_dict(), "drop_caches": False,
                               "result_path": str(result),
                               "phase_path": str(tmp_path / "phase.txt")}))
    subprocess.run([sys.executable, "-m", "storebench.bench.worker", str(job)], check=True,
                   env={**os.environ, "TMPDIR": str(temporary)}, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert json.loads(result.read_text())["status"] == "ok"
    assert sorted(p.name for p in temporary.iterdir()) == []


@pytest.mark.timeout(120)
def test_a_killed_case_leaves_nothing_in_the_temporary_directory_or_in_dev_shm(tmp_path):
    # A case's TMPDIR is inside its case directory: what its libraries would have removed at
    # a clean exit goes with that directory, even from a case killed by SIGKILL. The
    # semaphores its multiprocessing made, which its resource tracker (killed with the
    # group) would have unlinked, are unlinked by the runner.
    outer, where = tmp_path / "tmp", tmp_path / "where.txt"
    outer.mkdir()
    case = Case(study="s", function=f"{FNS}:temp_leaving_case", repeats=1, warmup=False,
                params={"where_file": str(where)})
    outcome = run_case(case, python_path=[HERE], env={"TMPDIR": str(outer)})
    assert outcome.status == "failed" and "killed by SIGKILL" in outcome.error
    mine, pymp, *semaphores = map(Path, where.read_text().split("\n"))
    assert semaphores and all(name.name.startswith("sem.mp-") for name in semaphores)
    assert not [name for name in semaphores if (Path("/dev/shm") / name).exists()]
    assert mine.name.startswith("left-by-case-") and pymp.name.startswith("pymp-")
    assert mine.parent == pymp.parent
    assert mine.parent.name == "tmp" and mine.parent.parent.name.startswith("storebench-case-")
    assert not mine.exists() and not pymp.exists() and not mine.parent.parent.exists()
    assert sorted(p.name for p in outer.iterdir()) == []


def test_group_pids_and_their_shm_segments(tmp_path):
    from multiprocessing import shared_memory

    from storebench.bench.runner import group_pids, shm_segments_of

    segment = shared_memory.SharedMemory(create=True, size=4096)
    try:
        assert os.getpid() in group_pids(os.getpgrp())
        assert Path("/dev/shm") / segment.name in shm_segments_of([os.getpid()])
    finally:
        segment.close()
        segment.unlink()
    assert Path("/dev/shm") / segment.name not in shm_segments_of([os.getpid()])


@pytest.mark.timeout(60)
def test_a_summarise_function_adds_whole_case_rows(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(256)) * 16)
    case = Case(study="summary", function=f"{FNS}:summarised_checksum_case", cache="warm",
                cache_files=(str(data),), repeats=3, summarise=f"{FNS}:total_of_repeats")
    outcome = run_case(case, python_path=[HERE])
    assert outcome.status == "ok", outcome.error
    per_repeat = [r for r in outcome.records if r["metric"] == "samples"]
    assert [r["repeat"] for r in per_repeat] == [0, 1, 2]
    (total,) = [r for r in outcome.records if r["metric"] == "samples_total"]
    assert total["repeat"] == -1 and total["value"] == 3 * 4096
    with pytest.raises(ValueError, match="case summarise must be 'module.path:function'"):
        Case(study="x", function=f"{FNS}:raising_case", summarise="no_colon")


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _case_dirs_of(pid: int) -> list[Path]:
    from storebench.bench.runner import CASE_DIR_PREFIX

    return sorted(Path(tempfile.gettempdir()).glob(f"{CASE_DIR_PREFIX}{pid}-*"))


@pytest.mark.timeout(120)
def test_a_sigkilled_runner_leaves_no_case_process_and_no_directory(tmp_path):
    pid_file = tmp_path / "pids.txt"
    script = textwrap.dedent(f"""
        from storebench.bench.case import Case
        from storebench.bench.runner import run_cases
        case = Case(study="k", function="{FNS}:hanging_case", format="killed", repeats=1,
                    warmup=False, params={{"pid_file": {str(pid_file)!r}}})
        run_cases([case], {str(tmp_path / "killed.csv")!r}, python_path=[{str(HERE)!r}],
                  progress=False)
    """)
    runner = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid_file.exists(), "the hanging case never started"
    worker_pid, grandchild_pid = map(int, pid_file.read_text().split())
    (case_dir,) = _case_dirs_of(runner.pid)
    assert (case_dir / "job.json").is_file()
    runner.kill()
    runner.wait()
    # The worker by its parent-death signal, the grandchild and the directory by the watcher.
    assert wait_gone(worker_pid) and wait_gone(grandchild_pid)
    deadline = time.monotonic() + 10
    while case_dir.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not case_dir.exists()


@pytest.mark.timeout(60)
def test_a_case_worker_dies_with_its_parent():
    # No runner, no watcher: only the parent-death signal can end the sleeping child.
    script = textwrap.dedent("""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c",
            "import os, sys, time\\n"
            "from storebench.processes import die_with_parent\\n"
            f"die_with_parent({os.getpid()})\\n"
            "print('armed', flush=True)\\n"
            "time.sleep(600)"], stdout=subprocess.PIPE)
        assert child.stdout.readline() == b"armed\\n"
        print(child.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    child_pid = int(parent.stdout.readline())
    assert live(child_pid)
    parent.kill()
    parent.wait()
    assert wait_gone(child_pid)


def test_a_worker_whose_parent_is_already_gone_ends_at_once():
    code = ("from storebench.processes import die_with_parent\n"
            f"die_with_parent({_dead_pid()})\n"
            "print('still running')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert result.returncode == -signal.SIGKILL
    assert result.stdout == b""


def test_stale_case_directories_are_removed_live_ones_kept(tmp_path):
    from storebench.bench.runner import CASE_DIR_PREFIX, remove_stale_temp_dirs

    dead, alive = _dead_pid(), os.getpid()
    stale = tmp_path / f"{CASE_DIR_PREFIX}{dead}-abc"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "worker.log").write_text("left by a killed runner")
    kept = [tmp_path / f"{CASE_DIR_PREFIX}{alive}-def", tmp_path / f"{CASE_DIR_PREFIX}old",
            tmp_path / f"other-{dead}-x"]
    for path in kept:
        path.mkdir()
    assert remove_stale_temp_dirs(CASE_DIR_PREFIX, tmp_path) == [stale]
    assert not stale.exists()
    assert all(path.is_dir() for path in kept)


@pytest.mark.timeout(60)
def test_the_next_case_removes_what_a_killed_runner_left(tmp_path):
    # Runner and watcher both SIGKILLed: the directory stays until the next case starts;
    # a whole-session kill (resource tracker too) leaves the shared memory as well.
    from storebench.processes import SHM_DIR, SHM_PREFIX

    stale = Path(tempfile.gettempdir()) / f"storebench-case-{_dead_pid()}-zz"
    stale.mkdir()
    (stale / "job.json").write_text("{}")
    orphan = SHM_DIR / f"{SHM_PREFIX}{_dead_pid()}_5e5e5e5e"
    orphan.write_bytes(b"\0" * 4096)
    try:
        outcome = run_case(_file_case(tmp_path, "checksum_file_case"), python_path=[HERE])
        assert outcome.status == "ok", outcome.error
        assert not stale.exists()
        assert not orphan.exists()
    finally:
        orphan.unlink(missing_ok=True)
    assert _case_dirs_of(os.getpid()) == []


@pytest.fixture
def adaptive_rule(monkeypatch):
    """The adaptive rule as designed, for the tests of the rule itself: a suite run with
    ``STOREBENCH_REPEAT_RULE`` forced to either end leaves these tests' inputs fixed."""
    from storebench.bench.stats import REPEAT_RULE_ENV

    monkeypatch.delenv(REPEAT_RULE_ENV, raising=False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rates, expected", [
    ("100,101,100,150,50", 3),        # narrow after the minimum: stops at 3
    ("100,150,60,140,70,130,80,120,90", 9),  # wide throughout: goes on to the maximum
])
@pytest.mark.usefixtures("adaptive_rule")
def test_adaptive_repeats_stop_when_the_median_interval_is_narrow(tmp_path, rates, expected):
    from storebench.bench.stats import AdaptiveRepeats, relative_halfwidth

    case = Case(study="adaptive", function=f"{FNS}:scripted_rate_case", repeats=9,
                min_repeats=3, stop_halfwidth=0.05, params={"rates": rates})
    outcome = run_case(case, python_path=[HERE])
    assert outcome.status == "ok", outcome.error
    taken = [r["value"] for r in outcome.records if r["metric"] == "samples_per_s"]
    assert len(taken) == expected
    rule = AdaptiveRepeats(3, 9, 0.05)
    assert [rule.done(taken[:n]) for n in range(1, expected + 1)] == (
        [False] * (expected - 1) + [True])
    whole = {r["metric"]: r["value"] for r in outcome.records if r["repeat"] == -1}
    assert whole["repeats_run"] == expected
    assert whole["median_ci_halfwidth"] == pytest.approx(relative_halfwidth(taken))
    assert 0 < whole["case_startup_s"] < 30
    # The rule the repeats ran under, in the case's own rows: no budget, no threshold.
    assert {m: v for m, v in whole.items() if m.startswith("repeat_rule.")} == {
        "repeat_rule.minimum": 3, "repeat_rule.maximum": 9, "repeat_rule.halfwidth": 0.05}


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("adaptive_rule")
def test_a_repeat_budget_stops_costly_wide_repeats_at_the_minimum(tmp_path):
    # Wide throughout (9 repeats without a budget), but each repeat sleeps 0.4 s: after 3,
    # a fourth would take the repeats past 1.5 s.
    case = Case(study="adaptive", function=f"{FNS}:scripted_rate_case", repeats=9,
                min_repeats=3, stop_halfwidth=0.05, repeat_budget_s=1.5,
                params={"rates": "100,150,60,140,70,130,80,120,90", "sleep_s": 0.4})
    outcome = run_case(case, python_path=[HERE])
    assert outcome.status == "ok", outcome.error
    whole = {r["metric"]: r["value"] for r in outcome.records if r["repeat"] == -1}
    assert whole["repeats_run"] == 3
    assert 1.2 <= whole["repeats_seconds"] < 30
    assert whole["repeat_rule.budget_s"] == 1.5
    assert "repeat_rule.threshold" not in whole
    assert [r["value"] for r in outcome.records if r["metric"] == "samples_per_s"] == [
        100.0, 150.0, 60.0]


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("adaptive_rule")
def test_a_targets_threshold_is_recorded_with_its_rule():
    case = Case(study="adaptive", function=f"{FNS}:scripted_rate_case", repeats=9,
                min_repeats=3, stop_halfwidth=0.05, stop_threshold=50.0,
                params={"rates": "100,101,100"})
    outcome = run_case(case, python_path=[HERE])
    assert outcome.status == "ok", outcome.error
    whole = {r["metric"]: (r["value"], r["unit"]) for r in outcome.records
             if r["repeat"] == -1}
    assert whole["repeats_run"] == (3, "count")  # decided: the interval clears 50
    assert whole["repeat_rule.threshold"] == (50.0, "ratio")
    assert "repeat_rule.budget_s" not in whole


@pytest.mark.timeout(120)
@pytest.mark.parametrize("forcing, expected", [("minimum", 3), ("maximum", 9)])
def test_a_forced_repeat_rule_runs_exactly_its_end_and_records_it(monkeypatch, forcing,
                                                                  expected):
    """``STOREBENCH_REPEAT_RULE`` forces the adaptive rule to one end, whatever the values:
    narrow repeats that would stop at 3 run to 9 under ``maximum``, wide ones that would
    run to 9 stop at 3 under ``minimum``; the case's rows record the rule it ran under."""
    from storebench.bench.stats import REPEAT_RULE_ENV

    monkeypatch.setenv(REPEAT_RULE_ENV, forcing)
    rates = "100,101,100,100,101,100,100,101,100" if forcing == "maximum" else (
        "100,150,60,140,70,130,80,120,90")
    case = Case(study="adaptive", function=f"{FNS}:scripted_rate_case", repeats=9,
                min_repeats=3, stop_halfwidth=0.05, params={"rates": rates})
    outcome = run_case(case, python_path=[HERE])
    assert outcome.status == "ok", outcome.error
    assert [r["repeat"] for r in outcome.records if r["metric"] == "samples_per_s"] == list(
        range(expected))
    whole = {r["metric"]: r["value"] for r in outcome.records if r["repeat"] == -1}
    assert whole["repeats_run"] == expected
    assert whole["repeat_rule.minimum"] == whole["repeat_rule.maximum"] == expected


def test_an_unknown_forced_repeat_rule_is_one_clear_error(monkeypatch):
    from storebench.bench.stats import REPEAT_RULE_ENV

    monkeypatch.setenv(REPEAT_RULE_ENV, "most")
    case = Case(study="fixed", function=f"{FNS}:scripted_rate_case", repeats=1,
                params={"rates": "100"})
    with pytest.raises(ValueError) as raised:
        run_case(case, python_path=[HERE])
    assert str(raised.value) == (
        "STOREBENCH_REPEAT_RULE='most': expected one of adaptive, minimum, maximum")


@pytest.mark.timeout(60)
def test_fixed_repeats_take_exactly_that_many(tmp_path):
    case = Case(study="fixed", function=f"{FNS}:scripted_rate_case", repeats=4,
                params={"rates": "100,150,60,100"})
    outcome = run_case(case, python_path=[HERE])
    assert [r["repeat"] for r in outcome.records if r["metric"] == "samples_per_s"] == [
        0, 1, 2, 3]
    whole = {r["metric"]: r["value"] for r in outcome.records if r["repeat"] == -1}
    assert {m: v for m, v in whole.items() if m.startswith("repeat_rule.")} == {
        "repeat_rule.minimum": 4, "repeat_rule.maximum": 4}


@pytest.mark.timeout(120)
def test_a_resumed_run_refuses_rows_read_under_another_epoch_size(tmp_path):
    from storebench.bench.runner import run_cases

    results = tmp_path / "scripted.csv"
    whole = Case(study="scripted", function=f"{FNS}:scripted_rate_case", repeats=1,
                 params={"rates": "100"})
    run_cases([whole], results, python_path=[HERE], progress=False)
    assert run_cases([whole], results, python_path=[HERE], progress=False).skipped == [
        whole.case_id]
    capped = Case(study="scripted", function=f"{FNS}:scripted_rate_case", repeats=1,
                  params={"rates": "100"}, epoch_samples=2048)
    before = results.read_bytes()
    with pytest.raises(ValueError, match=(
            f"case {re.escape(whole.case_id)} was measured with whole epochs, this plan reads "
            "epochs of 2048 samples; rerun with --fresh")):
        run_cases([capped], results, python_path=[HERE], progress=False)
    assert results.read_bytes() == before
    again = tmp_path / "capped.csv"
    run_cases([capped], again, python_path=[HERE], progress=False)
    rows = [line for line in again.read_text().splitlines() if ",epoch_samples_cap," in line]
    assert len(rows) == 1 and ",2048.0," in rows[0]
    assert run_cases([capped], again, python_path=[HERE], progress=False).skipped == [
        capped.case_id]


def test_a_case_runs_with_its_environments_interpreter(monkeypatch, tmp_path):
    """param ``environment``: the runner starts the worker with that environment's python
    (here ``STOREBENCH_PEERS_PYTHON`` names a link to this one outside its venv, so the
    worker must report the link's path as its ``sys.executable``)."""
    import site

    import storebench

    link = tmp_path / "python"
    link.symlink_to(sys.executable)
    monkeypatch.setenv("STOREBENCH_PEERS_PYTHON", str(link))
    case = Case(study="s", function=f"{FNS}:interpreter_case", repeats=1, warmup=False,
                params={"environment": "peers", "python": str(link)})
    # Outside its venv the link finds neither the venv's packages nor the editable install.
    packages = [*site.getsitepackages(), Path(storebench.__file__).parents[1]]
    outcome = run_case(case, python_path=[HERE, *packages])
    assert outcome.status == "ok", outcome.error
    assert [r["value"] for r in outcome.records if r["metric"] == "samples"] == [1]


def test_a_case_whose_environment_is_missing_is_skipped_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("STOREBENCH_PEERS_PYTHON", str(tmp_path / "no-such-python"))
    case = Case(study="s", function=f"{FNS}:interpreter_case", repeats=1,
                params={"environment": "peers"})
    outcome = run_case(case, python_path=[HERE])
    assert outcome.status == "skipped"
    assert "the peers environment is not installed" in outcome.error
    assert "no-such-python" in outcome.error and "make peers" in outcome.error


def test_the_warm_up_reads_a_few_batches_and_repeats_read_what_they_ask():
    from storebench.bench.case import WARMUP_BATCHES, Trial
    from storebench.bench.schema import CASE_REPEAT

    case = Case(study="s", function=f"{FNS}:no_such_case", repeats=1)
    warmup, repeat = Trial(case, CASE_REPEAT), Trial(case, 0)
    assert warmup.warmup and not repeat.warmup
    assert warmup.batches_wanted(None) == WARMUP_BATCHES
    assert warmup.batches_wanted(1) == 1
    assert repeat.batches_wanted(None) is None and repeat.batches_wanted(7) == 7


def test_a_timed_repeat_reads_at_most_the_cases_epoch_samples():
    from storebench.bench.case import WARMUP_BATCHES, Trial
    from storebench.bench.schema import CASE_REPEAT

    case = Case(study="s", function=f"{FNS}:no_such_case", repeats=1, batch_size=256,
                epoch_samples=1000)
    repeat = Trial(case, 0)
    assert repeat.batches_wanted(None) == 4  # 1000 samples: 4 batches of 256, the last full
    assert repeat.batches_wanted(None, samples=20_000) == 4
    assert repeat.batches_wanted(3, samples=20_000) == 3
    assert repeat.batches_wanted(None, samples=20_000, ranks=2) == 2  # each rank's share
    # A set no larger than the cap is read whole: no cap, so the whole-epoch checks apply.
    assert repeat.batches_wanted(None, samples=1000) is None
    assert repeat.batches_wanted(None, samples=600) is None
    assert Trial(case, CASE_REPEAT).batches_wanted(None, samples=20_000) == WARMUP_BATCHES
    with pytest.raises(ValueError, match="epoch_samples must be positive, got 0"):
        Case(study="s", function=f"{FNS}:no_such_case", epoch_samples=0)


def test_a_capped_loader_epoch_reads_the_first_batches_of_the_order(ci_data_dir):
    from storebench.bench.case import Trial
    from storebench.studies.shared_cases import loader_epoch_case

    path = ci_data_dir / "memmap-raw"
    case = Case(study="s", function="storebench.studies.shared_cases:loader_epoch_case",
                format="memmap", encoding="raw", dataset=str(path), loader="lazy",
                prefetcher="thread", workers=2, batch_size=32, access="shuffle", repeats=1,
                epoch_samples=100)
    assert read_manifest(path)["num_samples"] > 128
    metrics = loader_epoch_case(case, Trial(case, 0))
    # Epochs of the first 128 samples (4 batches), through one loader until its steady
    # window holds a batch past its read-ahead of 4: a whole epoch, then 2 batches.
    assert metrics["read_ahead_batches"] == (4, "count")
    assert metrics["steady_epochs"] == (2, "count")
    assert metrics["samples"] == (128 + 64, "count")


def test_a_sized_epoch_ends_at_its_last_batch_not_after_its_loader_stopped():
    from storebench.studies.shared_cases import drain, epoch_ended

    closed = []

    def loader():
        try:
            for k in range(5):
                yield np.zeros((2, 1), np.uint8), np.array([k, k])
        finally:
            closed.append(time.perf_counter())

    started = time.perf_counter()
    tally = drain(loader(), started=started, max_batches=2)
    assert tally.batches == 2 and tally.samples == 4 and len(closed) == 1
    assert started < tally.last_batch_at <= closed[0]
    assert epoch_ended(tally, 2) == tally.last_batch_at
    whole = drain(loader(), started=started, max_batches=None)
    assert whole.batches == 5 and epoch_ended(whole, None) >= closed[1]


def test_an_epoch_short_of_its_batches_or_with_a_sample_twice_is_an_error():
    from storebench.studies.shared_cases import EpochTally, check_epoch

    case = Case(study="s", function=f"{FNS}:no_such_case", dataset="/d", batch_size=4)
    short = EpochTally(samples=8, seen=[np.arange(4), np.arange(4, 8)])
    check_epoch(case, short, 100, 2)
    with pytest.raises(RuntimeError, match="/d: an epoch of 3 batches delivered 8 samples, "
                                           "expected 12"):
        check_epoch(case, short, 100, 3)
    twice = EpochTally(samples=8, seen=[np.arange(4), np.arange(3, 7)])
    with pytest.raises(RuntimeError, match="/d: an epoch of 2 batches delivered a sample "
                                           "twice"):
        check_epoch(case, twice, 100, 2)
    with pytest.raises(RuntimeError, match="/d: an epoch did not deliver every sample once"):
        check_epoch(case, twice, 8, None)
    with pytest.raises(RuntimeError, match="/d: an epoch delivered 8 samples, the dataset "
                                           "has 9"):
        check_epoch(case, short, 9, None)


def test_a_preloaded_case_warms_up_without_preloading(ci_data_dir, monkeypatch):
    """The warm-up's few batches come through the case's loader path over a lazy dataset
    (a preload would read the whole set for nothing); a timed repeat preloads."""
    import storebench.loaders
    from storebench.bench.case import WARMUP_BATCHES, Trial
    from storebench.bench.schema import CASE_REPEAT
    from storebench.studies.shared_cases import loader_epoch_case

    path = ci_data_dir / "memmap-raw"
    case = Case(study="s", function="storebench.studies.shared_cases:loader_epoch_case",
                format="memmap", encoding="raw", dataset=str(path), loader="preloaded",
                prefetcher="thread", workers=2, batch_size=32, access="shuffle", repeats=1)
    preloads = []
    real = storebench.loaders.PreloadedDataset

    class Counted(real):
        def __init__(self, *args, **kwargs):
            preloads.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(storebench.loaders, "PreloadedDataset", Counted)
    warm = loader_epoch_case(case, Trial(case, CASE_REPEAT))
    assert warm["samples"] == (WARMUP_BATCHES * 32, "count") and preloads == []
    timed = loader_epoch_case(case, Trial(case, 0))
    # Its epochs run on until the steady window holds a batch past the read-ahead: here
    # within the first, over the one preload.
    assert timed["samples"][0] >= (4 + 2) * 32 and timed["steady_epochs"] == (1, "count")
    assert preloads == [1]


@pytest.mark.timeout(60)
def test_the_warm_up_runs_in_whatever_cache_state_and_each_repeat_in_its_own(tmp_path):
    data, seen = tmp_path / "data.bin", tmp_path / "seen.txt"
    data.write_bytes(os.urandom(1 << 20))  # just written: resident
    case = Case(study="s", function=f"{FNS}:residency_case", cache="cold",
                cache_files=(str(data),), repeats=2, params={"seen_file": str(seen)})
    outcome = run_case(case, python_path=[HERE])
    assert outcome.status == "ok", outcome.error
    assert seen.read_text().split() == ["-1", "1.0", "0", "0.0", "1", "0.0"]
    rows = [r for r in outcome.records if r["metric"] == "samples"]
    assert [r["resident_fraction"] for r in rows] == [0.0, 0.0]


def test_a_warm_up_gives_its_loader_only_the_batches_it_reads(ci_data_dir, monkeypatch):
    """A prefetcher handed a whole epoch reads ahead (its first idle thread takes the third
    batch before the second is done), and its stop waits for what its threads hold: the
    warm-up's loader gets just its batches, and so does each capped epoch of a timed
    repeat."""
    import storebench.loaders
    from storebench.bench.case import WARMUP_BATCHES, Trial
    from storebench.bench.schema import CASE_REPEAT
    from storebench.studies.shared_cases import loader_epoch_case, warmup_samples

    path = ci_data_dir / "memmap-raw"
    case = Case(study="s", function="storebench.studies.shared_cases:loader_epoch_case",
                format="memmap", encoding="raw", dataset=str(path), loader="lazy",
                prefetcher="thread", workers=2, batch_size=32, access="shuffle", repeats=1,
                epoch_samples=WARMUP_BATCHES * 32)
    read = []
    real = storebench.loaders.LazyDataset

    class Counted(real):
        def get_batch(self, indices, out=None):
            read.append(len(indices))
            return super().get_batch(indices, out=out)

    monkeypatch.setattr(storebench.loaders, "LazyDataset", Counted)
    assert read_manifest(path)["num_samples"] > 4 * 32
    warm = loader_epoch_case(case, Trial(case, CASE_REPEAT))
    assert warm["samples"] == (WARMUP_BATCHES * 32, "count")
    assert read == [32] * WARMUP_BATCHES
    timed = Trial(case, 0)
    assert warmup_samples(case, timed, timed.batches_wanted(None, samples=10_000)) is None
    # A timed repeat's capped epochs end as whole ones (its loader keeps its threads for the
    # next) and run on until the steady window holds a batch past the read-ahead of 4.
    read.clear()
    metrics = loader_epoch_case(case, timed)
    assert metrics["samples"] == (3 * WARMUP_BATCHES * 32, "count")
    assert read == [32] * 3 * WARMUP_BATCHES


def test_orphaned_shared_memory_segments_are_removed_live_ones_kept(tmp_path):
    """A segment whose creator is gone (a whole-session kill takes the resource tracker
    too) is unlinked before the next case; a live creator's, or anyone else's, stays."""
    from storebench.processes import SHM_PREFIX, remove_orphaned_shm_segments

    dead, alive = _dead_pid(), os.getpid()
    orphans = [f"{SHM_PREFIX}{dead}_0a1b2c3d", f"{SHM_PREFIX}{dead}_ffff0000"]
    kept = [f"{SHM_PREFIX}{alive}_0a1b2c3d", f"{SHM_PREFIX}{dead}", f"{SHM_PREFIX}x_{dead}",
            f"psm_{dead}_0a1b", f"other{SHM_PREFIX}{dead}_00"]
    for name in orphans + kept:
        (tmp_path / name).write_bytes(b"\0" * 64)
    assert remove_orphaned_shm_segments(tmp_path) == sorted(orphans)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
    assert remove_orphaned_shm_segments(tmp_path / "missing") == []



def test_case_processes_load_the_package_from_bytecode_even_where_none_is_written():
    import importlib.util

    import data_gen
    import storebench
    from storebench.bench import worker

    package, generator = Path(storebench.__file__).parent, Path(data_gen.__file__).parent
    cached = Path(importlib.util.cache_from_source(worker.__file__))
    cached.unlink(missing_ok=True)
    assert byte_compile_package() == [package, generator]
    assert cached.is_file()
    # what a case worker does under PYTHONDONTWRITEBYTECODE: reads that bytecode
    loaded = subprocess.run(
        [sys.executable, "-v", "-c", "import storebench.bench.worker"],
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, capture_output=True, text=True,
        check=True)
    assert f"code object from '{cached}'" in loaded.stderr


def test_wait_for_exit_returns_the_exit_status_or_times_out_leaving_the_process():
    from storebench.processes import wait_for_exit

    done = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    assert wait_for_exit(done, 30) == 7
    assert wait_for_exit(done, 30) == 7  # already collected
    killed = subprocess.Popen([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"])
    assert wait_for_exit(killed, 30) == -signal.SIGKILL
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            wait_for_exit(running, 0.2)
        assert running.poll() is None
    finally:
        running.kill()
    assert wait_for_exit(running, 30) == -signal.SIGKILL


@pytest.mark.timeout(60)
def test_a_kept_service_starts_once_per_case_and_stops_after_its_last_trial(tmp_path):
    log = tmp_path / "service.log"
    case = Case(study="kept", function=f"{FNS}:kept_service_case", repeats=3, warmup=True,
                params={"log": str(log), "link": "20ms"})
    outcome = run_case(case, python_path=[HERE])
    assert outcome.status == "ok", outcome.error
    lines = log.read_text().splitlines()
    assert [line.partition("|")[0] for line in lines] == [
        "start warm-up", "trial -1 warm-up",
        "start 20ms", "trial 0 20ms", "trial 1 20ms", "trial 2 20ms",
        "stop 20ms", "stop warm-up"]  # the last made stops first, after the last trial
    assert len({line.partition("|")[2] for line in lines if " 20ms|" in line}) == 1


def test_a_trial_without_the_workers_resources_starts_and_stops_its_service_itself(
        tmp_path):
    from bench_case_functions import kept_service_case

    log = tmp_path / "service.log"
    case = Case(study="kept", function=f"{FNS}:kept_service_case",
                params={"log": str(log), "link": "2ms"})
    for repeat in (0, 1):
        kept_service_case(case, Trial(case, repeat))
    assert [line.partition("|")[0] for line in log.read_text().splitlines()] == [
        "start 2ms", "trial 0 2ms", "stop 2ms", "start 2ms", "trial 1 2ms", "stop 2ms"]


def test_a_semaphore_another_live_process_made_during_a_case_is_left_alone():
    # glibc maps a semaphore under a temporary name it then deletes: a live process's
    # spawn-context lock shows in its maps as "/dev/shm/sem.XXXXXX (deleted)", and the
    # cleanup after a case must still see that it is held (another program's spawned
    # children open it by name).
    from storebench.bench.runner import remove_unheld_multiprocessing_shm

    before = set(os.listdir("/dev/shm"))
    lock = multiprocessing.get_context("spawn").Lock()
    (name,) = [n for n in set(os.listdir("/dev/shm")) - before if n.startswith("sem.mp-")]
    dead_group = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                                capture_output=True, text=True, check=True).stdout.strip()
    assert remove_unheld_multiprocessing_shm(int(dead_group), before) == []
    assert (Path("/dev/shm") / name).exists()
    del lock
