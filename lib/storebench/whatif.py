"""What another repeat budget would have changed in a stored run, from its rows alone: which
cases would have stopped sooner, the seconds and repeats that saves, the stop metric's
interval half-widths with and without those repeats, and the decision guide's choices from
the shorter rows against the stored ones.

Each case is replayed under its own rule (``stats.AdaptiveRepeats``: from its
``repeat_rule.*`` rows, or given for runs from before they were written) with only the
budget replaced, and only where the rule had the plan's budget: targets (no budget) and the
peers study's target rows (their own) keep theirs. A repeat's cost is the case's mean pace,
``repeats_seconds`` over ``repeats_run``, as the rule itself estimates it.

``python -m storebench.whatif RESULTS_DIR --budget 2 [--data data/small]``: ``--data`` gives
the grid whose rules the rows lack (runs before ``repeat_rule`` rows).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from .bench.stats import AdaptiveRepeats, relative_halfwidth, stop_metric
from .results import Results


@dataclass(frozen=True)
class BudgetEffect:
    """``cut``: (study, case_id, repeats stored, repeats under the budget, seconds saved,
    half-width stored, half-width under the budget), one row per case that would stop
    sooner; ``changed``: (study, question, stored choice, choice under the budget), one row
    per guide row whose choice differs; ``guide_rows``: how many were compared."""

    budget_s: float
    cut: pd.DataFrame
    changed: pd.DataFrame
    guide_rows: int

    @property
    def seconds_saved(self) -> float:
        return float(self.cut["seconds_saved"].sum())

    def summary(self) -> str:
        cut = self.cut
        if cut.empty:
            return f"A {self.budget_s:g} s budget stops no case sooner."
        lines = [
            f"A {self.budget_s:g} s budget stops {len(cut)} cases sooner: "
            f"{int((cut['repeats'] - cut['repeats_under_budget']).sum())} repeats, "
            f"{self.seconds_saved:.1f} s.",
            f"Their stop metric's relative interval half-width, median (90th percentile): "
            f"{cut['halfwidth'].median():.3f} ({cut['halfwidth'].quantile(0.9):.3f}) with "
            f"every repeat, {cut['halfwidth_under_budget'].median():.3f} "
            f"({cut['halfwidth_under_budget'].quantile(0.9):.3f}) without.",
            f"Decision guide: {len(self.changed)} of {self.guide_rows} rows choose otherwise.",
        ]
        for row in self.changed.itertuples():
            lines.append(f"  {row.study}: {row.question}\n    stored: {row.choice}\n"
                         f"    under the budget: {row.choice_under_budget}")
        return "\n".join(lines)


def stored_rules(df: pd.DataFrame) -> dict[tuple[str, str], AdaptiveRepeats]:
    """(study, case_id) -> the adaptive rule its ``repeat_rule.*`` rows record (cases with
    fixed repeats, or from before those rows, are absent)."""
    rows = df[(df["repeat"] == -1) & df["metric"].str.startswith("repeat_rule.")]
    rules = {}
    for key, part in rows.groupby(["study", "case_id"]):
        values = dict(zip(part["metric"].str.removeprefix("repeat_rule."), part["value"]))
        if "halfwidth" not in values:
            continue
        rules[key] = AdaptiveRepeats(int(values["minimum"]), int(values["maximum"]),
                                     float(values["halfwidth"]), values.get("budget_s"),
                                     values.get("threshold"))
    return rules


def guide_choices(results: Results) -> dict[tuple[str, str], str]:
    """(study, question) -> the guide's choice: the best candidate, or the tie it calls."""
    from .studies import STUDIES

    choices = {}
    for name, study in STUDIES.items():
        for row in study.guide(results):
            choices[(name, row.question)] = row.choice
    return choices


def budget_effect(results: Results, budget_s: float, *, plan_budget_s: float,
                  rules: Mapping[tuple[str, str], AdaptiveRepeats] | None = None
                  ) -> BudgetEffect:
    """Replay every case whose rule had ``plan_budget_s`` under ``budget_s`` instead (see
    the module docstring). ``rules`` fills in the cases whose rows record none."""
    df = results.df
    known = {**(rules or {}), **stored_rules(df)}
    whole = df[df["repeat"] == -1].pivot_table(index=["study", "case_id"], columns="metric",
                                                values="value", aggfunc="first")
    timed = dict(list(df[(df["repeat"] >= 0) & (df["status"] == "ok")].groupby(
        ["study", "case_id"])))
    keep: dict[tuple[str, str], int] = {}
    cut = []
    for key, rule in known.items():
        if rule.budget_s is None or not math.isclose(rule.budget_s, plan_budget_s):
            continue
        if key not in whole.index or not np.isfinite(whole.loc[key].get("repeats_run", np.nan)):
            continue
        ran = int(whole.loc[key, "repeats_run"])
        pace = float(whole.loc[key, "repeats_seconds"]) / ran
        rows = timed.get(key)
        metric = None if rows is None else stop_metric(dict.fromkeys(rows["metric"]))
        if metric is None:
            continue
        values = rows[rows["metric"] == metric].sort_values("repeat")["value"].to_numpy()
        shorter = replace(rule, budget_s=budget_s)
        stop = next((n for n in range(1, ran + 1)
                     if shorter.done(values[:n], elapsed_s=pace * n)), ran)
        if stop < ran:
            keep[key] = stop
            cut.append((*key, ran, stop, (ran - stop) * pace, relative_halfwidth(values),
                        relative_halfwidth(values[:stop])))
    cut_frame = pd.DataFrame(cut, columns=[
        "study", "case_id", "repeats", "repeats_under_budget", "seconds_saved", "halfwidth",
        "halfwidth_under_budget"])
    limit = np.array([keep.get(key, np.iinfo(np.int64).max)
                      for key in zip(df["study"], df["case_id"])])
    shorter_df = df[(df["repeat"] < limit) | (df["repeat"] == -1)]
    stored = guide_choices(results)
    # Everything but the rows as stored (the workloads name the questions' sets).
    under = guide_choices(replace(results, df=shorter_df))
    changed = pd.DataFrame(
        [(study, question, choice, under.get((study, question), "(no row)"))
         for (study, question), choice in stored.items()
         if under.get((study, question)) != choice],
        columns=["study", "question", "choice", "choice_under_budget"])
    return BudgetEffect(budget_s, cut_frame, changed, len(stored))


def grid_rules(results: Results, data_dir: Path | str, *, plan_budget_s: float
               ) -> dict[tuple[str, str], AdaptiveRepeats]:
    """The rules of the grids of the run's studies over ``data_dir``, for rows without
    ``repeat_rule`` rows: today's grids, with today's plan budget read as the one the run
    had (``plan_budget_s``); a case's own budget (none, or the peers targets') stays."""
    from .bench.plan import REPEAT_BUDGET_S
    from .study import planned_cases

    profile = str(results.df["profile"].iloc[0])
    rules = {}
    for name in sorted(set(results.df["study"])):
        for case in planned_cases(name, profile, Path(data_dir), None):
            rule = case.adaptive_repeats
            if rule is None:
                continue
            if rule.budget_s is not None and math.isclose(rule.budget_s, REPEAT_BUDGET_S):
                rule = replace(rule, budget_s=plan_budget_s)
            rules[(name, case.case_id)] = rule
    return rules


def main(argv: list[str] | None = None) -> int:
    from .bench.plan import REPEAT_BUDGET_S

    parser = argparse.ArgumentParser(prog="python -m storebench.whatif",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("results_dir")
    parser.add_argument("--budget", type=float, required=True, help="seconds")
    parser.add_argument("--plan-budget", type=float, default=REPEAT_BUDGET_S,
                        help="the budget the run's cases had (default: the plan's)")
    parser.add_argument("--data", help="dataset root of the run's profile, for rows that "
                        "record no repeat rule")
    args = parser.parse_args(argv)
    results = Results.load(args.results_dir)
    rules = (grid_rules(results, args.data, plan_budget_s=args.plan_budget) if args.data
             else None)
    print(budget_effect(results, args.budget, plan_budget_s=args.plan_budget,
                        rules=rules).summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
