"""The out_of_core study's two stages at the largest k: screens (a short window of each pass)
rank every candidate and never decide; the best of them are timed over whole epochs of a
subset (a warming pass, then one whole pass per repeat, in one cgroup), and every guide row
and target rests on those rows only. Older results, whose rows carry no stage, are read as
they are."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from result_rows import case_rows, frame

import data_gen
from storebench.bench import runner
from storebench.bench.memory_budget import budget_available
from storebench.formats import build_dataset
from storebench.results import Results
from storebench.studies import get_study
from storebench.studies.out_of_core import study as ooc
from storebench.studies.out_of_core.cases import SCREEN, WHOLE_EPOCHS
from storebench.study import run_finalists

LIMIT_GBPS = 2.0
DECODED = {"decode": "simplejpeg", "transform": "train"}


def epochs(fmt, encoding, access, k, *, rate, stage, params=None, read=4000, of=4000,
           fill=1.0, repeats=5):
    """One out_of_core case's rows at ``stage``: its last epoch's rate, how many samples
    that epoch read of the ``of`` the case reads, and its page cache's fill of the cap."""
    params = {"k": k, **({"stage": stage} if stage else {}), **(params or {})}
    name = "/".join(f"{key}={value}" for key, value in sorted(params.items()))
    metrics = {
        "epoch1.samples_per_s": [rate] * repeats,
        "epoch2.samples_per_s": [rate * (1 + i / 100) for i in range(repeats)],
        "epoch2.samples": [read] * repeats,
        "epoch2.read_MBps": [rate * 0.15] * repeats,
        "epoch2.device_read_bytes": [rate * 0.15e6] * repeats,
        "epoch2.seconds": [read / rate] * repeats,
        "samples": [of] * repeats,
        "dataset_bytes": [of * 150e3] * repeats,
    }
    if k:
        metrics["cache_fill"] = [fill] * repeats
    if "subset_samples" in params:
        metrics["set_samples"] = [12000] * repeats
    return case_rows("out_of_core", f"out_of_core_epochs:{fmt}-{encoding}/{access}/{name}",
                     metrics, format=fmt, encoding=encoding, loader="lazy",
                     prefetcher="thread", workers=2, batch_size=64, access=access,
                     cache="cold" if stage != WHOLE_EPOCHS else "", params=params)


def screened_frame(*, fill=1.0):
    """Screens where a fast memmap window would win, and finalists (whole epochs of a
    4,000-sample subset) where LMDB does."""
    subset = {"subset_samples": 4000}
    return frame(
        epochs("memmap", "raw", "shuffle", 5, rate=9000.0, stage=SCREEN, read=448,
               of=12000, repeats=1),
        epochs("lmdb", "raw", "shuffle", 5, rate=3000.0, stage=SCREEN, read=448,
               of=12000, repeats=1),
        epochs("memmap", "raw", "shuffle", 5, rate=1000.0, stage=WHOLE_EPOCHS,
               params=subset, fill=fill),
        epochs("lmdb", "raw", "shuffle", 5, rate=2000.0, stage=WHOLE_EPOCHS, params=subset,
               fill=fill),
        epochs("lmdb", "jpeg", "shuffle", 5, rate=800.0, stage=SCREEN, params=DECODED,
               read=448, of=12000, repeats=1),
        epochs("lmdb", "jpeg", "shuffle", 5, rate=500.0, stage=WHOLE_EPOCHS,
               params={**DECODED, **subset}, fill=fill),
        epochs("lmdb", "jpeg", "shuffle", 0, rate=520.0, stage=WHOLE_EPOCHS,
               params={**DECODED, **subset, "cached": True}),
    )


def results(df):
    return Results(df, {"limits": {"cold_seq_read_GBps": LIMIT_GBPS}})


def decision_sources(found: Results) -> set[tuple[str, str, str]]:
    """The result rows every decision of the study rests on: each guide row's candidates'
    and each target's (value and denominator)."""
    sources = {source for row in ooc.guide(found) for candidate in row.candidates
               for source in candidate.stat.sources}
    for spec in (ooc.COLD_READ, ooc.DECODE_KEEP):
        measured = spec.measure(found)
        if measured is not None:
            sources |= set(measured.sources) | set(measured.against)
    return sources


def short_epoch_decisions(found: Results) -> list[str]:
    """The cases a capped decision rests on whose timed epoch read fewer samples than the
    set (or subset) the case reads: none may be."""
    rows = ooc.study_rows(found.df)
    short = []
    for _, case_id, _ in decision_sources(found):
        mine = rows[(rows["case_id"] == case_id) & (rows["status"] == "ok")]
        read = mine.loc[mine["metric"] == f"{ooc.LAST}.samples", "value"]
        whole = mine.loc[mine["metric"] == "samples", "value"]
        if read.empty or whole.empty or read.min() < whole.max():
            short.append(case_id)
    return sorted(set(short))


def test_screen_rows_are_labelled_and_never_decide():
    found = results(screened_frame())
    table = ooc.ooc_table(found.df)
    assert set(table.loc[table["stage"] == SCREEN, "label"]) == {
        "memmap-raw, shuffle, screen", "lmdb-raw, shuffle, screen",
        "lmdb-jpeg, shuffle, screen"}
    rows = {row.facets["encoding"]: row for row in ooc.guide(found)}
    # The memmap screen's window is the fastest raw rate, but the finalists decide.
    assert rows["raw"].best.label == "lmdb-raw, shuffle"
    assert {c.label for c in rows["raw"].candidates} == {"lmdb-raw, shuffle",
                                                          "memmap-raw, shuffle"}
    assert "whole epochs of the first 4,000 of 12,000 samples" in rows["raw"].question
    assert short_epoch_decisions(found) == []


def test_a_decision_resting_on_a_row_that_read_less_than_its_set_is_caught():
    # A finalist whose timed epoch stopped short: the check names it.
    df = screened_frame()
    short = frame(epochs("hdf5", "raw", "shuffle", 5, rate=5000.0, stage=WHOLE_EPOCHS,
                         params={"subset_samples": 4000}, read=3000))
    found = results(frame(df.to_dict("records"), short.to_dict("records")))
    assert [case for case in short_epoch_decisions(found) if "hdf5" in case]


def test_the_guide_says_k_times_the_ram_only_where_the_cache_filled_its_cap():
    full = {row.facets["encoding"]: row.question for row in ooc.guide(results(
        screened_frame(fill=0.97)))}
    assert full["raw"].startswith("Raw arrays 5\u00d7 larger than the RAM left")
    short = {row.facets["encoding"]: row.question for row in ooc.guide(results(
        screened_frame(fill=0.31)))}
    assert "larger than the RAM" not in short["raw"]
    assert short["raw"].startswith("Raw arrays capped at 1/5 of the set, its page cache "
                                   "never filling the cap")


def test_both_targets_rest_on_whole_epochs_only():
    found = results(screened_frame())
    cold = ooc.cold_read_target(found)
    assert cold.value == pytest.approx(2000.0 * 0.15 / (LIMIT_GBPS * 1000.0))
    assert all(WHOLE_EPOCHS in case_id for _, case_id, _ in cold.sources)
    keep = ooc.decode_keep_target(found)
    assert keep.value == pytest.approx(500.0 / 520.0)
    assert all(WHOLE_EPOCHS in case_id for _, case_id, _ in (*keep.sources, *keep.against))


def test_results_from_before_the_screen_are_read_as_they_are():
    old = frame(*(epochs(fmt, "raw", "shuffle", 5, rate=rate, stage="", read=448, of=12000)
                  for fmt, rate in (("memmap", 1000.0), ("lmdb", 2000.0))))
    (row,) = ooc.guide(results(old))
    assert row.best.label == "lmdb-raw, shuffle"
    assert row.question.startswith("Raw arrays 5\u00d7 larger than the RAM")


def test_the_cache_fill_rows_say_whether_each_case_reached_its_cap_and_read_whole_epochs():
    table = ooc.cache_fill_rows(screened_frame(fill=0.5))
    assert list(table["label"]) == ["lmdb-raw, shuffle", "memmap-raw, shuffle",
                                    "lmdb-jpeg, shuffle"]
    assert set(table["fill"]) == {"50%"} and set(table["reached"]) == {"no"}
    assert set(table["whole_epochs"]) == {"yes"}


@pytest.fixture(scope="module")
def two_stage_results(tmp_path_factory) -> Path:
    """The ci profile's ImageNet-like sets in memmap (raw) and LMDB (both), their grid run,
    then the finalists the runner's second stage lays out from its rows."""
    reason = budget_available()
    if reason:
        pytest.skip(f"no writable memory cgroup: {reason}")
    root = tmp_path_factory.mktemp("ooc-two-stage")
    data, out = root / "data", root / "results"
    out.mkdir()
    for spec in data_gen.get_profile("ci").family("imagenet"):
        # The formats the ci grid keeps (``out_of_core_grid``'s compact plan).
        name = "memmap" if spec.encoding == "raw" else "lmdb"
        build_dataset(spec, name, data, workers=1, progress=False)
    study = get_study("out_of_core")
    cases = study.grid(profile="ci", data_dir=data)

    def run(stage_cases):
        return runner.run_cases(stage_cases, out / "out_of_core.csv", profile="ci",
                                progress=False, timeout_s=300)

    summary = run_finalists(study, run(cases), cases, out, run)
    assert not summary.failed
    return out, data


def test_the_runner_runs_whole_epochs_of_the_screens_best_after_them(two_stage_results):
    found = results(Results.load(two_stage_results[0]).df)
    table = ooc.ooc_table(found.df)
    finals = table[table["stage"] == WHOLE_EPOCHS]
    # Raw: every capped lazy shuffled screen (fewer than five); JPEG: its one decoding
    # path, also cached with no cap and read undecoded.
    screened_raw = table[(table["stage"] == SCREEN) & (table["encoding"] == "raw")
                         & (table["access"] != "sequential") & (table["loader"] == "lazy")]
    assert len(finals[finals["encoding"] == "raw"]) == len(screened_raw)
    assert set(finals.loc[finals["encoding"] == "jpeg", "label"]) == {
        "lmdb-jpeg, shuffle", "lmdb-jpeg, shuffle, cached", "lmdb-jpeg, shuffle, undecoded"}
    rows = ooc.study_rows(found.df)
    whole = rows[rows["stage"] == WHOLE_EPOCHS]
    # One warming pass, then a whole pass per repeat, counted on from it.
    timed = whole[whole["metric"] == "timed_epoch"].groupby("case_id")["value"]
    assert all(sorted(v) == [2.0, 3.0, 4.0, 5.0, 6.0] for _, v in timed)
    assert short_epoch_decisions(found) == []
    assert ooc.guide(found) and decision_sources(found)
    fill = ooc.cache_fill_rows(found.df)
    assert len(fill) == len(finals[finals["k"] > 0]) and set(fill["whole_epochs"]) == {"yes"}


def test_a_finalist_reads_a_subset_whole_with_its_cap_scaled_to_it(two_stage_results):
    from storebench.bench.case import Trial
    from storebench.studies.out_of_core.cases import out_of_core_epochs_case

    case = next(c for c in ooc.out_of_core_grid(profile="ci",
                                                          data_dir=two_stage_results[1])
                if c.param("stage") == SCREEN and c.format == "memmap"
                and c.access == "shuffle" and c.loader == "lazy"
                and not c.param("open_madvise_random"))
    final = ooc.whole_epochs(case)
    final = dataclasses.replace(final, params={**dict(final.params), "subset_samples": 40})
    metrics = out_of_core_epochs_case(final, Trial(final, 0))
    assert metrics["samples"][0] == metrics[f"{ooc.LAST}.samples"][0] == 40
    assert metrics[f"{ooc.LAST}.complete"][0] == 1
    assert metrics["set_samples"][0] == 64
    assert metrics["dataset_bytes"][0] == metrics["set_bytes"][0] * 40 // 64


def test_the_workload_names_the_subset_the_finalists_read(two_stage_results):
    from storebench.studies.grid import cases_workloads

    case = next(c for c in ooc.out_of_core_grid(profile="ci", data_dir=two_stage_results[1])
                if c.encoding == "jpeg" and c.param("stage") == SCREEN)
    final = ooc.whole_epochs(case)
    final = dataclasses.replace(final, params={**dict(final.params), "subset_samples": 40})
    assert cases_workloads([case])["jpeg"] + (
        "; some cases read whole epochs of its first 40 samples") == cases_workloads(
        [case, final])["jpeg"]


def test_the_committed_reference_decides_on_whole_epochs_once_it_screened():
    reference = Results.load(Path(__file__).resolve().parents[2] / "results" / "reference")
    if not ooc.screened(reference.df):
        pytest.skip("the committed reference predates the screen: its rows are read as "
                    "they are until it is measured again")
    assert short_epoch_decisions(reference) == []
