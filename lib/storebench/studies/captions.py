"""What a figure's title and a guide question say of the data their rows read: the study's
recorded workload where the results have one, else the profile's caption."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..plots import profile_caption
from ..text import DASH

if TYPE_CHECKING:
    import pandas as pd

    from ..results import Results


def study_caption(df: pd.DataFrame, encoding: str | None = None,
                  workloads: Mapping | None = None, *, width: int = 60) -> str:
    """What the rows read, for a title: the study's recorded workload of ``encoding`` (its
    entry of ``Results.workloads``: the set, its samples' stored size, the transform; all
    its encodings' without one), wrapped at ``width``; for results that record none, the
    profile's caption (``plots.profile_caption``), which knows the synthetic sets only."""
    import textwrap

    texts = []
    if workloads:
        texts = ([workloads[encoding]] if encoding in workloads
                 else [] if encoding else list(workloads.values()))
    if not texts:
        return profile_caption(df, encoding)
    return "\n".join(textwrap.fill(compact_workload(str(text)), width) for text in texts)


def compact_workload(text: str) -> str:
    """A workload's builds of one set, which differ by their stored size only, said once
    with the range of sizes: "64 ImageNet-like JPEGs of many sizes, 104-106 KB stored per
    sample; read through ..." (``grid.cases_workloads`` joins them with " or ")."""
    import re

    head, sep, how = text.partition("; ")
    sets: dict[str, list[float]] = {}
    for part in head.split(" or "):
        found = re.fullmatch(r"(.*), ([\d,.]+) KB stored per sample", part)
        if found is None:
            return text
        sets.setdefault(found[1], []).append(float(found[2].replace(",", "")))
    said = [f"{name}, {min(kb):,.0f}{'' if min(kb) == max(kb) else DASH + f'{max(kb):,.0f}'}"
            " KB stored per sample" for name, kb in sets.items()]
    return " or ".join(said) + sep + how


def question_caption(results: Results, study: str, df: pd.DataFrame, encoding: str) -> str:
    """A guide question's parenthesis on its data, " (...)": the profile's caption where
    the results record no workload; nothing where they do, since the guide row names its
    workload then (``GuideRow.workload``)."""
    if results.workload(study, encoding):
        return ""
    return f" ({profile_caption(df, encoding)})"
