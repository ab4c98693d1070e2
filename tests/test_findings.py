"""Findings: every number in a sentence or table follows from the results it is given."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from storebench import findings
from storebench.bench.schema import METRIC_UNITS, ResultsWriter, make_row, validate

RUN = "20260101T000000Z-aaaaaa"


def case_rows(study, case_id, metrics, *, run_id=RUN, status="ok", resident=None, params=None,
              **fields):
    """Schema rows of one case: ``metrics`` maps a metric to its values, one per repeat."""
    rows = []
    for metric, values in metrics.items():
        unit = METRIC_UNITS.get(metric) or ("ratio" if "fraction" in metric else "samples/s")
        for repeat, value in enumerate(values):
            rows.append(make_row(
                run_id=run_id, study=study, case_id=case_id, repeat=repeat, metric=metric,
                value=value, unit=unit, status=status,
                error="" if status == "ok" else "RuntimeError: boom",
                resident_fraction=resident, params=json.dumps(params or {}), profile="ci",
                **fields))
    return rows


def frame(*groups) -> pd.DataFrame:
    return validate(pd.DataFrame([row for rows in groups for row in rows]))


def read_case(fmt, cache, values, *, encoding="raw"):
    return case_rows("formats", f"read:{fmt}-{encoding}/{cache}", {"samples_per_s": values},
                     format=fmt, encoding=encoding, loader="reader", access="sequential",
                     cache=cache, batch_size=256, resident=1.0 if cache == "warm" else 0.0)


def build_case(fmt, *, seconds, apparent, files, encoding="raw", raw=1_000_000):
    return case_rows("formats", f"build:{fmt}-{encoding}", {
        "write_seconds": [seconds], "write_MBps": [raw / seconds / 1e6],
        "bytes_apparent": [apparent], "bytes_allocated": [apparent], "raw_bytes": [raw],
        "size_ratio": [apparent / raw], "file_count": [files],
    }, format=fmt, encoding=encoding)


# -- formatting ----------------------------------------------------------------------------
@pytest.mark.parametrize(("ratio", "text"), [
    (2.0, "2.0\u00d7"), (1.04, "1.0\u00d7"), (12.4, "12\u00d7"), (230.4, "230\u00d7"),
    (0.25, "0.25\u00d7"), (float("nan"), "n/a"),
])
def test_format_ratio(ratio, text):
    assert findings.format_ratio(ratio) == text


@pytest.mark.parametrize(("value", "unit", "text"), [
    (1234.0, "samples/s", "1.23k samples/s"),
    (950.0, "samples/s", "950 samples/s"),
    (2_500_000.0, "samples/s", "2.50M samples/s"),
    (1_500_000.0, "bytes", "1.50 MB"),
    (512.0, "bytes", "512 B"),
    (0.0123, "s", "12.3 ms"),
    (0.000045, "s", "45.0 \u00b5s"),
    (3.5, "s", "3.50 s"),
    (1500.0, "MB/s", "1.50 GB/s"),
    (250.0, "MB/s", "250 MB/s"),
    (512.0, "count", "512"),
])
def test_format_value(value, unit, text):
    assert findings.format_value(value, unit) == text


def test_format_percent_and_signed_bytes():
    assert findings.format_percent(0.873) == "87%"
    assert findings.format_percent(0.005) == "0.5%"
    assert findings.format_percent(0.0001) == "<0.1%"
    assert findings.signed_bytes(-57_300) == "-57.3 kB"
    assert findings.signed_bytes(1_160_000) == "+1.16 MB"


def test_relative_text_says_slower_below_one():
    assert findings.relative_text(2.0) == "2.0\u00d7 faster than"
    assert findings.relative_text(0.5) == "2.0\u00d7 slower than"


# -- selecting -----------------------------------------------------------------------------
def test_stat_is_the_median_of_ok_timed_repeats_of_the_latest_run():
    df = frame(
        read_case("memmap", "warm", [10.0, 30.0, 20.0]),
        # an older run of the same case, and a whole-case row: both ignored
        case_rows("formats", "read:memmap-raw/warm", {"samples_per_s": [999.0]},
                  run_id="20250101T000000Z-bbbbbb", format="memmap", encoding="raw",
                  loader="reader", cache="warm"),
        [make_row(run_id=RUN, study="formats", case_id="read:memmap-raw/warm", repeat=-1,
                  metric="case_seconds", value=5.0, unit="s", status="ok", format="memmap",
                  encoding="raw", loader="reader", cache="warm")],
    )
    value = findings.stat(df, "samples_per_s", format="memmap", cache="warm")
    assert (value.median, value.low, value.high, value.count) == (20.0, 10.0, 30.0, 3)
    assert str(value) == "20.0 samples/s"
    assert value.spread == "10.0 samples/s\u201330.0 samples/s"


def test_stat_skips_failed_rows_and_names_what_is_missing():
    df = frame(case_rows("formats", "read:hdf5-raw/warm", {"samples_per_s": [1.0]},
                         status="failed", format="hdf5", encoding="raw", cache="warm"))
    with pytest.raises(findings.MissingResultError,
                       match="no ok result for samples_per_s with format='hdf5'"):
        findings.stat(df, "samples_per_s", format="hdf5")


def test_select_matches_params():
    df = frame(
        case_rows("gpu_feed", "a", {"samples_per_s": [1.0]}, params={"compute_ms": 2.0}),
        case_rows("gpu_feed", "b", {"samples_per_s": [2.0]}, params={"compute_ms": 10.0}),
    )
    assert list(findings.select(df, "samples_per_s", param_compute_ms=10.0)["case_id"]) == ["b"]


def test_faster_sentence_follows_from_the_medians():
    fast = findings.Stat(2000.0, 1900.0, 2100.0, 5, "samples/s")
    slow = findings.Stat(1000.0, 900.0, 1100.0, 5, "samples/s")
    assert findings.faster_sentence("memmap", "rawfiles", fast, slow, condition="warm") == (
        "memmap reads 2.0\u00d7 faster than rawfiles warm (median of 5 repeats: "
        "2.00k samples/s vs 1.00k samples/s)")
    assert "2.0\u00d7 slower than" in findings.faster_sentence("rawfiles", "memmap", slow, fast)


def test_markdown_table_escapes_pipes_and_formats_columns():
    table = pd.DataFrame({"name": ["a|b"], "value": [0.5]})
    text = findings.markdown_table(table, {"value": findings.format_percent})
    assert text.splitlines() == ["| name | value |", "|---|---|", "| a\\|b | 50% |"]


# -- formats -----------------------------------------------------------------------------------
def formats_frame():
    return frame(
        build_case("memmap", seconds=0.5, apparent=1_000_000, files=2),
        build_case("rawfiles", seconds=2.0, apparent=1_200_000, files=500),
        read_case("memmap", "warm", [3000.0, 3000.0, 3000.0]),
        read_case("rawfiles", "warm", [1000.0, 1000.0, 1000.0]),
        read_case("memmap", "cold", [800.0, 800.0, 800.0]),
        read_case("rawfiles", "cold", [100.0, 100.0, 100.0]),
    )


def test_build_cost_and_cold_warm_tables():
    df = formats_frame()
    build = findings.build_cost_table(df)
    assert list(build["format"]) == ["rawfiles", "memmap"]  # the registry's order
    assert build.set_index("format").loc["rawfiles", "size_ratio"] == pytest.approx(1.2)
    reads = findings.cold_warm_table(df).set_index("format")
    assert reads.loc["memmap", "warm_over_cold"] == pytest.approx(3000 / 800)
    assert reads.loc["rawfiles", "cold_resident"] == 0.0
    assert reads.loc["rawfiles", "warm_resident"] == 1.0


def test_formats_findings_state_the_measured_ratios():
    sentences = findings.formats_findings(formats_frame())
    assert ("raw arrays: smallest on disk is memmap at 1.00\u00d7 the raw pixel bytes (1.00 MB); "
            "largest is rawfiles at 1.20\u00d7 (1.20 MB).") in sentences
    assert any("memmap reads 3.0\u00d7 faster than rawfiles warm, sequentially "
               "(median of 3 repeats: 3.00k samples/s vs 1.00k samples/s)." in s
               for s in sentences)
    assert any("memmap reads 8.0\u00d7 faster than rawfiles cold" in s
               and "at most 0% of the files resident" in s for s in sentences)
    assert any("slowest is rawfiles (2.00 s, 4.0\u00d7 longer)" in s for s in sentences)
    assert any("rawfiles writes 500 files, memmap 2" in s for s in sentences)


# -- lazy vs preloaded ------------------------------------------------------------------------
def loader_case(fmt, loader, cache, *, throughput, first, pss):
    return case_rows(
        "lazy_vs_preloaded", f"epoch:{fmt}/{loader}/{cache}",
        {"samples_per_s": [throughput] * 3, "time_to_first_batch_s": [first] * 3,
         "preload_seconds": [first / 2] * 3, "peak_pss_bytes": [pss] * 3,
         "peak_uss_bytes": [pss / 2] * 3},
        format=fmt, encoding="raw", loader=loader, prefetcher="none", workers=0,
        access="block_shuffle", cache=cache, resident=1.0 if cache == "warm" else 0.0)


def test_lazy_vs_preloaded_findings():
    df = frame(
        build_case("memmap", seconds=0.5, apparent=1_000_000, files=2),
        loader_case("memmap", "lazy", "warm", throughput=1000.0, first=0.01, pss=50e6),
        loader_case("memmap", "preloaded", "warm", throughput=4000.0, first=0.05, pss=60e6),
        loader_case("memmap", "lazy", "cold", throughput=250.0, first=0.02, pss=50e6),
        loader_case("memmap", "preloaded", "cold", throughput=4000.0, first=0.2, pss=60e6),
    )
    sentences = findings.lazy_vs_preloaded_findings(
        df, {"ram_bytes": 10e9}, profile_bytes={"large": 25e9})
    text = "\n".join(sentences)
    assert "the preloaded epoch runs 4.0\u00d7 the lazy one's throughput on memmap" in text
    assert "preloading delays the first batch to 200 ms on memmap against 20.0 ms" in text
    assert "preloaded minus lazy is +10.0 MB" in text
    assert "a cold cache costs lazy reading most on memmap (4.0\u00d7 slower than warm)" in text
    assert "The largest dataset measured is memmap-raw at 1.00 MB, <0.1% of this machine's " \
           "10.0 GB RAM." in text
    assert "opt-in `large` profile (25.0 GB, 250% of RAM)" in text


# -- prefetch and targets ----------------------------------------------------------------------
def prefetch_case(prefetcher, workers, throughput):
    return case_rows("prefetch", f"epoch:{prefetcher}/{workers}",
                     {"samples_per_s": [throughput] * 3, "cpu_utilisation": [1.0] * 3},
                     format="memmap", encoding="raw", loader="lazy", prefetcher=prefetcher,
                     workers=workers, access="shuffle", cache="warm",
                     params={"start_method": "fork"} if workers else {})


def test_prefetch_table_and_findings():
    df = frame(prefetch_case("none", 0, 1000.0), prefetch_case("process", 2, 4000.0),
               prefetch_case("torch", 2, 1000.0), prefetch_case("pickled_baseline", 2, 500.0))
    table = findings.prefetch_table(df).set_index("variant")
    assert table.loc["ProcessPrefetcher x2", "speedup"] == pytest.approx(4.0)
    sentences = findings.prefetch_findings(df)
    assert ("memmap-raw: ProcessPrefetcher x2 is 4.0\u00d7 faster than torch DataLoader x2 "
            "(4.00k samples/s vs 1.00k samples/s).") in sentences
    assert any("the fastest path is ProcessPrefetcher x2 at 4.00k samples/s (4.0\u00d7 one "
               "thread" in s for s in sentences)
    assert any("8.0\u00d7 faster than pickled-queue baseline x2" in s for s in sentences)


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


def test_targets_table_reads_the_rows_written_by_each_target_case():
    df = frame(
        target_case("process_vs_torch", [3.0, 2.0, 1.0], threshold=1.0,
                    extra={"process_prefetcher.samples_per_s": [300.0, 200.0, 100.0]}),
        target_case("process_vs_pickled", [3.0, 2.0, 1.0], threshold=3.0),
        target_case("memmap_gather_vs_dram", [0.25, 0.25], threshold=0.5),
    )
    table = findings.targets_table(df).set_index("target")
    assert list(table.index) == ["memmap gather vs DRAM read",
                                 "ProcessPrefetcher vs torch DataLoader",
                                 "ProcessPrefetcher vs pickled baseline"]  # TARGETS order
    versus_torch = table.loc["ProcessPrefetcher vs torch DataLoader"]
    assert (versus_torch["value"], versus_torch["low"], versus_torch["high"]) == (2.0, 1.0, 3.0)
    assert versus_torch["met"] and versus_torch["repeats"] == 3
    versus_pickled = table.loc["ProcessPrefetcher vs pickled baseline"]
    assert not versus_pickled["met"]
    assert versus_pickled["shortfall"] == pytest.approx(1 - 2.0 / 3.0)
    assert table.loc["memmap gather vs DRAM read", "value"] == 0.25
    markdown = findings.targets_markdown(df)
    assert "| ProcessPrefetcher vs torch DataLoader | 2.0\u00d7 (1.0\u00d7\u20133.0\u00d7, " \
           "n=3) | \u2265 1.0\u00d7 | yes |" in markdown
    assert "| memmap gather vs DRAM read | 25% (25%\u201325%, n=2) | \u2265 50% | no (50% " \
           "short) |" in markdown


def test_the_thresholds_live_in_one_place():
    from storebench.bench.targets import TARGETS

    assert not hasattr(findings, "TARGETS")
    assert len({t.key for t in TARGETS}) == len(TARGETS)
    df = frame(target_case("thread_vs_serial_decode", [2.0], threshold=1.8))
    (row,) = findings.targets_table(df).itertuples()
    assert row.threshold == 1.8 and row.what == TARGETS[4].description


# -- feed --------------------------------------------------------------------------------------
CPU = {"device": "cpu", "emulated": True, "device_name": "cpu"}


def feed_case(prefetcher, workers, compute_ms, au, device=CPU):
    return case_rows("gpu_feed", f"feed:{prefetcher}/{compute_ms}",
                     {"accelerator_utilisation": [au] * 3, "stall_fraction": [1 - au] * 3,
                      "h2d_GBps": [1.0] * 3, "samples_per_s": [100.0] * 3},
                     format="memmap", encoding="raw", loader="lazy", prefetcher=prefetcher,
                     workers=workers, access="shuffle", cache="warm",
                     params={"compute_ms": compute_ms, **device})


def test_the_feed_device_is_read_from_the_rows_not_the_machine():
    emulated = frame(feed_case("none", 0, 2.0, 0.5))
    assert "No CUDA device took part" in findings.feed_device_text(emulated)
    real = frame(feed_case("none", 0, 2.0, 0.5, device={
        "device": "cuda", "emulated": False, "device_name": "NVIDIA H100"}))
    assert findings.feed_device_text(real).startswith("Copies went to NVIDIA H100 (a real")
    assert findings.feed_devices(real).to_dict("records") == [
        {"device": "cuda", "device_name": "NVIDIA H100", "emulated": False}]
    guide = findings.decision_guide(real)
    assert "emulated" not in guide.set_index("situation").loc[
        "Keeping an accelerator busy with short steps", "evidence"]


def test_feed_findings_name_the_compute_time_that_reaches_the_threshold():
    df = frame(feed_case("process", 2, 2.0, 0.5), feed_case("process", 2, 10.0, 0.95),
               feed_case("none", 0, 2.0, 0.2), feed_case("none", 0, 10.0, 0.6))
    sentences = findings.feed_findings(df)
    assert "No CUDA device" in sentences[0]
    assert ("ProcessPrefetcher x2 (pageable, sync) keeps AU at or above 90% from 10 ms of "
            "compute per batch.") in sentences
    assert ("this thread (pageable, sync) stays below 90% AU up to 10 ms per batch (at best "
            "60%).") in sentences
    assert ("At 2 ms of compute per batch, accelerator utilisation is: ProcessPrefetcher x2 "
            "(pageable, sync) 50%; this thread (pageable, sync) 20%.") in sentences


# -- decision guide and README table -------------------------------------------------------
def test_readme_findings_table_from_a_results_dir(tmp_path):
    groups = {
        "formats": [build_case("memmap", seconds=0.5, apparent=1_000_000, files=2),
                    build_case("rawfiles", seconds=2.0, apparent=1_200_000, files=500)],
        "gpu_feed": [feed_case("process", 2, 2.0, 0.5)],
    }
    for study, parts in groups.items():
        with ResultsWriter(tmp_path / f"{study}.csv") as writer:
            for rows in parts:
                writer.write_rows(rows)
    env = {"cpu_model": "Test CPU", "cpus_usable": 2, "ram_bytes": 24e9, "profile": "ci",
           "cuda": {"torch_cuda_available": False}, "utc_time": "2026-01-01T00:00:00+00:00"}
    (tmp_path / "env.json").write_text(json.dumps(env))
    text = findings.readme_findings_table(tmp_path)
    lines = text.splitlines()
    assert lines[0] == ("Measured on: Test CPU, 2 cores; 24.0 GB RAM; no GPU; profile `ci`; "
                        "run 2026-01-01T00:00:00+00:00.")
    assert lines[2] == "| situation | choice | evidence |"
    assert "| Fastest to build (raw arrays) | memmap | 500 ms vs 2.00 s for rawfiles |" in lines
    assert ("| Few files (shared or object storage, many-file limits) | anything but rawfiles | "
            "rawfiles writes 500 files; memmap 2 |") in lines
    assert ("| Keeping an accelerator busy with short steps | ProcessPrefetcher x2, pageable, "
            "sync | AU 50% at 2 ms per batch (emulated accelerator) |") in lines


def test_readme_findings_table_needs_results(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results"):
        findings.readme_findings_table(tmp_path)


def test_caveats_count_cases_and_failures():
    df = frame(read_case("memmap", "warm", [1.0, 1.0]),
               case_rows("formats", "read:hdf5-raw/warm", {"samples_per_s": [1.0]},
                         status="failed", format="hdf5", encoding="raw", cache="warm"))
    sentences = findings.caveats(df)
    assert sentences[0] == ("2 cases in 1 studies, profile `ci`, from 1 run(s); 2 timed "
                            "repeat(s) per case (figures are medians, ranges min to max).")
    assert sentences[1] == ("1 case(s) failed or timed out: read:hdf5-raw/warm "
                            "(failed: RuntimeError: boom).")


def test_format_table_formats_by_column_meaning():
    table = pd.DataFrame({"size_ratio": [1.0417], "speedup": [2.0], "resident_fraction": [1.0],
                          "cpu_utilisation": [1.5], "compute_ms": [2.0],
                          "write_seconds": [0.0155], "median": [1234.0]})
    shown = findings.format_table(table, {"median": "samples/s"}).iloc[0].to_dict()
    assert shown == {"size_ratio": "1.04\u00d7", "speedup": "2.0\u00d7",
                     "resident_fraction": "100%", "cpu_utilisation": "1.50",
                     "compute_ms": "2", "write_seconds": "15.5 ms",
                     "median": "1.23k samples/s"}


# -- knobs, access orders, readahead ---------------------------------------------------------
def variant_read(fmt, knob, value, cache, access, values):
    params = {} if knob is None else {"dataset_name": f"{fmt}-raw-{knob}={value}",
                                      f"knob_{knob}": value}
    name = params.get("dataset_name", f"{fmt}-raw")
    return case_rows("formats", f"read:{name}/{access}/{cache}", {"samples_per_s": values},
                     format=fmt, encoding="raw", loader="reader", access=access, cache=cache,
                     params=params, resident=0.0 if cache == "cold" else 1.0)


def test_knob_table_puts_each_variant_beside_the_default_build():
    df = frame(
        variant_read("hdf5", None, None, "cold", "shuffle", [100.0] * 3),
        variant_read("hdf5", "chunk_samples", 1, "cold", "shuffle", [50.0] * 3),
        variant_read("hdf5", "chunk_samples", 1024, "cold", "shuffle", [400.0] * 3),
        variant_read("hdf5", None, None, "warm", "sequential", [1000.0] * 3),
        variant_read("hdf5", "chunk_samples", 1024, "warm", "sequential", [3000.0] * 3),
    )
    table = findings.knob_table(df)
    assert list(table["setting"]) == ["1", "64 (default)", "1024"]
    assert list(table["random_cold"]) == [50.0, 100.0, 400.0]
    (sentence,) = findings.knob_findings(df)
    assert sentence == ("hdf5 (raw arrays) chunk_samples, random batches, cold: 1: 50.0 "
                        "samples/s; 64 (default): 100 samples/s; 1024: 400 samples/s; "
                        "sequential warm reads are fastest with 1024, 3.0\u00d7 those with "
                        "64 (default).")
    # The variants stay out of the per-format comparisons.
    assert findings.cold_warm_table(findings.default_builds(df))["dataset"].tolist() == [
        "hdf5-raw"]


def lazy_epoch(fmt, access, cache, value, params=None):
    return case_rows("lazy_vs_preloaded", f"epoch:{fmt}/{access}/{cache}/{params}",
                     {"samples_per_s": [value] * 3, "time_to_first_batch_s": [0.01] * 3},
                     format=fmt, encoding="raw", loader="lazy", prefetcher="none", workers=0,
                     access=access, cache=cache, params=params or {},
                     resident=0.0 if cache == "cold" else 1.0)


def test_access_orders_and_readahead_knobs():
    df = frame(
        lazy_epoch("parquet", "sequential", "warm", 1000.0),
        lazy_epoch("parquet", "block_shuffle", "warm", 900.0),
        lazy_epoch("parquet", "shuffle", "warm", 100.0),
        lazy_epoch("memmap", "sequential", "warm", 2000.0),
        lazy_epoch("memmap", "block_shuffle", "warm", 2000.0),
        lazy_epoch("memmap", "shuffle", "warm", 1800.0),
        lazy_epoch("memmap", "shuffle", "cold", 500.0, {"open_madvise_random": True}),
        lazy_epoch("memmap", "shuffle", "cold", 250.0, {"open_madvise_random": False}),
    )
    orders = findings.access_order_table(df).set_index("format")
    assert orders.loc["parquet", "shuffle_vs_sequential"] == pytest.approx(0.1)
    (sentence,) = findings.access_order_findings(df)
    assert sentence == ("Raw arrays, warm, read lazily by one thread: a full shuffle runs at "
                        "0.10\u00d7 of sequential throughput on parquet (the worst) and "
                        "0.90\u00d7 on memmap; block shuffle brings parquet to 0.90\u00d7 of "
                        "sequential.")
    # The knob cases are not mistaken for the default memmap epochs.
    assert "cold" not in set(findings.loader_table(df)["cache"])
    assert findings.readahead_findings(df) == [
        "memmap, cold, shuffled: madvise_random=True runs 2.0\u00d7 faster than "
        "madvise_random=False (500 samples/s vs 250 samples/s)."]
