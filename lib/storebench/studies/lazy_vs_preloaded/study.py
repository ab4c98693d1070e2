"""The lazy_vs_preloaded study: read from storage per access, or preload into RAM first?

Every dataset read lazily (``LazyDataset``) and preloaded (``PreloadedDataset``), cold and
warm, decoded to arrays, one thread. Raw sets in every access order (sequential, shuffled,
block-shuffled); preloaded, one case per cache state reads all three from one preload,
since a preload reads the files in one order whatever the epoch's (its block-shuffled epoch
is the case's own, the others ``RAM_ORDERS`` after it). Encoded sets block-shuffled (compact
plans: ``COMPACT_ENCODED_FORMATS`` only). Plus the readahead knobs of the memory-mapped formats
(each format's ``TRAITS.readahead_option``) on and off, lazy, cold, shuffled.

Its grid is ``grid``, its tables, figures and findings ``report``, its guide rows
``guide``, its case functions ``cases``; this module ties them into ``STUDY``.
"""

from __future__ import annotations

from ..base import LiveComparison, Study
from .grid import grid
from .guide import guide
from .report import FIGURES, caveats, findings

# The live cell: lazy against preloaded loading of one raw set, block-shuffled.
LIVE = LiveComparison(
    pair=("lazy", "preloaded"),
    choices={kind: {"function": "loader_epoch", "loader": kind, "format": "memmap",
                    "encoding": "raw", "access": "block_shuffle"}
             for kind in ("lazy", "preloaded")},
    formats=(), encodings=(), settings={"batch_size": None, "cache": "warm"},
)


STUDY = Study(
    name="lazy_vs_preloaded",
    question="Read from storage per access, or preload into RAM first?",
    grid=grid,
    figures=FIGURES,
    findings=findings,
    guide=guide,
    notebook="02_lazy_vs_preloaded.ipynb",
    readme_figures=("lazy_vs_preloaded_throughput",),
    caveats=caveats,
    live=LIVE,
    cold_rate_metric="samples_per_s",
)
