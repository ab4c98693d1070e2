"""``storebench compare RUN_A RUN_B``: do RUN_A's decisions hold in RUN_B?

Both results directories' decision guides (``report.guide.decision_guide``) are matched
question by question (study and question text; where the text changed, the one row of
the same study, metric and facets). A decision of RUN_A is a row that names a
winner or declares equivalence; an undecided row decides nothing and is listed only. Each
decision either holds (the same winner, or equivalence again), became a tie (equivalent),
became undecided, flipped to another winner (an equivalence: became decided), or is
missing from RUN_B.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..guide import GuideRow
from ..results import Results
from .guide import decision_guide

HOLDS = "same decision"
FLIPPED = "flipped to another winner"
NOT_A_DECISION = "was undecided in RUN_A"
OUTCOMES = (HOLDS, "became a tie", "became undecided", "became decided", FLIPPED,
            "missing in RUN_B", NOT_A_DECISION)


@dataclass(frozen=True)
class QuestionComparison:
    """One of RUN_A's guide questions: its decision in each run and the outcome."""

    study: str
    question: str
    decision_a: str
    decision_b: str
    outcome: str

    @property
    def is_decision(self) -> bool:
        return self.outcome != NOT_A_DECISION


def decision_text(row: GuideRow | None) -> str:
    """What a row decided, shortly: the winner, ``equivalent: A, B``, or ``undecided``."""
    if row is None:
        return "(not asked)"
    if row.verdict == "better" or row.runner_up is None:
        return row.best.label
    if row.verdict == "equivalent":
        return "equivalent: " + ", ".join([row.best.label, *row.tied])
    return "undecided"


def outcome_of(a: GuideRow, b: GuideRow | None) -> str:
    """How RUN_A's row ``a`` fared in RUN_B's row ``b`` (``OUTCOMES``)."""
    decided_a = a.verdict == "better" or a.runner_up is None
    if not decided_a and a.verdict != "equivalent":
        return NOT_A_DECISION
    if b is None:
        return "missing in RUN_B"
    decided_b = b.verdict == "better" or b.runner_up is None
    if decided_b:
        if decided_a and b.best.key == a.best.key:
            return HOLDS
        return FLIPPED if decided_a else "became decided"
    if b.verdict == "equivalent":
        return HOLDS if not decided_a else "became a tie"
    return "became undecided"


def situation(row: GuideRow) -> tuple:
    """What a row answers as data: its study, metric and facets (not its text, which may
    hold a measured figure)."""
    return (row.study, row.metric, tuple(sorted((k, str(v)) for k, v in row.facets.items())))


def same_question(a: GuideRow, rows_b: list[GuideRow]) -> GuideRow | None:
    """RUN_B's row asking ``a``'s question: the same study and text, else the one row of
    the same study, metric and facets (a question whose text changed between versions)."""
    for row in rows_b:
        if (row.study, row.question) == (a.study, a.question):
            return row
    if not a.facets:
        return None
    alike = [row for row in rows_b if situation(row) == situation(a)]
    return alike[0] if len(alike) == 1 else None


def compare_guides(rows_a: list[GuideRow], rows_b: list[GuideRow]
                   ) -> list[QuestionComparison]:
    """RUN_A's questions in its order, each with RUN_B's answer to the same question."""
    out = []
    for a in rows_a:
        b = same_question(a, rows_b)
        out.append(QuestionComparison(a.study, a.question, decision_text(a),
                                      decision_text(b), outcome_of(a, b)))
    return out


def compare_text(comparisons: list[QuestionComparison], run_a: str, run_b: str) -> str:
    """A table (question | RUN_A | RUN_B | outcome) and the share of decisions that hold."""
    header = ("question", "RUN_A", "RUN_B", "outcome")
    table = [header] + [(c.question, c.decision_a, c.decision_b, c.outcome)
                        for c in comparisons]
    widths = [min(60, max(len(row[i]) for row in table)) for i in range(3)]

    def line(cells) -> str:
        shown = [(text if len(text) <= w else text[:w - 1] + "\u2026").ljust(w)
                 for text, w in zip(cells, widths)]
        return " | ".join([*shown, cells[3]])

    rule = "-+-".join(["-" * w for w in widths] + ["-" * 20])
    lines = [f"RUN_A: {run_a}", f"RUN_B: {run_b}", "", line(header), rule]
    lines += [line(row) for row in table[1:]]
    decisions = [c for c in comparisons if c.is_decision]
    held = sum(c.outcome == HOLDS for c in decisions)
    flipped = sum(c.outcome == FLIPPED for c in decisions)
    share = f"{held / len(decisions):.0%}" if decisions else "n/a"
    lines.append("")
    lines.append(f"{held} of {len(decisions)} decisions of RUN_A hold in RUN_B ({share}); "
                 f"{flipped} flipped to another winner")
    return "\n".join(lines)


def compare_command(run_a: Path | str, run_b: Path | str) -> str:
    """The text ``storebench compare RUN_A RUN_B`` prints."""
    rows_a = decision_guide(Results.load(run_a))
    rows_b = decision_guide(Results.load(run_b))
    return compare_text(compare_guides(rows_a, rows_b), str(run_a), str(run_b))
