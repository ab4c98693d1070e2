"""The fixed result schema: rules enforced, append-safe writing, resumable."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from storebench.bench.schema import (
    COLUMNS,
    ResultsWriter,
    SchemaError,
    finished_case_ids,
    make_row,
    read_results,
    validate,
)


def row(**fields):
    base = {"run_id": "r1", "study": "s", "case_id": "c", "metric": "wall_seconds",
            "value": 0.5, "unit": "s", "status": "ok", "repeat": 0}
    return make_row(**{**base, **fields})


def test_make_row_fills_every_column_and_refuses_unknown_ones():
    full = row()
    assert tuple(full) == COLUMNS
    assert full["params"] == "{}" and full["loader"] == "" and full["workers"] is None
    assert math.isnan(full["resident_fraction"])
    with pytest.raises(SchemaError, match="unknown result column.*'speed'"):
        make_row(speed=3)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"unit": "ms"}, "unit must be one of"),
        ({"unit": "bytes"}, "wrong unit"),
        ({"value": math.nan}, "ok row needs a finite value"),
        ({"status": "failed"}, "failed row needs an error message"),
        ({"status": "crashed", "error": "x"}, "status must be one of"),
        ({"cache": "tepid"}, "cache must be one of"),
        ({"resident_fraction": 1.5}, "resident_fraction must be within"),
        ({"repeat": -2}, "repeat must be"),
        ({"workers": -1}, "workers'"),
        ({"params": "[1, 2]"}, "params must be a JSON object"),
        ({"case_id": ""}, "must not be empty"),
    ],
)
def test_each_rule_is_enforced(fields, message):
    validate(pd.DataFrame([row()]))
    with pytest.raises(SchemaError, match=message):
        validate(pd.DataFrame([row(**fields)]))


def test_non_numbers_and_missing_columns_are_named():
    frame = pd.DataFrame([row(workers="two")])
    with pytest.raises(SchemaError, match="column 'workers' holds non-numbers"):
        validate(frame)
    with pytest.raises(SchemaError, match=r"missing \['unit'\]"):
        validate(pd.DataFrame([row()]).drop(columns=["unit"]))
    with pytest.raises(SchemaError, match="appears twice"):
        validate(pd.DataFrame([row(), row()]))


def test_writer_appends_one_header_and_round_trips_types(tmp_path):
    path = tmp_path / "study.csv"
    with ResultsWriter(path) as writer:
        writer.write_rows([row(case_id="a", workers=2, batch_size=64, resident_fraction=0.0,
                               cache="cold", params='{"k": 1}')])
    with ResultsWriter(path) as writer:
        writer.write_rows([row(case_id="b", status="failed", value=math.nan, repeat=-1,
                               metric="case_seconds", error='line one\nline, "two"')])
    text = path.read_text()
    assert text.count("run_id,") == 1
    df = read_results(path)
    assert list(df.columns) == list(COLUMNS)
    assert df["case_id"].tolist() == ["a", "b"]
    assert df.loc[0, "workers"] == 2 and pd.isna(df.loc[1, "workers"])
    assert df.loc[1, "error"] == 'line one\nline, "two"'
    assert df.loc[0, "params"] == '{"k": 1}'
    assert finished_case_ids(path) == {"a", "b"}


def test_torn_last_line_is_cut_and_a_foreign_header_refused(tmp_path):
    path = tmp_path / "study.csv"
    with ResultsWriter(path) as writer:
        writer.write_rows([row(case_id="a")])
    complete = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b"r1,2026-01-01,ci,s,half-writ")  # a writer killed mid-line
    with ResultsWriter(path) as writer:
        writer.write_rows([row(case_id="b")])
    assert path.read_bytes().startswith(complete)
    assert read_results(path)["case_id"].tolist() == ["a", "b"]

    other = tmp_path / "other.csv"
    other.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(SchemaError, match="other.csv: existing header"):
        ResultsWriter(other).open()


def test_rejected_rows_are_not_written(tmp_path):
    path = tmp_path / "study.csv"
    with ResultsWriter(path) as writer, pytest.raises(SchemaError):
        writer.write_rows([row(case_id="a"), row(case_id="b", unit="parsecs")])
    assert finished_case_ids(path) == set()
