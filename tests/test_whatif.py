"""storebench.whatif: a stored run replayed under another repeat budget."""

from __future__ import annotations

from pathlib import Path

import pytest
from result_rows import frame, prefetch_case, write_results

from storebench.bench.stats import AdaptiveRepeats, relative_halfwidth
from storebench.results import Results
from storebench.whatif import budget_effect, stored_rules

THREAD = [1000.0, 1300.0, 1050.0, 1150.0, 1700.0, 1650.0, 1620.0, 1680.0, 1640.0]
NONE = [1000.0, 1100.0, 900.0, 1080.0, 920.0]


def with_summary(rows: list[dict], *, seconds: float, rule: dict[str, float] | None
                 ) -> list[dict]:
    """The case's rows with its whole-case rows: repeats run and their seconds, and the
    ``repeat_rule`` rows of ``rule`` (none for a run from before them)."""
    first = rows[0]
    ran = len({row["repeat"] for row in rows})
    whole = {"repeats_run": (ran, "count"), "repeats_seconds": (seconds, "s")}
    whole.update({f"repeat_rule.{name}": (value, "s" if name == "budget_s" else
                                          "ratio" if name in ("halfwidth", "threshold")
                                          else "count")
                  for name, value in (rule or {}).items()})
    return rows + [dict(first, repeat=-1, metric=metric, value=value, unit=unit)
                   for metric, (value, unit) in whole.items()]


PLAN = {"minimum": 3, "maximum": 9, "halfwidth": 0.05, "budget_s": 4.0}


def test_a_shorter_budget_cuts_the_cheap_wide_case_and_says_what_the_guide_loses():
    # 9 repeats of 0.5 s: under 2 s, a fifth would take four past it, so it stops at 4.
    thread = with_summary(prefetch_case("thread", 2, THREAD), seconds=4.5, rule=PLAN)
    none = with_summary(prefetch_case("none", 0, NONE), seconds=1.0, rule=PLAN)
    results = Results(frame(thread, none), {"cpus_usable": 2})
    effect = budget_effect(results, 2.0, plan_budget_s=4.0)
    assert effect.cut[["case_id", "repeats", "repeats_under_budget"]].values.tolist() == [
        [thread[0]["case_id"], 9, 4]]
    assert effect.seconds_saved == pytest.approx(2.5)
    assert effect.cut["halfwidth"].iloc[0] == pytest.approx(relative_halfwidth(THREAD))
    assert effect.cut["halfwidth_under_budget"].iloc[0] == pytest.approx(
        relative_halfwidth(THREAD[:4]))
    # All nine put the thread prefetcher ahead; its first four do not tell it from none.
    assert effect.guide_rows == 1
    ((choice, under_budget),) = effect.changed[["choice", "choice_under_budget"]].values.tolist()
    assert choice == "ThreadPrefetcher \u00d72"
    assert under_budget.startswith(
        "undecided between ThreadPrefetcher \u00d72 and one thread, no prefetcher (")
    assert "stops 1 cases sooner: 5 repeats, 2.5 s." in effect.summary()
    assert "1 of 1 rows choose otherwise" in effect.summary()
    # A budget it never reached changes nothing.
    assert budget_effect(results, 30.0, plan_budget_s=4.0).cut.empty


def test_rules_other_than_the_plans_are_kept_and_older_rows_take_them_from_the_grid():
    target = {"minimum": 3, "maximum": 9, "halfwidth": 0.05, "threshold": 1.0}
    peers_target = dict(PLAN, budget_s=15.0)
    rows = [with_summary(prefetch_case("thread", 2, THREAD), seconds=4.5, rule=target),
            with_summary(prefetch_case("process", 2, THREAD), seconds=4.5, rule=peers_target)]
    results = Results(frame(*rows), {"cpus_usable": 2})
    rules = stored_rules(results.df)
    assert rules[("prefetch", rows[0][0]["case_id"])] == AdaptiveRepeats(3, 9, 0.05, None, 1.0)
    assert rules[("prefetch", rows[1][0]["case_id"])].budget_s == 15.0
    assert budget_effect(results, 2.0, plan_budget_s=4.0).cut.empty

    older = with_summary(prefetch_case("thread", 2, THREAD), seconds=4.5, rule=None)
    results = Results(frame(older), {"cpus_usable": 2})
    assert stored_rules(results.df) == {}
    assert budget_effect(results, 2.0, plan_budget_s=4.0).cut.empty  # no rule known
    given = {("prefetch", older[0]["case_id"]): AdaptiveRepeats(budget_s=4.0)}
    effect = budget_effect(results, 2.0, plan_budget_s=4.0, rules=given)
    assert effect.cut["repeats_under_budget"].tolist() == [4]


def test_a_run_without_rule_rows_takes_its_rules_from_the_grid_with_the_budget_it_had(
        ci_data_root, monkeypatch):
    """Today's grid over the run's data: cases with the plan's budget get the one the run
    had; the targets keep theirs (none)."""
    from storebench.bench import plan
    from storebench.whatif import grid_rules

    monkeypatch.setitem(plan.PLANS, "ci", plan.StudyPlan(compact=True, epoch_samples=None))
    rows = [dict(row, study=study) for study in ("prefetch", "targets")
            for row in prefetch_case("thread", 2, THREAD[:3])]
    rules = grid_rules(Results(frame(rows)), ci_data_root, plan_budget_s=4.0)
    budgets = {(study, rule.budget_s) for (study, _), rule in rules.items()}
    assert budgets == {("prefetch", 4.0), ("targets", None)}
    assert sum(study == "prefetch" for study, _ in rules) > 1


def test_the_replay_keeps_the_workloads_that_name_the_questions():
    # A question names its workload; the replayed rows once lost it, so every row of the
    # reference read as "(no row)" under any budget.
    reference = Results.load(Path(__file__).resolve().parents[1] / "results" / "reference")
    assert reference.workloads
    effect = budget_effect(reference, 1e9, plan_budget_s=1.5)
    assert effect.cut.empty and effect.changed.empty and effect.guide_rows > 0


PROCESS = [1200.0, 1250.0, 1220.0, 1230.0, 1210.0, 1240.0, 1260.0, 1190.0, 1225.0]
SLOW = [1000.0, 1100.0, 900.0, 1080.0, 920.0, 1010.0, 990.0, 1005.0, 995.0]


def test_a_screened_run_keeps_three_repeats_but_floors_the_top_two_at_five(capsys):
    """Three candidates of 9 repeats (0.5 s each) under today's rule (at least 3, a 1 s
    budget: each stops at 3); the floor takes the two best by their first three back to 5,
    and the slowest keeps 3."""
    from storebench.whatif import main, screen_effect

    cases = {name: with_summary(prefetch_case(name, workers, values), seconds=4.5, rule=PLAN)
             for name, workers, values in (("thread", 2, THREAD), ("process", 2, PROCESS),
                                           ("none", 0, SLOW))}
    results = Results(frame(*cases.values()), {"cpus_usable": 2})
    today = AdaptiveRepeats(minimum=3, maximum=9, halfwidth=0.05, budget_s=1.0)
    rules = {("prefetch", rows[0]["case_id"]): today for rows in cases.values()}
    effect = screen_effect(results, rules, decision_repeats=5)
    kept = {row.case_id: (row.repeats, row.repeats_screened, row.repeats_after_floor)
            for row in effect.cases.itertuples()}
    assert kept == {cases["thread"][0]["case_id"]: (9, 3, 5),
                    cases["process"][0]["case_id"]: (9, 3, 5),
                    cases["none"][0]["case_id"]: (9, 3, 3)}
    # 18 repeats of 0.5 s saved by the first pass, 4 spent again by the floor.
    assert effect.cases["first_pass_saved_s"].sum() == pytest.approx(9.0)
    assert effect.cases["floor_spent_s"].sum() == pytest.approx(2.0)
    assert effect.seconds_saved == pytest.approx(7.0)
    assert "The floor takes 2 of them back to their decision repeats: 4 repeats" in (
        effect.summary())

    with pytest.raises(SystemExit) as raised:
        main([str(Path(__file__).parent), "--screen"])
    assert raised.value.code == 2
    assert "--screen replays today's grid: give the run's --data" in capsys.readouterr().err


def test_the_least_time_floors_the_top_two_cuts_windows_and_drops_unasked_cases(
        tmp_path, capsys):
    """A prefetch question of three candidates and one targets case behind no question.
    The best (thread) holds a 3 s steady window of 60 batches: its least window is
    max(1 s, 20 batches = 1 s), 2 s shorter a repeat."""
    import json

    from result_rows import case_rows

    from storebench.whatif import least_time, main

    def whole(rows, *, repeats_s: float, case_s: float) -> list[dict]:
        rows = with_summary(rows, seconds=repeats_s, rule=None)
        return rows + [dict(rows[0], repeat=-1, metric="case_seconds", value=case_s, unit="s")]

    thread = prefetch_case("thread", 2, [2000.0, 2010.0, 1990.0, 2005.0, 1995.0])
    first = thread[0]
    thread += [dict(first, repeat=r, metric=metric, value=value, unit=unit)
               for r in range(5) for metric, value, unit in (
                   ("steady_seconds", 3.0, "s"), ("steady_batches", 60.0, "count"))]
    groups = [whole(thread, repeats_s=20.0, case_s=22.0),
              whole(prefetch_case("process", 2, [1500.0, 1510.0, 1490.0, 1505.0, 1495.0]),
                    repeats_s=10.0, case_s=11.0),
              whole(prefetch_case("none", 0, [500.0, 510.0, 490.0, 505.0, 495.0]),
                    repeats_s=5.0, case_s=5.5),
              whole(case_rows("targets", "target:x", {"samples_per_s": [1.0]}),
                    repeats_s=6.0, case_s=6.0)]
    (tmp_path / "timing.json").write_text(json.dumps({"total_seconds": 100.0}))
    results = Results(frame(*groups), {"cpus_usable": 2}, directory=tmp_path)

    least = least_time(results)
    # thread: 2 s overhead + 5 x (4 - 3 + 1) s; process: 1 + 5 x 2; none: 0.5 + 3 x 1.
    assert least.by_study.loc["prefetch"].to_dict() == pytest.approx(
        {"as run": 38.5 / 60, "no question dropped": 26.5 / 60,
         "no question kept": 26.5 / 60})
    # The targets case ran 1 repeat: kept, it needs no more than it ran.
    assert least.by_study.loc["targets"].to_dict() == pytest.approx(
        {"as run": 0.1, "no question dropped": 0.0, "no question kept": 0.1})
    assert least.outside_cases_min == pytest.approx((100.0 - 44.5) / 60)
    # No other candidate measured: only the top two's 23 s remain.
    assert least_time(results, other_repeats=0).by_study["no question kept"].sum() == (
        pytest.approx(23.0 / 60))
    # (26.5 + 55.5) s: the least with nothing behind no question.
    assert "the least a whole study takes is 1.4 min" in least.summary()

    with pytest.raises(SystemExit) as raised:
        main([str(tmp_path), "--budget", "1", "--other-repeats", "1"])
    assert raised.value.code == 2
    assert "--other-repeats goes with --least" in capsys.readouterr().err

    # A timing.json from someone else: a clear error naming it, no traceback.
    write_results(tmp_path, *groups)
    for text in ('{"total_seconds": "soon"}', "[1]", "{"):
        (tmp_path / "timing.json").write_text(text)
        with pytest.raises(SystemExit) as raised:
            main([str(tmp_path), "--least"])
        assert raised.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"python -m storebench.whatif: {tmp_path / 'timing.json'}: ")
        assert "Traceback" not in err
