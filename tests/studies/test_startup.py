"""The startup study: the ImageNet-size index (arrays and lists serve the same entries, the
set's bytes), what each path pickles per worker, the copy-on-read effect under fork, and the
family running under the ci profile to rows with its metrics, findings and guide rows."""

from __future__ import annotations

import gc
import pickle
import tracemalloc
from pathlib import Path

import numpy as np
import psutil
import pytest

import data_gen
from storebench.bench.case import Case, Trial
from storebench.bench.plan import IMAGENET_TRAIN_SAMPLES, plan_for
from storebench.formats import DatasetError, build_dataset, open_dataset
from storebench.loaders.index import (
    ArrayIndex,
    IndexedDataset,
    ListIndex,
    make_index,
    set_labels,
)
from storebench.studies.grid import StudyNotApplicableError
from storebench.studies.startup import cases as startup_cases
from storebench.studies.startup import grid, guide, report

pytestmark = pytest.mark.timeout(600)
CI = data_gen.PROFILES["ci"]
ENTRIES = 50_000


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """A data root holding only what the study reads: the ci profile's raw memmap set."""
    root = tmp_path_factory.mktemp("startup-data")
    build_dataset(CI.spec_for("raw"), "memmap", root / "ci", workers=1)
    return root


@pytest.fixture(scope="module")
def memmap_set(data_root) -> Path:
    return data_root / "ci" / "memmap-raw"


def children() -> set[int]:
    """Live children other than multiprocessing's per-interpreter helpers, which the first
    spawn or forkserver start leaves running until the interpreter exits."""
    helpers = ("resource_tracker", "forkserver")
    return {c.pid for c in psutil.Process().children(recursive=True)
            if c.status() != psutil.STATUS_ZOMBIE
            and not any(h in " ".join(c.cmdline()) for h in helpers)}


def case_for(dataset: Path, path: str, kind: str, *, method: str | None = None,
             epoch: bool = False, entries: int = ENTRIES) -> Case:
    params = {"index_kind": kind, "index_size": entries,
              **({"start_method": method} if method else {}), **({"epoch": True} if epoch else {})}
    return Case(study="startup", function=f"{grid.CASES}:startup_case", format="memmap",
                encoding="raw", dataset=str(dataset), loader="lazy", prefetcher=path,
                workers=2, batch_size=256, access="shuffle", cache="", warmup=False,
                params=params)


def test_both_index_kinds_serve_the_same_entries_and_the_sets_bytes(memmap_set):
    labels = set_labels(CI.spec_for("raw"))
    arrays, lists = ArrayIndex(labels, 3_000), ListIndex(labels, 3_000)
    picked = np.random.default_rng(0).permutation(3_000)[:300]
    a, b = arrays.lookup(picked), lists.lookup(picked)
    assert a[0] == b[0] and a[0][0].startswith("train/n") and a[0][0].endswith(".JPEG")
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[2], picked % CI.spec_for("raw").num_samples)
    with open_dataset(memmap_set) as reader:
        for index in (arrays, lists):
            batch = IndexedDataset(reader, index).get_batch(picked[:40])
            images, set_label = reader.read_many(picked[:40] % len(reader))
            np.testing.assert_array_equal(batch.images, images)
            np.testing.assert_array_equal(batch.labels, set_label)
            np.testing.assert_array_equal(batch.indices, picked[:40])


def test_an_entry_whose_label_disagrees_with_the_set_is_named(memmap_set):
    labels = set_labels(CI.spec_for("raw"))
    index = ListIndex(labels, 1_000)
    path, label = index.samples[700]
    index.samples[700] = (path, label + 1)
    with open_dataset(memmap_set) as reader:
        dataset = IndexedDataset(reader, index)
        with pytest.raises(DatasetError, match=f"index entry 700 \\({path}\\) says label "
                                               f"{label + 1}, sample {700 % len(reader)}"):
            dataset.get_batch(np.array([3, 700]))
        with pytest.raises(IndexError, match="out of range for 1000 entries"):
            dataset.get_batch(np.array([1_000]))


def deep_size(make) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        made = make()
        size = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del made
    return size


def test_lists_pickle_about_as_large_as_arrays_but_hold_far_more_memory(memmap_set):
    """Each spawned worker is sent the index pickled: about 50 bytes an entry either way
    (lists are not the larger: the arrays' path bytes and integers pickle as dense as the
    lists' strings and small ints). In RAM the lists are several times larger."""
    labels = set_labels(CI.spec_for("raw"))
    with open_dataset(memmap_set) as reader:
        sent = {}
        for kind in ("arrays", "lists"):
            dataset = IndexedDataset(reader, make_index(kind, labels, ENTRIES))
            for path in ("thread", "process", "torch"):
                assert startup_cases.pickled_bytes(path, "fork", dataset) == 0
            assert startup_cases.pickled_bytes("thread", None, dataset) == 0
            process = startup_cases.pickled_bytes("process", "spawn", dataset)
            assert process == startup_cases.pickled_bytes("process", "forkserver", dataset)
            assert process > len(pickle.dumps(dataset.index)) > 0
            torch_sent = startup_cases.pickled_bytes("torch", "spawn", dataset)
            assert process < torch_sent < process + 4096  # the same index, torch's wrapper
            sent[kind] = process
    per_entry = {kind: size / ENTRIES for kind, size in sent.items()}
    assert all(35 < value < 70 for value in per_entry.values()), per_entry
    assert 0.75 < sent["lists"] / sent["arrays"] < 1.25, sent
    held = {kind: deep_size(lambda kind=kind: make_index(kind, labels, ENTRIES))
            for kind in ("arrays", "lists")}
    assert held["lists"] > 3 * held["arrays"], held


@pytest.mark.parametrize("path,method", [("thread", None), ("process", "spawn"),
                                         ("torch", "fork")])
def test_a_startup_case_reports_its_starts_and_leaves_nothing(memmap_set, path, method):
    before = children()
    case = case_for(memmap_set, path, "lists", method=method, entries=5_000)
    metrics = startup_cases.startup_case(case, Trial(case, repeat=0))
    first, last = metrics["first_worker_start_s"][0], metrics["last_worker_start_s"][0]
    assert 0 < first <= last
    assert metrics["time_to_first_batch_s"][0] > 0
    assert metrics["index_entries"] == (5_000.0, "count")
    assert (metrics["pickled_bytes_per_worker"][0] > 0) == (method == "spawn")
    assert metrics["samples"][0] >= 2 * 256  # a batch from every worker, nothing of an epoch
    assert metrics["samples"][0] < 5_000
    assert "worker_uss_growth_bytes" not in metrics
    assert not children() - before


def test_an_epoch_under_fork_shows_the_copy_on_read_of_lists(memmap_set):
    """One epoch of the index in forked workers: reading a list's entries copies the pages
    that hold them into each worker; reading arrays copies nothing."""
    growth = {}
    for kind in ("arrays", "lists"):
        case = case_for(memmap_set, "process", kind, method="fork", epoch=True)
        metrics = startup_cases.startup_case(case, Trial(case, repeat=0))
        assert metrics["samples"] == (float(ENTRIES), "count")
        assert ("cgroup_peak_bytes" in metrics) != ("maxrss_sum_bytes" in metrics)
        growth[kind] = metrics["worker_private_dirty_growth_bytes"][0]
    held = deep_size(lambda: make_index("lists", set_labels(CI.spec_for("raw")), ENTRIES))
    assert growth["lists"] > growth["arrays"] + held / 4, (growth, held)
    assert growth["arrays"] < held / 4, (growth, held)


def test_the_grid_declares_its_index_size_per_plan(data_root, monkeypatch, tmp_path):
    ci = grid.grid(profile="ci", data_dir=data_root / "ci")
    assert plan_for("ci").index_entries == ENTRIES
    assert {c.param("index_size") for c in ci} == {ENTRIES}
    assert {(c.prefetcher, c.param("start_method"), bool(c.param("epoch"))) for c in ci} == {
        *((p, m, False) for p, m in grid.COMPACT_STARTUP_PATHS),
        *((p, m, True) for p, m in grid.MEMORY_PATHS)}
    # The small profile's grid over the ci set (the small set is 245 MB): only the lookup
    # of the set is replaced.
    ci_set = grid.memmap_raw_set("ci", data_root / "ci")
    monkeypatch.setattr(grid, "memmap_raw_set", lambda profile, data_dir: ci_set)
    small = grid.grid(profile="small", data_dir=data_root / "ci")
    assert {c.param("index_size") for c in small} == {IMAGENET_TRAIN_SAMPLES}
    few = {(c.prefetcher, c.param("start_method")) for c in small
           if c.repeats == grid.SLOW_START_REPEATS}
    assert few == grid.SLOW_STARTS
    monkeypatch.undo()
    with pytest.raises(StudyNotApplicableError, match="no datasets of profile 'ci'"):
        grid.grid(profile="ci", data_dir=tmp_path)


def test_the_family_runs_under_the_ci_profile(ci_study):
    """As the session's ci study (``make study``'s path) ran it."""
    from storebench.bench.schema import read_results
    from storebench.results import Results

    profile_dir, _ = ci_study
    rows = read_results(profile_dir / "startup.csv")
    failed = rows[rows["status"] != "ok"]
    assert failed.empty, failed[["case_id", "error"]].to_dict("records")
    metrics = set(rows["metric"])
    assert {"time_to_first_batch_s", "first_worker_start_s", "last_worker_start_s",
            "pickled_bytes_per_worker", "worker_uss_growth_bytes",
            "worker_private_dirty_growth_bytes"} <= metrics
    assert metrics & set(report.PEAKS)
    results = Results.load(profile_dir)
    sentences = report.findings(results)
    assert any("Copy-on-read" in s for s in sentences), sentences
    questions = [row.question for row in guide.guide(results)]
    assert [q.split(":")[0] for q in questions] == ["Fastest to first batch",
                                                    "Least memory for 2 workers"]
    fig = report.plot_startup(results.df)
    assert "an index of 50,000 entries" in fig.get_suptitle()
    assert all(ax.get_xscale() == "linear" for ax in fig.get_axes())
