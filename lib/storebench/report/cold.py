"""Cold on a virtual machine: each study's cold cases, first repeat against the later ones.

Every cold repeat starts with its files evicted from this guest's page cache, and checked. A
cache below the guest (the host's, on a VM) is out of the eviction's reach: where it holds the
files, the later repeats read faster than the first. The methodology page shows what the
results say, study by study and format by format, and what a "cold" label may claim.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..results import HOST_CACHE_MARGIN, Results, cold_repeats, host_cache_detected
from ..studies import STUDIES
from ..text import DASH, GUEST_COLD, format_percent, format_ratio, markdown_table


def cold_repeats_table(results: Results) -> pd.DataFrame:
    """Every study's cold cases (``results.cold_repeats`` on the rate the study declares,
    ``Study.cold_rate_metric``), with a ``study`` column."""
    parts = []
    for name, study in STUDIES.items():
        if not study.cold_rate_metric:
            continue
        try:
            df = results.study(name)
        except LookupError:
            continue
        table = cold_repeats(df, study.cold_rate_metric)
        if not table.empty:
            parts.append(table.assign(study=name, metric=study.cold_rate_metric))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def host_cache_sentence(table: pd.DataFrame) -> str:
    """What the cold cases say of a cache below the guest, in one sentence."""
    detected = host_cache_detected(table)
    if detected is None:
        return "No cold case here ran two repeats, so a cache below the guest was not looked for."
    ratio = table["later_over_first"]
    started = format_percent(float(table["resident_before"].max()))
    seen = (f"over {len(table)} cold cases, the later repeats ran a median "
            f"{format_ratio(float(ratio.median()))} the first's rate "
            f"({format_ratio(float(ratio.min()))}{DASH}{format_ratio(float(ratio.max()))}), "
            f"though every repeat started with at most {started} of its files in the "
            f"guest's page cache")
    if detected:
        return (f"A cache below the guest is detected: {seen}. The later repeats read what "
                f"the host still held, so every cold row here is {GUEST_COLD}, and its "
                "first repeat is shown apart.")
    return (f"No cache below the guest is detected ({seen}; the margin is "
            f"{format_percent(HOST_CACHE_MARGIN)}), but none is excluded either: the rows "
            f"are still {GUEST_COLD}.")


def cold_block(results_dir: Path | str) -> str:
    """The methodology page's generated block: the verdict, then per study and format the
    cases, the later repeats' rate over the first (median and range) and the residency
    the repeats started and ended with."""
    results = Results.load(results_dir)
    table = cold_repeats_table(results)
    lines = [host_cache_sentence(table)]
    if not table.empty:
        rows = []
        for (study, fmt, encoding), part in table.groupby(["study", "format", "encoding"],
                                                          sort=True):
            ratio = part["later_over_first"]
            after = part["resident_after"].dropna()
            rows.append([
                study, f"{fmt} ({encoding})", str(len(part)),
                f"{format_ratio(float(ratio.median()))} ({format_ratio(float(ratio.min()))}"
                f"{DASH}{format_ratio(float(ratio.max()))})",
                format_percent(float(part["resident_before"].max())),
                format_percent(float(after.max())) if len(after) else "not recorded",
            ])
        lines += ["", markdown_table(pd.DataFrame(rows, columns=[
            "study", "format", "cold cases", "later repeats \u00f7 first (median, range)",
            "resident before (most)", "resident after (most)"]))]
        if math.isfinite(float(table["resident_after"].max())):
            lines += ["", "Resident after: the most any repeat left in the guest's page cache "
                          "as it ended."]
    return "\n".join(lines) + "\n"
