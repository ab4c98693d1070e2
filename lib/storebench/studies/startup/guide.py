"""The startup study's guide rows."""

from __future__ import annotations

from ...results import Results
from .grid import NAME, WORKERS
from .report import FIRST_BATCH, KIND_LABELS, entries, medians, peak_metric, startup_rows


def guide(results: Results) -> list:
    from ...guide import Candidate, choose

    rows = startup_rows(results.df)
    count = entries(results.df)
    if count is None:
        return []
    out = []
    first = rows[~rows["epoch"]]
    candidates = [Candidate(f"{label}:{kind}", f"{label}, {KIND_LABELS[kind]}", value)
                  for (label, kind), value in medians(first, FIRST_BATCH).items()]
    row = choose(NAME, f"Fastest to first batch: an index of {count:,} entries, "
                 f"{WORKERS} workers: which loader, start method and index?",
                 FIRST_BATCH, candidates, lower_is_better=True,
                 facets={"question": "first_batch", "workers": WORKERS})
    if row is not None:
        out.append(row)
    epoch = rows[rows["epoch"]]
    peak = peak_metric(epoch)
    if peak is not None:
        candidates = [Candidate(f"{label}:{kind}", f"{label}, {KIND_LABELS[kind]}", value)
                      for (label, kind), value in medians(epoch, peak).items()]
        row = choose(NAME, f"Least memory for {WORKERS} workers: an epoch of an index of "
                     f"{count:,} entries under fork: which index?", peak, candidates,
                     lower_is_better=True,
                     facets={"question": "memory", "workers": WORKERS})
        if row is not None:
            out.append(row)
    return out
