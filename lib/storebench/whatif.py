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

``--screen --data data/small`` replays the run under today's grid's rules instead (a first
pass of ``bench.plan.SCREEN_REPEATS``) and the top-up's floor (``storebench.topup``): every
case behind a question's best and runner-up taken back to ``MIN_DECISION_REPEATS`` of its
stored repeats, the guide read again until no top two falls short; it prints the seconds
the first pass saves, what the floor spends again (its repeats and each floored case's
start-up), and the guide rows that choose otherwise.

``--least`` prints the least case time the run's decision guide needs under today's rules,
from the run's own paces: every repeat's steady window cut to its minimum (``max(1 s, 20
batches)``, ``bench.plan.STEADY_SECONDS`` and ``STEADY_BATCHES``), each question's top two
at ``MIN_DECISION_REPEATS``, every other candidate at ``SCREEN_REPEATS`` (or fewer, with
``--other-repeats``), and the cases behind no guide question dropped or kept at that
number; beside it, the run's time outside its cases (build, plots, notebooks, each study's
set-up), which no repeat rule shortens.
"""

from __future__ import annotations

import argparse
import json
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
        return "\n".join(lines + changed_lines(self.changed, "under the budget"))


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


def changed_choices(results: Results, replayed: Results) -> tuple[pd.DataFrame, int]:
    """The guide rows whose choice differs between ``results`` and the same run
    ``replayed`` with fewer repeats (study, question, choice, choice_under_budget), and how
    many rows were compared."""
    stored = guide_choices(results)
    under = guide_choices(replayed)
    changed = pd.DataFrame(
        [(study, question, choice, under.get((study, question), "(no row)"))
         for (study, question), choice in stored.items()
         if under.get((study, question)) != choice],
        columns=["study", "question", "choice", "choice_under_budget"])
    return changed, len(stored)


def changed_lines(changed: pd.DataFrame, replayed_as: str) -> list[str]:
    """A line per guide row of ``changed``: its question, the stored choice and the one
    the replay (``replayed_as``) makes."""
    return [f"  {row.study}: {row.question}\n    stored: {row.choice}\n"
            f"    {replayed_as}: {row.choice_under_budget}" for row in changed.itertuples()]


@dataclass(frozen=True)
class StoredCase:
    """A case as a run stored it: its first pass's ``repeats``, their mean ``pace`` (s a
    repeat), its ``start`` outside them (``case_seconds`` less ``repeats_seconds``; 0 where
    unknown) and its stop metric's ``values`` in repeat order."""

    repeats: int
    pace: float
    start: float
    values: np.ndarray

    def stop(self, rule: AdaptiveRepeats) -> int:
        """The repeat ``rule`` would have stopped this case at (its repeats if none)."""
        return next((n for n in range(1, self.repeats + 1)
                     if rule.done(self.values[:n], elapsed_s=self.pace * n)), self.repeats)


def stored_cases(df: pd.DataFrame) -> dict[tuple[str, str], StoredCase]:
    """(study, case_id) -> its ``StoredCase``, for every case with a repeat count, a pace
    and a stop metric in ``df``."""
    whole = df[df["repeat"] == -1].pivot_table(index=["study", "case_id"], columns="metric",
                                                values="value", aggfunc="first")
    cases = {}
    for key, rows in df[(df["repeat"] >= 0) & (df["status"] == "ok")].groupby(
            ["study", "case_id"]):
        if key not in whole.index or not np.isfinite(whole.loc[key].get("repeats_run", np.nan)):
            continue
        metric = stop_metric(dict.fromkeys(rows["metric"]))
        if metric is None:
            continue
        ran = int(whole.loc[key, "repeats_run"])
        pace = float(whole.loc[key, "repeats_seconds"]) / ran
        start = float(whole.loc[key].get("case_seconds", np.nan)) - pace * ran
        cases[key] = StoredCase(
            ran, pace, max(0.0, start) if np.isfinite(start) else 0.0,
            rows[rows["metric"] == metric].sort_values("repeat")["value"].to_numpy())
    return cases


def cut_to(results: Results, keep: Mapping[tuple[str, str], int]) -> Results:
    """``results`` with each case of ``keep`` cut to its first that many timed repeats;
    everything but the rows as stored (the workloads name the questions' sets)."""
    df = results.df
    limit = np.array([keep.get(key, np.iinfo(np.int64).max)
                      for key in zip(df["study"], df["case_id"])])
    return replace(results, df=df[(df["repeat"] < limit) | (df["repeat"] == -1)])


def budget_effect(results: Results, budget_s: float, *, plan_budget_s: float,
                  rules: Mapping[tuple[str, str], AdaptiveRepeats] | None = None
                  ) -> BudgetEffect:
    """Replay every case whose rule had ``plan_budget_s`` under ``budget_s`` instead (see
    the module docstring). ``rules`` fills in the cases whose rows record none."""
    known = {**(rules or {}), **stored_rules(results.df)}
    stored = stored_cases(results.df)
    keep: dict[tuple[str, str], int] = {}
    cut = []
    for key, rule in known.items():
        if rule.budget_s is None or not math.isclose(rule.budget_s, plan_budget_s):
            continue
        case = stored.get(key)
        if case is None:
            continue
        stop = case.stop(replace(rule, budget_s=budget_s))
        if stop < case.repeats:
            keep[key] = stop
            cut.append((*key, case.repeats, stop, (case.repeats - stop) * case.pace,
                        relative_halfwidth(case.values), relative_halfwidth(case.values[:stop])))
    cut_frame = pd.DataFrame(cut, columns=[
        "study", "case_id", "repeats", "repeats_under_budget", "seconds_saved", "halfwidth",
        "halfwidth_under_budget"])
    changed, compared = changed_choices(results, cut_to(results, keep))
    return BudgetEffect(budget_s, cut_frame, changed, compared)


@dataclass(frozen=True)
class ScreenEffect:
    """A run replayed under a screening first pass and the top-up's floor: ``cases``, one
    row per case the first pass cut (study, case_id, repeats stored, repeats screened,
    repeats after the floor, seconds saved by the first pass, seconds the floor spends
    again); ``changed`` and ``guide_rows`` as in ``BudgetEffect``."""

    cases: pd.DataFrame
    changed: pd.DataFrame
    guide_rows: int

    @property
    def seconds_saved(self) -> float:
        return float(self.cases["first_pass_saved_s"].sum()
                     - self.cases["floor_spent_s"].sum())

    def summary(self) -> str:
        cases = self.cases
        floored = cases[cases["repeats_after_floor"] > cases["repeats_screened"]]
        lines = [
            f"A screening first pass stops {len(cases)} cases sooner: "
            f"{int((cases['repeats'] - cases['repeats_screened']).sum())} repeats, "
            f"{cases['first_pass_saved_s'].sum():.1f} s.",
            f"The floor takes {len(floored)} of them back to their decision repeats: "
            f"{int((floored['repeats_after_floor'] - floored['repeats_screened']).sum())} "
            f"repeats and their start-up, {cases['floor_spent_s'].sum():.1f} s.",
            f"Saved in all: {self.seconds_saved:.1f} s.",
            f"Decision guide: {len(self.changed)} of {self.guide_rows} rows choose otherwise.",
        ]
        return "\n".join(lines + changed_lines(self.changed, "screened"))


ROLES = ("top two", "other candidate", "no guide question")


def guide_roles(results: Results) -> dict[tuple[str, str], str]:
    """(study, case id) -> ``ROLES[0]`` or ``ROLES[1]`` for every case behind a guide row's
    candidate; a case behind no guide question is absent."""
    from .report.guide import decision_guide
    from .topup import row_cases

    roles: dict[tuple[str, str], str] = {}
    for row in decision_guide(results):
        top = row_cases(row)
        for candidate in row.candidates:
            for study, case_id, _metric in candidate.stat.sources:
                role = ROLES[0] if (study, case_id) in top else ROLES[1]
                if roles.get((study, case_id)) != ROLES[0]:
                    roles[(study, case_id)] = role
    return roles


def case_roles(results: Results) -> pd.DataFrame:
    """Per study, the case seconds of its cases as run (``case_seconds``, top-up repeats at
    their case's pace included) by role in the decision guide: behind a question's best or
    runner-up, behind another candidate only, or behind no guide question (a figure's, a
    target's or a finding's alone)."""
    from .topup import case_costs

    roles = guide_roles(results)
    spent = [(study, roles.get((study, case_id), ROLES[2]), cost.seconds(cost.repeats))
             for (study, case_id), cost in case_costs(results.df).items()]
    table = pd.DataFrame(spent, columns=["study", "role", "seconds"]).pivot_table(
        index="study", columns="role", values="seconds", aggfunc="sum", fill_value=0.0)
    return table.reindex(columns=list(ROLES), fill_value=0.0)


def screen_effect(results: Results, rules: Mapping[tuple[str, str], AdaptiveRepeats], *,
                  decision_repeats: int) -> ScreenEffect:
    """Replay every case of ``results`` under its rule of ``rules`` (today's grid's, whose
    minimum may be below the repeats the run took), then the top-up's floor at
    ``decision_repeats`` (module docstring). A floored case spends again its start-up
    (``case_seconds`` less ``repeats_seconds``: a top-up runs it afresh)."""
    from .report.guide import decision_guide
    from .topup import row_cases

    stored = stored_cases(results.df)
    screened = {key: stored[key] for key, rule in rules.items()
                if key in stored and stored[key].stop(rule) < stored[key].repeats}
    keep = {key: case.stop(rules[key]) for key, case in screened.items()}
    first_pass = dict(keep)

    floored: set[tuple[str, str]] = set()
    while True:
        short = {key for row in decision_guide(cut_to(results, keep))
                 if row.runner_up is not None for key in row_cases(row)
                 if key in screened
                 and keep[key] < min(decision_repeats, screened[key].repeats)}
        if not short:
            break
        for key in short:
            keep[key] = min(decision_repeats, screened[key].repeats)
        floored |= short
    rows = [(*key, case.repeats, first_pass[key], keep[key],
             (case.repeats - first_pass[key]) * case.pace,
             (keep[key] - first_pass[key]) * case.pace + (case.start if key in floored else 0.0))
            for key, case in sorted(screened.items())]
    cases = pd.DataFrame(rows, columns=["study", "case_id", "repeats", "repeats_screened",
                                        "repeats_after_floor", "first_pass_saved_s",
                                        "floor_spent_s"])
    changed, compared = changed_choices(results, cut_to(results, keep))
    return ScreenEffect(cases, changed, compared)


@dataclass(frozen=True)
class LeastTime:
    """``by_study``: per study, case minutes as run, and the least the guide needs with the
    cases behind no guide question dropped or kept (at ``other_repeats``);
    ``outside_cases_min``: the run's minutes outside its cases (``timing.json``'s total
    less every case's seconds), NaN where the run has no ``timing.json``."""

    by_study: pd.DataFrame
    top_repeats: int
    other_repeats: int
    outside_cases_min: float

    def summary(self) -> str:
        totals = self.by_study.sum()
        lines = [f"Least case minutes the decision guide needs: each question's top two at "
                 f"{self.top_repeats} repeats, every other candidate at "
                 f"{self.other_repeats}, every steady window at its minimum.",
                 (self.by_study.round(1)).to_string(),
                 f"all studies: {totals.round(1).to_dict()}"]
        if np.isfinite(self.outside_cases_min):
            least = totals["no question dropped"] + self.outside_cases_min
            lines.append(f"Outside the cases (build, set-up, plots, notebooks): "
                         f"{self.outside_cases_min:.1f} min as run; with it, the least a "
                         f"whole study takes is {least:.1f} min.")
        return "\n".join(lines)


def least_time(results: Results, *, other_repeats: int | None = None) -> LeastTime:
    """What the run's guide needs at the least (``LeastTime``), from its own paces: a
    repeat's time less its steady window plus that window cut to max(``STEADY_SECONDS``,
    ``STEADY_BATCHES`` of its batches); each case's overhead once where it runs at all."""
    from .bench.plan import SCREEN_REPEATS, STEADY_BATCHES, STEADY_SECONDS
    from .bench.stats import MIN_DECISION_REPEATS
    from .results import latest_runs
    from .study import TIMING_FILE
    from .topup import case_costs

    other_repeats = SCREEN_REPEATS if other_repeats is None else other_repeats
    roles = guide_roles(results)
    timed = latest_runs(results.df)
    timed = timed[(timed["status"] == "ok") & (timed["repeat"] >= 0)
                  & timed["metric"].isin(["steady_seconds", "steady_batches"])]
    by_case = timed.groupby(["study", "case_id", "metric"])["value"].median()
    out = []
    for key, cost in case_costs(results.df).items():
        window = by_case.get((*key, "steady_seconds"), np.nan)
        batches = by_case.get((*key, "steady_batches"), np.nan)
        repeat_s = cost.repeat_s
        if np.isfinite(window) and np.isfinite(batches) and batches > 0:
            least_window = max(STEADY_SECONDS, STEADY_BATCHES * window / batches)
            repeat_s = cost.repeat_s - window + min(window, least_window)
        role = roles.get(key, ROLES[2])
        # A case outside the top two never needs more than it ran (resume's 1 repeat).
        need = (MIN_DECISION_REPEATS if role == ROLES[0]
                else min(other_repeats, cost.repeats))
        least = cost.overhead_s + need * repeat_s if need else 0.0
        out.append((key[0], cost.seconds(cost.repeats), 0.0 if role == ROLES[2] else least,
                    least))
    table = pd.DataFrame(out, columns=["study", "as run", "no question dropped",
                                       "no question kept"]).groupby("study").sum() / 60
    outside = np.nan
    timing = results.directory / TIMING_FILE if results.directory else None
    if timing is not None and timing.exists():
        outside = total_seconds(timing) / 60 - table["as run"].sum()
    return LeastTime(table, MIN_DECISION_REPEATS, other_repeats, outside)


def total_seconds(timing: Path) -> float:
    """``timing.json``'s ``total_seconds``; ``ValueError`` naming the file where it holds
    no finite number (a results directory may come from someone else)."""
    try:
        total = json.loads(timing.read_text())["total_seconds"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{timing}: no total_seconds ({err})") from None
    if isinstance(total, bool) or not isinstance(total, int | float) or not math.isfinite(total):
        raise ValueError(f"{timing}: total_seconds is not a finite number: {total!r}")
    return float(total)


def grid_rules(results: Results, data_dir: Path | str, *, plan_budget_s: float | None
               ) -> dict[tuple[str, str], AdaptiveRepeats]:
    """The rules of the grids of the run's studies over ``data_dir``, for rows without
    ``repeat_rule`` rows: today's grids, with today's plan budget read as the one the run
    had (``plan_budget_s``; None: today's as it is); a case's own budget (none, or the peers
    targets') stays."""
    from .bench.plan import REPEAT_BUDGET_S
    from .study import planned_cases

    profile = str(results.df["profile"].iloc[0])
    rules = {}
    for name in sorted(set(results.df["study"])):
        for case in planned_cases(name, profile, Path(data_dir), None):
            rule = case.adaptive_repeats
            if rule is None:
                continue
            if (plan_budget_s is not None and rule.budget_s is not None
                    and math.isclose(rule.budget_s, REPEAT_BUDGET_S)):
                rule = replace(rule, budget_s=plan_budget_s)
            rules[(name, case.case_id)] = rule
    return rules


def main(argv: list[str] | None = None) -> int:
    from .bench.plan import REPEAT_BUDGET_S

    parser = argparse.ArgumentParser(prog="python -m storebench.whatif",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("results_dir")
    chosen = parser.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--budget", type=float, help="seconds")
    chosen.add_argument("--screen", action="store_true",
                        help="today's grid's first pass and the top-up's floor (needs --data)")
    chosen.add_argument("--least", action="store_true",
                        help="the least case time the run's decision guide needs")
    parser.add_argument("--other-repeats", type=int, default=None,
                        help="with --least: repeats of a candidate outside a question's top "
                        "two (default: the first pass's)")
    parser.add_argument("--plan-budget", type=float, default=REPEAT_BUDGET_S,
                        help="the budget the run's cases had (default: the plan's)")
    parser.add_argument("--data", help="dataset root of the run's profile, for rows that "
                        "record no repeat rule")
    args = parser.parse_args(argv)
    if args.screen and not args.data:
        parser.error("--screen replays today's grid: give the run's --data")
    if args.other_repeats is not None and (not args.least or args.other_repeats < 0):
        parser.error("--other-repeats goes with --least and counts repeats (0 or more)")
    try:
        results = Results.load(args.results_dir)
        if args.least:
            print(least_time(results, other_repeats=args.other_repeats).summary())
            return 0
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"python -m storebench.whatif: {err}\n")
    if args.screen:
        from .bench.stats import MIN_DECISION_REPEATS

        rules = grid_rules(results, args.data, plan_budget_s=None)
        print(screen_effect(results, rules, decision_repeats=MIN_DECISION_REPEATS).summary())
        roles = case_roles(results)
        print("\nCase minutes as run, by role in the decision guide:")
        print((roles / 60).round(1).to_string())
        print(f"all studies: {(roles.sum() / 60).round(1).to_dict()}")
        return 0
    rules = (grid_rules(results, args.data, plan_budget_s=args.plan_budget) if args.data
             else None)
    print(budget_effect(results, args.budget, plan_budget_s=args.plan_budget,
                        rules=rules).summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
