"""The decision guide: every study's guide rows, in the studies' run order, each naming
its workload."""

from __future__ import annotations

import dataclasses

from ..guide import GuideRow
from ..results import Results
from ..studies import STUDIES


def decision_guide(results: Results) -> list[GuideRow]:
    """Every study's guide rows, in the studies' run order; a study with no rows is left
    out."""
    rows: list[GuideRow] = []
    for study in STUDIES.values():
        if (results.df["study"] == study.name).any():
            rows += [with_workload(row, results) for row in study.guide(results)
                     if row is not None]
    return rows


def with_workload(row: GuideRow, results: Results) -> GuideRow:
    """``row`` naming its workload: what its study read for its encoding (its facets'),
    unless the study's guide named one itself."""
    if row.workload:
        return row
    return dataclasses.replace(
        row, workload=results.workload(row.study, row.facets.get("encoding")))
