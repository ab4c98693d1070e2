"""The gpu_feed study: does the loader keep an accelerator busy?

An ``EmulatedAccelerator`` spends ``compute_ms`` per batch (as MLPerf Storage does) while a
loader path feeds it through ``GpuFeeder``, in this thread and with two prefetch processes
(and one per core, where the machine has more than two: ``feed_loaders``).
The copies go to the first CUDA device where one is present (found without importing torch
in the grid), with pageable, pinned and asynchronous copies, and for the prefetch processes
also from slots they page-lock themselves (``pin_memory=True``: no staging copy); there a
``ThreadPrefetcher`` also feeds, pageable and from buffers it page-locked itself
(``CUDA_FEED_LOADERS``); else to the CPU, and every case's params say ``emulated=True``,
``device="cpu"``. Accelerator utilisation (AU) is compute time over wall time; the
accelerator's idle time is split into waiting for data, the host copy and host overhead (see
``storebench.loaders.gpu.run_feed``).

Its grid is ``grid``, its tables, figures and findings ``report``, its guide rows
``guide``, its case functions ``cases``; this module ties them into ``STUDY``.
"""

from __future__ import annotations

from ..base import LiveComparison, Study
from .grid import grid
from .guide import guide
from .report import FIGURES, caveats, findings, readme_text

# The live cell: the accelerator's utilisation fed by processes against one thread.
LIVE = LiveComparison(
    pair=("process", "one thread"),
    choices={"process": {"prefetcher": "process", "param_compute_ms": 10.0},
             "one thread": {"prefetcher": "none", "param_compute_ms": 10.0}},
    formats=("memmap",), encodings=("raw",), metric="accelerator_utilisation",
    settings={"workers": 2, "batch_size": None},
)


STUDY = Study(
    name="gpu_feed",
    question="Does the loader keep an accelerator busy?",
    grid=grid,
    figures=FIGURES,
    findings=findings,
    guide=guide,
    notebook="04_gpu_feed.ipynb",
    readme_figures=("gpu_feed_utilisation",),
    readme_text=readme_text,
    caveats=caveats,
    live=LIVE,
)
