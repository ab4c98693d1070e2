"""The gpu_decode study's guide rows: the CPU decode and prefetcher that deliver most at the
most cores, and the fastest decode on the device."""

from __future__ import annotations

from ...results import Results, ok_repeats, select, stat
from .grid import NAME
from .report import decode_rows


def guide(results: Results) -> list:
    """Which CPU decode and prefetcher delivers most at the most cores measured; which
    device decode path decodes fastest, where any was measured."""
    from ...guide import Candidate, choose

    rows = ok_repeats(decode_rows(results.df))
    out = []
    cpu = rows[rows["family"] == "cpu"]
    if not cpu.empty:
        most = int(cpu["workers"].max())
        part = cpu[cpu["workers"] == most]
        out.append(choose(NAME, f"JPEG (375x500) decoded on the CPU with {most} cores: "
                          "whole or reduced-size decode, which prefetcher?", "samples_per_s",
                          [Candidate(label, label, stat(part, "samples_per_s", label=label))
                           for label in dict.fromkeys(part["label"])]))
    device = rows[rows["family"] == "device"]
    if not device.empty and not select(device, "samples_per_s").empty:
        out.append(choose(NAME, "JPEG (375x500) decoded, cropped and flipped on the GPU: "
                          "which library?", "samples_per_s",
                          [Candidate(label, label, stat(device, "samples_per_s", label=label))
                           for label in dict.fromkeys(device["label"])]))
    return [row for row in out if row is not None]
