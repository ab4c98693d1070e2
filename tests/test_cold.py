"""Cold reads on a virtual machine: each cold case's first repeat apart from the later ones,
the verdict on a cache below the guest, and the labels that follow from it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from storebench.report.cold import cold_block, host_cache_sentence
from storebench.results import HOST_CACHE_MARGIN, cold_repeats, host_cache_detected
from storebench.text import GUEST_COLD, cache_label


def _rows(case_id: str, values, *, cache="cold", fmt="lmdb", after=None, resident=0.0):
    rows = []
    for repeat, value in enumerate(values):
        base = {"run_id": "r1", "study": "formats", "case_id": case_id, "format": fmt,
                "encoding": "jpeg", "cache": cache, "resident_fraction": resident,
                "repeat": repeat, "status": "ok", "params": json.dumps({})}
        rows.append({**base, "metric": "samples_per_s", "value": value, "unit": "samples/s"})
        if after is not None:
            rows.append({**base, "metric": "resident_fraction_after", "value": after[repeat],
                         "unit": "ratio"})
    return rows


def test_the_first_cold_repeat_is_apart_from_the_later_ones():
    df = pd.DataFrame(
        _rows("a", [100.0, 300.0, 200.0, 250.0], after=[0.5, 0.9, 0.7, 0.8])
        + _rows("b", [50.0], fmt="hdf5")  # one repeat: nothing to compare
        + _rows("c", [10.0, 20.0, 30.0], cache="warm", resident=1.0))
    table = cold_repeats(df, "samples_per_s")
    assert table.to_dict("records") == [{
        "case_id": "a", "format": "lmdb", "encoding": "jpeg", "n": 4, "first": 100.0,
        "later_median": 250.0, "later_over_first": 2.5, "resident_before": 0.0,
        "resident_after": 0.9, "unit": "samples/s"}]


def test_residency_after_is_nan_where_no_repeat_recorded_it():
    table = cold_repeats(pd.DataFrame(_rows("a", [100.0, 100.0])), "samples_per_s")
    assert table["resident_after"].isna().all()


@pytest.mark.parametrize(("ratios", "detected"), [
    ([1.0, 1.0 + HOST_CACHE_MARGIN, 3.0], True),
    ([1.0, 1.0 + HOST_CACHE_MARGIN / 2, 3.0], False),
    ([0.8, 1.0, 1.01], False),
])
def test_a_cache_below_the_guest_is_detected_by_the_median_case_and_its_margin(ratios,
                                                                               detected):
    table = pd.DataFrame({"later_over_first": ratios, "resident_before": 0.0})
    assert host_cache_detected(table) is detected
    sentence = host_cache_sentence(table)
    if detected:
        assert sentence.startswith("A cache below the guest is detected: over 3 cold cases")
    else:
        assert sentence.startswith("No cache below the guest is detected (over 3 cold cases")
        assert "none is excluded either" in sentence
    assert GUEST_COLD in sentence


def test_no_case_with_two_repeats_is_no_verdict():
    assert host_cache_detected(pd.DataFrame(columns=["later_over_first"])) is None
    assert host_cache_sentence(pd.DataFrame(columns=["later_over_first"])) == (
        "No cold case here ran two repeats, so a cache below the guest was not looked for.")


def test_cold_is_shown_as_guest_cold_and_other_states_as_they_are():
    assert [cache_label(c) for c in ("cold", "warm", "")] == ["guest-cold", "warm", ""]


def test_the_methodology_block_has_a_row_per_study_and_format(tmp_path):
    from storebench.studies import STUDIES

    root = tmp_path / "results"
    root.mkdir()
    rows = (_rows("a", [100.0, 300.0, 200.0]) + _rows("b", [100.0, 90.0, 110.0], fmt="hdf5"))
    pd.DataFrame(rows).assign(
        timestamp="", profile="ci", loader="reader", prefetcher="", workers="",
        batch_size="", access="sequential", error="").to_csv(root / "formats.csv",
                                                            index=False)
    assert STUDIES["formats"].cold_rate_metric == "samples_per_s"
    block = cold_block(root)
    assert block.splitlines()[0].startswith("A cache below the guest is detected: over 2 cold "
                                            "cases, the later repeats ran a median 1.75\u00d7")
    assert "| formats | hdf5 (jpeg) | 1 | 1.00\u00d7 (1.00\u00d7\u20131.00\u00d7) | 0% |" in block
    assert "| formats | lmdb (jpeg) | 1 | 2.50\u00d7 (2.50\u00d7\u20132.50\u00d7) | 0% |" in block
