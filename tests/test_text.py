"""Numbers as text: every value a sentence, table or README line shows is formatted here."""

from __future__ import annotations

import pandas as pd
import pytest

from storebench import text
from storebench.results import Stat


@pytest.mark.parametrize(("ratio", "shown"), [
    (2.0, "2.00\u00d7"), (1.04, "1.04\u00d7"), (12.4, "12\u00d7"), (230.4, "230\u00d7"),
    (0.25, "0.25\u00d7"), (float("nan"), "n/a"), (float("inf"), "n/a"),
])
def test_format_ratio(ratio, shown):
    assert text.format_ratio(ratio) == shown


@pytest.mark.parametrize(("value", "unit", "shown"), [
    (1234.0, "samples/s", "1.23k samples/s"),
    (950.0, "samples/s", "950 samples/s"),
    (2_500_000.0, "samples/s", "2.50M samples/s"),
    (45_000.0, "IOPS", "45.0k IOPS"),
    (1_500_000.0, "bytes", "1.50 MB"),
    (24e9, "bytes", "24.0 GB"),
    (512.0, "bytes", "512 B"),
    (0.0123, "s", "12.3 ms"),
    (0.000045, "s", "45.0 \u00b5s"),
    (3.5, "s", "3.50 s"),
    (0.0, "s", "0 s"),
    (1500.0, "MB/s", "1.50 GB/s"),
    (250.0, "MB/s", "250 MB/s"),
    (13.0, "GB/s", "13.0 GB/s"),
    (20_000.0, "count", "20,000"),
    (0.644, "ratio", "0.644"),
    (float("nan"), "samples/s", "n/a"),
    (None, "bytes", "n/a"),
])
def test_format_value(value, unit, shown):
    assert text.format_value(value, unit) == shown


# Integer digits are kept (1,234, not 1,230): a count or a long time reads as measured.
@pytest.mark.parametrize(("value", "digits", "shown"), [
    (1234.5, 3, "1,234"), (123.45, 3, "123"), (0.012345, 3, "0.0123"), (0.0, 3, "0"),
    (-57.31, 3, "-57.3"), (1.04166, 3, "1.04"), (2.0, 2, "2.0"),
])
def test_sig_rounds_to_significant_figures_without_exponents(value, digits, shown):
    assert text.sig(value, digits) == shown


def test_format_percent_and_signed_bytes():
    assert text.format_percent(0.873) == "87%"
    assert text.format_percent(0.005) == "0.5%"
    assert text.format_percent(0.0001) == "<0.1%"
    assert text.format_percent(0.0) == "0%"
    assert text.format_percent(float("nan")) == "n/a"
    assert text.signed_bytes(-57_300) == "-57.3 kB"
    assert text.signed_bytes(1_160_000) == "+1.16 MB"
    assert text.signed_bytes(float("nan")) == "n/a"


def test_relative_text_says_slower_below_one():
    assert text.relative_text(2.0) == "2.00\u00d7 faster than"
    assert text.relative_text(0.5) == "2.00\u00d7 slower than"
    assert text.relative_text(0.0) == "not comparable with"
    assert text.relative_text(float("nan")) == "not comparable with"


def test_grid_values_read_as_typed():
    assert [text.grid_value(v) for v in (2.0, 0.5, 10.0, 0.0)] == ["2", "0.5", "10", "0"]


def test_repeats_text_names_each_repeat_count():
    five = Stat(1.0, 1.0, 1.0, 5, "s")
    assert text.repeats_text(five, five) == "median of 5 repeats"
    assert text.repeats_text(Stat(1.0, 1.0, 1.0, 1, "s")) == "median of 1 repeat"
    assert text.repeats_text(five, Stat(1.0, 1.0, 1.0, 3, "s")) == "medians of 3 and 5 repeats"


def test_faster_sentence_follows_from_the_medians():
    fast = Stat(2000.0, 1900.0, 2100.0, 5, "samples/s")
    slow = Stat(1000.0, 900.0, 1100.0, 5, "samples/s")
    assert text.faster_sentence("memmap", "rawfiles", fast, slow, condition="warm") == (
        "memmap reads 2.00\u00d7 faster than rawfiles warm (median of 5 repeats: "
        "2.00k samples/s vs 1.00k samples/s)")
    assert text.faster_sentence("rawfiles", "memmap", slow, fast, verb="delivers") == (
        "rawfiles delivers 2.00\u00d7 slower than memmap (median of 5 repeats: "
        "1.00k samples/s vs 2.00k samples/s)")


def test_markdown_table_escapes_pipes_and_formats_columns():
    table = pd.DataFrame({"name": ["a|b", "c"], "value": [0.5, float("nan")],
                          "note": [None, "x"]})
    shown = text.markdown_table(table, {"value": text.format_percent})
    assert shown.splitlines() == ["| name | value | note |", "|---|---|---|",
                                  "| a\\|b | 50% |  |", "| c | n/a | x |"]


def test_bullets():
    assert text.bullets(["one", "two"]) == "- one\n- two"
    assert text.bullets([]) == ""


def test_format_table_formats_by_column_meaning():
    table = pd.DataFrame({"size_ratio": [1.0417], "speedup": [2.0], "resident_fraction": [1.0],
                          "cpu_utilisation": [1.5], "compute_ms": [2.0],
                          "write_seconds": [0.0155], "median": [1234.0],
                          "peak_pss_bytes": [52_400_000.0], "format": ["memmap"]})
    shown = text.format_table(table, {"median": "samples/s"}).iloc[0].to_dict()
    assert shown == {"size_ratio": "1.04\u00d7", "speedup": "2.00\u00d7",
                     "resident_fraction": "100%", "cpu_utilisation": "1.50",
                     "compute_ms": "2", "write_seconds": "15.5 ms",
                     "median": "1.23k samples/s", "peak_pss_bytes": "52.4 MB",
                     "format": "memmap"}
    # The table given is left as it was.
    assert table["write_seconds"].iloc[0] == 0.0155


def test_encoding_names_cover_every_encoding_in_order():
    assert tuple(text.ENCODING_NAMES) == text.ENCODING_ORDER
    assert text.MULTIPLY == "\u00d7" and text.DASH == "\u2013"


def test_a_percentage_beside_a_bar_never_reads_as_the_bar_itself():
    assert text.format_percent_beside(0.949, 0.95) == "94.9%"
    assert text.format_percent_beside(0.9499, 0.95) == "94.99%"
    assert text.format_percent_beside(0.953, 0.95) == "95.3%"
    assert text.format_percent_beside(0.95, 0.95) == "95%"
    assert text.format_percent_beside(0.73, 0.95) == "73%"
