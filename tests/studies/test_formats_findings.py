"""The formats study's tables, sentences and figures: every number follows from the rows."""

from __future__ import annotations

import pandas as pd
import pytest
from result_rows import build_case, case_rows, frame, read_case

from storebench.formats import FORMATS
from storebench.results import Results, default_builds
from storebench.studies.formats import guide as formats_guide
from storebench.studies.formats import report as formats
from storebench.studies.shared_rows import build_cost_table
from storebench.text import format_ratio, format_value


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
    build = build_cost_table(df)
    assert list(build["format"]) == ["rawfiles", "memmap"]  # the registry's order
    assert list(FORMATS).index("rawfiles") < list(FORMATS).index("memmap")
    assert build.set_index("format").loc["rawfiles", "size_ratio"] == pytest.approx(1.2)
    assert build.set_index("format").loc["rawfiles", "file_count"] == 500
    reads = formats.cold_warm_table(df).set_index("format")
    assert reads.loc["memmap", "warm_over_cold"] == pytest.approx(3000 / 800)
    assert reads.loc["rawfiles", "cold_resident"] == 0.0
    assert reads.loc["rawfiles", "warm_resident"] == 1.0
    assert reads.loc["memmap", "repeats"] == 3


def test_formats_findings_state_the_measured_ratios():
    sentences = formats.formats_findings(formats_frame())
    assert ("raw arrays: smallest on disk is memmap at 1.00\u00d7 the raw pixel bytes "
            "(1.00 MB); largest is rawfiles at 1.20\u00d7 (1.20 MB).") in sentences
    assert ("raw arrays: memmap reads 3.00\u00d7 faster than rawfiles warm, sequentially "
            "(median of 3 repeats: 3.00k samples/s vs 1.00k samples/s).") in sentences
    assert any("memmap reads 8.00\u00d7 faster than rawfiles guest-cold, sequentially" in s
               and "at most 0% of the files resident" in s for s in sentences)
    assert any("slowest is rawfiles (2.00 s, 4.00\u00d7 longer)" in s for s in sentences)
    assert any("rawfiles writes 500 files, memmap 2" in s for s in sentences)


def test_the_sequential_read_sentence_leaves_random_reads_out():
    random_reads = frame(read_case("memmap", "warm", [90000.0] * 3, access="random"),
                         read_case("rawfiles", "warm", [10.0] * 3, access="random"))
    sentences = formats.formats_findings(pd.concat([formats_frame(), random_reads]))
    assert ("raw arrays: memmap reads 3.00\u00d7 faster than rawfiles warm, sequentially "
            "(median of 3 repeats: 3.00k samples/s vs 1.00k samples/s).") in sentences


def test_the_build_cost_figure_draws_the_numbers_its_sentence_quotes():
    df = formats_frame()
    fig = formats.plot_build_cost(df)
    # One row of panels per encoding: disk per sample (labelled by dataset), write time.
    size_axis, seconds_axis = fig.axes[:2]
    drawn = {tick.get_text().split("-")[0]: patch.get_width() for tick, patch in
             zip(size_axis.get_yticklabels(), seconds_axis.patches, strict=True)}
    assert drawn == {"rawfiles": 2.0, "memmap": 0.5}
    (sentence,) = [s for s in formats.formats_findings(df) if "fastest to write" in s]
    assert (f"fastest to write is memmap ({format_value(drawn['memmap'], 's')}"
            in sentence)
    assert f"slowest is rawfiles ({format_value(drawn['rawfiles'], 's')}" in sentence


# -- knobs ---------------------------------------------------------------------------------
def variant_read(fmt, knob, value, cache, access, values):
    params = {} if knob is None else {"dataset_name": f"{fmt}-raw-{knob}={value}",
                                      f"knob_{knob}": value}
    return read_case(fmt, cache, values, access=access, params=params)


def knob_frame():
    return frame(
        variant_read("hdf5", None, None, "cold", "shuffle", [100.0] * 3),
        variant_read("hdf5", "chunk_samples", 1, "cold", "shuffle", [50.0] * 3),
        variant_read("hdf5", "chunk_samples", 1024, "cold", "shuffle", [400.0] * 3),
        variant_read("hdf5", None, None, "warm", "sequential", [1000.0] * 3),
        variant_read("hdf5", "chunk_samples", 1024, "warm", "sequential", [3000.0] * 3),
    )


def test_knob_table_puts_each_variant_beside_the_default_build():
    df = knob_frame()
    table = formats.knob_table(df)
    default = FORMATS["hdf5"].DEFAULT_KNOBS["chunk_samples"]
    assert list(table["setting"]) == ["1", f"{default} (default)", "1024"]
    assert list(table["random_cold"]) == [50.0, 100.0, 400.0]
    (sentence,) = formats.knob_findings(df)
    assert sentence == (f"hdf5 (raw arrays) chunk_samples, random batches, guest-cold: 1: 50.0 "
                        f"samples/s; {default} (default): 100 samples/s; 1024: 400 samples/s; "
                        "sequential warm reads are fastest with 1024, 3.00\u00d7 those with "
                        f"{default} (default).")
    # The variants stay out of the per-format comparisons.
    assert formats.cold_warm_table(default_builds(df))["dataset"].tolist() == ["hdf5-raw"]
    assert formats.cold_warm_table(df, access=None)["dataset"].tolist() == [
        "hdf5-raw", "hdf5-raw-chunk_samples=1", "hdf5-raw-chunk_samples=1024"]


def test_the_formats_guide_compares_every_measured_build():
    df = frame(*(read_case(fmt, "cold", [100.0 * (i + 1) + d for d in (0, 2, -2, 1, -1)])
                 for i, fmt in enumerate(FORMATS)),
               build_case("memmap", seconds=0.5, apparent=1_000_000, files=2),
               build_case("rawfiles", seconds=2.0, apparent=1_200_000, files=500))
    rows = {row.question: row for row in formats_guide.guide(Results(df, {}))}
    (cold,) = [row for question, row in rows.items()
               if question.startswith("Reading every sample once from a guest-cold cache, "
                                      "undecoded, raw")]
    assert {c.key for c in cold.candidates} == set(FORMATS)
    assert cold.best.key == list(FORMATS)[-1] and not cold.tie
    space = rows["Least disk space per sample, allocated, lossless (raw or PNG samples)"]
    assert [c.key for c in space.candidates] == ["memmap-raw", "rawfiles-raw"]
    assert space.choice == "memmap-raw" and space.ratio == pytest.approx(1.2)


def verify_case(fmt: str, ratios, *, encoding: str = "raw", params=None) -> list[dict]:
    """A warm sequential read's verified pass, as ``sequential_read_case`` writes it."""
    name = (params or {}).get("dataset_name", f"{fmt}-{encoding}")
    return case_rows("formats", f"read:{name}/sequential/warm", {"verify_time_ratio": ratios},
                     format=fmt, encoding=encoding, loader="reader", access="sequential",
                     cache="warm", batch_size=256, params=params, resident=1.0)


def test_the_verify_cost_finding_names_the_cheapest_and_dearest_format_per_encoding():
    df = frame(
        verify_case("memmap", [1.9, 2.0, 2.1, 2.0]),
        verify_case("rawfiles", [1.05, 1.1, 1.2]),
        verify_case("lmdb", [1.3, 1.4, 1.5], encoding="jpeg"),
        # A knob variant is not a format's default build: left out.
        verify_case("parquet", [9.0, 9.0, 9.0],
                    params={"dataset_name": "parquet-raw-compression=zstd",
                            "knob_compression": "zstd"}),
        read_case("memmap", "cold", [800.0, 800.0, 800.0]),
    )
    table = formats.verify_cost_table(df).set_index(["encoding", "format"])
    assert table.loc[("raw", "memmap"), "median"] == pytest.approx(2.0)
    assert table.loc[("raw", "memmap"), "repeats"] == 4
    assert ("raw", "parquet") not in table.index

    def quoted(encoding, fmt):
        row = table.loc[(encoding, fmt)]
        assert row["low"] <= row["median"] <= row["high"]
        return (f"{format_ratio(row['median'])} (95% interval {format_ratio(row['low'])}"
                f"\u2013{format_ratio(row['high'])}) on {fmt}")

    assert quoted("raw", "rawfiles").startswith("1.10\u00d7 (95% interval ")
    assert formats.verify_cost_findings(df) == [
        "raw arrays: checking every sample's CRC32C (verify=True, the default) made a warm "
        f"sequential read take {quoted('raw', 'rawfiles')} to {quoted('raw', 'memmap')} the "
        "time of the same read without (medians of repeat-paired ratios, 3+ repeats).",
        "JPEG: checking every sample's CRC32C (verify=True, the default) made a warm "
        f"sequential read take {quoted('jpeg', 'lmdb')} the time of the same read without "
        "(medians of repeat-paired ratios, 3+ repeats).",
    ]
    assert formats.verify_cost_findings(frame(read_case("memmap", "warm", [1.0] * 3))) == []


def test_the_sequential_read_figure_answers_with_the_fastest_format_per_encoding():
    """Its takeaway is computed from the rows drawn: per encoding, the fastest format warm
    and cold, against the slowest of the same cache state."""
    import pandas as pd

    from storebench.studies.formats.report import sequential_read_takeaway

    rows = [("raw", "warm", "memmap", 2400.0), ("raw", "warm", "rawfiles", 100.0),
            ("raw", "cold", "memmap", 190.0), ("raw", "cold", "rawfiles", 10.0),
            ("jpeg", "warm", "lmdb", 500.0), ("jpeg", "warm", "tfrecord", 250.0),
            ("jpeg", "warm", "tfrecord", 350.0)]
    df = pd.DataFrame(rows, columns=["encoding", "cache", "format", "value"]).assign(
        metric="file_MBps")
    assert sequential_read_takeaway(df, "file_MBps") == [
        "raw arrays, fastest: warm memmap (24\u00d7 the slowest); guest-cold memmap (19\u00d7 the "
        "slowest).",
        "JPEG, fastest: warm lmdb (1.67\u00d7 the slowest).",
    ]
    assert sequential_read_takeaway(df, "samples_per_s") == []
