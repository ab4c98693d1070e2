"""The resume study's guide row: which path resumes exactly in the most scenarios."""

from __future__ import annotations

from ...results import Results
from .cases import RANK_SCENARIOS, SCENARIOS, get_resume_path
from .grid import NAME
from .report import resume_table


def guide(results: Results) -> list:
    """"Which loaders resume exactly": the paths that resumed exactly in at least one
    scenario, ranked by how many of the study's scenarios they resumed exactly."""
    from ...guide import Candidate, GuideRow
    from ...results import Stat

    table = resume_table(results.df)
    if table.empty:
        return []
    exact = table[table["outcome"] == "exact"]
    counts = exact.groupby("path", sort=False).size()
    if counts.empty:
        return []
    counts = counts.sort_values(ascending=False, kind="stable")
    # A count's rows: the audit's lost and duplicated samples of each case it counts.
    sources = {path: tuple((NAME, case_id, metric) for case_id in dict.fromkeys(part["case_id"])
                           for metric in ("lost", "duplicated"))
               for path, part in exact.groupby("path", sort=False)}
    candidates = tuple(
        Candidate(name, get_resume_path(name).label,
                  Stat(float(n), float(n), float(n), 1, "count", (float(n),),
                       derived_from=sources[name]))
        for name, n in counts.items())
    best = float(counts.iloc[0])
    runner = float(counts.iloc[1]) if len(counts) > 1 else float("nan")
    tied = tuple(c.label for c in candidates[1:] if c.stat.median == best)
    question = (f"Which loaders resume an epoch exactly after SIGKILL? (scenarios resumed "
                f"exactly of the {len(SCENARIOS)}: same workers, workers changed, "
                f"{len(RANK_SCENARIOS)} world-size changes)")
    return [GuideRow(NAME, question, "exact_scenarios", candidates, False,
                     best / runner, best / runner, best / runner, bool(tied), tied,
                     {"question": "resume"}, "equivalent" if tied else "better")]
