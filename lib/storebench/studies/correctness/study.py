"""The correctness study: which loaders deliver every sample exactly once, with independent
randomness, deterministically, and resume exactly?

Every recipe of the registry (``storebench.recipes``; the peers' in the peers environment)
reads a set of probe images of its own (``cases``: each sample alone in its class, so a
delivered label names it; red and green encode each pixel's coordinates, so a delivered
crop gives back its box and flip), and each property is measured from what the recipe
delivers, with no hook of ours in its loader:

- **exactly once**: one epoch at 1, 2 and 4 workers (the library's own unit of parallelism,
  named in the row) and at 2, 3 and 4 gloo ranks, ``drop_last`` off: duplicates, misses, and
  apart from them the padding a sampler adds to even out ranks;
- **distinct randomness**: a sample's draws in two epochs, the draws of workers within an
  epoch and of ranks (identical sequences, correlation below ``RANK_CORRELATION_LIMIT``),
  and what a pass without ``set_epoch`` repeats;
- **deterministic given a seed**: a second run of the same seed, at the same and at another
  worker count, delivers the same order and draws (where the library does not promise it,
  the row says so);
- **shuffle quality**: the delivered order's rank correlation with the stored order and its
  longest run of consecutive stored samples, one measure for every recipe;
- **resume**: the resume study's rows, joined by loader path (``resume_outcomes``);
- **a worker killed mid-epoch** (SIGKILL to the loader's oldest worker process a quarter of
  the way in): whether it stops with an error, carries on, or hangs, and the duplicates and
  misses it delivers. Shown beside the five properties, not counted among them: a loader
  whose workers are threads has no worker process to lose.

Its grid is ``grid``, its tables, figures and findings ``report``, its guide rows
``guide``, its case functions ``cases``; this module ties them into ``STUDY``.
"""

from __future__ import annotations

from ..base import LiveAudit, Study
from .cases import REFERENCE_WORKERS
from .grid import NAME, grid
from .guide import guide
from .report import FIGURES, KILLED_WORKER, PROPERTIES, QUESTION, findings, verdict_grid

# Probes the notebook's live audit reads (fewer where the profile's audit reads fewer).
LIVE_SAMPLES = 256


STUDY = Study(
    name=NAME,
    question=QUESTION,
    grid=grid,
    figures=FIGURES,
    findings=findings,
    guide=guide,
    notebook="12_correctness.ipynb",
    readme_figures=("correctness_properties",),
    synthetic_only=True,
    reads_profile_sets=False,
    # Two recipes whose workers are processes (a worker can be killed), over a few hundred
    # probes: the audit's runs, ranks included, in well under a minute.
    live=LiveAudit(recipes=("storebench-process-lmdb", "torch-imagefolder"),
                   verdicts=verdict_grid,
                   properties=(*PROPERTIES[:-1], KILLED_WORKER),
                   settings={"samples": LIVE_SAMPLES, "ranks": (3,),
                             "workers": (1, REFERENCE_WORKERS)}),
)
