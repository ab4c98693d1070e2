"""An independent recompute of the reference guide from its CSV files.

Every guide candidate whose figure names its result rows (``Stat.sources``) is read again
from ``results/reference/*.csv`` with plain pandas, and every verdict between the best and
the runner-up is decided again by the rule the README states, written out here without
storebench's statistics code: the ratio of medians; a percentile bootstrap (4,000 resamples,
seed 0, 95%), paired only when both figures are one case's and have as many repeats (or
neither names its rows), else each side resampled on its own; no interval below 5 repeats
a side; "better" only when the interval's lower end
exceeds 1 and the ratio exceeds 1.05; "equivalent" when the interval lies within
[1/1.05, 1.05]; else "undecided". Sizes and counts identical in every repeat compare
exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from storebench.report.guide import decision_guide
from storebench.results import Results

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"
MARGIN = 1.05
MIN_REPEATS = 5


@pytest.fixture(scope="module")
def reference_rows() -> pd.DataFrame:
    """The ok timed repeats of each case's latest run, in file order."""
    paths = sorted(REFERENCE.glob("*.csv")) + sorted(REFERENCE.glob("*.csv.gz"))
    df = pd.concat([pd.read_csv(p, keep_default_na=False, na_values=[""]) for p in paths],
                   ignore_index=True)
    latest = df.groupby(["study", "case_id"])["run_id"].transform("max")
    repeat = pd.to_numeric(df["repeat"])
    return df[(df["run_id"] == latest) & (df["status"] == "ok") & (repeat >= 0)].assign(
        repeat=repeat)


@pytest.fixture(scope="module")
def guide_rows():
    return [row.to_dict() for row in decision_guide(Results.load(REFERENCE))]


def values_from_csv(rows: pd.DataFrame, sources) -> np.ndarray:
    wanted = {tuple(source) for source in sources}
    keys = zip(rows["study"], rows["case_id"], rows["metric"])
    chosen = rows[[key in wanted for key in keys]].sort_values("repeat", kind="stable")
    return chosen["value"].astype(float).to_numpy()


def bootstrap_ratio(top: np.ndarray, other: np.ndarray,
                    paired: bool) -> tuple[float, float, float]:
    ratio = float(np.median(top) / np.median(other))
    if min(len(top), len(other)) < MIN_REPEATS:
        return ratio, -np.inf, np.inf
    rng = np.random.default_rng(0)
    if paired and len(top) == len(other):
        picks_top = picks_other = rng.integers(0, len(top), size=(4000, len(top)))
    else:
        picks_top = rng.integers(0, len(top), size=(4000, len(top)))
        picks_other = rng.integers(0, len(other), size=(4000, len(other)))
    ratios = np.median(top[picks_top], axis=1) / np.median(other[picks_other], axis=1)
    low, high = np.quantile(ratios, [0.025, 0.975])
    return ratio, float(low), float(high)


def one_case(top_sources, other_sources) -> bool:
    """Both figures read from one case's rows (repeat i of each taken together), or neither
    names its rows."""
    if not top_sources and not other_sources:
        return True
    cases = {(s[0], s[1]) for s in (*top_sources, *other_sources)}
    return bool(top_sources) and bool(other_sources) and len(cases) == 1


def verdict(top: np.ndarray, other: np.ndarray, *, lower_is_better: bool, unit: str,
            paired: bool):
    if lower_is_better:
        top, other = other, top
    if unit in ("bytes", "count") and np.ptp(top) == 0 and np.ptp(other) == 0:
        ratio = float(np.median(top) / np.median(other))
        return ratio, ratio, ratio, "better" if ratio > MARGIN else "equivalent"
    ratio, low, high = bootstrap_ratio(top, other, paired)
    if low > 1.0 and ratio > MARGIN:
        return ratio, low, high, "better"
    if low >= 1.0 / MARGIN and high <= MARGIN:
        return ratio, low, high, "equivalent"
    return ratio, low, high, "undecided"


def test_every_traced_candidate_figure_is_the_csv_rows(reference_rows, guide_rows):
    traced = 0
    for row in guide_rows:
        for candidate in row["candidates"]:
            if not candidate["sources"]:
                continue
            values = values_from_csv(reference_rows, candidate["sources"])
            assert values.tolist() == pytest.approx(candidate["values"], rel=1e-12), (
                row["question"], candidate["label"])
            assert float(np.median(values)) == pytest.approx(candidate["median"], rel=1e-12)
            traced += 1
    assert traced >= len(guide_rows)  # at least one traced candidate per row on average


def test_every_verdict_follows_the_stated_rule(reference_rows, guide_rows):
    decided = 0
    for row in guide_rows:
        if row["runner_up"] is None:
            continue
        best, runner_up = row["candidates"][0], row["candidates"][1]
        top = np.asarray(best["values"], dtype=float)
        other = np.asarray(runner_up["values"], dtype=float)
        ratio, low, high, expected = verdict(
            top, other, lower_is_better=row["lower_is_better"], unit=best["unit"],
            paired=one_case(best["sources"], runner_up["sources"]))
        assert row["ratio"] == pytest.approx(ratio, rel=1e-9), row["question"]
        if np.isfinite(low):
            assert row["interval"] == pytest.approx([low, high], rel=1e-9), row["question"]
        assert row["verdict"] == expected, row["question"]
        if expected == "better":
            assert min(len(top), len(other)) >= MIN_REPEATS or best["unit"] in ("bytes",
                                                                                "count")
        decided += 1
    assert decided
