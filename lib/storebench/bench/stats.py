"""Bootstrap intervals of medians, and the adaptive-repeats rule that uses them.

NumPy only: case workers import this to decide when to stop repeating, and the results layer
(``storebench.results``) and the targets study use the same functions, so one rule holds
everywhere.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_RESAMPLES = 4000
INTERVAL_LEVEL = 0.95

# The metric a case's repeats are judged by, the first one it reports.
STOP_METRICS = ("target_ratio", "samples_per_s", "later_epochs_samples_per_s",
                "epoch1_samples_per_s", "read_MBps", "wall_seconds")


def median_interval(values: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES,
                    level: float = INTERVAL_LEVEL, seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high): the ``level`` bootstrap interval of the median of ``values``
    (``resamples`` resamples with replacement, a fixed seed: the same values always give the
    same interval)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values: no median")
    median = float(np.median(data))
    if data.size == 1:
        return median, median, median
    picks = np.random.default_rng(seed).integers(0, data.size, size=(resamples, data.size))
    medians = np.median(data[picks], axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(medians, [tail, 1 - tail])
    return median, float(low), float(high)


def relative_halfwidth(values: Sequence[float], **kwargs) -> float:
    """Half the width of the median's bootstrap interval, over the median (inf for a zero
    median)."""
    median, low, high = median_interval(values, **kwargs)
    return (high - low) / 2 / abs(median) if median else float("inf")


# Repeats a side below which no comparison names a winner (``results.TIE_RULE``): every
# case that feeds a decision takes at least this many.
MIN_DECISION_REPEATS = 5


@dataclass(frozen=True)
class AdaptiveRepeats:
    """Repeat a case at least ``minimum`` times, then stop as soon as the 95% bootstrap
    interval of the median of its stop metric (``STOP_METRICS``) has a half-width of at most
    ``halfwidth`` of the median, or at ``maximum`` repeats, or (with ``budget_s``) when one
    more repeat, at the mean pace of those so far, would take the repeats past ``budget_s``
    seconds: the cases that cost most per repeat stop at the minimum instead of dominating
    the study's time, while the quick ones still narrow their intervals.

    With a ``threshold`` (a target's: its verdict is whether the interval's lower end clears
    it), the repeats are there to decide, so an undecided interval does not stop them: once
    the interval after some repeat from the minimum on contains the threshold, the case runs
    every repeat up to the maximum, whatever the width or budget says. So a case stops
    before the maximum only where every look from the minimum on found it decided: an
    undecided one is judged on all its repeats, never at whichever repeat first happened to
    clear the threshold."""

    minimum: int = 3
    maximum: int = 9
    halfwidth: float = 0.05
    budget_s: float | None = None
    threshold: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, got {self.minimum}, {self.maximum}")
        if self.halfwidth <= 0:
            raise ValueError(f"halfwidth must be positive, got {self.halfwidth}")
        if self.budget_s is not None and self.budget_s <= 0:
            raise ValueError(f"budget_s must be positive, got {self.budget_s}")
        if self.threshold is not None and not np.isfinite(self.threshold):
            raise ValueError(f"threshold must be finite, got {self.threshold}")

    @property
    def rule(self) -> str:
        budget = ("" if self.budget_s is None else
                  f", or once another repeat would take the repeats past {self.budget_s:g} s")
        undecided = ("" if self.threshold is None else
                     f"; once the interval contains the threshold {self.threshold:g}, "
                     f"all {self.maximum}")
        return (f"at least {self.minimum} repeats, then stop when the 95% bootstrap interval "
                f"of the median has a half-width of at most {self.halfwidth:.0%} of the "
                f"median{budget}, at most {self.maximum} repeats{undecided}")

    def done(self, values: Sequence[float], *, elapsed_s: float | None = None) -> bool:
        """Whether to stop after ``values`` (one per repeat so far), which took
        ``elapsed_s`` seconds in all (the budget is not applied without it)."""
        count = len(values)
        if count < self.minimum:
            return False
        if count >= self.maximum:
            return True
        if self.threshold is not None and any(
                self._contains_threshold(values[:looked])
                for looked in range(self.minimum, count + 1)):
            return False
        if relative_halfwidth(values) <= self.halfwidth:
            return True
        return (self.budget_s is not None and elapsed_s is not None
                and elapsed_s * (count + 1) / count > self.budget_s)

    def _contains_threshold(self, values: Sequence[float]) -> bool:
        _, low, high = median_interval(values)
        return low < self.threshold <= high


# Forces every rule that depends on how noisy or fast the machine is to one of its ends:
# ``minimum`` (adaptive repeats stop at their minimum; the top-up adds no rounds) or
# ``maximum`` (adaptive repeats run to their maximum; the top-up treats every question as
# undecided). Unset or ``adaptive``: the rules as designed. A test suite run both ways shows
# the tests whose outcome depends on the machine they ran on.
REPEAT_RULE_ENV = "STOREBENCH_REPEAT_RULE"
REPEAT_RULES = ("adaptive", "minimum", "maximum")


def forced_repeat_rule() -> str | None:
    """``minimum`` or ``maximum`` where ``STOREBENCH_REPEAT_RULE`` forces the adaptive rules
    to that end; None where it is unset, empty or ``adaptive``."""
    value = os.environ.get(REPEAT_RULE_ENV, "").strip().lower() or "adaptive"
    if value not in REPEAT_RULES:
        raise ValueError(f"{REPEAT_RULE_ENV}={os.environ[REPEAT_RULE_ENV]!r}: expected one of "
                         f"{', '.join(REPEAT_RULES)}")
    return None if value == "adaptive" else value


def forced(rule: AdaptiveRepeats | None, forcing: str | None) -> AdaptiveRepeats | None:
    """``rule`` as ``forcing`` (``forced_repeat_rule``) fixes it: ``minimum`` makes its
    maximum its minimum, ``maximum`` its minimum its maximum; either way, it then runs
    exactly that many repeats, whatever the values."""
    if rule is None or forcing is None:
        return rule
    ends = rule.minimum if forcing == "minimum" else rule.maximum
    return dataclasses.replace(rule, minimum=ends, maximum=ends)


def stop_metric(metrics: Mapping[str, object]) -> str | None:
    """The metric of ``metrics`` that adaptive repeats judge a case by."""
    return next((name for name in STOP_METRICS if name in metrics), None)
