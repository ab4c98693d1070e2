"""One comparison, one number: the canonical key of a measurement and the check that two
studies measuring one key agree (``storebench consistency``)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from result_rows import case_rows, feed_case, frame, prefetch_case, write_results

from storebench.report.consistency import check_consistency, consistency_command
from storebench.report.quotes import Quote, check_quotes, quotes
from storebench.results import (
    KEY_FIELDS,
    Results,
    key_label,
    keyed_throughput,
    measurement_key,
)

FORK = {"start_method": "fork"}


def target_case(values, *, target: str = "process_vs_pickled", workers: int = 2,
                params=FORK) -> list[dict]:
    """A targets-study case timing the ProcessPrefetcher under its metric prefix."""
    return case_rows("targets", f"target:{target}", {
        "process_prefetcher.samples_per_s": values,
        "pickled_baseline.samples_per_s": [v / 3 for v in values],
        "target_ratio": [3.0] * len(values)},
        format="memmap", encoding="raw", loader=target, workers=workers, access="shuffle",
        cache="warm", batch_size=256, params={**params, "target": target})


def keys(df) -> dict:
    rows = keyed_throughput(df)
    return {(study, metric): key for study, metric, key in
            zip(rows["study"], rows["metric"], rows["key"])}


def test_the_key_names_every_condition_of_a_throughput_row():
    df = frame(prefetch_case("process", 2, [100.0, 101.0, 99.0], start_method="spawn",
                             fmt="lmdb", encoding="jpeg", decode="simplejpeg"))
    row = df[df["metric"] == "samples_per_s"].iloc[0].to_dict()
    key = measurement_key(row)
    assert dict(zip(KEY_FIELDS, key)) == {
        "path": "lazy/process", "workers": "2", "start_method": "spawn",
        "dataset": "lmdb-jpeg", "encoding": "jpeg", "decoder": "simplejpeg", "transform": "",
        "cache": "warm", "order": "shuffle", "batch_size": "256", "timed": "",
        "conditions": ""}
    assert key_label(key) == ("lazy/process \u00d72 spawn, lmdb-jpeg, decode simplejpeg, "
                              "warm shuffle, batch 256")
    # Other metrics have no key.
    assert measurement_key(df[df["metric"] == "cpu_utilisation"].iloc[0].to_dict()) is None


def test_a_target_path_and_a_study_path_share_one_key_with_the_default_start_method():
    # The prefetch case names no start method: ProcessPrefetcher's default (fork) is meant.
    found = keys(frame(prefetch_case("process", 2, [100.0]), target_case([100.0])))
    assert found[("prefetch", "samples_per_s")] == found[
        ("targets", "process_prefetcher.samples_per_s")]
    assert found[("targets", "pickled_baseline.samples_per_s")][0] == "lazy/pickled_baseline"


def test_what_differs_is_in_the_key():
    found = keys(frame(
        prefetch_case("process", 2, [100.0], start_method="fork"),
        feed_case("process", 2, 10.0, [0.9], params=FORK),
        case_rows("peers", "peer:process", {"later_epochs_samples_per_s": [100.0],
                                            "epoch1_samples_per_s": [50.0]},
                  format="memmap", encoding="raw", loader="lazy", prefetcher="process",
                  workers=2, access="shuffle", cache="warm", batch_size=256)))
    prefetch = found[("prefetch", "samples_per_s")]
    feed = found[("gpu_feed", "samples_per_s")]
    assert feed[:-1] == prefetch[:-1] and "compute_ms=10.0" in feed[-1]
    # The peers' later epochs are the steady throughput; their first epoch is labelled.
    assert found[("peers", "later_epochs_samples_per_s")] == prefetch
    first = found[("peers", "epoch1_samples_per_s")]
    assert first[KEY_FIELDS.index("timed")] == "first epoch, start-up inside"
    # A case that says it timed its start-up too is another key, saying so.
    timed = keys(frame(case_rows(
        "prefetch", "epoch:short", {"samples_per_s": [100.0]}, format="memmap",
        encoding="raw", loader="lazy", prefetcher="process", workers=2, access="shuffle",
        cache="warm", batch_size=256,
        params={"start_method": "fork", "timed_region": "8 batches, start-up inside"})))
    short = timed[("prefetch", "samples_per_s")]
    assert short[KEY_FIELDS.index("timed")] == "8 batches, start-up inside"
    assert [a == b for a, b in zip(short, prefetch)] == [f != "timed" for f in KEY_FIELDS]
    assert key_label(short).endswith(", timed: 8 batches, start-up inside")


def agreeing_and_not(prefetch_values, target_values):
    return frame(prefetch_case("process", 2, prefetch_values, start_method="fork"),
                 prefetch_case("thread", 2, [300.0, 300.0, 300.0]),
                 target_case(target_values))


def test_studies_within_ten_percent_pass():
    report = check_consistency(agreeing_and_not([100.0, 104.0, 98.0], [109.0, 110.0, 108.0]))
    assert report.ok and report.shared_keys == 1


def test_studies_more_than_ten_percent_apart_fail_with_both_medians_and_n():
    report = check_consistency(agreeing_and_not([100.0, 104.0, 98.0],
                                                [111.0, 112.0, 112.0, 113.0]))
    assert not report.ok
    assert [str(d) for d in report.disagreements] == [
        "lazy/process \u00d72 fork, memmap-raw, warm shuffle, batch 256: prefetch 100 "
        "samples/s (n=3) vs targets 112 samples/s (n=4); 1.12\u00d7 apart"]


def test_one_study_alone_is_never_inconsistent():
    df = frame(prefetch_case("process", 2, [100.0], start_method="fork"),
               prefetch_case("process", 2, [500.0], start_method="spawn"))
    report = check_consistency(df)
    assert report.ok and report.shared_keys == 0


def storebench(*args):
    return subprocess.run([sys.executable, "-m", "storebench.cli", *args],
                          capture_output=True, text=True, timeout=300)


def two_paths():
    """A prefetch study of two paths: the guide quotes both and their ratio."""
    return (prefetch_case("process", 2, [100.0, 101.0, 99.0, 100.0, 102.0],
                          start_method="fork"),
            prefetch_case("thread", 2, [300.0, 301.0, 299.0, 300.0, 302.0]))


def test_the_command_counts_the_quoted_figures_it_checked(tmp_path):
    write_results(tmp_path, *two_paths())
    checked = check_quotes(Results.load(tmp_path))
    assert checked.ok and checked.checked >= 3
    result = storebench("consistency", str(tmp_path))
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == (
        f"consistency OK: {checked.checked} quoted figures match their rows, one value and "
        f"one case per key ({checked.keys} keys); 0 key(s) measured by more than one study "
        f"agree within 10% ({tmp_path})\n")
    assert consistency_command(tmp_path)[0] == 0


@pytest.mark.parametrize("target", [[101.0, 100.0, 99.0], [400.0, 410.0, 390.0]])
def test_a_quoted_key_measured_again_by_another_study_fails_even_when_it_agrees(
        tmp_path, target):
    """The guide quotes the ProcessPrefetcher's prefetch case; a targets case measuring the
    same key is a second number for it, within 10% or not."""
    write_results(tmp_path, *two_paths(), target_case(target))
    result = storebench("consistency", str(tmp_path))
    assert result.returncode == 1 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        "one case per key: lazy/process \u00d72 fork, memmap-raw, warm shuffle, batch 256 is "
        "quoted (docs/guide.md: ")
    assert lines[0].endswith(
        "and measured by 2 cases: prefetch epoch:memmap-raw/process/2/fork/None "
        "samples_per_s, targets target:process_vs_pickled process_prefetcher.samples_per_s")
    assert lines[1:] == ([] if target[0] < 110 else [
        "lazy/process \u00d72 fork, memmap-raw, warm shuffle, batch 256: prefetch 100 "
        "samples/s (n=5) vs targets 400 samples/s (n=3); 4.00\u00d7 apart"])


def test_a_second_value_planted_for_a_quoted_key_fails():
    df = frame(*two_paths())
    found = quotes(Results(df=df, env={}, workloads={}))
    best = next(q for q in found if not q.is_ratio)
    planted = Quote("README", "the same path again", best.value * 1.2, best.unit,
                    best.sources)
    report = check_quotes(df, [*found, planted])
    assert [p.rule for p in report.problems] == ["sourced", "one value per key"]
    assert str(report.problems[0]) == (
        f"sourced: README: the same path again shows {best.value * 1.2:g} samples/s, its "
        f"rows give {best.value:g} samples/s ({best.sources[0][0]} {best.sources[0][1]} "
        f"{best.sources[0][2]})")
    assert f"README: the same path again = {best.value * 1.2:g} samples/s" in str(
        report.problems[1])
    assert check_quotes(df, found).ok


def test_a_quote_without_rows_or_with_rows_that_are_gone_fails():
    df = frame(*two_paths())
    gone = ("prefetch", "epoch:nowhere", "samples_per_s")
    report = check_quotes(df, [Quote("README", "typed", 5.0, "samples/s", ()),
                               Quote("README", "stale", 5.0, "samples/s", (gone,))])
    assert [str(p) for p in report.problems] == [
        "sourced: README: typed (5 samples/s) names no rows",
        "sourced: README: stale: no ok rows for prefetch epoch:nowhere samples_per_s"]


def test_nothing_quoted_is_not_a_pass():
    assert not check_quotes(frame(*two_paths()), []).ok


def test_the_reference_results_pass_with_every_quote_checked():
    """The committed reference: what ``make test`` checks before the suite."""
    from storebench.study import REPO_ROOT

    code, text = consistency_command(REPO_ROOT / "results" / "reference")
    assert code == 0, text
    assert int(text.removeprefix("consistency OK: ").split()[0]) > 0


def test_the_command_says_what_is_missing_without_a_traceback(tmp_path):
    result = storebench("consistency", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert result.stderr == (f"storebench consistency: {tmp_path / 'nowhere'}: no such "
                             "results directory\n")
