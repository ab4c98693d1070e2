"""The gpu_feed study's table and sentences: AU and where the stall went, per compute time
and feed path, read from the rows (the device too, never from this machine)."""

from __future__ import annotations

import pytest
from result_rows import feed_case, frame

from storebench.results import Results
from storebench.studies.gpu_feed import grid as feed_grid
from storebench.studies.gpu_feed import guide as feed_guide
from storebench.studies.gpu_feed import report as gpu_feed

H100 = {"device": "cuda", "emulated": False, "device_name": "NVIDIA H100"}


def test_the_feed_device_is_read_from_the_rows_not_the_machine():
    emulated = frame(feed_case("none", 0, 2.0, 0.5))
    assert gpu_feed.feed_device_text(emulated).startswith("No CUDA device took part")
    real = frame(feed_case("none", 0, 2.0, 0.5, device=H100))
    assert gpu_feed.feed_device_text(real).startswith("Copies went to NVIDIA H100 (a real")
    assert gpu_feed.feed_devices(real).to_dict("records") == [
        {"device": "cuda", "device_name": "NVIDIA H100", "emulated": False}]
    (row,) = feed_guide.guide(Results(real, {}))
    assert "emulated" not in row.question
    (row,) = feed_guide.guide(Results(emulated, {}))
    assert "(emulated accelerator)" in row.question
    assert gpu_feed.feed_device_text(emulated.iloc[0:0]) == "No accelerator-feed results."


def feed_frame():
    return frame(feed_case("process", 2, 0.0, 0.0, samples_per_s=60_000.0),
                 feed_case("process", 2, 2.0, 0.5), feed_case("process", 2, 10.0, 0.97),
                 feed_case("none", 0, 0.0, 0.0, samples_per_s=20_000.0),
                 feed_case("none", 0, 2.0, 0.2), feed_case("none", 0, 10.0, 0.6))


def test_feed_table_states_each_paths_headroom_over_the_accelerator():
    table = gpu_feed.feed_table(feed_frame()).set_index(["compute_ms", "path"])
    ten = table.loc[10.0]
    # 256-sample batches every 10 ms are 25.6k samples/s; the path alone reached 60k.
    assert ten.loc["process/w2/pageable, sync", "path_rate_over_accelerator"] == pytest.approx(
        60_000 / 25_600)
    assert ten.loc["none/w0/pageable, sync", "path_rate_over_accelerator"] == pytest.approx(
        20_000 / 25_600)
    assert ten.loc["process/w2/pageable, sync", "label"] == "ProcessPrefetcher \u00d72"
    assert table.loc[(2.0, "none/w0/pageable, sync"), "wait_for_data_fraction"] == (
        pytest.approx(0.4))


def test_feed_findings_give_au_and_the_stall_split_per_compute_time():
    sentences = gpu_feed.feed_findings(feed_frame())
    assert sentences[0].startswith("No CUDA device took part")
    assert ("At 2 ms of compute per batch, accelerator utilisation is: one thread, no "
            "prefetcher 20% (waiting for data 40%, host copy 40%, host overhead 0%); "
            "ProcessPrefetcher \u00d72 50% (waiting for data 25%, host copy 25%, host "
            "overhead 0%).") in sentences
    # Only ProcessPrefetcher at 10 ms has the headroom (60k against 25.6k samples/s).
    (fed,) = [s for s in sentences if s.startswith("Where a path alone delivers")]
    assert ("1.25\u00d7 the accelerator's rate (1 pair of path and compute time), all reach "
            "95% AU (lowest: 97%)") in fed
    assert ("With no compute the feed itself runs at 60.0k samples/s (ProcessPrefetcher "
            "\u00d72, 1.00 GB/s copied).") in sentences


def test_a_fed_path_short_of_the_au_bar_is_counted():
    df = frame(feed_case("process", 2, 0.0, 0.0, samples_per_s=60_000.0),
               feed_case("process", 2, 10.0, 0.73))
    sentences = gpu_feed.feed_findings(df)
    assert any("1 of 1 fall short of 95% AU (lowest: 73%)" in s for s in sentences)


def with_rates(rows: list[dict], **rates: float) -> list[dict]:
    """The case's rows with each named metric's value set (added where the case lacks it)."""
    rows = [dict(row) for row in rows]
    for metric, value in rates.items():
        found = [row for row in rows if row["metric"] == metric]
        if not found:
            found = [dict(row, metric=metric, unit="GB/s") for row in rows
                     if row["metric"] == "h2d_GBps"]
            rows += found
        for row in found:
            row["value"] = value
    return rows


def test_pinned_copies_are_compared_with_pageable_ones_staging_included():
    pinned = with_rates(feed_case("process", 2, 2.0, 0.5, params={"pinned": True}),
                        h2d_GBps=0.8)
    df = frame(feed_case("process", 2, 2.0, 0.5), pinned)
    sentences = gpu_feed.feed_findings(df)
    # Rows from before the device copy was recorded apart: no sentence about it.
    assert ("From the loader's memory to the device, pinned copies (the host copy into the "
            "page-locked buffer counted) run at 0.80\u00d7 the rate of pageable ones (medians "
            "over loaders and compute times).") in sentences
    labels = set(gpu_feed.feed_rows(df)["label"])
    assert labels == {"ProcessPrefetcher \u00d72", "ProcessPrefetcher \u00d72, pinned, sync"}


def test_the_device_copy_alone_is_compared_where_recorded():
    pageable = with_rates(feed_case("process", 2, 2.0, 0.5, device=H100),
                          h2d_GBps=8.0, h2d_device_GBps=8.0)
    pinned = with_rates(feed_case("process", 2, 2.0, 0.5, device=H100,
                                  params={"pinned": True}),
                        h2d_GBps=6.0, h2d_device_GBps=24.0)
    sentences = gpu_feed.feed_findings(frame(pageable, pinned))
    assert ("From the loader's memory to the device, pinned copies (the host copy into the "
            "page-locked buffer counted) run at 0.75\u00d7 the rate of pageable ones; the device "
            "copy alone at 3.00\u00d7 (medians over loaders and compute times).") in sentences
    table = gpu_feed.feed_table(frame(pageable, pinned)).set_index("copy")
    assert table.loc["pinned, sync", "h2d_device_GBps"] == pytest.approx(24.0)


def test_the_newest_stored_run_on_a_cuda_device_is_found_and_an_emulated_one_is_not(tmp_path):
    from result_rows import write_results

    from storebench.studies.base import ReadmePlace
    from storebench.studies.gpu_feed.report import cuda_feed_text

    root = tmp_path / "results" / "gpu-runs"
    assert gpu_feed.latest_cuda_run(root) is None  # no such folder
    for name, device in (("20260101T000000Z-aaaaaa", H100), ("20260102T000000Z-bbbbbb", H100),
                         ("20260103T000000Z-cccccc", {})):
        folder = root / name
        folder.mkdir(parents=True)
        case = (feed_case("process", 2, 2.0, 0.97, device=device) if device
                else feed_case("process", 2, 2.0, 0.97))
        write_results(folder, case, env={"run_id": name, "cpus_usable": 16,
                                         "cuda": {"torch_cuda_available": bool(device),
                                                  "devices": ["NVIDIA H100"]}})
    (root / "empty").mkdir()
    run = gpu_feed.latest_cuda_run(root)
    assert run.env["run_id"] == "20260102T000000Z-bbbbbb"
    assert run.directory == root / "20260102T000000Z-bbbbbb"

    text = cuda_feed_text(root, ReadmePlace(results_dir=root, base=tmp_path))
    assert text.startswith("**On a real GPU** (the `gpu_feed` study in "
                           "`results/gpu-runs/20260102T000000Z-bbbbbb`; machine: ")
    assert "- Copies went to NVIDIA H100 (a real CUDA device" in text
    assert "At 2 ms of compute" not in text  # per compute time: the figure's, not the README's
    assert "![" not in text  # no figure drawn for that run
    figures = run.directory / "figures"
    figures.mkdir()
    (figures / "gpu_feed_utilisation.png").write_bytes(b"png")
    assert cuda_feed_text(root, ReadmePlace(results_dir=root, base=tmp_path)).endswith(
        "(results/gpu-runs/20260102T000000Z-bbbbbb/figures/gpu_feed_utilisation.png)")
    assert cuda_feed_text(tmp_path / "nowhere", tmp_path) == ""


def test_slots_the_prefetcher_pinned_itself_are_compared_with_both_other_copies():
    def case(h2d, **params):
        return with_rates(feed_case("process", 2, 2.0, 0.5, device=H100, params=params),
                          h2d_GBps=h2d)

    df = frame(case(8.0), case(6.0, pinned=True), case(24.0, pinned=True, pin_memory=True))
    sentences = gpu_feed.feed_findings(df)
    assert ("Where the prefetcher writes each batch into memory it page-locked itself "
            "(pin_memory=True), the feeder copies each batch from where it lies. Over compute "
            "times (medians), that runs at 3.00\u00d7 for ProcessPrefetcher \u00d72 the rate "
            "of the same loader's pageable copies, and at 4.00\u00d7 that of pinned copies "
            "through a staging buffer (the median over the loaders measured both ways)."
            ) in sentences
    # A thread prefetcher measured pageable and in place only: its own ratio, and the
    # staged comparison still from the processes alone.
    thread = [with_rates(feed_case("thread", 2, 2.0, 0.5, device=H100, params=params),
                         h2d_GBps=h2d)
              for h2d, params in ((10.0, {}), (15.0, {"pinned": True, "pin_memory": True}))]
    sentences = gpu_feed.feed_findings(frame(
        case(8.0), case(6.0, pinned=True), case(24.0, pinned=True, pin_memory=True), *thread))
    assert any("at 3.00\u00d7 for ProcessPrefetcher \u00d72 and 1.50\u00d7 for "
               "ThreadPrefetcher \u00d72 the rate of the same loader's pageable copies, and at "
               "4.00\u00d7 that of pinned copies through a staging buffer" in s
               for s in sentences)
    # The staged pinned copies are still compared with pageable ones alone.
    assert any("pinned copies (the host copy into the page-locked buffer counted) run at "
               "0.75\u00d7" in s for s in sentences)
    assert "ProcessPrefetcher \u00d72, pinned slots, sync" in set(gpu_feed.feed_rows(df)["label"])
    # Without the slots measured, no sentence about them.
    assert not any("page-locked themselves" in s
                   for s in gpu_feed.feed_findings(frame(case(8.0), case(6.0, pinned=True))))


def test_a_lowest_au_just_under_the_bar_is_not_printed_as_the_bar():
    df = frame(feed_case("process", 2, 0.0, 0.0, samples_per_s=60_000.0),
               feed_case("process", 2, 10.0, 0.949))
    assert any("1 of 1 fall short of 95% AU (lowest: 94.9%)" in s
               for s in gpu_feed.feed_findings(df))


def test_copies_are_compared_within_each_worker_count_of_a_loader():
    """With prefetch processes at two worker counts (one per core on a GPU server), a copy
    mode is compared with pageable copies of the same count: pooled over both counts, the
    ratio of means mixed loaders that feed at different rates."""

    def case(workers, h2d, **params):
        return with_rates(feed_case("process", workers, 2.0, 0.5, device=H100,
                                    params=params), h2d_GBps=h2d)

    df = frame(case(2, 8.0), case(2, 6.0, pinned=True),
               case(16, 10.0), case(16, 10.0, pinned=True))
    table = gpu_feed.feed_table(df)
    assert set(table["feed_loader"]) == {"process/w2", "process/w16"}
    # Medians of the per-count ratios, 0.75 and 1.0 (pooled means would give 8/9).
    assert gpu_feed._pinned_over_pageable(table, "h2d_GBps") == pytest.approx(0.875)
    assert {"ProcessPrefetcher \u00d716", "ProcessPrefetcher \u00d716, pinned, sync"} <= set(
        gpu_feed.feed_rows(df)["label"])


def test_the_feed_grid_adds_one_prefetch_process_per_core_where_there_are_more_than_two():
    loaders = feed_grid.FEED_LOADERS
    # The small profile's 78 batches of 256: 16 processes read 32 ahead, 42 leave 8 to time.
    assert feed_grid.feed_loaders(1, 78) == feed_grid.feed_loaders(2, 78) == loaders
    assert feed_grid.feed_loaders(16, 78) == (*loaders, ("process", 16))
    # More cores than the epoch can time past their read-ahead: as many as it can.
    assert feed_grid.feed_loaders(64, 78) == (*loaders, ("process", 34))
    assert feed_grid.feed_loaders(8, 12) == loaders


def test_rows_timed_before_the_read_ahead_was_used_up_say_what_that_overstates():
    caveat = "timed from the third batch, before the batches the workers had read ahead"
    old = frame(feed_case("none", 0, 2.0, 0.9), feed_case("process", 2, 2.0, 0.9))
    assert any(caveat in s for s in gpu_feed.feed_findings(old))
    timed_after = [dict(row) for row in feed_case("process", 2, 2.0, 0.9)]
    timed_after += [dict(row, metric="warmup_batches", value=6.0, unit="count")
                    for row in timed_after if row["metric"] == "samples_per_s"]
    # The loader without a prefetcher reads nothing ahead: its rows need no warm-up metric.
    new = frame(feed_case("none", 0, 2.0, 0.9), timed_after)
    assert not any(caveat in s for s in gpu_feed.feed_findings(new))


def test_a_small_set_is_fed_in_smaller_batches_so_that_every_loader_times_some():
    """36 images of your own in batches of 8 left 4 batches, fewer than two prefetch
    processes read ahead: their batches shrink until the epoch holds enough."""
    needed = feed_grid.min_feed_batches()
    assert needed == feed_grid.batches_before_timing(2) + feed_grid.TIMED_BATCHES == 8
    assert feed_grid.feed_batch_size(20_000) == 256
    assert feed_grid.feed_batch_size(512) == 64
    assert feed_grid.feed_batch_size(36) == 4
    assert feed_grid.feed_batch_size(needed) == 1
    assert feed_grid.feed_batch_size(needed - 1) is None


def test_the_feed_figure_gives_each_loader_a_panel_and_splits_time_only_where_paths_differ():
    df = frame(feed_case("process", 2, 0.0, 0.0, samples_per_s=60_000.0),
               feed_case("process", 2, 2.0, 0.8), feed_case("process", 16, 2.0, 0.9),
               feed_case("none", 0, 2.0, 0.5), feed_case("none", 0, 10.0, 1.0),
               feed_case("process", 2, 10.0, 1.0), feed_case("process", 16, 10.0, 1.0))
    fig = gpu_feed.plot_feed(df)
    panels = [ax for ax in fig.axes if ax.get_xlabel() == "accelerator demand (samples/s)"]
    # Slowest own rate first; a loader without a 0 ms row has no ceiling to sort by.
    assert {ax.get_title() for ax in panels} == {
        "ProcessPrefetcher \u00d72", "ProcessPrefetcher \u00d716", "one thread, no prefetcher"}
    # The demand a 256-sample batch every 2 ms and 10 ms makes: 128k and 25.6k samples/s.
    (process,) = [ax for ax in panels if ax.get_title() == "ProcessPrefetcher \u00d72"]
    measured = process.containers[0].lines[0].get_xydata()
    assert [tuple(p) for p in measured] == [(25_600.0, 1.0), (128_000.0, 0.8)]
    # Its ceiling: its own 60k samples/s over the demand, dotted.
    (ceiling,) = [line for line in process.get_lines()
                  if line.get_linestyle() == ":" and len(line.get_xdata())]
    x, y = ceiling.get_data()
    assert y[x > 60_000] == pytest.approx(60_000 / x[x > 60_000])
    # A time split only at 2 ms, where the paths differ, with the three paths below 95%,
    # the least busy on top; each bar's parts sum to one.
    (split,) = [ax for ax in fig.axes if ax.get_xlabel() == "fraction of wall time"]
    assert split.get_title().startswith("2 ms of compute per batch")
    assert [t.get_text() for t in split.get_yticklabels()] == [
        "one thread, no prefetcher", "ProcessPrefetcher \u00d72", "ProcessPrefetcher \u00d716"]
    assert split.get_ylim() == (2.6, -0.6)
    ends = {}
    for bar in split.patches:
        ends[round(bar.get_y(), 3)] = max(ends.get(round(bar.get_y(), 3), 0.0),
                                          bar.get_x() + bar.get_width())
    assert list(ends.values()) == pytest.approx([1.0, 1.0, 1.0])


def test_on_the_imagenet_family_the_feed_reads_the_224_copy_and_its_caption_says_so(
        tmp_path):
    """No device here: every case copies into CPU memory, emulated; each case names the
    arrays it feeds, and the figure's caption comes from them, not from the profile."""
    from storebench.bench.plan import family_data_dir
    from storebench.study import build_profile

    data_dir = family_data_dir(tmp_path, "imagenet")
    build_profile("ci", data_dir, formats=["memmap"], family="imagenet", knob_variants=False,
                  progress=False)
    cases = feed_grid.grid(profile="ci", data_dir=data_dir)
    assert cases and {c.param("sample_shape") for c in cases} == {"224x224x3"}
    assert {(c.param("device"), c.param("emulated")) for c in cases} == {("cpu", True)}
    rows = gpu_feed.feed_rows(frame(feed_case("process", 2, 10.0, au=0.9,
                                              params={"sample_shape": "224x224x3"})))
    caption = gpu_feed.feed_caption(rows)
    assert caption.startswith("raw 224\u00d7224\u00d73 arrays as stored, batch ")
    assert "64\u00d764" not in caption
