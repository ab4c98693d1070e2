"""The gpu_feed study's grid: per compute time, the loader paths that feed the (emulated or
CUDA) accelerator, each with the copies it is measured with."""

from __future__ import annotations

import os
from pathlib import Path

from ...bench.case import Case
from ...bench.plan import plan_for
from ...loaders.paths import get_loader_path
from ...loaders.prefetch import default_depth
from ..gpu_feed.cases import START_BATCHES
from ..grid import (
    StudyNotApplicableError,
    batch_size_for,
    dataset_fields,
    epoch_fields,
    pick,
    profile_datasets,
    repeat_fields,
)

CASES = "storebench.studies.gpu_feed.cases"
COMPUTE_MS = (0.0, 2.0, 10.0)
# With a CUDA device the host is a GPU server's, and copies run at tens of GB/s: on an H100
# machine every path fed a 256-sample batch in 1-1.6 ms (results/gpu-runs), so 2 ms already
# kept the accelerator busy and the starved range lies below it.
CUDA_COMPUTE_MS = (0.0, 0.5, 1.0, 2.0, 10.0)
# Compact plans (ci): no compute and a busy accelerator. A third value runs the same code
# again, and each case pays torch's import (about 1.3 s of a 1.7 s ci case).
COMPACT_COMPUTE_MS = (0.0, 10.0)
FEED_LOADERS = (("none", 0), ("process", 2))
# Where a CUDA device takes the copies, a ThreadPrefetcher feeds too: pageable, and from
# buffers it page-locked itself (pin_memory=True), the in-place copy without prefetch
# processes. Two copy modes, not four: the staged pinned copies are measured on the loaders
# above, and each CUDA case pays torch's import and a CUDA context (about 5 s on an H200).
CUDA_FEED_LOADERS = (("thread", 2),)
CUDA_FEED_LOADER_COPIES = ({}, {"pinned": True, "pin_memory": True})


def feed_loaders(cores: int, batches: int) -> tuple[tuple[str, int], ...]:
    """(loader path, workers) of the grid for an epoch of ``batches`` batches:
    ``FEED_LOADERS``, and the prefetch processes once per core where ``cores`` is more than
    two, as many as leave ``PER_CORE_TIMED_BATCHES`` of the epoch to time after
    ``batches_before_timing``. A GPU server has many cores per accelerator, and two
    processes there deliver no faster than they gather: on an H200 machine the time that
    page-locked slots saved on the copy went into waiting for data (``results/gpu-runs``)."""
    most = max(w for _, w in FEED_LOADERS)
    fits = [w for w in range(most + 1, cores + 1)
            if batches_before_timing(w) + PER_CORE_TIMED_BATCHES <= batches]
    return (*FEED_LOADERS, *((("process", max(fits)),) if fits else ()))


def min_feed_batches() -> int:
    """Batches an epoch needs for every loader of ``FEED_LOADERS`` to time some."""
    return max(batches_before_timing(w) for _, w in FEED_LOADERS) + TIMED_BATCHES


def feed_batch_size(num_samples: int) -> int | None:
    """``batch_size_for``'s batch, or a smaller one where that leaves an epoch too few
    batches to time past the warm-up (a small import of your own images); None where even
    one sample a batch does not."""
    batch_size = batch_size_for(num_samples)
    if num_samples // batch_size >= min_feed_batches():
        return batch_size
    return num_samples // min_feed_batches() or None


def batches_before_timing(workers: int) -> int:
    """Batches a case feeds before timing: ``START_BATCHES`` and what a prefetcher of
    ``workers`` processes reads ahead (none without one; ``cases.gpu_feed``)."""
    return START_BATCHES + (default_depth(workers) if workers else 0)

# Batches timed after the warm-up, at the least (an epoch needs room for them); for the
# loader with one process per core, as many as the default plan's epochs time (2,048
# samples of the small profile: 8 batches of 256), or fewer processes.
TIMED_BATCHES = 2
PER_CORE_TIMED_BATCHES = 8


def grid(*, profile: str, data_dir: Path | str, repeats: int | None = None,
         compute_ms: tuple[float, ...] | None = None) -> list[Case]:
    """See the module docstring. ``compute_ms``: the emulated compute per batch of each
    case (default ``COMPUTE_MS``, ``CUDA_COMPUTE_MS`` where a CUDA device takes the copies;
    ``COMPACT_COMPUTE_MS`` for compact plans)."""
    from ...bench.envinfo import cuda_info

    repeats = {**repeat_fields(profile, repeats), **epoch_fields(profile)}
    picked = pick(profile_datasets(profile, data_dir), "raw", ("memmap", "lmdb", "hdf5"))
    if picked is None:
        raise StudyNotApplicableError(f"{data_dir}: gpu_feed needs a raw dataset (for an "
                                  "import: storebench import ... --resize HxW)")
    path, manifest = picked
    batch_size = feed_batch_size(manifest["num_samples"])
    if batch_size is None:
        raise StudyNotApplicableError(
            f"{path}: gpu_feed needs at least {min_feed_batches()} samples, one batch each "
            "(the batches fed before timing, start-up and what the loader reads ahead, are "
            f"discarded); the dataset has {manifest['num_samples']}")
    batches = manifest["num_samples"] // batch_size
    fields = dataset_fields("gpu_feed", path, manifest)
    # What each batch holds, for the captions (the set's arrays, as stored: a training-set
    # family's 224x224 copy is fed uncropped, its crop left to the device, so that what
    # the feed moves, not a CPU crop, decides the study's question).
    from ...formats.specs import spec_from_dict

    shape = "x".join(str(n) for n in spec_from_dict(manifest["spec"]).image_shape)
    cuda = cuda_info()
    if cuda["torch_cuda_available"]:
        device = {"device": "cuda", "emulated": False,
                  "device_name": (cuda["devices"] or ["CUDA device"])[0]}
        copies = [{}, {"pinned": True}, {"pinned": True, "non_blocking": True},
                  {"pinned": True, "pin_memory": True}]
    else:
        device = {"device": "cpu", "emulated": True, "device_name": "cpu"}
        copies = [{}]
    if compute_ms is None:
        compute_ms = (COMPACT_COMPUTE_MS if plan_for(profile).compact
                      else CUDA_COMPUTE_MS if cuda["torch_cuda_available"] else COMPUTE_MS)
    loaders = [(prefetcher, workers, copies) for prefetcher, workers
               in feed_loaders(len(os.sched_getaffinity(0)), batches)]
    if cuda["torch_cuda_available"]:
        loaders += [(prefetcher, workers, CUDA_FEED_LOADER_COPIES)
                    for prefetcher, workers in CUDA_FEED_LOADERS]
    cases = []
    for ms in compute_ms:
        for prefetcher, workers, loader_copies in loaders:
            path = get_loader_path(prefetcher)
            for copy in loader_copies:
                if copy.get("pin_memory") and not path.pins_memory:
                    continue
                params = {"compute_ms": ms, "sample_shape": shape, **device, **copy}
                if workers and path.start_method:
                    params["start_method"] = path.start_method
                cases.append(Case(
                    function=f"{CASES}:gpu_feed_case", loader="lazy", prefetcher=prefetcher,
                    workers=workers, batch_size=batch_size,
                    access="shuffle", cache="warm", **repeats, params=params, **fields,
                ))
    return cases
