"""The bootstrap interval of a median and the adaptive-repeats rule built on it."""

from __future__ import annotations

import numpy as np
import pytest

from storebench.bench.stats import (
    REPEAT_RULE_ENV,
    AdaptiveRepeats,
    forced,
    forced_repeat_rule,
    median_interval,
    relative_halfwidth,
    stop_metric,
)


def test_median_interval_is_deterministic_and_brackets_the_median():
    values = [10.0, 12.0, 11.0, 30.0, 11.5]
    median, low, high = median_interval(values)
    assert median == 11.5
    assert low <= median <= high
    assert (low, high) == median_interval(values)[1:]  # fixed seed
    assert low >= min(values) and high <= max(values)
    assert median_interval([7.0]) == (7.0, 7.0, 7.0)
    with pytest.raises(ValueError, match="no values"):
        median_interval([])


def test_identical_values_have_a_zero_width_interval():
    assert relative_halfwidth([5.0, 5.0, 5.0]) == 0.0
    assert relative_halfwidth([0.0, 0.0, 0.0]) == float("inf")


def test_adaptive_rule_minimum_width_and_maximum():
    rule = AdaptiveRepeats(minimum=3, maximum=5, halfwidth=0.05)
    assert not rule.done([100.0, 100.0])             # below the minimum, however narrow
    assert rule.done([100.0, 101.0, 100.5])          # narrow at the minimum
    assert not rule.done([100.0, 150.0, 60.0])       # wide
    assert not rule.done([100.0, 150.0, 60.0, 100.0])
    assert rule.done([100.0, 150.0, 60.0, 100.0, 70.0])  # the maximum
    assert "at least 3 repeats" in rule.rule and "at most 5" in rule.rule
    assert "5%" in rule.rule
    with pytest.raises(ValueError, match="minimum <= maximum"):
        AdaptiveRepeats(minimum=4, maximum=3)
    with pytest.raises(ValueError, match="halfwidth must be positive"):
        AdaptiveRepeats(halfwidth=0)


def test_a_time_budget_stops_wide_repeats_that_cost_too_much():
    rule = AdaptiveRepeats(minimum=3, maximum=9, halfwidth=0.05, budget_s=10.0)
    wide = [100.0, 150.0, 60.0]
    assert not rule.done(wide[:2], elapsed_s=100.0)   # the minimum comes first
    assert rule.done(wide, elapsed_s=9.0)             # a 4th at 3 s each: 12 s > 10 s
    assert not rule.done(wide, elapsed_s=6.0)         # a 4th: 8 s, within the budget
    assert not rule.done(wide)                        # no elapsed time: no budget applied
    assert not AdaptiveRepeats(budget_s=None).done(wide, elapsed_s=1e9)
    assert "another repeat would take the repeats past 10 s" in rule.rule
    assert "past" not in AdaptiveRepeats().rule
    with pytest.raises(ValueError, match="budget_s must be positive"):
        AdaptiveRepeats(budget_s=0)


def test_a_target_interval_that_holds_its_threshold_runs_every_repeat():
    rule = AdaptiveRepeats(minimum=3, maximum=9, halfwidth=0.05, threshold=200.0)
    plain = AdaptiveRepeats(minimum=3, maximum=9, halfwidth=0.05)
    straddling = [207.4, 195.5, 208.4]  # narrow (3%), but 200 lies inside its interval
    assert plain.done(straddling)
    assert not rule.done(straddling)
    # Once undecided, decided and narrow later is still not enough: all 9 repeats.
    later = straddling + [207.0, 208.0, 207.5, 206.9]
    assert median_interval(later)[1] >= 200.0 and relative_halfwidth(later) <= 0.05
    assert not rule.done(later)
    assert not rule.done(later + [207.2])
    assert rule.done(later + [207.2, 207.8])
    # Decided at the minimum, either way: the width rule alone.
    assert rule.done([207.4, 209.0, 208.4])   # met
    assert rule.done([150.0, 151.0, 152.0])   # missed
    assert not rule.done([150.0, 190.0, 120.0])  # missed but wide: the width rule goes on
    assert "once the interval contains the threshold 200, all 9" in rule.rule
    assert "threshold" not in plain.rule
    with pytest.raises(ValueError, match="threshold must be finite"):
        AdaptiveRepeats(threshold=float("nan"))


def test_the_stop_metric_is_the_first_the_case_reports():
    assert stop_metric({"wall_seconds": 1, "samples_per_s": 2}) == "samples_per_s"
    assert stop_metric({"target_ratio": 1, "samples_per_s": 2}) == "target_ratio"
    assert stop_metric({"write_seconds": 1}) is None


def test_halfwidth_shrinks_as_repeats_agree():
    rng = np.random.default_rng(0)
    few = rng.normal(100, 5, 3)
    many = np.concatenate([few, rng.normal(100, 5, 30)])
    assert relative_halfwidth(many) < relative_halfwidth(few)


def test_a_case_with_epoch_1_only_stops_on_its_rate_not_its_wall_time():
    assert stop_metric({"wall_seconds": 1, "epoch1_samples_per_s": 2}) == "epoch1_samples_per_s"
    assert stop_metric({"epoch1_samples_per_s": 2, "later_epochs_samples_per_s": 3,
                        "wall_seconds": 1}) == "later_epochs_samples_per_s"


@pytest.mark.parametrize("value, expected", [
    ("", None), ("adaptive", None), ("minimum", "minimum"), (" Maximum ", "maximum")])
def test_the_forced_repeat_rule_is_read_from_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv(REPEAT_RULE_ENV, value)
    assert forced_repeat_rule() == expected
    monkeypatch.delenv(REPEAT_RULE_ENV)
    assert forced_repeat_rule() is None


def test_a_forced_rule_runs_exactly_its_end_whatever_the_values():
    rule = AdaptiveRepeats(minimum=3, maximum=9, halfwidth=0.05, budget_s=10.0)
    narrow, wide = [100.0] * 9, [100.0, 150.0, 60.0] * 3
    least, most = forced(rule, "minimum"), forced(rule, "maximum")
    assert (least.minimum, least.maximum, most.minimum, most.maximum) == (3, 3, 9, 9)
    assert [least.done(wide[:n], elapsed_s=0.1) for n in (2, 3)] == [False, True]
    assert [most.done(narrow[:n], elapsed_s=1e9) for n in (8, 9)] == [False, True]
    assert forced(rule, None) is rule and forced(None, "maximum") is None
