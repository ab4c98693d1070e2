"""The remote study's in-flight sweep and far point: the grid holds them per profile, the
pass's counts are scaled to one epoch, cross-case ratios are unpaired, and the sweep's
figure draws a mark per point beside the capacity model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from result_rows import case_rows, frame

from storebench.results import (
    one_case,
    ratio_interval,
    stat,
    unpaired_ratio_interval,
)
from storebench.studies.remote import study as remote

REPEATS = 5


def epoch(concurrency: int, rtt: float, rates, *, workers: int = 2, extra=None,
          access: str = "shuffle") -> list[dict]:
    """One S3 epoch case of the remote study (samples/s per repeat, and ``extra``)."""
    params = {"source": "s3", "rtt_ms": rtt, "ranks": 1, "concurrency": concurrency}
    return case_rows(
        "remote", f"remote_epoch:tfrecord-jpeg/w{workers}/{access}/c{concurrency}/rtt{rtt}",
        {"samples_per_s": list(rates), "per_rank_samples_per_s": list(rates),
         **(extra or {})},
        format="tfrecord", encoding="jpeg", loader="lazy", prefetcher="thread",
        workers=workers, batch_size=32, access=access, params=params)


def counted(rates, *, samples_per_request=1.0, sample_bytes=100_000.0):
    """``extra`` metrics of a pass that counted its GETs: 320 samples of a 1,280 set."""
    n = len(rates)
    requests = 320 / samples_per_request
    return {"samples": [320.0] * n, "dataset_samples": [1280.0] * n,
            "requests": [requests] * n, "samples_per_request": [samples_per_request] * n,
            "bytes_per_request": [sample_bytes * samples_per_request] * n,
            "server_cpu_s": [0.64] * n}


def sweep_frame():
    zero = [400.0] * REPEATS
    groups = [epoch(64, 0, zero, extra=counted(zero)),
              epoch(64, 0, [390.0] * REPEATS, workers=4, extra=counted(zero))]
    for concurrency, rate in ((1, 50.0), (2, 98.0), (4, 190.0), (8, 330.0), (16, 395.0),
                              (64, 400.0)):
        rates = [rate * f for f in (0.99, 1.0, 1.01, 1.0, 1.0)]
        groups.append(epoch(concurrency, remote.TARGET_RTT_MS, rates, extra=counted(rates)))
    far_concurrency, far_workers = remote.FAR_PATH[2], remote.FAR_PATH[3]
    groups.append(epoch(far_concurrency, remote.FAR_RTT_MS, [280.0] * REPEATS,
                        workers=far_workers, extra=counted([280.0] * REPEATS)))
    return frame(*groups)


# -- the grid ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def imagenet_root(tmp_path_factory):
    from storebench.bench.plan import family_data_dir
    from storebench.study import build_profile

    root = family_data_dir(tmp_path_factory.mktemp("ci"), "imagenet")
    build_profile("ci", root, formats=["tfrecord"], family="imagenet", knob_variants=False,
                  progress=False)
    return root


def epochs(cases):
    """The grid's epochs of storebench's own readers."""
    return [c for c in cases if c.function.endswith(":remote_epoch_case")]


def runs(cases):
    """(in flight, threads, RTT) of the one-rank uncapped S3 epochs."""
    return sorted((c.param("concurrency"), c.workers, c.param("rtt_ms")) for c in epochs(cases)
                  if c.param("source") == "s3" and c.param("ranks") == 1
                  and not c.param("bandwidth_mbit"))


def test_the_compact_grid_sweeps_two_in_flight_counts_at_20_ms_and_has_no_far_point(
        imagenet_root):
    cases = remote.remote_grid(profile="ci", data_dir=imagenet_root)
    assert remote.COMPACT_SWEEP_IN_FLIGHT == (8, 64)
    assert runs(c for c in cases if c.format == "tfrecord") == [
        (8, 2, 20), (64, 2, 0), (64, 2, 20)]
    assert len({c.case_id for c in cases}) == len(cases)


def test_the_full_grid_sweeps_every_in_flight_count_at_20_ms_and_one_far_point(
        imagenet_root, monkeypatch):
    from storebench.bench import plan

    full = dataclasses.replace(plan.plan_for("ci"), compact=False)
    monkeypatch.setattr(remote, "plan_for", lambda profile: full)
    cases = remote.remote_grid(profile="ci", data_dir=imagenet_root)
    assert remote.SWEEP_IN_FLIGHT == (1, 2, 4, 8, 16, 64)
    assert (remote.FAR_RTT_MS, remote.FAR_PATH) == (150, ("tfrecord", "shuffle", 128, 4))
    assert runs(c for c in cases if c.format == "tfrecord") == [
        (1, 2, 20), (2, 2, 20), (4, 2, 20), (8, 2, 20), (16, 2, 20),
        (64, 2, 0), (64, 2, 20), (64, 4, 0), (64, 4, 20), (128, 4, 150)]
    assert len({c.case_id for c in cases}) == len(cases)
    # The sweep's and the far point's cases take the decision's repeats, as the targets'.
    target = next(c for c in epochs(cases) if c.param("concurrency") == 64 and c.workers == 2
                  and c.param("rtt_ms") == 20 and c.param("ranks") == 1
                  and not c.param("bandwidth_mbit"))
    for c in epochs(cases):
        if c.param("concurrency") in (1, 128):
            assert c.repeats == target.repeats


def test_the_label_says_the_in_flight_count_is_a_rank_s_shared_by_its_threads():
    rows = remote.remote_rows(sweep_frame())
    assert "tfrecord, shuffle, 2 threads sharing 8 GETs in flight" in set(rows["path"])
    assert remote.path_label("tfrecord", "block_shuffle", 2) == "tfrecord, block shuffle, 2 threads"


# -- what an epoch costs ----------------------------------------------------------------
def test_the_pass_s_gets_bytes_and_server_cpu_are_scaled_to_one_epoch_exactly():
    rates = [100.0] * REPEATS
    # A pass of 320 samples of a 1,280 set, two samples a GET of 200 kB, 0.64 s of server
    # CPU: 160 GETs a pass, 640 an epoch, 128 MB an epoch, 2 ms a sample.
    df = frame(epoch(64, 0, rates, extra=counted(rates, samples_per_request=2.0)))
    row = remote.remote_table(df).iloc[0]
    assert row["epoch_requests"] == 640.0
    assert row["epoch_bytes"] == 128_000_000.0
    assert row["server_cpu_s_per_sample"] == 0.002
    costs = remote.cost_rows(remote.remote_rows(df))
    assert sorted(costs.groupby("metric")["unit"].first().items()) == [
        ("epoch_bytes", "bytes"), ("epoch_requests", "count"),
        ("server_cpu_s_per_sample", "s")]
    assert (costs.groupby("metric")["repeat"].apply(list) == [list(range(REPEATS))] * 3).all()


def test_rows_without_the_set_s_size_have_no_per_epoch_counts():
    rates = [100.0] * REPEATS
    extra = {k: v for k, v in counted(rates).items() if k != "dataset_samples"}
    row = remote.remote_table(frame(epoch(64, 0, rates, extra=extra))).iloc[0]
    assert np.isnan(row["epoch_requests"]) and np.isnan(row["epoch_bytes"])
    assert row["server_cpu_s_per_sample"] == 0.002


# -- paired only within one case ---------------------------------------------------------
def test_two_cases_are_compared_unpaired_one_case_s_two_metrics_paired():
    # Repeat i of the two moves together: paired, every ratio is exactly 2; unpaired, the
    # resampled medians move apart.
    values = [100.0, 110.0, 120.0, 130.0, 140.0]
    df = frame(epoch(64, 0, values), epoch(64, 20, [2 * v for v in values]))
    near = stat(df[df["case_id"].str.endswith("rtt0")], "samples_per_s")
    far = stat(df[df["case_id"].str.endswith("rtt20")], "samples_per_s")
    assert not one_case(far, near)
    assert ratio_interval(far, near, paired=True) == (2.0, 2.0, 2.0)
    ratio, low, high = ratio_interval(far, near)
    assert (ratio, low, high) == unpaired_ratio_interval(far, near)
    assert ratio == 2.0 and low < 2.0 < high
    # One case's two metrics (its rate per rank and in all) were taken together: paired.
    one = df[df["case_id"].str.endswith("rtt20")]
    total, per_rank = stat(one, "samples_per_s"), stat(one, "per_rank_samples_per_s")
    assert one_case(total, per_rank)
    assert ratio_interval(total, per_rank) == (1.0, 1.0, 1.0)


def test_the_keep_target_s_interval_is_unpaired():
    from storebench.results import Results

    values = [100.0, 110.0, 120.0, 130.0, 140.0]
    df = frame(epoch(64, 0, values), epoch(64, 20, [0.9 * v for v in values]))
    measure = remote.keep_target(Results(df))
    assert measure.value == pytest.approx(0.9)
    assert measure.low < 0.9 < measure.high
    assert remote.keep_at(df, remote.path_label("tfrecord", "shuffle", 2, 64)) == (
        measure.value, measure.low, measure.high)


# -- findings and the figure ------------------------------------------------------------
def test_the_sweep_s_points_are_its_own_and_stay_out_of_the_rtt_comparisons():
    df = sweep_frame()
    sweep = remote.in_flight_sweep(df)
    assert sweep["concurrency"].tolist() == [1, 2, 4, 8, 16, 64]
    far = remote.far_point(df)
    assert far["rtt_ms"] == remote.FAR_RTT_MS and far["samples_per_s"] == 280.0
    # The model for a sweep point: the 64-in-flight 0 ms row, its own in-flight count.
    one = sweep.set_index("concurrency")["predicted_samples_per_s"]
    assert one[1] == pytest.approx(64 / (64 / 400 + 64 * 0.020))
    assert one[64] == pytest.approx(64 / (64 / 400 + 0.020))
    # The far point's model: the 4 threads' 0 ms row, with 128 in flight (one round).
    assert far["predicted_samples_per_s"] == pytest.approx(128 / (128 / 390 + 0.150))
    assert remote.fewest_within_margin(sweep) == 16
    findings = remote.remote_findings(df)
    assert not any("Best one-rank path at 150 ms" in f for f in findings)
    sweep_text = next(f for f in findings if f.startswith("Samples/s by GETs in flight at 20 ms"))
    assert "Little's law from the 0 ms rate asks 8.0 in flight" in sweep_text
    assert "the fewest within 5% of 64's rate: 16" in sweep_text
    assert any("costs 1,280 GETs and 128 MB, and the S3 server 2.00 ms of CPU a sample" in f
               for f in findings)
    assert any(f.startswith("At 150 ms, tfrecord, shuffle, 4 threads sharing 128 GETs")
               for f in findings)


def test_the_figure_draws_one_mark_per_sweep_point_and_the_far_point(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    df = sweep_frame()
    fig = remote.plot_remote_in_flight(df)
    ax = fig.axes[0]
    measured = [c for c in ax.containers
                if str(c.get_label()).startswith("measured at 20 ms")]
    assert len(measured) == 1
    x, y = measured[0].lines[0].get_data()
    assert list(x) == [1, 2, 4, 8, 16, 64]
    assert list(y) == [50.0, 98.0, 190.0, 330.0, 395.0, 400.0]
    far = [line for line in ax.get_lines()
           if str(line.get_label()).startswith("measured at 150 ms")]
    assert [list(line.get_xdata()) for line in far] == [[128]]
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "1", "2", "4", "8", "16", "32", "64", "128"]
    fig.savefig(tmp_path / "remote_in_flight.png")
    spec = next(s for s in remote.FIGURES if s.name == "remote_in_flight")
    from storebench.results import Results

    assert spec.draw(Results(df)) is not None


def test_the_figure_without_sweep_rows_says_so():
    values = [100.0] * REPEATS
    fig = remote.plot_remote_in_flight(frame(epoch(64, 0, values)))
    assert any("no in-flight sweep rows" in t.get_text() for t in fig.axes[0].texts)


# -- the study page ---------------------------------------------------------------------
def test_the_page_block_tables_the_sweep_and_the_far_point_from_the_rows():
    from storebench.results import Results

    text = remote.in_flight_page_text(Results(sweep_frame()))
    lines = text.splitlines()
    assert lines[0].startswith("| round trip | path | samples/s (median, range, n) |")
    assert lines[2 + 3] == (
        "| 20 ms | tfrecord, shuffle, 2 threads sharing 8 GETs in flight | 330 samples/s "
        "(327 samples/s\u2013333 samples/s, n = 5) | 200 samples/s | 1,280 | 128 MB | 2.00 ms |")
    assert lines[2 + 6].startswith("| 150 ms | tfrecord, shuffle, 4 threads sharing 128 GETs")
    assert any(line.startswith("- Samples/s by GETs in flight at 20 ms") for line in lines)
    values = [100.0] * REPEATS
    assert "no in-flight sweep" in remote.in_flight_page_text(
        Results(frame(epoch(64, 0, values))))


def test_the_study_page_s_block_is_what_the_reference_results_generate():
    from pathlib import Path

    from storebench.report.readme import STUDY_END, STUDY_START, render_study_page_block

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "studies" / "remote.md").read_text()
    block = page.split(f"{STUDY_START}\n")[1].split(STUDY_END)[0]
    assert block == render_study_page_block(root / "results" / "reference", "remote")
