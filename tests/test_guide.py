"""The decision guide: each row is the measured best of every candidate answering its
question, or a tie declared by ``results.TIE_RULE``; nothing decides the winner in advance."""

from __future__ import annotations

import json
import math

import pytest
from result_rows import build_case, feed_case, frame, prefetch_case, read_case

from storebench import guide
from storebench.guide import Candidate, choose
from storebench.loaders.paths import LOADER_PATHS, path_label
from storebench.report.guide import decision_guide
from storebench.results import TIE_RULE, Results, Stat
from storebench.studies import STUDIES
from storebench.studies.prefetch.grid import prefetch_grid


def candidate(key: str, values, unit: str = "samples/s") -> Candidate:
    values = tuple(float(v) for v in values)
    ordered = sorted(values)
    median = (ordered[(len(values) - 1) // 2] + ordered[len(values) // 2]) / 2
    return Candidate(key, key.upper(), Stat(median, min(values), max(values), len(values),
                                            unit, values))


FAST = [200.0, 210.0, 190.0, 205.0, 195.0]
ALSO_FAST = [205.0, 190.0, 210.0, 195.0, 200.0]
SLOW = [100.0, 105.0, 95.0, 102.0, 98.0]
SLOWER = [50.0, 52.0, 48.0, 51.0, 49.0]


def test_the_best_median_wins_whatever_order_candidates_come_in():
    row = choose("prefetch", "which path?", "samples_per_s",
                 [candidate("slower", SLOWER), candidate("fast", FAST), candidate("slow", SLOW)])
    assert [c.key for c in row.candidates] == ["fast", "slow", "slower"]
    assert row.best.key == "fast" and row.runner_up.key == "slow"
    assert not row.tie and row.tied == ()
    assert row.choice == "FAST"
    assert row.ratio == pytest.approx(2.0)
    assert 1.0 < row.low <= 2.0 <= row.high
    assert row.evidence.startswith(
        "FAST 200 samples/s vs SLOW 100 samples/s; 2.00\u00d7 faster (95% interval ")
    assert row.evidence.endswith("; 3 candidates")


STEADY = [200.5, 201.0, 200.0, 200.8, 200.3]
ALSO_STEADY = [200.2, 199.8, 200.6, 199.4, 200.1]


def test_equivalence_names_every_candidate_within_the_margin_of_the_best():
    row = choose("prefetch", "which path?", "samples_per_s",
                 [candidate("a", STEADY), candidate("b", ALSO_STEADY), candidate("c", SLOW)])
    assert row.tie and row.verdict == "equivalent" and not row.undecided
    assert 1 / 1.05 <= row.low <= 1.0 <= row.high <= 1.05
    assert row.tied == ("B",)
    assert row.choice == "equivalent within 5%: A and B"
    assert "ratio (95% interval" in row.evidence

    three = choose("prefetch", "which path?", "samples_per_s",
                   [candidate("a", STEADY), candidate("b", ALSO_STEADY),
                    candidate("c", [198.0, 197.5, 198.5, 197.8, 198.2]),
                    candidate("d", SLOW)])
    assert three.choice == "equivalent within 5%: A, B and C"
    assert "D" not in three.choice


def test_a_clear_difference_under_the_margin_names_no_winner():
    # 3% faster, and the interval excludes 1: real, but under the 5% margin.
    ahead = [103.0, 103.1, 102.9, 103.05, 102.95]
    behind = [100.0, 100.1, 99.9, 100.05, 99.95]
    row = choose("prefetch", "which path?", "samples_per_s",
                 [candidate("behind", behind), candidate("ahead", ahead)])
    assert row.low > 1.0 and row.ratio == pytest.approx(1.03)
    assert row.tie and row.verdict == "equivalent"
    assert row.choice == "equivalent within 5%: AHEAD and BEHIND"


def test_an_interval_that_crosses_the_margin_is_undecided_with_its_repeats():
    wide = [104.0, 90.0, 118.0, 100.0, 110.0]
    base = [100.0, 100.5, 99.5, 100.2, 99.8]
    row = choose("prefetch", "which path?", "samples_per_s",
                 [candidate("wide", wide), candidate("base", base)])
    assert row.low < 1.0 < 1.05 < row.high
    assert row.undecided and row.tie and row.tied == ()
    assert row.choice == ("undecided between WIDE and BASE (the interval crosses the 5% "
                          "margin; n = 5 and 5)")


def test_too_few_repeats_to_decide_is_undecided_by_the_rule():
    four = [200.0, 205.0, 195.0, 201.0]
    row = choose("formats", "fastest?", "samples_per_s",
                 [candidate("a", four), candidate("b", [100.0, 101.0, 99.0, 100.5])])
    assert row.ratio == pytest.approx(2.0, rel=0.02)
    assert row.tie and (row.low, row.high) == (-math.inf, math.inf)
    assert row.undecided and row.to_dict()["undecided"] is True
    assert row.to_dict()["verdict"] == "undecided"
    assert row.choice == ("undecided between A and B (fewer than 5 repeats on a side: n = 4 "
                          "and 4)")
    assert "fewer than 5 repeats on a side: no interval" in row.evidence


@pytest.mark.parametrize("unit", ["bytes", "count"])
def test_exact_units_compare_exactly_from_one_measurement(unit):
    # One repeat each: sizes and counts are not noisy, so the margin alone decides.
    row = choose("formats", "least space?", "bytes_apparent",
                 [candidate("big", [1100.0], unit), candidate("small", [1000.0], unit)],
                 lower_is_better=True)
    assert not row.tie and row.choice == "SMALL"
    assert row.ratio == row.low == row.high == pytest.approx(1.1)
    assert "1.10\u00d7 smaller (exact)" in row.evidence
    close = choose("formats", "least space?", "bytes_apparent",
                   [candidate("big", [1001.0], unit), candidate("small", [1000.0], unit)],
                   lower_is_better=True)
    assert close.tie and close.choice == "equivalent within 5%: SMALL and BIG"
    equal = choose("formats", "fewest files?", "file_count",
                   [candidate("a", [1.0], unit), candidate("b", [1.0], unit),
                    candidate("c", [2.0], unit)], lower_is_better=True)
    assert equal.tie and equal.ratio == 1.0
    assert equal.choice == "equivalent within 5%: A and B"


def test_lower_is_better_picks_the_smallest_median():
    row = choose("lazy_vs_preloaded", "first epoch?", "seconds",
                 [candidate("long", [2.0, 2.1, 1.9, 2.05, 1.95], "s"),
                  candidate("short", [1.0, 1.05, 0.95, 1.02, 0.98], "s")],
                 lower_is_better=True)
    assert row.best.key == "short" and not row.tie
    assert row.ratio == pytest.approx(2.0)  # how many times better the best is
    assert row.low > 1.0
    assert "2.00\u00d7 less time" in row.evidence
    assert row.to_dict()["lower_is_better"] is True


def test_a_single_candidate_is_the_choice_without_a_comparison():
    row = choose("gpu_feed", "which path?", "accelerator_utilisation",
                 [candidate("only", [0.9, 0.91, 0.89], "ratio")])
    assert row.runner_up is None and not row.tie
    assert row.choice == "ONLY (the only candidate measured)"
    assert row.evidence == "ONLY 90%"  # utilisation reads as a percentage
    assert math.isnan(row.ratio)


def test_nothing_measured_gives_no_row():
    assert choose("prefetch", "which path?", "samples_per_s", []) is None


def test_to_dict_has_every_candidate_with_its_median():
    row = choose("prefetch", "which path?", "samples_per_s",
                 [candidate("slow", SLOW), candidate("fast", FAST)])
    data = row.to_dict()
    assert data["question"] == "which path?" and data["metric"] == "samples_per_s"
    assert (data["choice"], data["best"], data["runner_up"]) == ("FAST", "fast", "slow")
    assert data["tie"] is False and data["tied_with_best"] == []
    assert data["tie_rule"] == TIE_RULE
    assert data["interval"] == [row.low, row.high]
    assert data["candidates"] == [
        {"key": "fast", "label": "FAST", "median": 200.0, "low": 190.0, "high": 210.0,
         "repeats": 5, "unit": "samples/s", "values": FAST, "sources": []},
        {"key": "slow", "label": "SLOW", "median": 100.0, "low": 95.0, "high": 105.0,
         "repeats": 5, "unit": "samples/s", "values": SLOW, "sources": []},
    ]
    assert json.loads(json.dumps(data)) == data  # what `findings --json` prints


def test_guide_table_and_text_show_every_candidate():
    rows = [choose("prefetch", "which path?", "samples_per_s",
                   [candidate("fast", FAST), candidate("slow", SLOW)]),
            choose("formats", "least space?", "bytes_apparent",
                   [candidate("small", [1e6], "bytes")], lower_is_better=True)]
    table = guide.guide_table(rows)
    assert list(table.columns) == ["question", "workload", "choice", "evidence"]
    assert table["workload"].tolist() == ["", ""]
    assert table["choice"].tolist() == ["FAST", "SMALL (the only candidate measured)"]
    shown = guide.guide_text(rows).splitlines()
    assert shown[:4] == ["* which path?", "  -> FAST", f"     {rows[0].evidence}",
                         "     candidates: FAST 200 samples/s, SLOW 100 samples/s"]
    assert shown[-1] == f"Tie rule: {TIE_RULE}"


# -- rows of the studies, from results -----------------------------------------------------
def every_prefetch_path(dataset: tuple[str, str] = ("memmap", "raw")) -> list[list[dict]]:
    """Each variant of the prefetch study's full grid, plus a path no list names (a peer
    loader added later), each with its own clearly different throughput."""
    fmt, encoding = dataset
    cases = [prefetch_case(v.prefetcher, v.workers or 0,
                           [1000.0 * (i + 1) + d for d in (0.0, 5.0, -5.0, 3.0, -3.0)],
                           start_method=v.start_method, fmt=fmt, encoding=encoding)
             for i, v in enumerate(prefetch_grid())]
    cases.append(prefetch_case("peer_loader", 2, [500.0, 505.0, 495.0, 503.0, 497.0],
                               start_method="fork", fmt=fmt, encoding=encoding))
    return cases


def test_the_prefetch_row_has_every_measured_path_as_a_candidate():
    df = frame(*every_prefetch_path(), *every_prefetch_path(("lmdb", "raw"))[:3])
    (memmap, lmdb) = STUDIES["prefetch"].guide(Results(df, {"cpus_usable": 2}))
    variants = prefetch_grid()
    # Every path of ours, the frameworks' and the baselines' (the peers study has the peers').
    assert {v.prefetcher for v in variants} >= {
        name for name, path in LOADER_PATHS.items() if path.family != "peer"} - {"tf_data"}
    expected = {f"{v.prefetcher}/w{v.workers or 0}/{v.start_method or ''}" for v in variants}
    keys = [c.key for c in memmap.candidates]
    assert set(keys) == expected | {"peer_loader/w2/fork"}
    assert len(keys) == len(variants) + 1
    assert "memmap-raw" in memmap.question and "2 cores" in memmap.question
    # The last variant of the grid was given the highest throughput; it wins outright.
    last = variants[-1]
    assert memmap.best.label == path_label(last.prefetcher, last.workers, last.start_method)
    assert memmap.choice == memmap.best.label and not memmap.tie
    assert memmap.candidates[-1].key == "peer_loader/w2/fork"
    labels = [c.label for c in memmap.candidates]
    assert "ProcessPrefetcher \u00d72 (spawn)" in labels
    assert "ProcessPrefetcher \u00d72 (fork)" in labels
    # Another dataset is its own question, with only what was measured on it.
    assert len(lmdb.candidates) == 3 and "lmdb-raw" in lmdb.question


def test_tf_data_joins_the_simplejpeg_question_only():
    df = frame(
        prefetch_case("none", 0, [100.0, 101.0, 99.0], fmt="lmdb", encoding="jpeg",
                      decode="simplejpeg"),
        prefetch_case("thread", 2, [180.0, 181.0, 179.0], fmt="lmdb", encoding="jpeg",
                      decode="simplejpeg"),
        prefetch_case("thread", 2, [120.0, 121.0, 119.0], fmt="lmdb", encoding="jpeg",
                      decode="pil"),
        prefetch_case("tf_data", 0, [300.0, 301.0, 299.0], fmt="tfrecord", encoding="jpeg",
                      decode="tf"),
    )
    simplejpeg, pil = STUDIES["prefetch"].guide(Results(df, {}))
    assert "simplejpeg" in simplejpeg.question and "pil" in pil.question
    assert simplejpeg.best.label == "tf.data TFRecord AUTOTUNE over tfrecord-jpeg"
    assert len(simplejpeg.candidates) == 3
    assert [c.key for c in pil.candidates] == ["thread/w2/"]


def test_the_feed_row_has_every_measured_feed_path():
    df = frame(feed_case("none", 0, 10.0, [0.81, 0.80, 0.82]),
               feed_case("process", 2, 10.0, [0.97, 0.96, 0.98]),
               feed_case("thread", 2, 10.0, [0.90, 0.91, 0.89]),
               feed_case("process", 2, 10.0, [0.99, 0.985, 0.995],
                         params={"pinned": True, "non_blocking": True}),
               feed_case("process", 2, 0.0, [0.5, 0.5, 0.5]))
    (row,) = STUDIES["gpu_feed"].guide(Results(df, {}))
    assert "10 ms per batch (emulated accelerator)" in row.question
    assert [c.label for c in row.candidates] == [
        "ProcessPrefetcher \u00d72, pinned, non_blocking", "ProcessPrefetcher \u00d72",
        "ThreadPrefetcher \u00d72", "one thread, no prefetcher"]


def test_decision_guide_follows_the_studies_order_and_skips_absent_studies():
    df = frame(prefetch_case("none", 0, [100.0, 101.0, 99.0, 100.5, 99.5]),
               prefetch_case("thread", 2, [200.0, 201.0, 199.0, 200.5, 199.5]),
               build_case("memmap", seconds=0.5, apparent=1_000_000, files=2),
               build_case("rawfiles", seconds=2.0, apparent=1_200_000, files=500),
               read_case("memmap", "cold", [800.0, 810.0, 790.0, 805.0, 795.0]),
               read_case("rawfiles", "cold", [100.0, 101.0, 99.0, 100.5, 99.5]))
    rows = decision_guide(Results(df, {}))
    studies = [row.study for row in rows]
    assert studies == sorted(studies, key=list(STUDIES).index)
    assert set(studies) == {"formats", "prefetch"}
    by_question = {row.question: row for row in rows}
    assert by_question["Fewest files, raw arrays (shared or object storage, many-file "
                       "limits)"].choice == "memmap-raw"
    cold = next(r for q, r in by_question.items() if q.startswith("Reading every sample"))
    assert cold.choice == "memmap" and cold.ratio == pytest.approx(8.0)
