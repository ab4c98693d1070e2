"""The startup study: what an index of ImageNet's size costs before the first batch and in
workers' memory over an epoch, held as NumPy arrays (ours) or as Python lists (torchvision's
``ImageFolder``).

Users' most frequent loader complaints are not steady-state throughput: the time to the
first batch, when the dataset object is pickled into every worker and the workers start one
after another, and memory that grows during an epoch, when forked workers read Python lists
and copy their pages (pytorch#13246). Only the index needs to be large: its entries point into
the profile's raw memmap set (``storebench.loaders.index``), 1,281,167 of them
(``bench.plan.StudyPlan.index_entries``; 50,000 on ci).

Startup cases (``cases.startup_case``): per index kind, ThreadPrefetcher, ProcessPrefetcher
and the torch DataLoader under fork, spawn and forkserver, 2 workers, batch 256: time to first
batch, each worker's start, bytes pickled per worker (ci: ``COMPACT_STARTUP_PATHS``; the
DataLoader's spawned workers, which import torch, repeat ``SLOW_START_REPEATS`` times).
Memory cases: per index kind, a whole epoch of the index through ProcessPrefetcher x2 under
fork: the kernel's peak charge of a cgroup made for the case, and each worker's private memory
growth from the first batch to the last (the copy-on-read effect, shown or ruled out).

Its grid is ``grid``, its figure and findings ``report``, its guide rows ``guide``, its case
functions ``cases``; this module ties them into ``STUDY``.
"""

from __future__ import annotations

from ..base import LiveComparison, Study
from .grid import NAME, grid
from .guide import guide
from .report import FIGURES, findings

# The live cell: time to the first batch, threads against forked processes.
LIVE = LiveComparison(
    pair=("thread", "process"),
    choices={"thread": {"prefetcher": "thread", "param_index_kind": "lists",
                        "param_epoch": None},
             "process": {"prefetcher": "process", "param_start_method": "fork",
                         "param_index_kind": "lists", "param_epoch": None},
             "torch": {"prefetcher": "torch", "param_start_method": "fork",
                       "param_index_kind": "lists", "param_epoch": None}},
    formats=("memmap",), encodings=("raw",), metric="time_to_first_batch_s",
    higher_is_better=False,
)


STUDY = Study(
    name=NAME,
    question="With an index of ImageNet's size, how long to the first batch and how much "
             "memory: NumPy arrays or Python lists, threads or processes, fork, spawn or "
             "forkserver?",
    grid=grid,
    figures=FIGURES,
    findings=findings,
    guide=guide,
    notebook="10_startup.ipynb",
    synthetic_only=True,
    live=LIVE,
)
