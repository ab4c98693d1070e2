"""The correctness study's guide row: the recipes ranked by the properties they hold."""

from __future__ import annotations

import math

from ...results import Results
from .cases import REFERENCE_WORKERS
from .grid import NAME
from .report import PROPERTIES, PROPERTY_COLUMNS, QUESTION, correctness_table


def passed(row) -> int:
    return sum(row[PROPERTY_COLUMNS[p]] == "pass" for p in PROPERTIES)


def guide(results: Results) -> list:
    """The recipes ranked by how many of the five properties they hold."""
    from ...guide import Candidate, GuideRow
    from ...results import Stat

    table = correctness_table(results)
    measured = table[table["exactly_once"].isin(["pass", "fail"])]
    if measured.empty:
        return []
    counts = sorted(((passed(row), row) for _, row in measured.iterrows()),
                    key=lambda item: -item[0])
    candidates = tuple(
        Candidate(row["recipe"], row["recipe"],
                  Stat(float(n), float(n), float(n), 1, "count", (float(n),),
                       derived_from=((NAME, row["case_id"], "exactly_once.workers"
                                      f"{REFERENCE_WORKERS}.duplicates"),)))
        for n, row in counts)
    best = float(counts[0][0])
    runner = float(counts[1][0]) if len(counts) > 1 else math.nan
    tied = tuple(c.label for c in candidates[1:] if c.stat.median == best)
    question = f"{QUESTION} (properties held of the {len(PROPERTIES)})"
    ratio = best / runner if runner else math.nan
    return [GuideRow(NAME, question, "properties_held", candidates, False, ratio, ratio,
                     ratio, bool(tied), tied, {"question": "correctness"},
                     "equivalent" if tied else "better")]
