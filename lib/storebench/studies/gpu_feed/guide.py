"""The gpu_feed study's guide rows: per compute time, which feed path keeps the accelerator
busiest."""

from __future__ import annotations

from ...results import Results, select, stat
from ...text import grid_value
from .report import feed_devices, feed_rows


def guide(results: Results) -> list:
    """Per compute time above zero: every measured feed path is a candidate, by AU."""
    from ...guide import Candidate, choose

    rows = feed_rows(results.df)
    picked = select(rows, "accelerator_utilisation")
    out = []
    emulated = feed_devices(results.df)["emulated"].all()
    for compute_ms in sorted(set(picked["compute_ms"]) - {0.0}):
        part = picked[picked["compute_ms"] == compute_ms]
        candidates = [Candidate(key, label, stat(part, "accelerator_utilisation", path=key))
                      for key, label in dict.fromkeys(zip(part["path"], part["label"]))]
        out.append(choose(
            "gpu_feed",
            f"Keeping an accelerator busy at {grid_value(compute_ms)} ms per batch"
            + (" (emulated accelerator)" if emulated else "") + ": which feed path?",
            "accelerator_utilisation", candidates))
    return [row for row in out if row is not None]
