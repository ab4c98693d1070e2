"""The resume study: its audit counts what a bad delivery lost and repeated; a killed epoch
through a real ProcessPrefetcher comes back exact, in its own processes, leaving nothing
behind; its table, figure, findings and guide read rows whose outcomes are chosen; and the ci
study writes its rows (``storebench run --study resume`` resumes them)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import psutil
import pytest
from matplotlib.figure import Figure
from result_rows import frame

from storebench.bench.case import CaseSkipped, Trial
from storebench.bench.schema import make_row, read_results
from storebench.processes import SHM_DIR, SHM_PREFIX
from storebench.results import Results
from storebench.studies.resume import cases, grid, guide, report
from storebench.studies.resume.cases import audit_epoch, ids_of, sample_digests

ORDER = [3, 0, 4, 1, 2]


# -- the audit ---------------------------------------------------------------------------
def test_an_uninterrupted_delivery_is_exact():
    audit = audit_epoch(ORDER, range(5), order=ORDER)
    assert (audit.lost, audit.duplicated, audit.unknown, audit.in_order) == (0, 0, 0, True)
    assert audit.exact and audit.outcome() == "exact"


def test_a_restart_from_an_older_position_counts_the_repeated_samples():
    # Killed after 4 samples, restored from the checkpoint after 2: samples 4 and 1 twice.
    delivered = [3, 0, 4, 1, 4, 1, 2]
    audit = audit_epoch(delivered, range(5), order=ORDER)
    assert (audit.lost, audit.duplicated, audit.in_order) == (0, 2, False)
    assert not audit.exact and audit.outcome() == "0 lost, 2 duplicated"


def test_a_restore_that_skips_ahead_counts_the_lost_samples():
    delivered = [3, 0, 2]
    audit = audit_epoch(delivered, range(5), order=ORDER)
    assert (audit.lost, audit.duplicated, audit.delivered) == (2, 0, 3)
    assert audit.outcome() == "2 lost, 0 duplicated"


def test_lost_and_duplicated_together_and_content_of_no_sample():
    delivered = [3, 3, 0, -1, 2]  # 3 twice, 4 and 1 never, one unknown image
    audit = audit_epoch(delivered, range(5), order=ORDER)
    assert (audit.lost, audit.duplicated, audit.unknown) == (2, 1, 1)
    assert audit.outcome() == "2 lost, 1 duplicated, 1 unknown"


def test_the_right_samples_in_another_order_are_not_exact():
    audit = audit_epoch([0, 1, 2, 3, 4], range(5), order=ORDER)
    assert (audit.lost, audit.duplicated, audit.in_order) == (0, 0, False)
    assert not audit.exact and audit.outcome() == "exact samples, another order"


def test_a_multiset_with_padding_repeats_is_audited_as_a_multiset():
    # Across ranks the epoch pads with repeats: expected twice is not a duplicate.
    expected = [0, 1, 2, 3, 4, 0]
    assert audit_epoch([4, 0, 3, 0, 2, 1], expected).exact
    audit = audit_epoch([4, 0, 3, 2, 1], expected)
    assert (audit.lost, audit.duplicated, audit.in_order) == (1, 0, None)


def test_samples_are_identified_by_their_content():
    images = np.arange(3 * 4 * 4, dtype=np.uint8).reshape(3, 4, 4, 1)
    labels = np.array([5, 6, 7])
    known = {d: i for i, d in enumerate(sample_digests(images, labels))}
    assert len(known) == 3
    changed = images.copy()
    changed[1, 0, 0, 0] ^= 1  # one bit of sample 1's image
    relabelled = labels.copy()
    relabelled[2] = 8
    np.testing.assert_array_equal(ids_of(sample_digests(images[::-1], labels[::-1]), known),
                                  [2, 1, 0])
    np.testing.assert_array_equal(ids_of(sample_digests(changed, labels), known), [0, -1, 2])
    np.testing.assert_array_equal(ids_of(sample_digests(images, relabelled), known),
                                  [0, 1, -1])


def ci_cases(data_dir) -> dict:
    return {(c.param("path"), c.param("scenario")): c
            for c in grid.resume_grid(profile="ci", data_dir=data_dir)}


def test_kill_points_are_seeded_inside_the_epoch_after_a_checkpoint(tmp_path):
    case = ci_cases(tmp_path)[("process_fork", "same_workers")]
    points = cases.kill_points(case, 16, 2)
    assert points == cases.kill_points(case, 16, 2)
    batches = [b for b, _, _ in points]
    assert batches == sorted(set(batches)) and len(batches) == 2
    assert all(case.param("every") < b <= 14 for b in batches)
    assert [mid for _, mid, _ in points].count(True) == 1
    assert cases.kill_points(case, 16, 2, repeat=1) != points  # each repeat its own


def test_repeats_are_killed_epochs_and_the_worst_audit_counts(tmp_path):
    cases_laid_out = grid.resume_grid(profile="ci", data_dir=tmp_path)
    assert {c.repeats for c in cases_laid_out} == {1}
    assert not any(c.warmup for c in cases_laid_out)
    assert {c.repeats for c in grid.resume_grid(profile="ci", data_dir=tmp_path,
                                                  repeats=3)} == {3}
    rows = resume_case_rows("thread", "same_workers", exact(300.0))
    bad = {**exact(300.0), "duplicated": 5, "in_order": 0.0, "exact": 0.0}
    rows += [{**row, "repeat": 1} for row in resume_case_rows("thread", "same_workers", bad)]
    (row,) = report.resume_table(frame(rows)).itertuples()
    assert (row.outcome, row.kills) == ("0 lost, 5 duplicated", 4)


# -- a real killed epoch -----------------------------------------------------------------
def our_segments() -> set[str]:
    return {name for name in os.listdir(SHM_DIR) if name.startswith(SHM_PREFIX)}


@pytest.mark.timeout(300)
def test_a_killed_process_prefetcher_epoch_is_audited_exact(ci_data_root):
    case = ci_cases(ci_data_root)[("process_fork", "same_workers")]
    case = dataclasses.replace(case, params={**dict(case.params),
                                             "scenario": "workers_changed"})
    before_children = {p.pid for p in psutil.Process().children(recursive=True)}
    before_segments = our_segments()
    metrics = cases.resume_case(case, Trial(case, 0))
    assert metrics["kills"][0] == 2 and metrics["mid_batch_kills"][0] == 1
    assert metrics["delivered_samples"][0] == metrics["expected_samples"][0] == 256
    assert (metrics["lost"][0], metrics["duplicated"][0], metrics["unknown_samples"][0]) == (
        0, 0, 0)
    assert metrics["in_order"][0] == 1.0 and metrics["exact"][0] == 1.0
    assert 0 < metrics["checkpoint_bytes"][0] < 1000  # a few numbers, not a buffer
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before_children
    assert not left
    assert our_segments() <= before_segments


def test_paths_that_claim_nothing_and_scenarios_not_run_say_why(tmp_path):
    found = ci_cases(tmp_path)
    unsupported = found[("webdataset", "same_workers")]
    with pytest.raises(CaseSkipped, match="^unsupported: WebDataset keeps no position"):
        cases.resume_case(unsupported, Trial(unsupported, 0))
    full = {(c.param("path"), c.param("scenario")): c
            for c in grid.resume_grid(profile="small", data_dir=tmp_path)}
    assert set(full) >= {(p, s) for p in ("process_fork", "process_spawn", "thread", "torch")
                         for s in cases.SCENARIOS}
    tf_ranks = full[("tf_data", "ranks_2_to_3")]
    with pytest.raises(CaseSkipped, match="cannot re-partition"):
        cases.resume_case(tf_ranks, Trial(tf_ranks, 0))
    assert {p for p, _ in full} == set(cases.RESUME_PATHS)


# -- reading the rows --------------------------------------------------------------------
def resume_case_rows(path: str, scenario: str, metrics: dict | None = None, *,
                     status: str = "ok", error: str = "") -> list[dict]:
    params = json.dumps({"path": path, "scenario": scenario})
    base = dict(run_id="20260101T000000Z-aaaaaa", study="resume", profile="ci",
                case_id=f"resume:{path}/{scenario}", params=params, status=status,
                error=error, prefetcher=cases.get_resume_path(path).loader)
    units = {"checkpoint_bytes": "bytes", "checkpoint_save_s": "s",
             "restart_to_first_batch_s": "s", "in_order": "ratio", "exact": "ratio"}
    if status != "ok":
        return [make_row(repeat=-1, metric="case_seconds", value=1.0, unit="s", **base)]
    return [make_row(repeat=0, metric=name, value=value, unit=units.get(name, "count"),
                     **base) for name, value in metrics.items()]


def exact(bytes_: float, restart: float = 2.0) -> dict:
    return {"lost": 0, "duplicated": 0, "unknown_samples": 0, "in_order": 1.0, "exact": 1.0,
            "kills": 2, "mid_batch_kills": 1, "checkpoint_bytes": bytes_,
            "checkpoint_save_s": 0.01, "restart_to_first_batch_s": restart}


@pytest.fixture
def chosen() -> Results:
    wrong = {**exact(120.0), "duplicated": 64, "in_order": 0.0, "exact": 0.0}
    rows = frame(
        resume_case_rows("process_fork", "same_workers", exact(300.0, 1.0)),
        resume_case_rows("process_fork", "ranks_2_to_3", {k: v for k, v in exact(330.0).items()
                                                          if k != "in_order"}),
        resume_case_rows("mds", "same_workers", wrong),
        resume_case_rows("tf_data", "same_workers", exact(400_000.0, 9.0)),
        resume_case_rows("torchdata", "workers_changed", status="skipped",
                         error="refused: restoring with 1 workers raised AssertionError"),
        resume_case_rows("webdataset", "same_workers", status="skipped",
                         error="unsupported: WebDataset keeps no position to save"),
    )
    return Results(rows, {})


def test_the_table_reads_path_by_scenario(chosen):
    table = report.resume_table(chosen.df).set_index(["path", "scenario"])
    assert table.loc[("process_fork", "same_workers"), "outcome"] == "exact"
    assert table.loc[("process_fork", "ranks_2_to_3"), "outcome"] == "exact"
    assert table.loc[("mds", "same_workers"), "outcome"] == "0 lost, 64 duplicated"
    assert table.loc[("torchdata", "workers_changed"), "outcome"] == "refused"
    # A path that claims nothing is unsupported in every scenario, with its reason.
    for scenario in cases.SCENARIOS:
        row = table.loc[("webdataset", scenario)]
        assert (row["outcome"], row["reason"]) == ("unsupported",
                                                   "WebDataset keeps no position to save")
    outcomes = report.outcome_grid(report.resume_table(chosen.df))
    assert outcomes.loc["ProcessPrefetcher (fork)", "workers_changed"] == "not run"


def test_findings_figure_and_guide_follow_the_rows(chosen):
    sentences = report.findings(chosen)
    text = "\n".join(sentences)
    assert "ProcessPrefetcher (fork) resumed exactly (same workers and 2 \u2192 3 ranks)" in text
    assert ("MosaicML StreamingDataLoader did not resume exactly after SIGKILL (same workers: "
            "0 lost, 64 duplicated)") in text
    assert ("torchdata StatefulDataLoader did not resume exactly after SIGKILL (workers "
            "2\u21941: refused (restoring with 1 workers raised AssertionError))") in text
    assert "WebDataset + DataLoader: unsupported: WebDataset keeps no position" in text
    assert "from 120 B (MosaicML StreamingDataLoader) to 400 kB (tf.data" in text
    fig = report.plot_resume(chosen.df)
    assert isinstance(fig, Figure)
    assert fig.texts[0].get_text() == "Which loaders resume an epoch exactly after SIGKILL?"
    (row,) = guide.guide(chosen)
    assert row.best.key == "process_fork" and row.best.stat.median == 2
    assert [c.key for c in row.candidates] == ["process_fork", "tf_data"]
    assert row.choice == "ProcessPrefetcher (fork)"
    assert row.evidence.startswith("ProcessPrefetcher (fork) 2 vs tf.data iterator checkpoint "
                                   "1; 2.00\u00d7 more (exact)")


# -- the study through the command line --------------------------------------------------
def test_the_ci_study_runs_and_writes_its_rows(ci_study, tmp_path):
    """Built from nothing, as a user runs it: the session's ci study (``storebench study``)
    ran the resume study on the ci profile and the study's own sets. ``storebench run
    --study resume`` over those sets, with those rows copied in, finds nothing to build and
    nothing left to run, and leaves the rows as they were: the rows are read from there."""
    profile_dir, _ = ci_study
    results = tmp_path / "results"
    (results / "ci").mkdir(parents=True)
    shutil.copy(profile_dir / "resume.csv", results / "ci" / "resume.csv")
    completed = subprocess.run(
        [sys.executable, "-m", "storebench", "run", "--study", "resume", "--profile", "ci",
         "--data", str(profile_dir.parents[1] / "data"), "--results", str(results),
         "--quiet"],
        capture_output=True, text=True, timeout=280,
        env={**os.environ, "MPLBACKEND": "Agg"})
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert (results / "ci" / "resume.csv").read_bytes() == (
        profile_dir / "resume.csv").read_bytes()
    rows = read_results(results / "ci" / "resume.csv")
    assert set(rows["status"]) <= {"ok", "skipped"}, rows[["case_id", "error"]]
    table = report.resume_table(rows).set_index(["path", "scenario"])
    for key in grid.COMPACT:
        assert key in table.index
    for key in [("process_fork", "same_workers"), ("thread", "workers_changed"),
                ("process_fork", "ranks_3_to_2")]:
        assert table.loc[key, "outcome"] == "exact", table.loc[key].to_dict()
    assert table.loc[("webdataset", "same_workers"), "outcome"] == "unsupported"
