"""The corruption fuzzer over every ci format and encoding: no wrong sample, no hang, no crash.

The fuzz run here makes one damaged copy per damage class per dataset (``storebench fuzz``
makes 50 and more); the bar is the issue's, asserted on exactly these rows.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from storebench.formats import FORMATS, find_datasets, unavailable_reason
from storebench.fuzz import (
    COLUMNS,
    DAMAGES,
    FUZZ_DIR_PREFIX,
    OUTCOMES,
    FuzzTarget,
    KillablePool,
    ReadReport,
    catchable_without_verify,
    classify,
    damages_for,
    make_damaged_copy,
    run_fuzz,
    summarise,
    violations,
)
from storebench.fuzz_hostile import HOSTILE_KINDS

# The fuzzed fixture (a copy per damage and hostile kind of every ci dataset, read in
# both modes) is set up inside the first test that asks for it.
pytestmark = pytest.mark.timeout(900)


def _live(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while _live(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _live(pid)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    if int(f.read().rpartition(")")[2].split()[1]) == pid:
                        found.append(int(entry.name))
            except (OSError, IndexError):
                continue
    return found


def _scratch_dirs(pid: int) -> list[Path]:
    return sorted(Path(tempfile.gettempdir()).glob(f"{FUZZ_DIR_PREFIX}{pid}-*"))


def _shown(rows) -> str:
    return rows[["dataset", "damage", "detail", "verify", "outcome", "exception",
                 "message"]].to_string()


@pytest.fixture(scope="module")
def fuzzed(ci_data_root):
    """One damaged copy per class per ci dataset (classes cycle), read in both modes."""
    df = run_fuzz(ci_data_root, copies_per_dataset=len(DAMAGES), seed=0, timeout_s=20,
                  workers=2, progress=False)
    return df, multiprocessing.active_children(), _scratch_dirs(os.getpid())


def test_every_dataset_gets_every_damage_class_in_both_modes(fuzzed, ci_data_root):
    df, _, _ = fuzzed
    assert list(df.columns) == list(COLUMNS)
    assert set(df["outcome"]) <= set(OUTCOMES)
    # Every dataset under the data dir: the peers study's cut sets in peers/ too.
    datasets = sorted(str(p.relative_to(ci_data_root)) for p in find_datasets(ci_data_root))
    available = [(name, m) for name, m in FORMATS.items() if unavailable_reason(name) is None]
    built = sum(enc in m.ENCODINGS for _, m in available for enc in ("raw", "png", "jpeg"))
    # and raw and JPEG again, cut, in peers/
    built += sum(enc in m.ENCODINGS for _, m in available for enc in ("raw", "jpeg"))
    # Every default build at least; a test earlier in the session may have added knob
    # variants to the shared data root, and those are fuzzed too.
    assert sorted(df["dataset"].unique()) == datasets and len(datasets) >= built
    for name, rows in df.groupby("dataset"):
        # Every dataset has a donor (its next-seed build) for foreign_file.
        target = FuzzTarget.from_path(ci_data_root / name, donors=[ci_data_root / name])
        for verify in (True, False):
            mode = rows[rows["verify"] == verify]
            assert sorted(mode["copy"]) == list(range(len(DAMAGES)))
            assert set(mode["damage"]) == set(damages_for(target))
        # Both modes read the same damaged copy.
        pairs = rows.groupby("copy")["detail"].nunique()
        assert (pairs == 1).all()
    by_format = df.groupby("format")["damage"].apply(set)
    assert {"zero_index_entry", "copy_index_entry"} <= by_format["tfrecord"]
    assert not {"zero_index_entry", "swap_files"} & by_format["hdf5"]
    assert "swap_files" in by_format["rawfiles"] and "swap_files" in by_format["tfrecord"]
    assert "foreign_file" in by_format["memmap"]


def test_no_read_hangs_or_crashes(fuzzed):
    df, _, _ = fuzzed
    bad = df[df["outcome"].isin(["hang", "crash"])]
    assert bad.empty, _shown(bad)


def test_verify_true_never_returns_a_wrong_sample(fuzzed):
    df, _, _ = fuzzed
    bad = df[df["verify"] & (df["outcome"] == "silent_wrong")]
    assert bad.empty, _shown(bad)


def test_verify_false_is_wrong_only_where_no_check_can_see_the_damage(fuzzed):
    df, _, _ = fuzzed
    catchable = [catchable_without_verify(f, d) for f, d in zip(df["format"], df["damage"])]
    bad = df[~df["verify"] & (df["outcome"] == "silent_wrong") & np.array(catchable)]
    assert bad.empty, _shown(bad)


def test_every_error_is_a_dataset_error_naming_the_file(fuzzed):
    df, _, _ = fuzzed
    bad = df[df["outcome"] == "other_error"]
    assert bad.empty, _shown(bad)
    detected = df[df["outcome"] == "detected"]
    assert len(detected) > len(df) // 2
    unnamed = detected[~detected["names_file"]]
    assert unnamed.empty, _shown(unnamed)
    assert violations(df).empty


def test_the_fuzz_run_leaves_no_process_and_no_directory(fuzzed):
    _, children, scratch = fuzzed
    assert children == [] and scratch == []


def test_every_hostile_kind_is_refused_in_every_format_and_mode(fuzzed, ci_data_root):
    """Names out of the copy, links out, FIFOs, devices, link loops and huge headers: each
    refused (detected) on every dataset, in both modes; never read, hung on or crashed."""
    df, _, _ = fuzzed
    hostile = df[[DAMAGES[d].hostile for d in df["damage"]]]
    assert set(hostile["damage"]) == set(HOSTILE_KINDS)
    assert set(hostile["dataset"]) == set(df["dataset"])
    bad = hostile[hostile["outcome"] != "detected"]
    assert bad.empty, _shown(bad)
    assert hostile["names_file"].all(), _shown(hostile[~hostile["names_file"]])


def test_a_hostile_copy_that_reads_harmlessly_breaks_the_bar():
    import pandas as pd

    row = {c: "" for c in COLUMNS} | {"format": "hdf5", "verify": False, "wrong_samples": 0}
    rows = pd.DataFrame([row | {"damage": "symlink_out", "outcome": "harmless"},
                         row | {"damage": "flip_bytes", "outcome": "harmless"},
                         row | {"damage": "fifo", "outcome": "detected"}])
    assert list(violations(rows)["damage"]) == ["symlink_out"]


def test_summary_counts_every_row_once(fuzzed):
    df, _, _ = fuzzed
    table = summarise(df)
    assert list(table.columns) == list(OUTCOMES)
    assert table.to_numpy().sum() == len(df)
    assert table.loc[("memmap", "truncate", True)].sum() == len(
        df[(df["format"] == "memmap") & (df["damage"] == "truncate") & df["verify"]])


# ---------------------------------------------------------------------------------------
# Damage classes
# ---------------------------------------------------------------------------------------
def _tree(root: Path) -> dict[str, bytes]:
    """Each file's bytes; a symbolic link's target instead (never read through: the hostile
    kinds link to /dev/zero)."""
    return {str(p.relative_to(root)): (b"-> " + os.readlink(p).encode() if p.is_symlink()
                                       else p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_symlink() or p.is_file()}


@pytest.fixture(scope="module")
def tfrecord_target(ci_data_root) -> FuzzTarget:
    # tfrecord has every class (shards to swap, index files); the png build is a donor with
    # files of the same names.
    return FuzzTarget.from_path(ci_data_root / "tfrecord-raw",
                                donors=[ci_data_root / "tfrecord-png"])


def test_tfrecord_gets_every_damage_class(tfrecord_target):
    assert damages_for(tfrecord_target) == list(DAMAGES)


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_each_damage_changes_the_copy_and_is_reproducible(tmp_path, tfrecord_target, damage):
    original = _tree(tfrecord_target.path)
    first = make_damaged_copy(tfrecord_target, tmp_path / "a", seed=3, copy=5, damage=damage)
    again = make_damaged_copy(tfrecord_target, tmp_path / "b", seed=3, copy=5, damage=damage)
    damaged = _tree(tmp_path / "a")
    assert first[0] == damage
    assert damaged != original
    assert first == again and _tree(tmp_path / "b") == damaged
    # Other seeds damage differently (some classes have only a few choices: try several).
    details = {make_damaged_copy(tfrecord_target, tmp_path / f"s{seed}", seed=seed, copy=5,
                                 damage=damage)[1] for seed in range(8)}
    assert len(details) > 1
    assert _tree(tfrecord_target.path) == original  # the source is never touched


def test_damages_do_what_their_detail_says(tmp_path, tfrecord_target):
    root = tfrecord_target.path
    _, detail = make_damaged_copy(tfrecord_target, tmp_path / "t", seed=0, copy=0,
                                  damage="truncate")
    rel = detail.split(":")[0]
    assert (tmp_path / "t" / rel).stat().st_size < (root / rel).stat().st_size
    _, detail = make_damaged_copy(tfrecord_target, tmp_path / "d", seed=0, copy=0,
                                  damage="delete_file")
    assert not (tmp_path / "d" / detail.split(":")[0]).exists()
    _, detail = make_damaged_copy(tfrecord_target, tmp_path / "z", seed=0, copy=0,
                                  damage="zero_index_entry")
    rel, rest = detail.split(": entry ")
    entry = int(rest.split()[0])
    assert np.load(tmp_path / "z" / rel)[entry].tolist() == [0, 0]
    assert np.load(root / rel)[entry].tolist() != [0, 0]
    _, detail = make_damaged_copy(tfrecord_target, tmp_path / "s", seed=0, copy=0,
                                  damage="swap_files")
    first, second = detail.removeprefix("swapped ").split(", ")[0].split(" <-> ")
    assert (tmp_path / "s" / first).read_bytes() == (root / second).read_bytes()
    assert (tmp_path / "s" / second).read_bytes() == (root / first).read_bytes()
    _, detail = make_damaged_copy(tfrecord_target, tmp_path / "m", seed=0, copy=0,
                                  damage="manifest_encoding")
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert manifest["encoding"] == manifest["spec"]["encoding"] != "raw"
    assert detail.endswith("digest resealed")


def test_classify_puts_wrong_samples_first():
    def report(**fields):
        return ReadReport(length=8, **fields)

    error = ("CorruptSampleError", "x: sample 3: bad")
    assert classify(report(), 8) == ("harmless", "", "")
    assert classify(report(dataset_errors=2, dataset_error=error), 8) == ("detected", *error)
    assert classify(report(wrong=2, first_wrong=5, dataset_errors=1, dataset_error=error),
                    8) == ("silent_wrong", "CorruptSampleError",
                           "2 sample(s) differ from the undamaged build, the first is 5; "
                           "x: sample 3: bad")
    assert classify(report(other_errors=1, other_error=("struct.error", "unpack"),
                           dataset_errors=1, dataset_error=error), 8) == (
        "other_error", "struct.error", "unpack")
    # Samples missing without any error are silently wrong; with an error, detected.
    assert classify(ReadReport(length=4), 8) == (
        "silent_wrong", "", "4 samples, the undamaged build has 8")
    assert classify(ReadReport(length=4, dataset_errors=1, dataset_error=error), 8)[0] == (
        "detected")
    assert classify(ReadReport(length=-1, dataset_errors=1, dataset_error=error), 8)[0] == (
        "detected")


# ---------------------------------------------------------------------------------------
# Hangs and crashes are counted; nothing outlives the run
# ---------------------------------------------------------------------------------------
def double(value: int) -> int:
    return 2 * value


def segfault() -> None:
    # A real fault, raised synchronously in this thread: os.kill(getpid(), SIGSEGV) may be
    # delivered to another thread of the worker after this function has returned "ok".
    import ctypes

    ctypes.string_at(0)


def sleep_long() -> None:
    time.sleep(600)


def raise_value_error() -> None:
    raise ValueError("boom")


@pytest.mark.timeout(120)
def test_the_pool_counts_hangs_and_crashes_and_goes_on(tmp_path):
    with KillablePool(workers=2, timeout_s=4, log_dir=tmp_path) as pool:
        pool.submit("first", double, value=1)
        pool.submit("crash", segfault)
        pool.submit("hang", sleep_long)
        pool.submit("error", raise_value_error)
        pool.submit("after", double, value=21)
        results = {}
        while pool.busy:
            results.update((r.key, r) for r in pool.results())
        workers = [child.pid for child in multiprocessing.active_children()]
    assert sorted(results) == ["after", "crash", "error", "first", "hang"]
    assert (results["first"].status, results["first"].value) == ("ok", 2)
    assert (results["after"].status, results["after"].value) == ("ok", 42)
    assert results["crash"].status == "crash"
    assert results["crash"].error == "killed by SIGSEGV"
    assert "Segmentation fault" in results["crash"].log  # faulthandler, from the worker
    assert results["hang"].status == "hang"
    assert results["hang"].seconds >= 4
    assert "sleep_long" in results["hang"].log  # where it hung, dumped before the kill
    assert (results["error"].status, results["error"].error) == ("error", "ValueError: boom")
    assert len(workers) == 2
    assert all(_wait_gone(pid) for pid in workers)


_FUZZ_SCRIPT = textwrap.dedent("""
    import sys
    from storebench.fuzz import run_fuzz
    run_fuzz(sys.argv[1], copies_per_dataset=100000, formats=["memmap"], timeout_s=30,
             workers=2, progress=False)
""")


def _start_fuzz(ci_data_root) -> tuple[subprocess.Popen, Path, list[int]]:
    """A fuzz run in a subprocess, once its workers are reading damaged copies."""
    process = subprocess.Popen([sys.executable, "-c", _FUZZ_SCRIPT, str(ci_data_root)],
                               stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dirs = _scratch_dirs(process.pid)
        if dirs and any((dirs[0] / "copies").glob("*")):
            workers = _children(process.pid)
            if len(workers) >= 2:
                return process, dirs[0], workers
        time.sleep(0.05)
    process.kill()
    raise AssertionError("the fuzz run never started reading copies")


@pytest.mark.timeout(120)
def test_ctrl_c_stops_the_fuzz_run_and_leaves_nothing(ci_data_root):
    process, scratch, workers = _start_fuzz(ci_data_root)
    process.send_signal(signal.SIGINT)
    try:
        _, stderr = process.communicate(timeout=60)
    finally:  # a run the interrupt did not stop must not outlive the test
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode != 0 and b"KeyboardInterrupt" in stderr
    assert not scratch.exists()
    assert all(_wait_gone(pid) for pid in workers)


@pytest.mark.timeout(120)
def test_a_sigkilled_fuzz_run_loses_its_workers_and_its_directory_goes_next_time(
    ci_data_root, tmp_path
):
    from storebench.bench.runner import remove_stale_temp_dirs

    process, scratch, workers = _start_fuzz(ci_data_root)
    process.kill()
    process.communicate(timeout=60)
    assert all(_wait_gone(pid) for pid in workers)  # parent-death signal
    assert scratch.exists()
    # What the next run does first:
    assert scratch in remove_stale_temp_dirs(FUZZ_DIR_PREFIX)
    assert not scratch.exists()


def test_bad_arguments_are_refused(ci_data_root, tmp_path):
    with pytest.raises(ValueError, match="copies_per_dataset must be a positive integer"):
        run_fuzz(ci_data_root, copies_per_dataset=0, progress=False)
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        run_fuzz(ci_data_root, workers=True, progress=False)
    with pytest.raises(KeyError, match="unknown format"):
        run_fuzz(ci_data_root, formats=["n5"], progress=False, scratch_dir=tmp_path)
    from storebench.formats import DatasetError

    with pytest.raises(DatasetError, match="no dataset"):
        run_fuzz(tmp_path, progress=False, scratch_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_fuzz_command_writes_the_rows_and_says_whether_the_bar_is_met(ci_data_root, tmp_path):
    from storebench.fuzz import fuzz_command

    shutil.copytree(ci_data_root / "memmap-raw", tmp_path / "data" / "ci" / "memmap-raw")
    out = tmp_path / "fuzz.csv"
    lines = []
    code = fuzz_command(tmp_path / "data", copies_per_dataset=4, seed=1, out=out,
                        timeout_s=20, progress=False, echo=lines.append)
    import pandas as pd

    df = pd.read_csv(out)
    assert len(df) == 8 and set(df["dataset"]) == {"ci/memmap-raw"}
    assert list(df["damage"].unique()) == ["flip_bytes", "zero_range", "truncate",
                                           "append_garbage"]
    assert code == (1 if len(violations(df)) else 0)
    assert lines[0] == f"{out}: 8 rows"
    assert lines[-1] == "\nall 8 reads meet the bar" or "break the bar" in lines[-2]
    with pytest.raises(ValueError, match="is a directory"):
        fuzz_command(tmp_path, out=tmp_path, progress=False)
    with pytest.raises(FileNotFoundError, match="no such directory"):
        fuzz_command(tmp_path / "missing", progress=False)
