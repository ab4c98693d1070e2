"""The targets study: the loaders' performance targets, each measured in one case whose
repeats time every compared path back to back, so each repeat's ratio is fair.

A target is data (``Target``): the dataset it needs, its batch size, workers and params,
the function that measures its paths, which path metrics make the ratio, and the
threshold. ``target_case`` runs any of them; ``summarise_target`` writes the whole-case rows
``target_value`` (median of the per-repeat ratios), ``target_low``/``target_high`` (its 95%
bootstrap interval), ``target_threshold`` and ``target_met`` (1 when the interval's lower end
clears the threshold, else 0), so that a results file alone says whether each target was met.

Its grid is ``grid``, its tables, figures and findings ``report``, its guide row ``guide``,
its case functions ``cases``; this module ties them into ``STUDY``.
"""

from __future__ import annotations

from ..base import LiveComparison, Study
from .grid import grid
from .guide import guide
from .report import FIGURES, OWN_TARGETS, findings

# The live cell: one target's two paths, timed in one case.
LIVE = LiveComparison(
    pair=("ProcessPrefetcher", "torch DataLoader"),
    choices={"ProcessPrefetcher": {"param_target": "process_vs_torch"},
             "torch DataLoader": {"param_target": "process_vs_torch"}},
    formats=("memmap",), encodings=("raw",),
    metrics=("process_prefetcher.samples_per_s", "torch_dataloader.samples_per_s"),
)


STUDY = Study(
    name="targets",
    question="Do the loaders reach their performance targets?",
    grid=grid,
    figures=FIGURES,
    findings=findings,
    guide=guide,
    notebook="05_findings.ipynb",
    synthetic_only=True,
    targets=OWN_TARGETS,
    shows_every_target=True,
    live=LIVE,
)
