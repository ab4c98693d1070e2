"""How thoroughly each profile is measured: repeats, per-case timeout and grid size, in one
place.

The ``ci`` profile exists to exercise every code path of every study quickly (its datasets
are a few MB), so it gets fewer repeats and a grid trimmed where a dimension adds little
there (more formats of the same kind of case, more decoders under every prefetcher); every
*kind* of case still runs, so the notebooks draw every figure from it. Every other profile
gets the full grid.
"""

from __future__ import annotations

from dataclasses import dataclass

from .stats import AdaptiveRepeats

DEFAULT_REPEATS = 3
DEFAULT_TIMEOUT_S = 600.0
# Past their minimum, a case's repeats stop once another would take them past this: the
# reference run's costliest cases (a cold epoch of 20,000 raw files, a shuffled Zarr epoch)
# took 3 to 9 repeats of several seconds each, most of the study's time, for intervals the
# guide's tie rule mostly did not need narrower.
REPEAT_BUDGET_S = 6.0


@dataclass(frozen=True)
class StudyPlan:
    """``repeats``: timed repeats per case where a fixed count is used; ``adaptive``: the
    rule most cases repeat by instead (at least 3, until the median's interval is narrow or
    the repeat budget is spent, at most 9), None for fixed counts; ``timeout_s``: how long
    one case may run; ``compact``: trim grid dimensions that only add more of the same kind
    of case."""

    repeats: int = DEFAULT_REPEATS
    adaptive: AdaptiveRepeats | None = AdaptiveRepeats(budget_s=REPEAT_BUDGET_S)
    timeout_s: float = DEFAULT_TIMEOUT_S
    compact: bool = False

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")


# Profiles not named here get StudyPlan().
PLANS: dict[str, StudyPlan] = {
    # Fixed 3 repeats: ci exercises every path quickly, its numbers are not the reference.
    "ci": StudyPlan(repeats=3, adaptive=None, timeout_s=300.0, compact=True),
}


def plan_for(profile: str) -> StudyPlan:
    return PLANS.get(profile, StudyPlan())


def default_repeats(profile: str) -> int:
    return plan_for(profile).repeats


def case_timeout_s(profile: str) -> float:
    return plan_for(profile).timeout_s
