"""How long a study run has left: each remaining case's expected time, scaled by how this
run's finished cases compared with their expectations.

A case's expected time is its ``case_seconds`` in an earlier results directory of the same
profile (the committed reference, or the run being resumed), else the mean of this run's
finished cases of the same study, else of all finished cases.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from pathlib import Path


def expected_case_seconds(results_dir: Path | str, profile: str) -> dict[tuple[str, str], float]:
    """``{(study, case_id): case_seconds}`` of the ok rows of ``profile`` in
    ``results_dir/*.csv`` (csv only: no pandas in the runner's loop)."""
    found: dict[tuple[str, str], float] = {}
    for path in sorted(Path(results_dir).glob("*.csv")):
        try:
            with open(path, newline="") as f:
                for row in csv.DictReader(f):
                    if (row.get("metric") == "case_seconds" and row.get("profile") == profile
                            and row.get("status") == "ok"):
                        found[(row["study"], row["case_id"])] = float(row["value"])
        except (OSError, ValueError, KeyError):
            continue  # an unreadable earlier run only makes the estimate rougher
    return found


class StudyEta:
    """The remaining time of a run of ``planned`` cases (``{study: [case_id, ...]}``)."""

    def __init__(self, planned: Mapping[str, Iterable[str]],
                 expected: Mapping[tuple[str, str], float] | None = None) -> None:
        self.remaining = {(study, case_id) for study, ids in planned.items() for case_id in ids}
        self.expected = dict(expected or {})
        self.finished: dict[tuple[str, str], float] = {}

    def plan(self, study: str, case_ids: Iterable[str]) -> None:
        """``study``'s cases left to run, as its grid says when it starts: a grid planned
        before the study's own datasets were built (the peers study builds its sets when it
        starts) may have counted none of them."""
        self.remaining = {key for key in self.remaining if key[0] != study}
        self.remaining |= {(study, case_id) for case_id in case_ids
                           if (study, case_id) not in self.finished}

    def done(self, study: str, case_id: str, seconds: float) -> None:
        self.remaining.discard((study, case_id))
        self.finished[(study, case_id)] = seconds

    def _pace(self) -> float:
        """This run's seconds per expected second, over the finished cases with an
        expectation (1 without any)."""
        pairs = [(s, self.expected[k]) for k, s in self.finished.items() if k in self.expected]
        taken, expected = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        return taken / expected if expected > 0 else 1.0

    def _mean(self, study: str | None) -> float:
        values = [s for (st, _), s in self.finished.items() if study is None or st == study]
        return sum(values) / len(values) if values else math.nan

    def seconds_left(self) -> float:
        """NaN while nothing can be estimated (no expectation, nothing finished)."""
        pace = self._pace()
        total = 0.0
        for study, case_id in self.remaining:
            if (study, case_id) in self.expected:
                total += self.expected[(study, case_id)] * pace
                continue
            guess = self._mean(study)
            guess = guess if math.isfinite(guess) else self._mean(None)
            if not math.isfinite(guess):
                return math.nan
            total += guess
        return total

    def text(self) -> str:
        left = self.seconds_left()
        cases = len(self.remaining)
        if not math.isfinite(left):
            return f"{cases} cases to run"
        if left < 90:
            return f"{cases} cases to run, about {left:.0f} s left"
        return f"{cases} cases to run, about {left / 60:.0f} min left"
