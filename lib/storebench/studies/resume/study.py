"""The resume study: which loaders resume an epoch exactly after the training process is
SIGKILLed mid-epoch?

Every path that claims mid-epoch resumption (storebench's ProcessPrefetcher under fork and
spawn, ThreadPrefetcher and ``ResumableDataLoader``; torchdata's ``StatefulDataLoader``;
LitData's and MosaicML Streaming's ``StreamingDataLoader``; tf.data iterator checkpoints)
trains one shuffled epoch of the profile's raw set (cut as the peers study's,
``peer_specs``) in a child process that checkpoints every few batches and is SIGKILLed at
seeded points, some mid-batch; a new process restores the last checkpoint each time
(``cases``). The epoch's deliveries are audited by content against an uninterrupted epoch:
samples lost, duplicated, and whether the order is the same. Scenarios: the same worker
count; another worker count at each restart; 2 gloo ranks resumed by 3 and 3 by 2 (where
the path can split its state over ranks). Paths that make no claim (WebDataset, the plain
torch ``DataLoader``) have rows saying ``unsupported`` and why. Each row also records the
checkpoint's size (the loader's state only), the time to save it, and the time from the
restart's launch (interpreter and imports included) to the first resumed batch.

Its grid is ``grid``, its table, figure and findings ``report``, its guide row ``guide``, its
case functions ``cases``; this module ties them into ``STUDY``.
"""

from __future__ import annotations

from ..base import LiveComparison, Study
from .grid import NAME, prepare, resume_grid
from .guide import guide
from .report import FIGURES, findings

# The live cell: a restart's time to its first batch, same workers against fewer ranks.
LIVE = LiveComparison(
    pair=("same workers", "ranks 3 to 2"),
    choices={"same workers": {"param_path": "process_fork", "param_scenario": "same_workers"},
             "ranks 3 to 2": {"param_path": "process_fork", "param_scenario": "ranks_3_to_2"}},
    formats=("memmap",), encodings=("raw",), metric="restart_to_first_batch_s",
    higher_is_better=False,
)


STUDY = Study(
    name=NAME,
    question="Which loaders resume an epoch exactly after the training process is killed?",
    grid=resume_grid,
    figures=FIGURES,
    findings=findings,
    guide=guide,
    notebook="11_resume.ipynb",
    readme_figures=("resume_exact",),
    synthetic_only=True,
    prepare=prepare,
    live=LIVE,
)
