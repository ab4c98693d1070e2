"""One comparison, one number: the canonical key of a measurement and the check that two
studies measuring one key agree (``storebench consistency``)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from result_rows import case_rows, feed_case, frame, prefetch_case, write_results

from storebench.report.consistency import check_consistency, consistency_command
from storebench.results import KEY_FIELDS, key_label, keyed_throughput, measurement_key

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


@pytest.mark.parametrize("target, code", [([105.0, 106.0, 104.0], 0),
                                          ([400.0, 410.0, 390.0], 1)])
def test_the_command_exits_by_the_check_with_one_line_each(tmp_path, target, code):
    write_results(tmp_path, prefetch_case("process", 2, [100.0, 101.0, 99.0],
                                          start_method="fork"), target_case(target))
    result = storebench("consistency", str(tmp_path))
    assert result.returncode == code and result.stderr == ""
    assert result.stdout == {
        0: f"consistency OK: 1 key(s) measured by more than one study agree within 10% "
           f"({tmp_path})\n",
        1: "lazy/process \u00d72 fork, memmap-raw, warm shuffle, batch 256: prefetch 100 "
           "samples/s (n=3) vs targets 400 samples/s (n=3); 4.00\u00d7 apart\n"}[code]
    assert consistency_command(tmp_path)[0] == code


def test_the_command_says_what_is_missing_without_a_traceback(tmp_path):
    result = storebench("consistency", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert result.stderr == (f"storebench consistency: {tmp_path / 'nowhere'}: no such "
                             "results directory\n")
