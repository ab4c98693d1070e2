"""The decision guide: every study's guide rows, in the studies' run order."""

from __future__ import annotations

from ..guide import GuideRow
from ..results import Results
from ..studies import STUDIES


def decision_guide(results: Results) -> list[GuideRow]:
    """Every study's guide rows, in the studies' run order; a study with no rows is left
    out."""
    rows: list[GuideRow] = []
    for study in STUDIES.values():
        if (results.df["study"] == study.name).any():
            rows += [row for row in study.guide(results) if row is not None]
    return rows
