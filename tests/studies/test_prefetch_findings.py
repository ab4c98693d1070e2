"""The prefetch study's table, sentences and figures: rows keyed by loader-path registry
names, labels from the registry, and a figure and its sentence drawn from the same rows."""

from __future__ import annotations

from dataclasses import replace

import pytest
from result_rows import frame, prefetch_case

from storebench.loaders.paths import LOADER_PATHS
from storebench.plots import summarise
from storebench.studies.prefetch import guide as prefetch_guide
from storebench.studies.prefetch import report as prefetch
from storebench.text import format_ratio, format_value


def paths_frame():
    return frame(prefetch_case("none", 0, [1000.0, 1100.0, 900.0]),
                 prefetch_case("thread", 1, [1500.0, 1400.0, 1600.0]),
                 prefetch_case("thread", 2, [2500.0, 2400.0, 2600.0]),
                 prefetch_case("thread", 4, [2000.0, 2100.0, 1900.0]),
                 prefetch_case("process", 2, [4000.0, 4200.0, 3900.0], start_method="fork"),
                 prefetch_case("process", 2, [3000.0, 3100.0, 2900.0], start_method="spawn"),
                 prefetch_case("torch", 2, [1000.0, 990.0, 1010.0], start_method="fork"),
                 prefetch_case("pickled_baseline", 2, [500.0, 510.0, 490.0],
                               start_method="fork"))


def test_prefetch_rows_key_on_registry_names_and_label_from_the_registry():
    rows = prefetch.prefetch_rows(paths_frame())
    paths = dict(zip(rows["path"], rows["label"]))
    assert paths == {
        "none/w0/": "one thread, no prefetcher",
        "thread/w1/": "ThreadPrefetcher \u00d71",
        "thread/w2/": "ThreadPrefetcher \u00d72",
        "thread/w4/": "ThreadPrefetcher \u00d74",
        "process/w2/fork": "ProcessPrefetcher \u00d72",
        "process/w2/spawn": "ProcessPrefetcher \u00d72 (spawn)",
        "torch/w2/fork": "torch DataLoader \u00d72",
        "pickled_baseline/w2/fork": "pickled-queue baseline \u00d72",
    }
    assert set(rows["dataset"]) == {"memmap-raw"} and set(rows["decode"]) == {"none"}
    assert prefetch.prefetch_rows(paths_frame().iloc[0:0]).empty


def test_prefetch_table_and_findings():
    df = paths_frame()
    table = prefetch.prefetch_table(df).set_index("path")
    assert table.loc["process/w2/fork", "speedup"] == pytest.approx(4.0)
    assert table.loc["process/w2/fork", "label"] == "ProcessPrefetcher \u00d72"
    assert table.loc["process/w2/fork", "repeats"] == 3
    assert table.loc["process/w2/fork", "cpu_utilisation"] == 1.0
    sentences = prefetch.prefetch_findings(df)
    assert ("memmap-raw: ProcessPrefetcher \u00d72 is 4.00\u00d7 faster than torch DataLoader "
            "\u00d72 (4.00k samples/s vs 1.00k samples/s).") in sentences
    assert ("memmap-raw (copy-bound, 8 paths): one thread delivers 1.00k samples/s; the "
            "fastest path is ProcessPrefetcher \u00d72 at 4.00k samples/s (4.00\u00d7 one "
            "thread, median of 3 repeats, 3.90k samples/s\u20134.20k samples/s).") in sentences
    assert any("8.00\u00d7 faster than pickled-queue baseline \u00d72" in s for s in sentences)
    assert ("memmap-raw: ProcessPrefetcher \u00d72 (spawn) is 1.33\u00d7 slower than "
            "ProcessPrefetcher \u00d72 (3.00k samples/s vs 4.00k samples/s).") in sentences
    assert ("memmap-raw: ThreadPrefetcher peaks at 2 worker(s) (2.50k samples/s); 4 workers "
            "reach 0.80\u00d7 of that peak.") in sentences


def test_renaming_a_label_keeps_every_finding(monkeypatch):
    # Findings key on registry names: a label is only how a path is shown.
    df = paths_frame()
    before = prefetch.prefetch_findings(df)
    monkeypatch.setitem(LOADER_PATHS, "process",
                        replace(LOADER_PATHS["process"], label="Renamed Prefetcher"))
    after = prefetch.prefetch_findings(df)
    assert len(after) == len(before) == 8  # with threads vs processes explained
    assert [s.replace("Renamed Prefetcher", "ProcessPrefetcher") for s in after] == before
    assert any("Renamed Prefetcher \u00d72 is 4.00\u00d7 faster than torch" in s for s in after)


def drawn_bars(ax) -> dict[str, float]:
    """Tick label -> bar length of a horizontal bar chart."""
    return {tick.get_text(): patch.get_width()
            for tick, patch in zip(ax.get_yticklabels(), ax.patches, strict=True)}


def test_the_paths_figure_and_its_sentences_come_from_the_same_rows():
    df = paths_frame()
    (ax,) = prefetch.plot_prefetch_paths(df).axes
    drawn = drawn_bars(ax)
    table = prefetch.prefetch_table(df)
    assert drawn == dict(zip(table["label"], table["samples_per_s"]))
    assert drawn == dict(zip(*summarise(prefetch.prefetch_rows(df), "samples_per_s",
                                        ["label"])[["label", "median"]].T.to_numpy()))
    sentences = prefetch.prefetch_findings(df)
    fastest = max(drawn, key=drawn.get)
    one = drawn["one thread, no prefetcher"]
    assert any(f"the fastest path is {fastest} at {format_value(drawn[fastest], 'samples/s')} "
               f"({format_ratio(drawn[fastest] / one)} one thread" in s for s in sentences)
    for ours, theirs in (("ProcessPrefetcher \u00d72", "torch DataLoader \u00d72"),
                         ("ThreadPrefetcher \u00d72", "ThreadPrefetcher \u00d71")):
        quoted = (f"({format_value(drawn[ours], 'samples/s')} vs "
                  f"{format_value(drawn[theirs], 'samples/s')})")
        assert any(s.startswith(f"memmap-raw: {ours} is ") and f" {theirs} {quoted}" in s
                   for s in sentences), (ours, theirs, quoted)


def test_the_scaling_figure_draws_the_sweep_its_sentence_quotes():
    df = paths_frame()
    (ax,) = prefetch.plot_prefetch_scaling(df).axes
    sweeps = {c.get_label(): c.lines[0] for c in ax.containers}  # errorbar: label, data line
    assert set(sweeps) == {"ThreadPrefetcher", "ProcessPrefetcher"}
    thread = sweeps[LOADER_PATHS["thread"].label]
    assert list(thread.get_xdata()) == [1, 2, 4]
    assert list(thread.get_ydata()) == [1500.0, 2500.0, 2000.0]
    assert list(sweeps["ProcessPrefetcher"].get_ydata()) == [4000.0]  # fork only, not spawn
    (one_thread,) = [line for line in ax.get_lines()
                     if line.get_label() == LOADER_PATHS["none"].label]
    assert list(one_thread.get_ydata()) == [1000.0, 1000.0]
    peak = max(thread.get_ydata())
    assert (f"ThreadPrefetcher peaks at 2 worker(s) ({format_value(peak, 'samples/s')})"
            in " ".join(prefetch.prefetch_findings(df)))


def decoder_frame():
    cases = []
    for decode, serial, threads, processes in (("pil", 100.0, 120.0, 180.0),
                                               ("simplejpeg", 200.0, 380.0, 360.0)):
        for prefetcher, workers, value in (("none", 0, serial), ("thread", 2, threads),
                                           ("process", 2, processes)):
            cases.append(prefetch_case(prefetcher, workers, [value, value * 1.01, value * 0.99],
                                       start_method="fork" if prefetcher == "process" else None,
                                       fmt="lmdb", encoding="jpeg", decode=decode))
    cases.append(prefetch_case("tf_data", 0, [150.0, 151.0, 149.0], fmt="tfrecord",
                               encoding="jpeg", decode="tf"))
    return frame(*cases)


def test_decoder_findings_and_figure_agree():
    df = decoder_frame()
    table = prefetch.decoder_table(df)
    assert len(table) == 6
    assert ("lmdb-jpeg: two threads speed up simplejpeg decoding 1.90\u00d7 over one thread "
            "and pil 1.20\u00d7. CPU per sample, one thread then two: simplejpeg 5.00 ms then "
            "2.63 ms (-47%), pil 10.00 ms then 8.33 ms (-17%); two threads keep 1.00 and 1.00 "
            "cores busy. On as many busy cores, the decoder whose second thread costs less "
            "extra CPU per sample gains more.") in prefetch.prefetch_findings(df)
    (ax,) = prefetch.plot_decoders(df).axes
    heights = sorted(round(p.get_height(), 6) for p in ax.patches)
    assert heights == sorted([1.0, 1.0, 1.2, 1.8, 1.9, 1.8])


def test_tf_data_findings_compare_with_our_best_on_the_same_samples():
    df = decoder_frame()
    (native,) = prefetch.tf_data_findings(df)
    assert native == (
        "The same JPEG samples: tf.data TFRecord AUTOTUNE over tfrecord-jpeg (TensorFlow "
        "decodes) delivers 150 samples/s; our best, ThreadPrefetcher \u00d72 over lmdb-jpeg "
        "with simplejpeg, 380 samples/s (2.53\u00d7 tf.data).")
    # tf.data's own pipeline is drawn in the simplejpeg panel of the same samples.
    fig = prefetch.plot_prefetch_paths(df)
    panels = {ax.get_title().split(" (")[0]: drawn_bars(ax) for ax in fig.axes}
    assert set(panels) == {"lmdb-jpeg, pil decoder", "lmdb-jpeg, simplejpeg decoder"}
    assert panels["lmdb-jpeg, simplejpeg decoder"][
        "tf.data TFRecord AUTOTUNE (over tfrecord-jpeg, TensorFlow decodes)"] == 150.0


def test_guide_names_the_start_method_of_every_process_path():
    """A process path measured under fork reads "(fork)" in the guide: fork and spawn differ
    by tens of percent, so the row must not read as the path's answer under every method."""
    from storebench.results import Results

    (row,) = prefetch_guide.guide(Results(paths_frame(), {"cpus_usable": 2}))
    labels = {candidate.key: candidate.label for candidate in row.candidates}
    assert labels["process/w2/fork"] == "ProcessPrefetcher \u00d72 (fork)"
    assert labels["process/w2/spawn"] == "ProcessPrefetcher \u00d72 (spawn)"
    assert labels["torch/w2/fork"] == "torch DataLoader \u00d72 (fork)"
    assert labels["thread/w2/"] == "ThreadPrefetcher \u00d72"


def _table_row(decode, prefetcher, workers, rate, busy, serial_rate=None):
    from storebench.loaders.paths import LOADER_PATHS, path_label

    method = LOADER_PATHS[prefetcher].start_method or ""
    return {"dataset": "lmdb-jpeg", "decode": decode, "transform": "", "prefetcher": prefetcher,
            "workers": workers, "path": f"{prefetcher}/w{workers}/{method}",
            "label": path_label(prefetcher, workers, method), "samples_per_s": rate,
            "cpu_utilisation": busy, "speedup": rate / (serial_rate or rate)}


def test_the_surprises_are_explained_from_cpu_per_sample_and_busy_cores():
    """Threads against processes, and which decoder a second thread helps more, each said
    with the CPU the rows measured per sample and the cores kept busy."""
    import pandas as pd

    from storebench.studies.prefetch.report import (
        decoder_findings,
        threads_vs_processes_findings,
    )

    table = pd.DataFrame([
        _table_row("simplejpeg", "none", 0, 4000.0, 0.96),
        _table_row("simplejpeg", "thread", 2, 5600.0, 1.68, 4000.0),
        _table_row("simplejpeg", "process", 2, 4000.0, 1.60, 4000.0),
        _table_row("pil", "none", 0, 2000.0, 0.98),
        _table_row("pil", "thread", 2, 3400.0, 1.70, 2000.0),
    ])
    (sentence,) = threads_vs_processes_findings(table)
    assert sentence == (
        "lmdb-jpeg, simplejpeg decoder: ThreadPrefetcher \u00d72 delivers 5.60k samples/s "
        "against 4.00k samples/s for ProcessPrefetcher \u00d72; CPU per sample: threads "
        "0.30 ms, processes 0.40 ms (processes spend 0.10 ms more CPU per sample, handing "
        "every batch from the workers to the consumer).")
    (decoders,) = [s for s in decoder_findings(table) if "two threads speed up" in s]
    assert decoders == (
        "lmdb-jpeg: two threads speed up pil decoding 1.70\u00d7 over one thread and "
        "simplejpeg 1.40\u00d7. CPU per sample, one thread then two: pil 0.49 ms then "
        "0.50 ms (+2%), simplejpeg 0.24 ms then 0.30 ms (+25%); two threads keep 1.70 and "
        "1.68 cores busy. On as many busy cores, the decoder whose second thread costs less "
        "extra CPU per sample gains more.")
