"""Top-up repeats: spend a run's spare time where it decides a question.

Every case first repeats by its own rule (``bench.plan``: at least ``SCREEN_REPEATS``).
Then, before anything else, the cases behind every guide question's two best candidates
that hold fewer than the plan's ``decision_repeats`` (``MIN_DECISION_REPEATS``, the fewest
a side names a winner with) are taken to that many, outside the budget: the *floor*. Read
again, a question may have a new top two; the floor repeats until no top two falls short.
So a candidate no question is close on keeps its first pass's repeats, and the repeats go
where a question is decided.

Then each guide question whose two best candidates are still *undecided* (fewer than five
repeats on a side, or a ratio interval across the 5% margin) gets ``ROUND_REPEATS`` more
timed repeats of exactly the cases those two were measured by, and the guide is read again;
round after round, until the question is decided (a winner, or equivalent within the
margin), its cases hold ``MAX_REPEATS`` repeats, or the run's top-up budget is spent.
Questions are taken cheapest first, so the budget decides as many as it can; a question
already decided costs nothing.

The new repeats join their case's rows in the case's own run (same run id, repeat numbers
after its last), so every query reads them as repeats of that case; the case's whole-case
rows (its first pass's time and repeat count) stay as they were. ``topup.json`` records the
floor's cases and each question topped up: its cases, the repeats added, their seconds, and
the verdict before and after. A case whose whole-case rows summarise its repeats
(``Case.summarise``) is never topped up: its summary would no longer describe its repeats
(such cases take the decision's repeats in their first pass). Nor is a case that reports a
quantity measured once elsewhere (``Case.measured_once``, a build's time): another repeat
would copy its value, not measure it, so its row keeps n = 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .bench.case import Case
from .bench.runner import case_rows, run_case
from .bench.schema import ResultsWriter
from .bench.stats import forced_repeat_rule
from .guide import GuideRow
from .report.guide import decision_guide
from .results import Results, latest_runs
from .studies import get_study

# Repeats each round adds to each case of a question, and the most a case is taken to: past
# 15 repeats a side, an interval that still crosses the margin is an effect near 5%, which
# more repeats decide slowly.
ROUND_REPEATS = 4
MAX_REPEATS = 15
TOPUP_FILE = "topup.json"


@dataclass(frozen=True)
class CaseCost:
    """What the case's first pass took: ``overhead_s`` outside its timed repeats (worker
    start, data opened, the untimed first repeat) and ``repeat_s`` per timed repeat;
    ``repeats``: the timed repeats it holds now, ``next_repeat`` the number its next one
    takes; ``run_id``, ``profile``: its rows' run and profile, which its new rows carry
    too."""

    study: str
    case_id: str
    run_id: str
    profile: str
    repeats: int
    next_repeat: int
    overhead_s: float
    repeat_s: float

    def seconds(self, repeats: int) -> float:
        return self.overhead_s + repeats * self.repeat_s


@dataclass(frozen=True)
class Question:
    """An undecided guide row and the cases behind its best and runner-up."""

    study: str
    question: str
    verdict: str
    cases: tuple[CaseCost, ...]

    @property
    def key(self) -> tuple[str, str]:
        return (self.study, self.question)

    def cost_s(self, repeats: int) -> float:
        return sum(case.seconds(repeats) for case in self.cases)


@dataclass
class TopupLog:
    """What a top-up did, as ``topup.json`` holds it."""

    budget_s: float
    round_repeats: int = ROUND_REPEATS
    max_repeats: int = MAX_REPEATS
    # Wall seconds of the whole top-up, and the seconds its cases ran (what the budget caps).
    seconds: float = 0.0
    case_seconds: float = 0.0
    questions: dict[tuple[str, str], dict] = field(default_factory=dict)
    failed: list[dict] = field(default_factory=list)
    # The floor (module docstring): the repeats it takes top-two cases to (None: no floor),
    # each case it repeated, and the seconds those cases ran (outside the budget).
    decision_repeats: int | None = None
    floor: list[dict] = field(default_factory=list)
    floor_case_seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"budget_s": self.budget_s, "round_repeats": self.round_repeats,
                "max_repeats": self.max_repeats, "seconds": self.seconds,
                "case_seconds": self.case_seconds,
                "decision_repeats": self.decision_repeats, "floor": self.floor,
                "floor_case_seconds": self.floor_case_seconds,
                "questions": list(self.questions.values()), "failed": self.failed}

    def write(self, results_dir: Path) -> Path:
        path = Path(results_dir) / TOPUP_FILE
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        partial.replace(path)
        return path


def case_costs(df: pd.DataFrame) -> dict[tuple[str, str], CaseCost]:
    """Per (study, case id) of each case's latest run that finished ok: its ``CaseCost``."""
    rows = latest_runs(df)
    whole = rows[rows["repeat"] < 0]
    timed = rows[(rows["repeat"] >= 0) & (rows["status"] == "ok")]
    repeats = timed.groupby(["study", "case_id"])["repeat"].nunique()
    last = rows[rows["repeat"] >= 0].groupby(["study", "case_id"])["repeat"].max()
    per_metric = whole.pivot_table(index=["study", "case_id"], columns="metric",
                                   values="value", aggfunc="first")
    status = whole[whole["metric"] == "case_seconds"].set_index(["study", "case_id"])
    costs = {}
    for key, figures in per_metric.iterrows():
        if key not in repeats.index or status.loc[key, "status"] != "ok":
            continue
        case_s = figures.get("case_seconds")
        repeats_s = figures.get("repeats_seconds")
        run = figures.get("repeats_run")
        if not (pd.notna(case_s) and pd.notna(repeats_s) and pd.notna(run) and run > 0):
            continue
        costs[key] = CaseCost(key[0], key[1], str(status.loc[key, "run_id"]),
                              str(status.loc[key, "profile"]), int(repeats[key]),
                              int(last[key]) + 1,
                              max(0.0, float(case_s - repeats_s)), float(repeats_s / run))
    return costs


def row_cases(row: GuideRow) -> set[tuple[str, str]]:
    """The (study, case id) pairs the row's best and runner-up were measured by."""
    return {(study, case_id) for candidate in (row.best, row.runner_up)
            for study, case_id, _metric in candidate.stat.sources}


def undecided_questions(results: Results, rows: Sequence[GuideRow], *,
                        studies: Sequence[str] | None = None,
                        max_repeats: int = MAX_REPEATS,
                        can_top_up: Callable[[str, str], bool] = lambda study, case: True,
                        decided_too: bool = False,
                        ) -> list[Question]:
    """The undecided ``rows`` (``results``' guide; every row with a runner-up where
    ``decided_too``) that more repeats can still move: every case behind their top two is
    known, finished ok, may be topped up (``can_top_up``) and belongs to one of ``studies``
    (all when None), and one of them holds fewer than ``max_repeats``."""
    costs = case_costs(results.df)
    questions = []
    for row in rows:
        if (not row.undecided and not decided_too) or row.runner_up is None:
            continue
        keys = row_cases(row)
        if not keys or not all(key in costs and can_top_up(*key) for key in keys):
            continue
        if studies is not None and not all(study in studies for study, _ in keys):
            continue
        cases = tuple(costs[key] for key in sorted(keys))
        if all(case.repeats >= max_repeats for case in cases):
            continue
        questions.append(Question(row.study, row.question, row.verdict, cases))
    return questions


def short_of_decision(results: Results, rows: Sequence[GuideRow], *, repeats: int,
                      studies: Sequence[str] | None = None,
                      can_top_up: Callable[[str, str], bool] = lambda study, case: True,
                      ) -> list[tuple[CaseCost, int]]:
    """The cases behind the best and runner-up of every row of ``rows`` (``results``'
    guide) that hold fewer than ``repeats`` timed repeats, finished ok, may be topped up
    and belong to one of ``studies`` (all when None); each with the repeats it lacks."""
    costs = case_costs(results.df)
    short: dict[tuple[str, str], CaseCost] = {}
    for row in rows:
        if row.runner_up is None:
            continue
        for key in row_cases(row):
            if (key in costs and costs[key].repeats < repeats and can_top_up(*key)
                    and (studies is None or key[0] in studies)):
                short[key] = costs[key]
    return [(short[key], repeats - short[key].repeats) for key in sorted(short)]


def plan_round(questions: Sequence[Question], budget_left_s: float,
               repeats: int) -> list[Question]:
    """The questions one round tops up: cheapest first, each while its cases (those not
    already in the round) fit in what is left of the budget."""
    chosen: list[Question] = []
    planned: set[tuple[str, str]] = set()
    left = budget_left_s
    for question in sorted(questions, key=lambda q: (q.cost_s(repeats), q.key)):
        new = [case for case in question.cases if (case.study, case.case_id) not in planned]
        cost = sum(case.seconds(repeats) for case in new)
        if cost > left:
            continue
        chosen.append(question)
        planned.update((case.study, case.case_id) for case in new)
        left -= cost
    return chosen


def topped_up_rows(rows: Sequence[Mapping], *, run_id: str, first_repeat: int) -> list[dict]:
    """A top-up's timed-repeat rows as more repeats of the case's run: its run id, repeat
    numbers from ``first_repeat`` on; its whole-case rows are left out."""
    return [{**row, "run_id": run_id, "repeat": first_repeat + int(row["repeat"])}
            for row in rows if int(row["repeat"]) >= 0]


def verdicts(rows: Sequence[GuideRow]) -> dict[tuple[str, str], dict]:
    """Per guide row (study, question): its verdict, choice, ratio, interval and repeats."""
    return {(row.study, row.question): {
        "verdict": row.verdict, "choice": row.choice, "ratio": row.ratio,
        "interval": [row.low, row.high],
        "repeats": [c.stat.count for c in (row.best, row.runner_up) if c is not None]}
        for row in rows}


def top_up(
    results_dir: Path | str,
    *,
    profile: str,
    data_dir_of: Callable[[str], Path],
    budget_s: float,
    studies: Sequence[str] | None = None,
    round_repeats: int = ROUND_REPEATS,
    max_repeats: int = MAX_REPEATS,
    timeout_s: float | None = None,
    drop_caches: bool = False,
    decision_repeats: int | None = None,
    log: Callable[[str], None] = lambda text: None,
) -> TopupLog:
    """Top up ``results_dir``: with ``decision_repeats``, the floor first, then its
    undecided questions (module docstring) within ``budget_s`` seconds of planned case
    time; ``data_dir_of(study)`` is where a study's cases read their sets, ``profile``
    plans their grid. Writes ``topup.json`` after every pass, so an interrupted top-up
    keeps what it measured."""
    results_dir = Path(results_dir)
    # STOREBENCH_REPEAT_RULE: ``minimum`` adds no rounds, ``maximum`` takes decided questions
    # too; neither touches the floor, which is a guarantee, not an adaptive rule.
    forcing = forced_repeat_rule()
    record = TopupLog(budget_s, round_repeats, max_repeats, decision_repeats=decision_repeats)
    grids: dict[str, dict[str, Case]] = {}

    def grid(study: str) -> dict[str, Case]:
        if study not in grids:
            spec = get_study(study)
            cases = spec.grid(profile=profile, data_dir=data_dir_of(study))
            if spec.finalists is not None:
                # Its second stage's cases, as its first stage's rows here chose them.
                cases = [*cases, *spec.finalists(Results.load(results_dir), cases)]
            grids[study] = {case.case_id: case for case in cases}
        return grids[study]

    def can_top_up(study: str, case_id: str) -> bool:
        case = grid(study).get(case_id)
        return case is not None and not case.summarise and not case.measured_once

    started = time.perf_counter()
    def floored(cost: CaseCost, added: int, seconds: float) -> None:
        record.floor_case_seconds += seconds
        record.floor.append({"study": cost.study, "case_id": cost.case_id,
                             "repeats_before": cost.repeats, "repeats_added": added,
                             "seconds": seconds})

    if decision_repeats:
        tried: set[tuple[str, str]] = set()
        while True:
            results = Results.load(results_dir)
            short = [(cost, lacking) for cost, lacking in short_of_decision(
                results, decision_guide(results), repeats=decision_repeats, studies=studies,
                can_top_up=can_top_up) if (cost.study, cost.case_id) not in tried]
            if not short:
                break
            tried.update((cost.study, cost.case_id) for cost, _ in short)
            for study in sorted({cost.study for cost, _ in short}):
                mine = [(cost, lacking) for cost, lacking in short if cost.study == study]
                _run_repeats(results_dir, study, mine, grid(study), timeout_s=timeout_s,
                             drop_caches=drop_caches, record=record, on_added=floored,
                             log=log)
            record.seconds = time.perf_counter() - started
            record.write(results_dir)
    exhausted: set[tuple[str, str]] = set()
    while True:
        results = Results.load(results_dir)
        rows = decision_guide(results)  # once a round: the guide takes seconds
        now = verdicts(rows)
        for key, entry in record.questions.items():
            entry["after"] = now.get(key, {"verdict": "absent"})
        questions = [q for q in undecided_questions(results, rows, studies=studies,
                                                    max_repeats=max_repeats,
                                                    can_top_up=can_top_up,
                                                    decided_too=forcing == "maximum")
                     if q.key not in exhausted and forcing != "minimum"]
        chosen = plan_round(questions, budget_s - record.case_seconds, round_repeats)
        if not chosen:
            break
        for question in chosen:
            entry = record.questions.setdefault(question.key, {
                "study": question.study, "question": question.question,
                "before": now[question.key], "rounds": 0,
                "repeats_added": {}, "seconds": 0.0})
            entry["rounds"] += 1
            # A round's top two may differ from an earlier round's: each case gets a count.
            for case in question.cases:
                entry["repeats_added"].setdefault(case.case_id, 0)
        by_study: dict[str, list[CaseCost]] = {}
        for case in {c for q in chosen for c in q.cases if c.repeats < max_repeats}:
            by_study.setdefault(case.study, []).append(case)
        failed_cases = set()

        def added_to_questions(cost: CaseCost, added: int, seconds: float,
                               chosen: Sequence[Question] = chosen) -> None:
            record.case_seconds += seconds
            for question in chosen:
                if cost in question.cases:
                    entry = record.questions[question.key]
                    entry["repeats_added"][cost.case_id] += added
                    entry["seconds"] += seconds

        for study, costs in sorted(by_study.items()):
            planned = [(cost, min(round_repeats, max_repeats - cost.repeats))
                       for cost in sorted(costs, key=lambda c: c.case_id)]
            failed_cases |= _run_repeats(
                results_dir, study, planned, grid(study), timeout_s=timeout_s,
                drop_caches=drop_caches, record=record, on_added=added_to_questions,
                log=log)
        for question in chosen:
            if any((c.study, c.case_id) in failed_cases for c in question.cases):
                exhausted.add(question.key)
        record.seconds = time.perf_counter() - started
        record.write(results_dir)
    record.seconds = time.perf_counter() - started
    record.write(results_dir)
    return record


def _run_repeats(results_dir: Path, study: str, planned: Sequence[tuple[CaseCost, int]],
                 cases: Mapping[str, Case], *, timeout_s: float | None, drop_caches: bool,
                 record: TopupLog, on_added: Callable[[CaseCost, int, float], None],
                 log) -> set[tuple[str, str]]:
    """``planned``'s repeats (case, how many) of ``study``'s cases, appended to its results
    file (inside the study's services, an S3 server say, where it has them); each case that
    ran goes to ``on_added(case, repeats added, seconds)``, each that failed to
    ``record.failed``. Returns the cases that failed."""
    services = get_study(study).services
    failed = set()
    runs = [dataclasses.replace(cases[cost.case_id], repeats=repeats, min_repeats=None)
            for cost, repeats in planned]
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(services(runs)) if services is not None else {}
        with ResultsWriter(results_dir / f"{study}.csv") as writer:
            for (cost, _), case in zip(planned, runs):
                log(f"{study} {cost.case_id}: {case.repeats} more repeats")
                outcome = run_case(case, drop_caches=drop_caches, timeout_s=timeout_s,
                                   env=env)
                if outcome.status != "ok":
                    failed.add((study, cost.case_id))
                    record.failed.append({"study": study, "case_id": cost.case_id,
                                          "status": outcome.status, "error": outcome.error})
                    on_added(cost, 0, outcome.seconds)
                    continue
                rows = case_rows(case, outcome, run_id=cost.run_id, profile=cost.profile)
                new = topped_up_rows(rows, run_id=cost.run_id,
                                     first_repeat=cost.next_repeat)
                writer.write_rows(new)
                on_added(cost, len({row["repeat"] for row in new}), outcome.seconds)
    return failed
