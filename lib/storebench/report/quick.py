"""The quick answer: the README's answer table measured again on this machine from the cases
it rests on, and nothing else.

Every decision an answer row makes (the store, the decoder, the loader path, storebench's
best path against the common default) is a guide row of the committed reference. Its two
best candidates are the cases a quick study measures again (``quick_cases``); the answer
table is then drawn from those rows alone, under the same decision rule, so a candidate the
reference ranked third or lower can no longer win here. ``quick_report`` sets the two
answers side by side, with each case's median on both machines.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from ..results import Results, default_builds, params_of, select, stat
from ..text import DASH, ENCODING_NAMES, format_ratio, format_value, machine_text, markdown_table
from .advise import AdviceError, advise, recipe_versus_default
from .answer import ANSWER_SITUATIONS, FIT_FRACTION, answer_markdown, answer_rows, situation_for

# What each case is measured again for, in the order the answer table reads them.
PARTS = ("store", "decoder", "loader", "vs torch DataLoader", "sample size")


@dataclass(frozen=True)
class QuickCase:
    """One case a quick study measures: ``metric`` is the figure the decisions read,
    ``dataset`` the directory it reads (``<format>-<encoding>`` or a knob variant's name),
    ``decisions`` which answer rows rest on it (``"JPEG, local disk, fits in RAM: loader"``),
    ``reference_runs`` the run ids of the reference's rows of it."""

    study: str
    case_id: str
    metric: str
    format: str
    encoding: str
    dataset: str
    decisions: tuple[str, ...] = ()
    reference_runs: tuple[str, ...] = ()


def quick_cases(results: Results) -> tuple[QuickCase, ...]:
    """The cases behind every answer row of ``results`` (a full study's, such as the
    committed reference): each decision's best and runner-up, storebench's best path and the
    default it is set against in RAM, and the builds the answer reads sample sizes from.
    Rows no study measured (an image kind the sets lack) and rows the reference could not
    answer add nothing: they have no cases to measure."""
    found: dict[tuple[str, str], tuple[str, list[str]]] = {}

    def add(sources, decision: str) -> None:
        for study, case_id, metric in sources:
            decisions = found.setdefault((study, case_id), (metric, []))[1]
            if decision not in decisions:
                decisions.append(decision)

    measured = set(results.df["encoding"].dropna())
    builds = default_builds(results.study("formats"))
    for row in ANSWER_SITUATIONS:
        if row.images not in measured:
            continue
        try:
            advice = advise(situation_for(row, results), results)
        except (AdviceError, LookupError):
            continue
        parts = {"store": advice.store, "decoder": advice.decoder, "loader": advice.loader}
        for part, choice in parts.items():
            if choice is not None:
                add(choice.evidence, f"{row.text}: {part}")
        if row.storage == "local" and row.ram_ratio <= FIT_FRACTION:
            versus = recipe_versus_default(results, row.images)
            if versus is not None:
                recipe_row, default, _ = versus
                add(recipe_row.best.stat.sources + default.stat.sources,
                    f"{row.text}: vs torch DataLoader")
        sizes = select(builds, "bytes_apparent", format="rawfiles", encoding=row.images)
        add([("formats", case_id, "bytes_apparent") for case_id in sizes["case_id"]],
            f"{row.text}: sample size")
    return tuple(_quick_case(results, study, case_id, metric, decisions)
                 for (study, case_id), (metric, decisions) in found.items())


def _quick_case(results: Results, study: str, case_id: str, metric: str,
                decisions: Sequence[str]) -> QuickCase:
    df = results.df
    rows = df[(df["study"] == study) & (df["case_id"] == case_id)]
    first = rows.iloc[0]
    params = params_of(rows.iloc[[0]]).iloc[0]
    fmt, encoding = str(first["format"]), str(first["encoding"])
    dataset = str(params.get("dataset_name") or f"{fmt}-{encoding}")
    return QuickCase(study, case_id, metric, fmt, encoding, dataset, tuple(decisions),
                     tuple(sorted(set(rows["run_id"].astype(str)))))


def quick_plan_text(cases: Sequence[QuickCase], reference: Results) -> str:
    """What a quick study measures, in a few lines: its cases per study and where they came
    from."""
    per_study: dict[str, int] = {}
    for case in cases:
        per_study[case.study] = per_study.get(case.study, 0) + 1
    runs = sorted({run for case in cases for run in case.reference_runs})
    return (f"{len(cases)} cases behind the answer table of {reference.directory} "
            f"({', '.join(f'{study} {count}' for study, count in per_study.items())}), "
            f"from reference run(s) {', '.join(runs)}")


def case_table(cases: Sequence[QuickCase], reference: Results, quick: Results) -> pd.DataFrame:
    """One row per case: what it is measured for, its median and repeats on the reference
    machine and here, and here over there."""
    out = []
    for case in cases:
        ref = _stat_or_none(reference, case)
        here = _stat_or_none(quick, case)
        ratio = (here.median / ref.median if ref is not None and here is not None
                 and ref.median else math.nan)
        out.append({
            "study": case.study,
            "case": case.case_id,
            "measured for": "; ".join(case.decisions),
            "reference machine": _stat_text(ref),
            "this machine": _stat_text(here),
            "this / reference": format_ratio(ratio) if math.isfinite(ratio) else DASH,
            "reference run": ", ".join(case.reference_runs),
        })
    return pd.DataFrame(out)


def _stat_or_none(results: Results, case: QuickCase):
    try:
        return stat(results.df, case.metric, study=case.study, case_id=case.case_id)
    except LookupError:
        return None


def _stat_text(found) -> str:
    if found is None:
        return "not measured"
    return f"{format_value(found.median, found.unit)} (n = {found.count})"


def named(choice) -> frozenset[str]:
    """What a choice names: its best, those tied with it, and the runner-up it could not be
    told from; the order of an undecided pair is not part of the answer."""
    if choice is None:
        return frozenset()
    names = {choice.label, *choice.tied}
    if choice.undecided and choice.runner_up:
        names.add(choice.runner_up)
    return frozenset(names)


def agreement(mine: Sequence[frozenset], theirs: Sequence[frozenset]) -> str:
    """``"same"`` where every part names the same candidates, ``"overlapping"`` where each
    part shares one, else ``"different"``."""
    if list(mine) == list(theirs):
        return "same"
    if all(a & b or (not a and not b) for a, b in zip(mine, theirs)):
        return "overlapping"
    return "different"


def _parts(results: Results, situation) -> list[frozenset] | None:
    try:
        advice = advise(situation_for(situation, results), results)
    except (AdviceError, LookupError):
        return None
    return [named(advice.store), named(advice.loader), named(advice.decoder)]


def compared_answers(reference: Results, quick: Results) -> pd.DataFrame:
    """Each situation's store and loader on this machine beside the reference's, and
    whether they name the same candidates (``agreement``; the order of an undecided pair
    does not count)."""
    here = answer_rows(quick).set_index("your situation")
    there = answer_rows(reference).set_index("your situation")
    out = []
    for situation in ANSWER_SITUATIONS:
        text = situation.text
        row = {"your situation": text}
        for column in ("store as", "load with"):
            row[f"{column}, reference machine"] = there.loc[text, column]
            row[f"{column}, this machine"] = (here.loc[text, column] if text in here.index
                                              else DASH)
        mine, theirs = _parts(quick, situation), _parts(reference, situation)
        row["answers"] = (agreement(mine, theirs) if mine is not None and theirs is not None
                          else "not answered on both")
        out.append(row)
    return pd.DataFrame(out)


def quick_report(reference: Results, quick: Results, cases: Sequence[QuickCase]) -> str:
    """The quick study's markdown: this machine's answer table, the two answers side by
    side, and every case's median on both machines."""
    kinds = ", ".join(ENCODING_NAMES[e] for e in ENCODING_NAMES
                      if e in set(quick.df["encoding"].dropna()))
    return "\n\n".join([
        "# The quick answer on this machine",
        f"This machine: {machine_text(quick.env)} (run {quick.env.get('run_id', '')}). "
        f"Reference machine: {machine_text(reference.env)}. Measured: the {len(cases)} cases "
        "the reference's answer table rests on (each decision's two best candidates), on the "
        f"same sets ({kinds}) and under the same decision rule; a candidate the reference "
        "ranked third or lower is not measured again.",
        "## The answer",
        answer_markdown(quick),
        "## Against the reference's answer",
        markdown_table(compared_answers(reference, quick)),
        "## The evidence, case by case",
        markdown_table(case_table(cases, reference, quick)),
    ]) + "\n"


def cases_json(cases: Sequence[QuickCase]) -> str:
    return json.dumps([case.__dict__ for case in cases], indent=1) + "\n"
