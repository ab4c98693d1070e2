"""Findings across studies: what the results cover, where they came from, every study's
sentences, and the README's guide table. Each study's own tables and sentences live in its
folder (``storebench.studies.<name>``); every number comes from ``storebench.results``.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..results import TIE_RULE, Results, failed_cases, latest_runs
from ..text import DASH, bullets, format_value, machine_text, markdown_table


def caveats(results: Results) -> list[str]:
    """What the results cover and what they do not, from the results themselves."""
    from ..studies import STUDIES

    df, env = results.df, results.env
    rows = latest_runs(df)
    cases = rows.drop_duplicates(["study", "case_id"])
    failures = failed_cases(df)
    timed = rows[(rows["repeat"] >= 0).fillna(False) & (rows["status"] == "ok")]
    per_case = timed.groupby(["study", "case_id"])["repeat"].nunique()
    if per_case.empty:
        repeats = "no timed repeats"
    elif per_case.min() == per_case.max():
        repeats = f"{per_case.min()} timed repeat(s) per case"
    else:
        repeats = f"{per_case.min()}{DASH}{per_case.max()} timed repeats per case"
    profiles = ", ".join(f"`{p}`" for p in sorted(set(rows["profile"])) if p)
    sentences = [
        f"{len(cases)} cases in {rows['study'].nunique()} studies, profile {profiles}, "
        f"from {rows['run_id'].nunique()} run(s); {repeats} (figures are medians, ranges min "
        "to max)."
    ]
    if failures.empty:
        sentences.append("No case failed.")
    else:
        listed = "; ".join(f"{r.case_id} ({r.status}: {r.error})"
                           for r in failures.head(5).itertuples())
        sentences.append(f"{len(failures)} case(s) failed or timed out: {listed}.")
    if env:
        for study in STUDIES.values():  # each reads the rows it is about, of any study
            sentences += study.caveats(results)
        limits = env.get("limits") or {}
        if limits:
            def limit(key: str, unit: str) -> str:
                return format_value(limits.get(key, math.nan), unit)

            sentences.append(
                f"Machine limits measured in the same run: DRAM read "
                f"{limit('dram_read_GBps', 'GB/s')}, page-cache read "
                f"{limit('page_cache_read_GBps', 'GB/s')}, cold sequential read "
                f"{limit('cold_seq_read_GBps', 'GB/s')}, cold 4 KiB random reads "
                f"{limit('cold_random_4k_iops', 'IOPS')}.")
    return sentences




def guide_markdown(rows) -> str:
    """The guide as a markdown table: question | workload | choice | evidence (without the
    workload column where no row names one)."""
    from ..guide import guide_table

    table = guide_table(rows)
    if not table["workload"].astype(bool).any():
        table = table.drop(columns="workload")
    return markdown_table(table)


def guide_sections(rows) -> str:
    """The guide grouped by study, in the rows' order: a heading per study (its question,
    so a reader finds their situation in the page's table of contents), then its rows,
    each answer before its evidence."""
    from ..studies import get_study

    parts = []
    for study in dict.fromkeys(row.study for row in rows):
        mine = [row for row in rows if row.study == study]
        parts += [f"## {get_study(study).question}", "", guide_markdown(mine), ""]
    return "\n".join(parts).rstrip("\n")


def readme_findings_table(results_dir: Path | str) -> str:
    """The guide page's block (markdown) from ``<results_dir>/*.csv`` and env.json: a line
    on the machine, then the guide grouped by study (``guide_sections``), then the tie
    rule."""
    from .guide import decision_guide

    results = Results.load(results_dir)
    header = (f"Measured on: {machine_text(results.env)}." if results.env
              else "Machine unknown (no env.json).")
    return (header + "\n\n" + guide_sections(decision_guide(results)) + "\n\n"
            + f"Tie rule: {TIE_RULE}\n")


def all_findings(results: Results) -> dict[str, list[str]]:
    """Every study's sentences, keyed by study name, in the studies' run order; a study
    with no rows is left out."""
    from ..studies import STUDIES

    present = set(results.df["study"])
    return {name: study.findings(results) for name, study in STUDIES.items()
            if name in present}


def findings_markdown(results: Results, study: str) -> str:
    """One study's findings as a markdown bullet list (what a notebook's last cell shows)."""
    from ..studies import get_study

    return bullets(get_study(study).findings(results))


# The guide questions a notebook's opening answer lists before pointing to the full guide.
ANSWER_QUESTIONS = 6


def targets_line(results: Results, study: str | None = None) -> str:
    """``"Targets met: 1 of 2 (name: verdict; ...)."``: every target (``study``'s only,
    unless it is None or the targets study, which reports them all); empty when none."""
    from .targets import all_targets_table, target_verdict

    targets = all_targets_table(results)
    if study not in (None, "targets"):
        targets = targets[targets["study"] == study]
    if targets.empty:
        return ""
    verdicts = [target_verdict(row) for _, row in targets.iterrows()]
    named = "; ".join(f"{row['target']}: {verdict}"
                      for (_, row), verdict in zip(targets.iterrows(), verdicts))
    return f"Targets met: {verdicts.count('met')} of {len(verdicts)} ({named})."


def answer_lines(results: Results, study: str) -> list[str]:
    """The answer a study's notebook opens with, one line per guide question: the question
    and what the results choose; then how many of the study's targets are met. Where the
    rows decide nothing (a study not run here), the study's first findings."""
    from ..guide import guide_table
    from ..studies import get_study

    table = guide_table(get_study(study).guide(results))
    lines = [f"{question} \u2192 **{choice}**"
             for question, choice in zip(table["question"], table["choice"])]
    if len(lines) > ANSWER_QUESTIONS:
        more = len(lines) - ANSWER_QUESTIONS
        lines = lines[:ANSWER_QUESTIONS] + [f"{more} more question(s) in the guide below."]
    lines += [line for line in [targets_line(results, study)] if line]
    return lines or get_study(study).findings(results)[:3]


def answer_markdown(results: Results, study: str | None = None) -> str:
    """What a notebook opens with, under its question: ``answer_lines`` of ``study``, or
    for every study at once (None) the README's answer table and the targets met."""
    from ..studies import get_study

    if study is None:
        from .answer import answer_markdown as answer_table

        return answer_table(results) + "\n\n" + targets_line(results)
    return f"**{get_study(study).question}**\n\n" + bullets(answer_lines(results, study))
