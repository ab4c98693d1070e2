"""The decision guide: for each situation, the measured best of every candidate that answers
it, or a declared tie (``results.TIE_RULE``). Each study contributes its rows
(``Study.guide``); nothing here knows which path should win."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from .results import DECISION_MARGIN, MIN_PAIRED_REPEATS, TIE_RULE, Stat, ratio_interval
from .text import MULTIPLY, format_percent, format_ratio, format_value

# Units whose values are exact (counted, not timed): compared without an interval.
EXACT_UNITS = ("bytes", "count")
VERDICTS = ("better", "equivalent", "undecided")


@dataclass(frozen=True)
class Candidate:
    """One measured answer: ``key`` identifies it in the results (a loader path name, a
    dataset, ...), ``label`` is how people read it."""

    key: str
    label: str
    stat: Stat


@dataclass(frozen=True)
class GuideRow:
    """A question, every candidate measured for it (best first), and the verdict."""

    study: str
    question: str
    metric: str
    candidates: tuple[Candidate, ...]
    lower_is_better: bool
    ratio: float
    low: float
    high: float
    tie: bool
    tied: tuple[str, ...] = ()
    # What situation the row answers, as data (``{"encoding": "jpeg", "k": 5}``), so that
    # ``storebench advise`` finds rows without reading their question text.
    facets: Mapping = field(default_factory=dict)
    # ``VERDICTS``: the best named (``better``), or ``equivalent`` / ``undecided`` (``tie``).
    verdict: str = "better"
    # What the candidates read and did (``Results.workload``): the data set, its samples'
    # size and the transform; "" where the results do not record it.
    workload: str = ""

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    @property
    def runner_up(self) -> Candidate | None:
        return self.candidates[1] if len(self.candidates) > 1 else None

    @property
    def choice(self) -> str:
        if self.runner_up is None:
            return f"{self.best.label} (the only candidate measured)"
        if self.undecided:
            return (f"undecided between {self.best.label} and {self.runner_up.label} "
                    f"({self.undecided_reason})")
        if self.tie:
            names = [self.best.label, *self.tied]
            return (f"equivalent within {DECISION_MARGIN:.0%}: " + ", ".join(names[:-1])
                    + f" and {names[-1]}")
        return self.best.label

    @property
    def undecided(self) -> bool:
        """Neither a winner nor equivalence: too few repeats, or an interval that crosses
        the margin."""
        return self.verdict == "undecided"

    @property
    def undecided_reason(self) -> str:
        counts = f"n = {self.best.stat.count} and {self.runner_up.stat.count}"
        if math.isinf(self.low):
            return f"fewer than {MIN_PAIRED_REPEATS} repeats on a side: {counts}"
        return f"the interval crosses the {DECISION_MARGIN:.0%} margin; {counts}"

    def value_text(self, stat: Stat) -> str:
        """A candidate's median as the question reads it (utilisation as a percentage)."""
        if stat.unit == "ratio" and self.metric.endswith(("utilisation", "fraction")):
            return format_percent(stat.median)
        return format_value(stat.median, stat.unit)

    @property
    def evidence(self) -> str:
        """The best and the runner-up with their medians, the ratio and its interval."""
        best = self.best
        text = f"{best.label} {self.value_text(best.stat)}"
        second = self.runner_up
        if second is None:
            return text
        text += f" vs {second.label} {self.value_text(second.stat)}"
        unit = best.stat.unit
        if math.isinf(self.low):
            interval = f"fewer than {MIN_PAIRED_REPEATS} repeats on a side: no interval"
        elif unit in EXACT_UNITS and self.low == self.high:
            interval = "exact"
        else:
            interval = f"95% interval {format_ratio(self.low)}\u2013{format_ratio(self.high)}"
        # A count where more is better (scenarios passed) is "more", not "smaller".
        exact = "smaller" if self.lower_is_better else "more"
        word = (exact if unit in EXACT_UNITS else "less time" if unit == "s" else
                "faster" if unit == "samples/s" else "higher")
        # Two decimals: a ratio near the margin reads as what the rule compared.
        ratio = (f"{self.ratio:.2f}{MULTIPLY}" if math.isfinite(self.ratio) and self.ratio < 10
                 else format_ratio(self.ratio))
        text += f"; {ratio} {word if not self.tie else 'ratio'} ({interval})"
        return text + f"; {len(self.candidates)} candidates"

    def to_dict(self) -> dict:
        return {
            "study": self.study,
            "question": self.question,
            "metric": self.metric,
            "lower_is_better": self.lower_is_better,
            "choice": self.choice,
            "best": self.best.key,
            "runner_up": self.runner_up.key if self.runner_up else None,
            "ratio": self.ratio,
            "interval": [self.low, self.high],
            "tie": self.tie,
            "undecided": self.undecided,
            "verdict": self.verdict,
            "tied_with_best": list(self.tied),
            "tie_rule": TIE_RULE,
            "facets": dict(self.facets),
            "workload": self.workload,
            "candidates": [
                {"key": c.key, "label": c.label, "median": c.stat.median, "low": c.stat.low,
                 "high": c.stat.high, "repeats": c.stat.count, "unit": c.stat.unit,
                 "values": list(c.stat.values),
                 "sources": [list(source) for source in c.stat.sources]}
                for c in self.candidates
            ],
        }


def choose(study: str, question: str, metric: str, candidates: Sequence[Candidate], *,
           lower_is_better: bool = False, facets: Mapping | None = None) -> GuideRow | None:
    """The guide row for ``question`` (the situation it answers as ``facets``): candidates
    ranked by median (best first); the best against the runner-up under ``TIE_RULE``. None
    when nothing was measured."""
    ranked = sorted(candidates, key=lambda c: c.stat.median, reverse=not lower_is_better)
    facets = dict(facets or {})
    if not ranked:
        return None
    if len(ranked) == 1:
        return GuideRow(study, question, metric, tuple(ranked), lower_is_better,
                        float("nan"), float("nan"), float("nan"), False, facets=facets)
    verdicts = [compare(ranked[0].stat, other.stat, lower_is_better=lower_is_better)
                 for other in ranked[1:]]
    ratio, low, high, verdict = verdicts[0]
    tied = tuple(c.label for c, v in zip(ranked[1:], verdicts)
                 if v[3] == "equivalent") if verdict == "equivalent" else ()
    return GuideRow(study, question, metric, tuple(ranked), lower_is_better, ratio, low, high,
                    verdict != "better", tied, facets, verdict)


def compare(best: Stat, other: Stat, *, lower_is_better: bool
            ) -> tuple[float, float, float, str]:
    """(ratio, low, high, verdict) of ``best`` against ``other`` under ``TIE_RULE``; the
    ratio is how many times better ``best`` is (1.0 or more), the verdict one of
    ``VERDICTS``."""
    beyond = 1.0 + DECISION_MARGIN
    # Sizes and counts are exact where every repeat gave the same value (a build's bytes);
    # a peak memory in bytes varies between repeats and is judged by its interval.
    if best.unit in EXACT_UNITS and best.low == best.high and other.low == other.high:
        ratio = other.median / best.median if lower_is_better else best.median / other.median
        return ratio, ratio, ratio, "better" if ratio > beyond else "equivalent"
    ratio, low, high = (ratio_interval(other, best) if lower_is_better
                        else ratio_interval(best, other))
    if low > 1.0 and ratio > beyond:
        return ratio, low, high, "better"
    if 1.0 / beyond <= low and high <= beyond:
        return ratio, low, high, "equivalent"
    return ratio, low, high, "undecided"


def guide_table(rows: Sequence[GuideRow]) -> pd.DataFrame:
    """question | workload | choice | evidence, for markdown and notebooks."""
    columns = ["question", "workload", "choice", "evidence"]
    return pd.DataFrame([{"question": r.question, "workload": r.workload, "choice": r.choice,
                          "evidence": r.evidence} for r in rows], columns=columns)


def guide_text(rows: Sequence[GuideRow]) -> str:
    """The guide as plain text for a terminal: each question, its choice, its candidates."""
    lines = []
    for row in rows:
        lines.append(f"* {row.question}")
        if row.workload:
            lines.append(f"  workload: {row.workload}")
        lines.append(f"  -> {row.choice}")
        lines.append(f"     {row.evidence}")
        shown = ", ".join(f"{c.label} {row.value_text(c.stat)}" for c in row.candidates)
        lines.append(f"     candidates: {shown}")
    lines.append("")
    lines.append(f"Tie rule: {TIE_RULE}")
    return "\n".join(lines)
