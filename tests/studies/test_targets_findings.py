"""The targets study's table, markdown, sentences and figures, from the rows each target
case writes; the targets and their thresholds live in one place, ``studies.targets``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from result_rows import RUN, case_rows, frame

from storebench.bench.schema import make_row
from storebench.report import findings
from storebench.report import targets as all_targets
from storebench.results import Results
from storebench.studies.targets import cases, guide
from storebench.studies.targets import report as targets
from storebench.studies.targets.cases import target_ratio


def target_case(key, ratios, *, threshold, extra=None):
    """A target case's rows as the runner writes them: per-repeat ``target_ratio`` (and the
    path metrics), then the whole-case value, threshold and met rows."""
    rows = case_rows("targets", f"target:{key}", {"target_ratio": ratios, **(extra or {})},
                     loader=key, params={"target": key})
    median = sorted(ratios)[len(ratios) // 2]
    for metric, value, unit in (("target_value", median, "ratio"),
                                ("target_threshold", threshold, "ratio"),
                                ("target_met", float(median >= threshold), "count")):
        rows.append(make_row(run_id=RUN, study="targets", case_id=f"target:{key}", repeat=-1,
                             metric=metric, value=value, unit=unit, status="ok", loader=key,
                             params=json.dumps({"target": key}), profile="ci"))
    return rows


def targets_frame():
    return frame(
        target_case("process_vs_torch", [3.0, 2.0, 1.0], threshold=1.0,
                    extra={"process_prefetcher.samples_per_s": [300.0, 200.0, 100.0],
                           "torch_dataloader.samples_per_s": [100.0, 100.0, 100.0]}),
        target_case("process_vs_pickled", [3.0, 2.0, 1.0], threshold=3.0),
        target_case("memmap_gather_vs_dram", [0.25, 0.25], threshold=0.5),
    )


def test_targets_table_reads_the_rows_written_by_each_target_case():
    table = targets.targets_table(targets_frame()).set_index("target")
    assert list(table.index) == ["memmap gather vs DRAM copy",
                                 "ProcessPrefetcher vs torch DataLoader",
                                 "ProcessPrefetcher vs pickled baseline"]  # TARGETS order
    versus_torch = table.loc["ProcessPrefetcher vs torch DataLoader"]
    assert (versus_torch["value"], versus_torch["low"], versus_torch["high"]) == (2.0, 1.0, 3.0)
    assert versus_torch["met"] and versus_torch["repeats"] == 3
    versus_pickled = table.loc["ProcessPrefetcher vs pickled baseline"]
    assert not versus_pickled["met"]
    assert versus_pickled["shortfall"] == pytest.approx(1 - 2.0 / 3.0)
    assert table.loc["memmap gather vs DRAM copy", "value"] == 0.25


def test_targets_markdown_lists_every_declared_target_met_or_not():
    df = frame(
        target_case("process_vs_torch", [3.0, 2.0, 2.5, 2.2, 2.8], threshold=1.0),
        target_case("process_vs_pickled", [3.0, 2.0, 1.0, 2.0, 2.0], threshold=3.0),
        target_case("memmap_gather_vs_dram", [0.25, 0.25], threshold=0.5),
        target_case("thread_vs_serial_decode", [0.90, 0.95, 0.92], threshold=0.85),
    )
    markdown = all_targets.targets_markdown(Results(df))
    assert ("| best prefetcher decode vs cores \u00d7 one thread | not recorded | 92% (no "
            "interval: fewer than "
            "5 repeats, n=3) | \u2265 85% | **undecided** (the median clears it; n=3) |"
            ) in markdown
    assert ("| ProcessPrefetcher vs torch DataLoader | not recorded | 2.50\u00d7 "
            "(2.00\u00d7\u20133.00\u00d7, "
            "n=5) | \u2265 1.00\u00d7 | yes |") in markdown
    assert ("| ProcessPrefetcher vs pickled baseline | not recorded | 2.00\u00d7 "
            "(1.00\u00d7\u20133.00\u00d7, "
            "n=5) | \u2265 3.00\u00d7 | **no** (33% short) |") in markdown
    # Two repeats decide nothing, but a median that misses is a miss.
    assert ("| memmap gather vs DRAM copy | not recorded | 25% (no interval: fewer than 5 "
            "repeats, n=2) | "
            "\u2265 75% | **no** (67% short; n=2) |") in markdown
    # Targets other studies declare are listed though these rows hold none of them.
    assert ("| Out of core: shuffled vs guest-cold sequential |  | not measured in these results | "
            "\u2265 50% | not measured |") in markdown
    for _, spec in all_targets.every_target():
        assert f"| {spec.name} |" in markdown
    assert {study for study, _ in all_targets.every_target()} >= {
        "targets", "out_of_core", "remote", "peers"}
    # The targets study's, on small synthetic sets, calibrate the machine; the others are
    # measured on the training set.
    calibration = all_targets.targets_markdown(Results(df), calibration=True)
    training = all_targets.targets_markdown(Results(df), calibration=False)
    for study, spec in all_targets.every_target():
        assert spec.calibration == (study == "targets"), spec.name
        assert (f"| {spec.name} |" in calibration) == spec.calibration, spec.name
        assert (f"| {spec.name} |" in training) != spec.calibration, spec.name


def test_a_target_names_the_workload_its_rows_measured():
    df = frame(target_case("process_vs_torch", [3.0, 2.0, 2.5, 2.2, 2.8], threshold=1.0))
    results = Results(df, workloads={"targets": {"raw": "20 synthetic 8x8x3 raw arrays"}})
    table = all_targets.all_targets_table(results).set_index("key")
    assert table.loc["process_vs_torch", "workload"] == "20 synthetic 8x8x3 raw arrays"
    assert table.loc["out_of_core_cold_read", "workload"] == ""
    assert ("| ProcessPrefetcher vs torch DataLoader | 20 synthetic 8x8x3 raw arrays | "
            "2.50\u00d7") in all_targets.targets_markdown(results)


def test_target_sentences_state_value_interval_and_verdict():
    sentences = targets.targets_findings(targets_frame())
    assert ("ProcessPrefetcher vs pickled baseline (shared memory vs pickled batches through "
            "a multiprocessing.Queue): 2.00\u00d7 (median of 3 paired repeats, 95% interval "
            "1.00\u00d7\u20133.00\u00d7); threshold 3.00\u00d7, missed by 33%.") in sentences


def test_the_readme_and_the_methodology_page_list_every_target_declared_in_the_code():
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    table = readme[readme.index("**Performance targets**"):]
    methodology = (root / "docs" / "methodology.md").read_text()
    calibration = methodology[methodology.index("## Machine calibration"):]
    for _, spec in all_targets.every_target():
        assert f"| {spec.name} |" in (calibration if spec.calibration else table), spec.name
        assert f"| {spec.name} |" not in (table if spec.calibration else calibration)


def test_gather_sentence_splits_the_shortfall_and_names_the_split_gather():
    df = frame(target_case("memmap_gather_vs_dram", [0.9, 0.8, 1.0], threshold=0.75, extra={
        "memmap.fraction_of_dram_copy": [0.6, 0.5, 0.7],
        "memmap_threads.fraction_of_dram_copy": [0.9, 0.8, 1.0],
        "memmap.bare_take_fraction_of_dram_copy": [0.7, 0.75, 0.8],
        "memmap.fraction_of_bare_take": [0.9, 0.85, 0.95],
        "memmap.numpy_take_fraction_of_dram_copy": [0.4, 0.45, 0.5],
        "memmap.bare_take_threads_fraction_of_dram_copy": [1.1, 1.0, 1.2],
        "memmap_prefetched.fraction_of_dram_copy": [0.7, 0.72, 0.71],
        "memmap_consumer_reads.fraction_of_dram_copy": [0.74, 0.76, 0.73],
        "memmap_threads.fraction_of_bare_take_threads": [0.82, 0.8, 0.84],
        "threads": [2.0, 2.0, 2.0]}))
    (sentence,) = targets.targets_findings(df)
    assert sentence.endswith(
        " A bare one-thread take_rows of the same batches from the same array reaches 75% of "
        "the copy: the access pattern's own limit for one thread; the one-thread loader "
        "gather delivers 90% of that. NumPy's np.take of the same batches, one row at a time, "
        "reaches 45%. Gathered by one thread it reaches 60% of the copy, "
        "split over 2 threads (one per core) 90%. Through a ThreadPrefetcher with 2 workers, "
        "kept from epoch to epoch, it reaches 71%. With 1 worker and the consumer reading "
        "a batch itself rather than wait for one, it reaches 74%. 2 free-running threads, "
        "each taking every other batch whole with no hand-off per batch, reach 110% of the "
        "copy: the access pattern's own limit at 2 threads; the split gather, whose parts "
        "meet at every batch, delivers 82% of that."), sentence
    four = df.copy()
    four.loc[four["metric"] == "threads", "value"] = 4.0
    (sentence,) = targets.targets_findings(four)
    assert "4 free-running threads, each taking every 4th batch whole" in sentence
    assert "With 3 workers and the consumer reading" in sentence
    (other,) = targets.targets_findings(frame(target_case("process_vs_torch", [2.0],
                                                          threshold=1.0)))
    assert "np.take" not in other and "split over" not in other


def test_parquet_sentence_says_where_the_epochs_time_goes():
    df = frame(target_case("block_vs_random_parquet", [190.0, 195.0, 200.0], threshold=200.0,
                           extra={"block_shuffled_epoch.row_group_read_fraction": [0.8, 0.78, 0.79],
                                  "random_row_access.row_group_read_fraction": [0.97, 0.97, 0.96],
                                  "rows_per_row_group": [253.2, 253.2, 253.2],
                                  "reads_only_ratio": [244.0, 250.0, 247.0]}))
    (sentence,) = targets.targets_findings(df)
    assert sentence.endswith(
        " Reading row groups takes 79% of the block-shuffled epoch and 97% of the random "
        "reads; with 253 rows per group, had the epoch cost only its reads the ratio would "
        "be 247\u00d7. The rest of the epoch (the gather into the batch, per-batch "
        "bookkeeping) is what keeps it below that."), sentence
    # Other targets say nothing of row groups.
    assert "row groups" not in " ".join(targets.targets_findings(targets_frame()))


def test_the_thresholds_live_in_one_place():
    assert not hasattr(findings, "TARGETS")
    assert len({t.key for t in cases.TARGETS}) == len(cases.TARGETS)
    decode = cases.get_target("thread_vs_serial_decode")
    df = frame(target_case("thread_vs_serial_decode", [2.0], threshold=decode.threshold))
    (row,) = targets.targets_table(df).itertuples()
    assert row.threshold == decode.threshold and row.what == decode.description


def test_target_ratio_takes_the_best_numerator_over_the_denominator():
    tf = cases.get_target("torch_vs_tf_data")
    assert target_ratio(tf, {"torch_thread_prefetcher.samples_per_s": 500.0,
                             "torch_process_prefetcher.samples_per_s": 300.0,
                             "torch_dataloader.samples_per_s": 400.0,
                             "tf_data_autotune.samples_per_s": 200.0}) == 2.5
    # Every one of our paths is a candidate: one left unmeasured is an error, not a pass.
    with pytest.raises(KeyError, match="torch_thread_prefetcher"):
        target_ratio(tf, {"torch_process_prefetcher.samples_per_s": 300.0,
                          "torch_dataloader.samples_per_s": 400.0,
                          "tf_data_autotune.samples_per_s": 200.0})
    with pytest.raises(KeyError, match="did not measure"):
        target_ratio(tf, {"torch_dataloader.samples_per_s": 1.0})
    gather = cases.get_target("memmap_gather_vs_dram")
    assert gather.is_fraction
    # The gather split over threads and the two prefetched ones are candidates too: the
    # fastest of the four is the figure.
    paths = {"memmap.fraction_of_dram_copy": 0.3, "memmap_threads.fraction_of_dram_copy": 0.4,
             "memmap_prefetched.fraction_of_dram_copy": 0.35,
             "memmap_consumer_reads.fraction_of_dram_copy": 0.38}
    assert target_ratio(gather, paths) == 0.4
    assert target_ratio(gather, {**paths, "memmap_prefetched.fraction_of_dram_copy": 0.5}) == 0.5
    assert target_ratio(gather, {**paths,
                                 "memmap_consumer_reads.fraction_of_dram_copy": 0.6}) == 0.6
    for missing in ("memmap_threads", "memmap_prefetched", "memmap_consumer_reads"):
        with pytest.raises(KeyError, match=missing):
            target_ratio(gather, {name: value for name, value in paths.items()
                                  if not name.startswith(f"{missing}.")})


def test_target_figure_draws_each_value_against_its_threshold_from_the_rows():
    df = frame(target_case("process_vs_torch", [2.0] * 5, threshold=1.0),
               target_case("block_vs_random_parquet", [50.0] * 5, threshold=200.0),
               target_case("memmap_gather_vs_dram", [0.9], threshold=0.75))
    table = all_targets.all_targets_table(Results(df))
    figure = all_targets.plot_target_ratios(table)
    (ax,) = figure.axes
    bars = {label.get_text().split("\n")[0]: patch
            for label, patch in zip(ax.get_yticklabels(), ax.patches, strict=True)}
    assert set(bars) == set(table["target"])  # every declared target has a row
    # value / threshold: 1 is just met
    assert bars["ProcessPrefetcher vs torch DataLoader"].get_width() == 2.0
    assert bars["block-shuffled vs random Parquet rows"].get_width() == 0.25
    green, red = (0.173, 0.627, 0.173), (0.839, 0.153, 0.157)
    colour = {name: bar.get_facecolor()[:3] for name, bar in bars.items()}
    assert colour["ProcessPrefetcher vs torch DataLoader"] == pytest.approx(green, abs=0.01)
    assert colour["block-shuffled vs random Parquet rows"] == pytest.approx(red, abs=0.01)
    # Above its threshold, but on one repeat: undecided, so grey, and not in the caption.
    assert colour["memmap gather vs DRAM copy"] == pytest.approx((0.667,) * 3, abs=0.01)
    labels = [label.get_text() for label in ax.get_yticklabels()]
    assert "ProcessPrefetcher vs torch DataLoader\n2.00\u00d7 vs \u2265 1.00\u00d7" in labels
    (line,) = [line for line in ax.get_lines() if len(line.get_xdata()) == 2
               and line.get_linewidth() == 1.2]
    assert list(line.get_xdata()) == [1.0, 1.0]
    texts = [text.get_text() for text in figure.texts]
    assert any("block-shuffled vs random Parquet rows (unmet)" in text for text in texts)
    assert not any("memmap gather vs DRAM copy (unmet)" in text for text in texts)
    assert [text.get_text() for text in ax.texts].count("not measured in these results") == (
        int((~table["measured"]).sum()))


def test_the_paths_figure_draws_each_path_over_the_slowest():
    df = targets_frame()
    (ax,) = targets.plot_targets(df).axes
    widths = {label.get_text(): patch.get_width()
              for label, patch in zip(ax.get_yticklabels(), ax.patches, strict=True)}
    # Paths in words, never their metric names; the target's name heads its group.
    assert widths == {"ProcessPrefetcher": 2.0, "torch DataLoader": 1.0}
    assert [t.get_text() for t in ax.texts] == ["ProcessPrefetcher vs torch DataLoader"]
    # The target's own path in one colour, the path it is held to in another.
    colours = [patch.get_facecolor()[:3] for patch in ax.patches]
    assert colours[0] == pytest.approx((0.122, 0.467, 0.706), abs=0.01)
    assert colours[1] == pytest.approx((1.0, 0.498, 0.055), abs=0.01)


def test_the_paths_figure_shows_the_dram_copy_a_gather_is_held_to():
    df = frame(target_case("memmap_gather_vs_dram", [0.9, 0.95, 0.92], threshold=0.75, extra={
        "memmap.samples_per_s": [1000.0, 1000.0, 1000.0],
        "memmap.read_MBps": [3000.0, 3000.0, 3000.0],
        "memmap_threads.samples_per_s": [2000.0, 2000.0, 2000.0],
        "dram_copy_GBps": [12.0, 12.0, 12.0]}))
    (ax,) = targets.plot_targets(df).axes
    widths = {label.get_text(): patch.get_width()
              for label, patch in zip(ax.get_yticklabels(), ax.patches, strict=True)}
    # The copy moves 12 GB/s where the slowest gather delivers 3 GB/s: 4x its bar.
    assert widths == {"one thread gathers from the memmap": 1.0,
                      "a thread per core gathers from the memmap": 2.0,
                      "DRAM copy, 12.0 GB/s": 4.0}


def test_the_tfrecord_guide_row_compares_the_paths_measured_in_one_case():
    df = frame(target_case("torch_vs_tf_data", [1.5, 1.4, 1.6, 1.5, 1.5], threshold=1.0,
                           extra={
        "torch_thread_prefetcher.samples_per_s": [250.0, 260.0, 240.0, 255.0, 245.0],
        "torch_process_prefetcher.samples_per_s": [300.0, 290.0, 310.0, 305.0, 295.0],
        "torch_dataloader.samples_per_s": [150.0, 140.0, 160.0, 150.0, 150.0],
        "tf_data_autotune.samples_per_s": [200.0, 200.0, 200.0, 200.0, 200.0]}))
    (row,) = guide.guide(Results(df, {}))
    assert row.best.key == "torch_process_prefetcher"
    assert [c.key for c in row.candidates] == [
        "torch_process_prefetcher", "torch_thread_prefetcher", "tf_data_autotune",
        "torch_dataloader"]
    assert row.candidates[1].label == "ThreadPrefetcher \u00d72 (simplejpeg)"
    assert row.ratio == pytest.approx(300 / 250) and not row.tie
    assert guide.guide(Results(targets_frame(), {})) == []
