"""The one results-query layer: which rows count, their medians and spreads, and how two
paths' repeats compare."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from result_rows import (
    OLDER_RUN,
    RUN,
    build_case,
    case_rows,
    frame,
    read_case,
    write_results,
)

from storebench import results
from storebench.bench.case import open_options
from storebench.bench.schema import SchemaError, make_row
from storebench.formats import FORMATS
from storebench.results import MIN_PAIRED_REPEATS, Results, Stat, ratio_interval


# -- selecting -----------------------------------------------------------------------------
def test_stat_is_the_median_of_ok_timed_repeats_of_the_latest_run():
    df = frame(
        read_case("memmap", "warm", [10.0, 30.0, 20.0]),
        # an older run of the same case, and a whole-case row: both ignored
        case_rows("formats", "read:memmap-raw/sequential/warm", {"samples_per_s": [999.0]},
                  run_id=OLDER_RUN, format="memmap", encoding="raw", loader="reader",
                  cache="warm"),
        [make_row(run_id=RUN, study="formats", case_id="read:memmap-raw/sequential/warm",
                  repeat=-1, metric="samples_per_s", value=5.0, unit="samples/s",
                  status="ok", format="memmap", encoding="raw", loader="reader",
                  cache="warm")],
    )
    value = results.stat(df, "samples_per_s", format="memmap", cache="warm")
    assert (value.median, value.low, value.high, value.count) == (20.0, 10.0, 30.0, 3)
    assert value.values == (10.0, 30.0, 20.0)  # repeat order, for pairing
    assert value.unit == "samples/s"
    assert str(value) == "20.0 samples/s"
    assert value.spread == "10.0 samples/s\u201330.0 samples/s"


def test_latest_runs_keeps_each_cases_newest_run_only():
    df = frame(read_case("memmap", "warm", [1.0], ),
               case_rows("formats", "read:memmap-raw/sequential/warm", {"samples_per_s": [2.0]},
                         run_id=OLDER_RUN, format="memmap", encoding="raw", cache="warm"),
               # a case only the older run has stays
               case_rows("formats", "read:hdf5-raw/sequential/warm", {"samples_per_s": [3.0]},
                         run_id=OLDER_RUN, format="hdf5", encoding="raw", cache="warm"))
    latest = results.latest_runs(df)
    assert sorted(zip(latest["case_id"], latest["value"])) == [
        ("read:hdf5-raw/sequential/warm", 3.0), ("read:memmap-raw/sequential/warm", 1.0)]
    assert results.latest_runs(df.iloc[0:0]).empty


def test_stat_skips_failed_rows_and_names_what_is_missing():
    df = frame(case_rows("formats", "read:hdf5-raw/warm", {"samples_per_s": [1.0]},
                         status="failed", format="hdf5", encoding="raw", cache="warm"))
    with pytest.raises(results.MissingResultError,
                       match="no ok result for samples_per_s with format='hdf5'"):
        results.stat(df, "samples_per_s", format="hdf5")
    with pytest.raises(results.MissingResultError, match="^no ok result for samples_per_s$"):
        results.stat(df, "samples_per_s")


def test_select_matches_columns_and_params():
    df = frame(
        case_rows("gpu_feed", "a", {"samples_per_s": [1.0]}, params={"compute_ms": 2.0}),
        case_rows("gpu_feed", "b", {"samples_per_s": [2.0]}, params={"compute_ms": 10.0}),
        case_rows("gpu_feed", "c", {"samples_per_s": [3.0]}, params={}),
    )
    assert list(results.select(df, "samples_per_s", param_compute_ms=10.0)["case_id"]) == ["b"]
    assert list(results.select(df, "samples_per_s", param_compute_ms=None)["case_id"]) == ["c"]
    assert list(results.select(df, case_id="a")["case_id"]) == ["a"]
    with pytest.raises(KeyError, match="no result column 'colour'"):
        results.select(df, "samples_per_s", colour="red")


def test_with_params_and_params_of():
    df = frame(case_rows("gpu_feed", "a", {"samples_per_s": [1.0]},
                         params={"compute_ms": 2.0, "pinned": True}),
               case_rows("gpu_feed", "b", {"samples_per_s": [2.0]}, params={"compute_ms": 10.0}))
    wide = results.with_params(df)
    assert wide["param_compute_ms"].tolist() == [2.0, 10.0]
    assert wide["param_pinned"].tolist() == [True, None]
    assert "param_compute_ms" not in df  # the frame given is left alone
    assert results.params_of(df).tolist() == [{"compute_ms": 2.0, "pinned": True},
                                              {"compute_ms": 10.0}]


def test_summed_stat_sums_within_each_repeat():
    # Sum of the medians would be 0 + 0; the per-repeat sums are 0, 10 and 10.
    df = frame(case_rows("lazy_vs_preloaded", "epoch:memmap/preloaded/cold",
                         {"preload_seconds": [0.0, 10.0, 0.0], "epoch_seconds": [0.0, 0.0, 10.0]},
                         format="memmap", encoding="raw", loader="preloaded", cache="cold"))
    total = results.summed_stat(df, ("preload_seconds", "epoch_seconds"), format="memmap")
    assert total == Stat(10.0, 0.0, 10.0, 3, "s", (0.0, 10.0, 10.0))
    with pytest.raises(results.MissingResultError, match="no ok result for compute_seconds"):
        results.summed_stat(df, ("preload_seconds", "compute_seconds"))


def test_summary_table_groups_with_a_stat_per_group():
    df = frame(read_case("memmap", "warm", [10.0, 30.0, 20.0]),
               read_case("memmap", "cold", [1.0, 3.0]),
               case_rows("formats", "read:hdf5-raw/sequential/warm", {"samples_per_s": [5.0]},
                         status="failed", format="hdf5", encoding="raw", cache="warm"))
    table = results.summary_table(df, "samples_per_s", ["format", "cache"])
    assert list(table.columns) == ["format", "cache", "median", "low", "high", "repeats",
                                   "resident_fraction", "stat"]
    by = table.set_index("cache")
    assert list(by.index) == ["warm", "cold"]  # as the rows came; the failed case is out
    assert by.loc["warm", "stat"] == Stat(20.0, 10.0, 30.0, 3, "samples/s", (10.0, 30.0, 20.0))
    # each figure names the rows it came from, for a recompute from the CSV
    assert by.loc["warm", "stat"].sources == (
        (df.loc[df["cache"] == "warm", "study"].iloc[0],
         df.loc[df["cache"] == "warm", "case_id"].iloc[0], "samples_per_s"),)
    assert (by.loc["cold", "median"], by.loc["cold", "repeats"]) == (2.0, 2)
    assert by.loc["cold", "resident_fraction"] == 0.0
    empty = results.summary_table(df, "peak_pss_bytes", ["format"])
    assert empty.empty and "stat" in empty.columns


# -- paired comparisons --------------------------------------------------------------------
def stat_of(values, unit="samples/s") -> Stat:
    values = tuple(float(v) for v in values)
    ordered = sorted(values)
    median = (ordered[(len(values) - 1) // 2] + ordered[len(values) // 2]) / 2
    return Stat(median, min(values), max(values), len(values), unit, values)


def test_identical_repeats_give_an_interval_around_one():
    same = stat_of([100.0, 120.0, 90.0, 110.0, 105.0])
    ratio, low, high = ratio_interval(same, same)
    assert ratio == 1.0
    assert low <= 1.0 <= high


def test_noisy_but_equal_paths_give_an_interval_that_contains_one():
    a = stat_of([100.0, 80.0, 120.0, 95.0, 105.0])
    b = stat_of([90.0, 115.0, 85.0, 110.0, 100.0])
    _, low, high = ratio_interval(a, b)
    assert low < 1.0 < high


def test_clearly_separated_repeats_give_an_interval_above_one():
    fast = stat_of([200.0, 210.0, 190.0, 205.0, 195.0])
    slow = stat_of([100.0, 105.0, 95.0, 102.0, 98.0])
    ratio, low, high = ratio_interval(fast, slow)
    assert ratio == pytest.approx(2.0)
    assert 1.0 < low <= ratio <= high
    # and the other way round, below one
    _, low, high = ratio_interval(slow, fast)
    assert high < 1.0


def test_repeats_are_paired_so_shared_machine_drift_cancels():
    # Both paths slow down together from repeat to repeat (a noisy shared machine); each
    # pair's ratio is exactly 1.1, so the paired interval is [1.1, 1.1] although the two
    # ranges overlap widely.
    drift = [100.0, 200.0, 300.0, 400.0, 500.0]
    ours = stat_of([1.1 * v for v in drift])
    theirs = stat_of(drift)
    ratio, low, high = ratio_interval(ours, theirs)
    assert (ratio, low, high) == pytest.approx((1.1, 1.1, 1.1))
    assert ours.low < theirs.high  # unpaired, the spreads would not separate them


def test_too_few_paired_repeats_leave_the_comparison_undecided():
    pairs = MIN_PAIRED_REPEATS - 1
    few = stat_of([200.0 + i for i in range(pairs)])
    many = stat_of([100.0 + i for i in range(10)])
    ratio, low, high = ratio_interval(few, many)
    assert (low, high) == (-math.inf, math.inf)
    assert ratio == pytest.approx(few.median / many.median)
    # exactly the minimum is enough
    enough = stat_of([200.0 + i for i in range(MIN_PAIRED_REPEATS)])
    assert math.isfinite(ratio_interval(enough, many)[1])


def test_unequal_repeat_counts_resample_each_side_and_bracket_the_ratio():
    """Adaptive repeats stop cases at different counts: the interval is then about the same
    full medians the ratio is, so it contains it (pairing the first n repeats would not)."""
    many = stat_of([835.0, 700.0, 840.0, 820.0, 845.0, 830.0, 600.0, 838.0, 836.0])
    few = stat_of([721.0, 500.0, 720.0])
    ratio, low, high = ratio_interval(many, few)
    assert ratio == pytest.approx(many.median / few.median)
    assert low <= ratio <= high
    assert (low, high) == ratio_interval(many, few)[1:]  # still deterministic


def test_the_interval_is_deterministic():
    a = stat_of([100.0, 80.0, 120.0, 95.0, 105.0, 111.0, 87.0])
    b = stat_of([90.0, 115.0, 85.0, 110.0, 100.0, 93.0, 99.0])
    assert ratio_interval(a, b) == ratio_interval(a, b)
    assert ratio_interval(a, b, seed=0) == ratio_interval(a, b)
    assert ratio_interval(a, b, seed=1) != ratio_interval(a, b)  # the seed is what fixes it


# -- loading -------------------------------------------------------------------------------
def test_results_load_reads_every_csv_and_env(tmp_path):
    env = {"cpus_usable": 2, "limits": {"dram_read_GBps": 27.0}}
    write_results(tmp_path, read_case("memmap", "warm", [1.0, 2.0]),
                  build_case("memmap", seconds=0.5, apparent=1e6, files=2),
                  case_rows("prefetch", "epoch", {"samples_per_s": [3.0]}), env=env)
    loaded = Results.load(tmp_path)
    assert loaded.directory == tmp_path
    assert loaded.env == env
    assert loaded.limits == {"dram_read_GBps": 27.0}
    assert set(loaded.df["study"]) == {"formats", "prefetch"}
    assert loaded.study("prefetch")["value"].tolist() == [3.0]
    assert len(loaded.study("formats")) == 2 + 7


def test_results_load_reads_gzipped_results_as_stored_runs_keep_them(tmp_path):
    import gzip

    write_results(tmp_path, read_case("memmap", "warm", [1.0, 2.0]),
                  case_rows("prefetch", "epoch", {"samples_per_s": [3.0]}))
    plain = Results.load(tmp_path).df
    stored = tmp_path / "stored"
    stored.mkdir()
    for path in sorted(tmp_path.glob("*.csv")):
        (stored / f"{path.name}.gz").write_bytes(gzip.compress(path.read_bytes()))
    pd.testing.assert_frame_equal(Results.load(stored).df, plain)
    # One study both plain and gzipped would count its rows twice: refused, by name.
    (stored / "prefetch.csv").write_bytes((tmp_path / "prefetch.csv").read_bytes())
    with pytest.raises(SchemaError, match=r"prefetch.csv is there both plain and gzipped"):
        Results.load(stored)


def test_results_load_without_env_has_no_limits(tmp_path):
    write_results(tmp_path, read_case("memmap", "warm", [1.0]))
    assert Results.load(tmp_path).env == {} and Results.load(tmp_path).limits == {}


def test_results_load_names_a_missing_directory(tmp_path):
    missing = tmp_path / "no-such-results"
    with pytest.raises(FileNotFoundError, match=f"{missing}: no such results directory"):
        Results.load(missing)


def test_results_load_refuses_a_directory_without_results(tmp_path):
    (tmp_path / "env.json").write_text(json.dumps({"cpus_usable": 2}))
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}: no results"):
        Results.load(tmp_path)


# -- builds, options, failures and order ---------------------------------------------------
def test_default_builds_open_options_and_dataset_names():
    variant = {"dataset_name": "hdf5-raw-chunk_samples=1", "knob_chunk_samples": 1}
    df = frame(read_case("hdf5", "warm", [1.0]),
               read_case("hdf5", "warm", [2.0], params=variant),
               read_case("memmap", "cold", [3.0], access="shuffle",
                         params={"open_madvise_random": True}))
    assert results.dataset_names(df).tolist() == ["hdf5-raw", "hdf5-raw-chunk_samples=1",
                                                  "memmap-raw"]
    assert results.default_builds(df)["value"].tolist() == [1.0, 3.0]
    assert results.default_open(df)["value"].tolist() == [1.0, 2.0]
    assert open_options(json.dumps({"open_readahead": False, "seed": 1})) == {
        "readahead": False}
    assert results.default_builds(df.iloc[0:0]).empty


def test_failed_cases_give_the_errors_last_line_once_per_case():
    df = frame(read_case("memmap", "warm", [1.0]),
               case_rows("formats", "read:hdf5-raw/warm", {"samples_per_s": [1.0, 1.0],
                                                           "file_MBps": [1.0]},
                         status="failed", format="hdf5", encoding="raw", cache="warm"),
               # failed before, ok now: not a failure
               case_rows("formats", "read:memmap-raw/sequential/warm",
                         {"samples_per_s": [1.0]}, run_id=OLDER_RUN, status="timeout",
                         format="memmap", encoding="raw", cache="warm"))
    failures = results.failed_cases(df)
    assert failures.to_dict("records") == [
        {"study": "formats", "case_id": "read:hdf5-raw/warm", "status": "failed",
         "error": "RuntimeError: boom"}]
    assert results.failed_cases(df, study="prefetch").empty


def test_ordered_sort_rows_and_best_row():
    assert results.ordered(["b", "zeta", "a", "b", "alpha"], ["b", "a"]) == [
        "b", "a", "alpha", "zeta"]
    registry = list(FORMATS)
    table = pd.DataFrame({"encoding": ["jpeg", "raw", "raw"],
                          "format": [registry[0], registry[-1], registry[0]],
                          "median": [1.0, 3.0, 2.0]})
    ranked = results.sort_rows(table)
    assert list(zip(ranked["encoding"], ranked["format"])) == [
        ("raw", registry[0]), ("raw", registry[-1]), ("jpeg", registry[0])]
    assert results.best_row(table)["median"] == 3.0
    assert results.best_row(table, lowest=True)["median"] == 1.0


def test_a_study_run_on_its_own_reads_its_own_environment(tmp_path):
    """A study run apart (its env in env-<run id>.json) is described by that run's env; one
    of the main run by env.json; one with neither by nothing."""
    from result_rows import OLDER_RUN, RUN, case_rows, write_results

    write_results(tmp_path, case_rows("formats", "a", {"samples_per_s": [1.0]}, run_id=RUN),
                  case_rows("peers", "b", {"samples_per_s": [1.0]}, run_id=OLDER_RUN),
                  env={"run_id": RUN, "cpu_model": "main"})
    results = Results.load(tmp_path)
    assert results.study_env("formats")["cpu_model"] == "main"
    assert results.study_env("peers") == {}
    (tmp_path / f"env-{OLDER_RUN}.json").write_text(json.dumps({"run_id": OLDER_RUN,
                                                                "cpu_model": "apart"}))
    assert results.study_env("peers")["cpu_model"] == "apart"
