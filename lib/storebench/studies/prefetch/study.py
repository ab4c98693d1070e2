"""The prefetch study: one thread, threads or processes (and the frameworks' loaders)?

Every loader path of ``storebench.loaders.paths`` over the same shuffled epochs, warm cache:
on a raw set (copy-bound) and on a JPEG set (decode-bound) decoded by PIL and by simplejpeg
(both release the GIL while they decode); our thread and process prefetchers swept over
worker counts; plus tf.data's native TFRecord pipeline (AUTOTUNE, TensorFlow decoding) on
the TFRecord JPEG set. Rows key on registry names (``prefetcher``, ``workers``,
``start_method``); labels come from the registry.

Its grid is ``grid``, its tables, figures and findings ``report``, its guide rows
``guide``, its case functions ``cases``; this module ties them into ``STUDY``.
"""

from __future__ import annotations

from ..base import LiveComparison, Study
from .grid import grid
from .guide import guide
from .report import FIGURES, findings

# The live cell: our thread against our process prefetcher on the JPEG set.
LIVE = LiveComparison(
    pair=("thread", "process"),
    choices={
        "one thread": {"prefetcher": "none", "format": "lmdb", "encoding": "jpeg"},
        "thread": {"prefetcher": "thread", "format": "lmdb", "encoding": "jpeg"},
        "process": {"prefetcher": "process", "param_start_method": "fork", "format": "lmdb",
                    "encoding": "jpeg"},
        "pickled_baseline": {"prefetcher": "pickled_baseline", "format": "lmdb",
                             "encoding": "jpeg"},
        "torch": {"prefetcher": "torch", "format": "lmdb", "encoding": "jpeg"},
    },
    formats=(), encodings=(),
    settings={"workers": 2, "batch_size": None, "decoder": "simplejpeg", "cache": "warm"},
)


STUDY = Study(
    name="prefetch",
    question="One thread, threads or processes, or a framework's loader?",
    grid=grid,
    figures=FIGURES,
    findings=findings,
    guide=guide,
    notebook="03_thread_vs_process_prefetch.ipynb",
    readme_figures=("prefetch_paths",),
    live=LIVE,
)
