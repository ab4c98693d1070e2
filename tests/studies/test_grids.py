"""Profile plans and the studies' grids: every kind of case is laid out on the ci profile,
knob variants and readahead knobs are measured, and the new case functions run for real."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import numpy as np
import pytest

from data_gen import PROFILES
from storebench.bench.case import Case, Trial
from storebench.bench.plan import (
    REPEAT_BUDGET_S,
    SCREEN_REPEATS,
    case_timeout_s,
    default_repeats,
    plan_for,
)
from storebench.bench.runner import run_case
from storebench.bench.stats import MIN_DECISION_REPEATS, AdaptiveRepeats  # noqa: E402
from storebench.formats import FORMATS, build_dataset, knob_variants
from storebench.loaders.paths import LOADER_PATHS
from storebench.studies import STUDIES
from storebench.studies.formats.grid import grid as formats_study
from storebench.studies.gpu_feed.grid import grid as gpu_feed_study
from storebench.studies.lazy_vs_preloaded.grid import grid as lazy_vs_preloaded_study
from storebench.studies.prefetch.grid import grid as prefetch_study
from storebench.studies.targets.cases import TARGETS, get_target, summarise_target, target_ratio
from storebench.studies.targets.grid import grid as targets_study


def test_repeats_and_timeout_depend_on_the_profile(ci_data_root):
    assert (default_repeats("ci"), case_timeout_s("ci")) == (3, 300.0)
    assert (default_repeats("small"), case_timeout_s("small")) == (3, 600.0)
    assert plan_for("ci").compact and not plan_for("small").compact
    assert plan_for("ci").adaptive is None
    assert plan_for("small").adaptive == AdaptiveRepeats(
        minimum=SCREEN_REPEATS, maximum=9, halfwidth=0.05, budget_s=REPEAT_BUDGET_S)
    # The top-up's floor takes the top two of every question to the decision's repeats;
    # not on ci, whose numbers decide nothing.
    assert plan_for("small").decision_repeats == MIN_DECISION_REPEATS
    assert plan_for("ci").decision_repeats is None
    for name, study in STUDIES.items():
        if name == "out_of_core":
            continue  # two epochs per case: its own repeats rule (tested with its grid)
        if name == "resume":
            continue  # one killed epoch per repeat: its own rule (test_resume_study.py)
        # Build costs come from the manifest, an audit's counts from one seeded run: one
        # repeat whatever the plan says.
        planned = study.grid(profile="ci", data_dir=ci_data_root)
        assert planned, name
        once = [c for c in planned if c.measured_once]
        assert {c.repeats for c in once} <= {1}, name
        timed = [c for c in planned if not c.measured_once]
        if not timed:
            continue
        assert {c.repeats for c in timed} == {3}, name
        asked = [c for c in study.grid(profile="ci", data_dir=ci_data_root, repeats=2)
                 if not c.measured_once]
        assert {c.repeats for c in asked} == {2}, name
        assert {c.min_repeats for c in timed + asked} == {None}, name  # fixed counts


def test_default_plan_repeats_adaptively(ci_data_root, monkeypatch):
    """What make study runs (the default plan, here on the ci data): every timed case of
    the studies that follow the plan repeats adaptively (3..9, until the median's interval
    is within 5 % or the repeat budget is spent; the targets without the budget, and the
    cases whose verdicts the top-up does not repeat, a target's or the remote study's one
    rank over S3, from 5)."""
    from storebench.bench import plan

    monkeypatch.setitem(plan.PLANS, "ci", plan.StudyPlan(compact=True))
    for name in ("formats", "lazy_vs_preloaded", "prefetch", "gpu_feed", "targets", "remote"):
        timed = [c for c in STUDIES[name].grid(profile="ci", data_dir=ci_data_root)
                 if not c.function.endswith(":build_cost_case")]
        budget = None if name == "targets" else REPEAT_BUDGET_S
        for case in timed:
            decides_a_target = name == "targets" or (
                name == "remote" and case.param("source") == "s3"
                and case.param("ranks") == 1 and not case.param("bandwidth_mbit"))
            minimum = MIN_DECISION_REPEATS if decides_a_target else SCREEN_REPEATS
            assert (case.min_repeats, case.repeats, case.stop_halfwidth,
                    case.repeat_budget_s) == (minimum, 9, 0.05, budget), case.case_id
        # A target's repeats know its threshold, which an undecided interval holds.
        thresholds = {c.case_id: c.stop_threshold for c in timed}
        if name == "targets":
            assert thresholds == {c.case_id: get_target(c.param("target")).threshold
                                  for c in timed}
        else:
            assert set(thresholds.values()) == {None}, name

@pytest.fixture(scope="module")
def variant_data(tmp_path_factory):
    """The ci raw set as the default hdf5 build and one knob variant (chunks of one)."""
    root = tmp_path_factory.mktemp("variants")
    spec = PROFILES["ci"].spec_for("raw")
    variant = next(v for v in knob_variants() if v.format == "hdf5")
    build_dataset(spec, "hdf5", root, workers=1)
    build_dataset(spec, "hdf5", root, knobs=dict(variant.knobs), name=variant.name, workers=1)
    return root, variant


def test_formats_study_measures_the_knob_variants_beside_the_default(variant_data):
    root, variant = variant_data
    assert variant.name == "hdf5-raw-chunk_samples=1"
    cases = formats_study(profile="ci", data_dir=root)
    mine = [c for c in cases if c.param("dataset_name") == variant.name]
    assert {c.function.rpartition(":")[2] for c in mine} == {
        "build_cost_case", "sequential_read_case", "random_read_case"}
    assert all(c.param("knob_chunk_samples") == 1 and c.param("knob_compression") is None
               and "knob_compression" not in dict(c.params) for c in mine)
    default = [c for c in cases if c.param("dataset_name") is None]
    assert default and all(not any(k.startswith("knob_") for k, _ in c.params) for c in default)
    # The loader studies measure default builds only.
    assert all("chunk_samples" not in c.dataset
               for c in lazy_vs_preloaded_study(profile="ci", data_dir=root))


def test_random_read_case_reads_real_bytes_at_shuffled_indices(variant_data):
    from storebench.studies.formats.cases import random_read_case

    root, variant = variant_data
    case = Case(study="formats", function="storebench.studies.formats.cases:random_read_case",
                format="hdf5", encoding="raw", dataset=str(root / variant.name),
                loader="reader", access="shuffle", batch_size=64, repeats=1,
                params={"random_samples": 100})
    metrics = random_read_case(case, Trial(case, 0))
    assert metrics["samples"] == (100, "count")
    assert metrics["read_MBps"][0] > 0 and metrics["samples_per_s"][1] == "samples/s"


def test_a_random_read_stops_after_its_seconds_once_it_has_four_batches(variant_data):
    from storebench.studies.formats.cases import MIN_TIMED_BATCHES, random_read_case

    root, variant = variant_data
    case = Case(study="formats", function="storebench.studies.formats.cases:random_read_case",
                format="hdf5", encoding="raw", dataset=str(root / variant.name),
                loader="reader", access="shuffle", batch_size=8, repeats=1,
                params={"random_samples": 100, "random_seconds": 0.0})
    assert random_read_case(case, Trial(case, 0))["samples"] == (MIN_TIMED_BATCHES * 8, "count")
    roomy = replace(case, params={"random_samples": 100, "random_seconds": 600.0})
    assert random_read_case(roomy, Trial(roomy, 0))["samples"] == (100, "count")
    # Fewer samples than four batches: all of them, however short the time.
    few = replace(case, params={"random_samples": 20, "random_seconds": 0.0})
    assert random_read_case(few, Trial(few, 0))["samples"] == (20, "count")


def test_only_warm_random_reads_are_cut_by_time(variant_data, monkeypatch):
    from storebench.bench.plan import StudyPlan
    from storebench.studies.formats import grid as formats
    from storebench.studies.formats.grid import RANDOM_READ_SECONDS

    root, _ = variant_data
    monkeypatch.setattr(formats, "plan_for", lambda profile: StudyPlan())  # warm ones too
    random = [c for c in formats_study(profile="ci", data_dir=root)
              if c.function.endswith(":random_read_case")]
    seconds = {cache: {c.param("random_seconds") for c in random if c.cache == cache}
               for cache in ("cold", "warm")}
    assert seconds == {"cold": {None}, "warm": {RANDOM_READ_SECONDS}}


@pytest.mark.timeout(300)
def test_the_loader_studies_lay_out_every_kind_of_case_on_ci(ci_data_root):
    lvp = lazy_vs_preloaded_study(profile="ci", data_dir=ci_data_root)
    raw_formats = {name for name, m in FORMATS.items()
                   if "raw" in m.ENCODINGS and name in FORMATS.core}
    plain = [c for c in lvp if not any(k.startswith("open_") for k, _ in c.params)]
    for fmt in raw_formats:
        lazy = {(c.access, c.cache) for c in plain
                if c.format == fmt and c.encoding == "raw" and c.loader == "lazy"}
        assert lazy == {(a, s) for a in ("sequential", "shuffle", "block_shuffle")
                        for s in ("cold", "warm")}, fmt
        # Preloaded: one case per cache state, its other orders read from the same preload.
        preloaded = {(c.access, c.cache, c.param("ram_orders")) for c in plain
                     if c.format == fmt and c.encoding == "raw" and c.loader == "preloaded"}
        assert preloaded == {("block_shuffle", s, "sequential,shuffle")
                             for s in ("cold", "warm")}, fmt
    assert all(c.param("ram_orders") is None for c in lvp
               if c.encoding != "raw" or c.loader != "preloaded")
    knobs = {(c.format, json.dumps(dict(c.params))) for c in lvp if c not in plain}
    assert knobs == {("memmap", '{"open_madvise_random": true}'),
                     ("memmap", '{"open_madvise_random": false}'),
                     ("lmdb", '{"open_readahead": true}'), ("lmdb", '{"open_readahead": false}')}
    assert all(c.cache == "cold" and c.access == "shuffle" for c in lvp if c not in plain)
    assert {c.encoding for c in lvp} == {"raw", "png", "jpeg"}

    prefetch = prefetch_study(profile="ci", data_dir=ci_data_root)
    # Every registered loader path of the storebench, framework and baseline families.
    assert {c.prefetcher for c in prefetch} == {
        name for name, path in LOADER_PATHS.items() if path.family != "peer"}
    for decode in ("pil", "simplejpeg"):
        assert {c.prefetcher for c in prefetch if c.param("decode") == decode} >= {
            "none", "thread", "process"}
    for kind in ("thread", "process"):
        assert {c.workers for c in prefetch if c.prefetcher == kind
                and c.param("decode") == "simplejpeg"} == {1, 2, 4}
    (native,) = [c for c in prefetch if c.prefetcher == "tf_data"]
    assert native.format == "tfrecord" and native.encoding == "jpeg"

    feed = gpu_feed_study(profile="ci", data_dir=ci_data_root)
    for case in feed:
        assert case.param("emulated") is (case.param("device") == "cpu")
        assert case.param("device_name")
    # ci: an idle and a busy accelerator under both loaders (other profiles add 2 ms).
    assert {c.param("compute_ms") for c in feed} == {0.0, 10.0}
    assert {c.prefetcher for c in feed} == {"none", "process"}

    targets = targets_study(profile="ci", data_dir=ci_data_root)
    assert [c.loader for c in targets] == [t.key for t in TARGETS]
    assert all(c.summarise == "storebench.studies.targets.cases:summarise_target" for c in targets)
    # A case warm-up only where the measure function's own does not do: the Parquet target
    # times its first pass so that both sides see the same cache state, tf.data's first
    # pipeline in a process runs slow.
    assert {c.loader for c in targets if c.warmup} == {"block_vs_random_parquet",
                                                       "torch_vs_tf_data"}


@pytest.mark.parametrize("cuda", [False, True], ids=["no-cuda", "cuda"])
def test_feed_grid_copies_every_way_and_reaches_below_2_ms_only_where_cuda_copies(
        ci_data_root, monkeypatch, cuda):
    """Without a compact plan, where torch sees a CUDA device (as ``cuda_info`` reports
    it): three copy modes and the prefetch processes' own pinned slots, a ThreadPrefetcher
    pageable and from its own page-locked buffers, and the sub-2 ms compute times; where it
    does not, pageable copies to the CPU at 0, 2 and 10 ms, and no thread loader."""
    from storebench.bench import envinfo, plan
    from storebench.studies.gpu_feed.grid import COMPUTE_MS, CUDA_COMPUTE_MS

    monkeypatch.setitem(plan.PLANS, "ci", plan.StudyPlan(compact=False))
    monkeypatch.setattr(envinfo, "cuda_info", lambda: {
        "torch_cuda_available": cuda, "devices": ["NVIDIA H200"] if cuda else []})
    feed = gpu_feed_study(profile="ci", data_dir=ci_data_root)
    times = CUDA_COMPUTE_MS if cuda else COMPUTE_MS
    assert sorted({c.param("compute_ms") for c in feed}) == list(times)
    modes = {(c.prefetcher, c.workers, c.param("pinned", False),
              c.param("non_blocking", False), c.param("pin_memory", False)) for c in feed}
    assert modes == ({
        ("none", 0, False, False, False), ("none", 0, True, False, False),
        ("none", 0, True, True, False),
        ("process", 2, False, False, False), ("process", 2, True, False, False),
        ("process", 2, True, True, False), ("process", 2, True, False, True),
        ("thread", 2, False, False, False), ("thread", 2, True, False, True),
    } if cuda else {("none", 0, False, False, False), ("process", 2, False, False, False)})
    assert {c.param("device") for c in feed} == {"cuda" if cuda else "cpu"}
    assert {c.param("device_name") for c in feed} == {"NVIDIA H200" if cuda else "cpu"}
    # Threads have no start method; the processes fork, as their loader path does.
    assert {(c.prefetcher, c.param("start_method")) for c in feed if c.workers} == (
        {("process", "fork"), ("thread", None)} if cuda else {("process", "fork")})
    assert len(feed) == len({c.case_id for c in feed}) == len(times) * len(modes)


def test_the_feed_grid_adds_processes_per_core_only_where_the_epoch_can_time_them(
        ci_data_root, monkeypatch):
    """On 8 cores the ci set's 8 batches leave nothing to time after 2 start-up batches
    and the 16 that 8 processes read ahead: the grid stays the 2-core one."""
    import os

    from storebench.studies.gpu_feed.grid import batches_before_timing

    two = gpu_feed_study(profile="ci", data_dir=ci_data_root)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    eight = gpu_feed_study(profile="ci", data_dir=ci_data_root)
    assert [c.case_id for c in eight] == [c.case_id for c in two]
    assert batches_before_timing(0) == 2 and batches_before_timing(2) == 6
    assert batches_before_timing(8) == 18


def test_target_ratio_takes_the_best_numerator_path_and_the_summary_the_median():
    tf_target = get_target("torch_vs_tf_data")
    assert target_ratio(tf_target, {"torch_thread_prefetcher.samples_per_s": 250.0,
                                    "torch_process_prefetcher.samples_per_s": 300.0,
                                    "torch_dataloader.samples_per_s": 100.0,
                                    "tf_data_autotune.samples_per_s": 200.0}) == 1.5
    with pytest.raises(KeyError, match="did not measure"):
        target_ratio(tf_target, {"torch_dataloader.samples_per_s": 1.0})
    case = Case(study="targets", function="m:f", params={"target": "process_vs_pickled"})
    def summary(values):
        records = [{"repeat": r, "metric": "target_ratio", "value": v}
                   for r, v in enumerate(values)]
        return summarise_target(case, records)

    # Met only when the 95% interval's lower end clears the threshold, not the median alone.
    assert summary([2.0, 4.0, 3.5]) == {
        "target_value": (3.5, "ratio"), "target_low": (2.0, "ratio"),
        "target_high": (4.0, "ratio"), "target_threshold": (3.0, "ratio"),
        "target_met": (0.0, "count")}
    assert summary([3.2, 3.5, 3.4, 3.3])["target_met"] == (1.0, "count")


@pytest.mark.timeout(120)
def test_a_target_case_writes_its_value_threshold_and_verdict(ci_data_root):
    (case,) = [c for c in targets_study(profile="ci", data_dir=ci_data_root, repeats=2)
               if c.loader == "block_vs_random_parquet"]
    outcome = run_case(case, timeout_s=110)
    assert outcome.status == "ok", outcome.error
    ratios = [r["value"] for r in outcome.records if r["metric"] == "target_ratio"]
    whole = {r["metric"]: r["value"] for r in outcome.records if r["repeat"] == -1}
    assert len(ratios) == 2
    assert whole["target_value"] == pytest.approx(float(np.median(ratios)))
    assert whole["target_threshold"] == 200.0
    assert whole["target_low"] <= whole["target_value"] <= whole["target_high"]
    assert whole["target_met"] == float(whole["target_low"] >= 200.0)


@pytest.mark.timeout(120)
def test_the_locked_list_baseline_delivers_a_whole_epoch(ci_data_root):
    (case,) = [c for c in prefetch_study(profile="ci", data_dir=ci_data_root, repeats=1)
               if c.prefetcher == "locked_list_baseline"]
    outcome = run_case(case, timeout_s=110)
    assert outcome.status == "ok", outcome.error
    samples = {r["value"] for r in outcome.records if r["metric"] == "samples"}
    assert samples == {PROFILES["ci"].spec_for(case.encoding).num_samples}


@pytest.mark.parametrize("name", list(STUDIES))
def test_every_study_lays_out_unique_cases_over_the_built_data(name, ci_data_root):
    cases = STUDIES[name].grid(profile="ci", data_dir=ci_data_root, repeats=2)
    assert cases, name
    ids = [case.case_id for case in cases]
    assert len(ids) == len(set(ids))
    for case in cases:
        assert case.study == name
        if STUDIES[name].reads_profile_sets:
            assert case.dataset.startswith(str(ci_data_root))
        if case.cache:
            assert case.cache_files and all(f.startswith(case.dataset) for f in case.cache_files)
        assert case.repeats in (1, 2)
        if case.prefetcher:
            assert case.prefetcher in LOADER_PATHS  # cases key on registry names


def test_a_grid_over_missing_data_says_what_to_build(tmp_path):
    with pytest.raises(FileNotFoundError, match="no datasets of profile 'ci'"):
        STUDIES["formats"].grid(profile="ci", data_dir=tmp_path)


@pytest.mark.timeout(120)
def test_a_preloaded_cold_epoch_runs_in_a_worker(ci_data_root):
    from storebench.bench.cache import resident_fraction

    case = next(c for c in lazy_vs_preloaded_study(profile="ci", data_dir=ci_data_root,
                                                   repeats=1)
                if c.loader == "preloaded" and c.cache == "cold" and c.encoding == "raw")
    outcome = run_case(case, timeout_s=110)
    assert outcome.status == "ok", outcome.error
    metrics = {r["metric"]: r for r in outcome.records}
    # The preload (cold) then the epoch until its steady window holds the plan's batches:
    # one thread reads nothing ahead, so the window opens at the first batch.
    assert metrics["read_ahead_batches"]["value"] == 0
    assert metrics["steady_batches"]["value"] == case.steady_batches == 3
    assert metrics["samples"]["value"] == (1 + case.steady_batches) * case.batch_size
    assert metrics["samples"]["resident_fraction"] < 0.05
    assert metrics["preload_seconds"]["value"] > 0
    assert metrics["time_to_first_batch_s"]["value"] >= metrics["preload_seconds"]["value"]
    assert resident_fraction(case.cache_files) > 0.95
    # The other orders, each a fresh loader over the same preload (checked by check_epoch),
    # timed after the case's own, with a steady window of its own.
    for order in ("sequential", "shuffle"):
        assert metrics[f"{order}.samples_per_s"]["unit"] == "samples/s"
        assert metrics[f"{order}.steady_batches"]["value"] == case.steady_batches
        assert metrics[f"{order}.steady_seconds"]["value"] > 0
    assert not any(name.startswith("block_shuffle.") for name in metrics)


def test_ram_orders_are_a_preloaded_cases_other_orders_only(ci_data_root):
    from storebench.studies.shared_cases import ram_orders

    case = next(c for c in lazy_vs_preloaded_study(profile="ci", data_dir=ci_data_root)
                if c.loader == "preloaded" and c.encoding == "raw")
    assert ram_orders(case) == ("sequential", "shuffle")
    assert ram_orders(dataclasses.replace(case, params={})) == ()
    with pytest.raises(ValueError, match="ram_orders needs loader 'preloaded', got 'lazy'"):
        ram_orders(dataclasses.replace(case, loader="lazy"))
    for text in ("block_shuffle", "sequential,sequential", "random"):
        with pytest.raises(ValueError, match=f"other than the case's 'block_shuffle', got "
                                             f"'{text}'"):
            ram_orders(dataclasses.replace(case, params={"ram_orders": text}))


def test_out_of_core_repeats_what_the_guide_compares(ci_data_root, monkeypatch):
    from storebench.bench.plan import StudyPlan
    from storebench.studies.out_of_core import study as out_of_core

    grid = out_of_core.out_of_core_grid
    assert {c.repeats for c in grid(profile="ci", data_dir=ci_data_root)} == {1}
    assert {c.repeats for c in grid(profile="ci", data_dir=ci_data_root, repeats=2)} == {2}
    # A full plan over the same datasets: the shuffled raw reads under a cap (the guide's
    # candidates) get the guide's repeats, every other case one.
    monkeypatch.setattr(out_of_core, "plan_for", lambda profile: StudyPlan())
    cases = grid(profile="ci", data_dir=ci_data_root)
    guided = [c for c in cases if c.encoding == "raw" and c.loader == "lazy"
              and c.access != "sequential" and c.param("k") > 0
              and not any(k.startswith(("open_", "knob_")) for k, _ in c.params)]
    assert guided and {c.repeats for c in guided} == {out_of_core.GUIDE_REPEATS}
    assert {c.repeats for c in cases if c not in guided} == {1}
    assert out_of_core.GUIDE_REPEATS >= 3


def test_out_of_core_cuts_passes_under_a_cap_sooner_than_where_the_set_fits(ci_data_root):
    from storebench.studies.out_of_core import study as out_of_core

    cases = out_of_core.out_of_core_grid(profile="ci", data_dir=ci_data_root)
    limits = {capped: {c.param("epoch_seconds_limit") for c in cases
                       if (c.param("k") > 0) == capped} for capped in (True, False)}
    assert limits == {True: {out_of_core.CAPPED_EPOCH_SECONDS_LIMIT},
                      False: {out_of_core.EPOCH_SECONDS_LIMIT}}
    assert out_of_core.CAPPED_EPOCH_SECONDS_LIMIT < out_of_core.EPOCH_SECONDS_LIMIT


@pytest.mark.timeout(120)
def test_a_feed_case_is_timed_past_the_batches_its_loader_read_ahead(ci_data_root):
    """Timed from the third batch, a slow prefetcher's first ``depth`` batches were ready
    before the feed began and counted as fed: the case now feeds them first, and says how
    many batches it fed before timing."""
    from storebench.loaders.prefetch import default_depth
    from storebench.studies.gpu_feed.cases import START_BATCHES, gpu_feed_case

    by_loader = {}
    for case in gpu_feed_study(profile="ci", data_dir=ci_data_root):
        if case.param("compute_ms") == 0.0:
            by_loader[case.workers] = gpu_feed_case(case, Trial(case, 0))
    assert by_loader[0]["warmup_batches"] == (START_BATCHES, "count")
    assert by_loader[2]["warmup_batches"] == (START_BATCHES + default_depth(2), "count")
    # The ci set's 8 batches leave 2 to time after 6 fed first.
    assert by_loader[2]["samples"][0] == 2 * 64
