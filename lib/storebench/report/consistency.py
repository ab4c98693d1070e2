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
    """(exit code, text) of ``storebench consistency``: 1 and one line per disagreeing
    key, or 0 and one line saying how many shared keys agree."""
    report = check_consistency(Results.load(results_dir).df)
    if report.ok:
        return 0, (f"consistency OK: {report.shared_keys} key(s) measured by more than one "
                   f"study agree within {CONSISTENCY_TOLERANCE:.0%} ({results_dir})")
    lines = [str(d) for d in report.disagreements]
    return 1, "\n".join(lines)
