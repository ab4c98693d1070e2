"""The formats study: what each storage format costs to build and to read.

Per built dataset (knob variants included): its build cost (from the manifest), a full
sequential read through the Reader cold and warm, and for raw datasets shuffled batches read
through the Reader (what a chunk, row group or shard costs a random batch).

Its grid is ``grid``, its tables, figures and findings ``report``, its guide rows
``guide``, its case functions ``cases``; this module ties them into ``STUDY``.
"""

from __future__ import annotations

from ..base import LiveComparison, Study
from .grid import grid
from .guide import guide
from .report import FIGURES, findings, readme_text

# The live cell: two formats' warm sequential read of the same raw set.
LIVE = LiveComparison(
    pair=("memmap", "lmdb"),
    choices={name: {"function": "sequential_read", "format": name, "encoding": "raw"}
             for name in ("memmap", "lmdb", "hdf5", "tfrecord", "parquet", "rawfiles")},
    formats=(), encodings=("raw",), settings={"cache": "warm"},
)


STUDY = Study(
    name="formats",
    question="What does each storage format cost to build, and to read cold and warm?",
    grid=grid,
    figures=FIGURES,
    findings=findings,
    guide=guide,
    notebook="01_storage_formats.ipynb",
    readme_figures=("formats_build_cost", "formats_sequential_read"),
    readme_text=readme_text,
    live=LIVE,
    cold_rate_metric="samples_per_s",
)
