"""The lazy_vs_preloaded study's guide rows: the fastest format and loader (lazy or
preloaded) per encoding and cache state."""

from __future__ import annotations

from ...results import (
    MissingResultError,
    Results,
    format_order,
    ordered,
    select,
    stat,
    summed_stat,
)
from ...text import ENCODING_NAMES, ENCODING_ORDER
from ..captions import question_caption
from .report import block_shuffled


def guide(results: Results) -> list:
    """Per encoding and cache state: which format and loader (lazy or preloaded) give the
    fastest block-shuffled epoch in one process; every measured pair is a candidate."""
    from ...guide import Candidate, choose

    rows = block_shuffled(results.study("lazy_vs_preloaded"))
    picked = select(rows, "samples_per_s")
    out = []
    for encoding in ordered(picked["encoding"], ENCODING_ORDER):
        name = ENCODING_NAMES.get(encoding, encoding)
        name = name[0].upper() + name[1:]
        caption = question_caption(results, "lazy_vs_preloaded", picked, encoding)
        part = picked[picked["encoding"] == encoding]
        pairs = list(dict.fromkeys(zip(part["format"], part["loader"])))
        pairs.sort(key=lambda p: (format_order().index(p[0])
                                  if p[0] in format_order() else 99, p[1]))
        warm = part[part["cache"] == "warm"]
        candidates = [Candidate(f"{fmt}/{loader}", f"{fmt} ({loader})",
                                stat(warm, "samples_per_s", format=fmt, loader=loader))
                      for fmt, loader in pairs
                      if not warm[(warm["format"] == fmt) & (warm["loader"] == loader)].empty]
        out.append(choose(
            "lazy_vs_preloaded",
            f"{name} that fit in RAM and are cached, one process, later epochs: which "
            f"format, lazy or preloaded?{caption}", "samples_per_s", candidates,
            facets={"encoding": encoding, "epochs": "later"}))
        # A cold first epoch: a preload's own time counts, so compare seconds to the end
        # of the epoch (preload plus epoch), lower is better. A preload reads the whole set,
        # so the epoch is the whole set's too: its start-up, then the set at the repeat's
        # steady rate (``set_epoch_seconds``; results without the metric: whole epochs).
        epoch_metric = ("set_epoch_seconds" if "set_epoch_seconds" in set(rows["metric"])
                        else "epoch_seconds")
        cold = rows[(rows["encoding"] == encoding) & (rows["cache"] == "cold")]
        candidates = []
        for fmt, loader in pairs:
            try:
                seconds = summed_stat(cold, ("preload_seconds", epoch_metric),
                                      format=fmt, loader=loader)
            except MissingResultError:
                continue
            candidates.append(Candidate(f"{fmt}/{loader}", f"{fmt} ({loader})", seconds))
        out.append(choose(
            "lazy_vs_preloaded",
            f"{name}, the first epoch from a guest-cold cache, one process: which format, lazy or "
            f"preloaded? (time to the end of an epoch of the whole set, a preload "
            f"included{'; ' + caption[2:-1] if caption else ''})",
            "preload_plus_epoch_seconds", candidates, lower_is_better=True,
            facets={"encoding": encoding, "epochs": "first"}))
    return [row for row in out if row is not None]
