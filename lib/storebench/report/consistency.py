"""One comparison, one number: a measurement taken by two studies must give one figure.

Every throughput row has a canonical key (``results.measurement_key``: path, workers, start
method, dataset, encoding, decoder, transform, cache state, order, batch size, what was timed,
and every other condition). Where more than one study measured a key, each study's median
samples/s (over all its repeats of that key) must lie within ``CONSISTENCY_TOLERANCE`` of
the others'; ``storebench consistency RESULTS_DIR`` fails on the keys where they do not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..results import Results, key_label, keyed_throughput
from ..text import format_value

# Two studies' medians of one key may differ by at most this share of the smaller one.
CONSISTENCY_TOLERANCE = 0.10


@dataclass(frozen=True)
class StudyMedian:
    """One study's figure for a key: the median of its repeats and how many there were."""

    study: str
    median: float
    count: int

    def __str__(self) -> str:
        return f"{self.study} {format_value(self.median, 'samples/s')} (n={self.count})"


@dataclass(frozen=True)
class KeyDisagreement:
    """A key whose studies' medians differ by more than the tolerance (lowest first)."""

    key: tuple[str, ...]
    medians: tuple[StudyMedian, ...]

    @property
    def ratio(self) -> float:
        return self.medians[-1].median / self.medians[0].median

    def __str__(self) -> str:
        shown = " vs ".join(str(m) for m in self.medians)
        return f"{key_label(self.key)}: {shown}; {self.ratio:.2f}\u00d7 apart"


@dataclass(frozen=True)
class ConsistencyReport:
    """Keys measured by more than one study, and those of them that disagree."""

    shared_keys: int
    disagreements: tuple[KeyDisagreement, ...]

    @property
    def ok(self) -> bool:
        return not self.disagreements


def study_medians(df: pd.DataFrame) -> dict[tuple[str, ...], tuple[StudyMedian, ...]]:
    """Per key measured by more than one study: each study's median and n, lowest first."""
    rows = keyed_throughput(df)
    shared: dict[tuple[str, ...], tuple[StudyMedian, ...]] = {}
    for key, part in rows.groupby("key", sort=False):
        per_study = part.groupby("study")["value"].agg(["median", "size"])
        if len(per_study) < 2:
            continue
        shared[key] = tuple(sorted(
            (StudyMedian(str(study), float(r["median"]), int(r["size"]))
             for study, r in per_study.iterrows()), key=lambda m: (m.median, m.study)))
    return shared


def check_consistency(df: pd.DataFrame, *,
                      tolerance: float = CONSISTENCY_TOLERANCE) -> ConsistencyReport:
    """Every key measured by more than one study whose highest study median exceeds its
    lowest by more than ``tolerance`` (of the lowest), in key order."""
    shared = study_medians(df)
    bad = [KeyDisagreement(key, medians) for key, medians in shared.items()
           if medians[-1].median > medians[0].median * (1 + tolerance)]
    return ConsistencyReport(len(shared), tuple(sorted(bad, key=lambda d: d.key)))


def consistency_command(results_dir: Path | str) -> tuple[int, str]:
    """(exit code, text) of ``storebench consistency``: every figure the pages quote held
    to ``report.quotes``' rules, and every key two studies measured within the tolerance.
    0 and one line saying how many were checked, or 1 and one line per problem (also when
    nothing was quoted: a check of nothing passes nothing)."""
    from .quotes import check_quotes

    results = Results.load(results_dir)
    quoted = check_quotes(results)
    report = check_consistency(results.df)
    lines = [str(p) for p in quoted.problems] + [str(d) for d in report.disagreements]
    if quoted.checked == 0:
        lines.append(f"nothing quoted: {results_dir} answers no guide question, comparison "
                     "or target")
    if lines:
        return 1, "\n".join(lines)
    return 0, (f"consistency OK: {quoted.checked} quoted figures match their rows, one value "
               f"and one case per key ({quoted.keys} keys); {report.shared_keys} key(s) "
               f"measured by more than one study agree within {CONSISTENCY_TOLERANCE:.0%} "
               f"({results_dir})")
