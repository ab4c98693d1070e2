"""Building blocks of case functions shared by several studies, and the loader-epoch case.

A case function is ``fn(case, trial) -> {metric: (value, unit)}``, run inside the case's
fresh worker process. It opens what it needs itself (handles never cross a process
boundary), wraps exactly the part to be timed in ``with trial.measure():`` and checks after
timing that what it read is the dataset's real bytes, so a fast wrong answer cannot pass as a
result. Heavy imports (torch, tensorflow) belong inside the functions that need them. Each
study's own case functions live in its module (``storebench.studies.<name>``).

Grid vocabulary of the loader cases (the Case fields' values):

- ``loader``: ``"lazy"`` (LazyDataset, reads per access) | ``"preloaded"`` (PreloadedDataset)
- ``access``: ``"sequential"`` | ``"shuffle"`` | ``"block_shuffle"``
- ``prefetcher``: a loader path name of ``storebench.loaders.paths.LOADER_PATHS``
- params: ``decode`` (None | ``"simplejpeg"`` | ``"pil"`` | ``"auto"`` | ``"reduced"`` |
  ``"window"`` | ``"tf"``),
  ``resize`` (``"HxW"``: imported images of mixed sizes, resized before batching),
  ``transform`` (``"train"``: the standard training crop and flip, ImageNet-like sets;
  ``crop_filter`` ``"antialiased"`` | ``"plain"`` and ``crop_resampler`` ``"storebench"`` |
  ``"pillow"`` choose its resize, ``RandomResizedCropFlip``'s ``filter`` and ``resampler``),
  ``start_method``, ``seed``, ``max_batches``, ``shuffle_buffer`` (tf_data),
  ``open_<option>`` (format open options), ``ram_orders`` (preloaded only: more access
  orders read from the same preload, ``"sequential,shuffle"``; see ``ram_order_epochs``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..bench.case import Case, Trial, open_options
from .steady import SteadyMinimum, SteadyWindow

MB = 1e6
# Why a benchmark's read (unverified, checked after its timed region) is refused.
DIFFERS_FROM_BUILD = "benchmark read returned bytes that differ from the build"
LOADER_KINDS = ("lazy", "preloaded")
ACCESS_ORDERS = ("sequential", "shuffle", "block_shuffle")


def dataset_files(dataset) -> tuple[str, ...]:
    """The data files of a built dataset, from its manifest (what cache control acts on)."""
    from pathlib import Path

    from storebench.formats import read_manifest

    root = Path(dataset)
    return tuple(str(root / name) for name in read_manifest(root)["files"])



def make_sampler(case: Case, reader, *, rank: int = 0, world_size: int = 1,
                 first: int | None = None):
    """The sampler of ``case.access`` over ``reader``, this rank's share of each epoch; with
    ``first``, only the first ``first`` indices of that share (``FirstSamples``)."""
    from storebench.loaders import (
        BlockShuffleSampler,
        FirstSamples,
        SequentialSampler,
        ShuffleSampler,
    )

    seed = int(case.param("seed", 0))
    shard = {"rank": rank, "world_size": world_size}
    if case.access == "sequential":
        sampler = SequentialSampler(len(reader), **shard)
    elif case.access == "shuffle":
        sampler = ShuffleSampler(len(reader), seed=seed, **shard)
    elif case.access == "block_shuffle":
        sampler = BlockShuffleSampler.from_reader(reader, seed=seed, **shard)
    else:
        raise ValueError(f"case {case.case_id}: access must be one of {ACCESS_ORDERS}")
    return sampler if first is None else FirstSamples(sampler, first)


def capped_samples(case: Case, max_batches: int | None) -> int | None:
    """The samples of an epoch capped at ``max_batches`` batches (the warm-up's few, or a
    case's ``epoch_samples``), for ``make_sampler(first=...)``: its loader then reaches the
    end of that epoch as of a whole one, keeps its workers for the next, and has no batch
    to read ahead that nobody takes. None: whole epochs."""
    if max_batches is None:
        return None
    return max_batches * (case.batch_size or 256)


def warmup_samples(case: Case, trial: Trial, max_batches: int | None) -> int | None:
    """``capped_samples`` in the warm-up; None in a timed repeat (the remote study's epochs,
    whose loaders read ahead past a sized epoch's last batch as in the middle of a whole
    one)."""
    return capped_samples(case, max_batches) if trial.warmup else None


def resize_size(case: Case) -> tuple[int, int] | None:
    """The case's ``resize`` param (``"224x224"``) as (height, width), None when unset."""
    text = case.param("resize")
    if not text:
        return None
    height, _, width = str(text).partition("x")
    return int(height), int(width or height)


def sample_transform(case: Case):
    """The case's per-sample transform: the standard training crop and flip (param
    ``transform="train"``, seeded by the case's ``seed``), else the resize an imported set
    of mixed sizes needs before batching, else None."""
    transform = case.param("transform")
    if transform == "train":
        from storebench.loaders.train_transform import RandomResizedCropFlip

        return RandomResizedCropFlip(seed=int(case.param("seed", 0)),
                                     filter=case.param("crop_filter", "antialiased"),
                                     resampler=case.param("crop_resampler", "storebench"))
    if transform:
        raise ValueError(f"case {case.case_id}: unknown transform {transform!r}; known: 'train'")
    size = resize_size(case)
    if size is None:
        return None
    from storebench.loaders.transforms import Resize

    return Resize(*size)


def make_dataset(case: Case, reader, *, warmup: bool = False):
    """The case's dataset over ``reader``, or None where the loader path reads the files
    itself (tf.data over TFRecord). In the ``warmup`` a preloaded case gets a lazy dataset:
    the warm-up reads a few batches, a preload would read the whole set, and each repeat
    preloads (and allocates) afresh anyway."""
    from storebench.loaders import LazyDataset, PreloadedDataset
    from storebench.loaders.paths import get_loader_path

    if get_loader_path(case.prefetcher).reads_dataset_files:
        return None
    decode = case.param("decode")
    transform = sample_transform(case)
    if case.loader == "lazy" or (warmup and case.loader == "preloaded"):
        return LazyDataset(reader, decode=decode, transform=transform)
    if case.loader == "preloaded":
        return PreloadedDataset(reader, decode=decode, transform=transform, progress=False)
    raise ValueError(f"case {case.case_id}: loader must be one of {LOADER_KINDS}")


def open_batches(case: Case, dataset, sampler):
    """``(batches, close)`` of the case's loader path (``case.prefetcher``), its workers
    kept across passes where the path can (``close`` stops them)."""
    from storebench.loaders.paths import PathOptions, get_loader_path

    path = get_loader_path(case.prefetcher)
    options = PathOptions(
        batch_size=case.batch_size or 256, workers=case.workers or 0,
        start_method=case.param("start_method"), seed=int(case.param("seed", 0)),
        root=case.dataset, shuffle_buffer=int(case.param("shuffle_buffer", 4096)),
        resize=resize_size(case), shuffle=case.access != "sequential",
        decode=case.param("decode"), pin_memory=bool(case.param("pin_memory", False)),
        persistent_workers=True, transform=case.param("transform"))
    return path.open(dataset, sampler, options)


def ram_orders(case: Case) -> tuple[str, ...]:
    """The access orders of param ``ram_orders`` (``"sequential,shuffle"``), checked: a
    preloaded case's only, each a known order other than the case's own."""
    text = case.param("ram_orders")
    if not text:
        return ()
    orders = tuple(str(text).split(","))
    if case.loader != "preloaded":
        raise ValueError(f"case {case.case_id}: ram_orders needs loader 'preloaded', got "
                         f"{case.loader!r}: only a preload serves every order alike")
    wrong = [order for order in orders if order not in ACCESS_ORDERS or order == case.access]
    if wrong or len(set(orders)) != len(orders):
        raise ValueError(f"case {case.case_id}: ram_orders must be distinct orders of "
                         f"{ACCESS_ORDERS} other than the case's {case.access!r}, got {text!r}")
    return orders


def ram_order_epochs(case: Case, orders: tuple[str, ...], dataset, reader,
                     max_batches: int | None,
                     minimum: SteadyMinimum | None) -> dict[str, tuple[float, str]]:
    """After a preloaded case's timed run (its loader stopped), a run of the same preload
    in each of ``orders``, each through a fresh loader and timed alone, start-up and steady
    state apart as the case's own: ``<order>.samples_per_s`` (steady), ``<order>.
    epoch_seconds`` and what its steady window covered. A preload reads the set in one
    order whatever the epoch's, so the orders share one instead of each case preloading
    the set again. They are timed outside ``trial.measure()``, whose memory and CPU figures
    stay the case's own run's, and after that run, so they find what it left warm
    (allocator, caches): compare them with each other first."""
    import dataclasses

    metrics = {}
    for order in orders:
        variant = dataclasses.replace(case, access=order)
        close = None
        try:
            sampler = make_sampler(variant, reader, first=capped_samples(case, max_batches))
            loader, close = open_batches(variant, dataset, sampler)
            started = time.perf_counter()
            run = run_loader(variant, loader, sampler, started=started,
                             num_samples=len(reader), max_batches=max_batches,
                             minimum=minimum)
        finally:
            if close is not None:
                close()
        check_run(variant, run, len(reader), max_batches)
        measured = run_metrics(run, started=started, ready=started, set_samples=len(reader))
        for name in ("samples_per_s", "epoch_seconds", "steady_batches", "steady_seconds"):
            metrics[f"{order}.{name}"] = measured[name]
    return metrics


def release(reader, *, dataset=None, close=None) -> None:
    """Stop a case's loader (``close``), then close its dataset and its reader, in that
    order; what was never made (None) is skipped."""
    if close is not None:
        close()
    if dataset is not None:
        dataset.close()
    reader.close()


def batch_size_bytes(batch) -> tuple[int, int, np.ndarray | None]:
    """(samples, image bytes, indices or None) of a Batch or an (images, labels) pair."""
    from storebench.loaders import Batch

    if isinstance(batch, Batch):
        return len(batch), batch.nbytes, batch.indices
    images, labels = batch
    n = int(labels.shape[0])
    if hasattr(images, "element_size"):  # a torch tensor
        return n, int(images.numel() * images.element_size()), None
    if hasattr(images, "numpy") and not isinstance(images, np.ndarray):  # a tf.Tensor
        return n, int(np.prod(images.shape)) * images.dtype.size, None
    if isinstance(images, np.ndarray):
        return n, int(images.nbytes), None
    return n, int(sum(len(x) for x in images)), None


@dataclass
class EpochTally:
    """What draining a loader delivered: samples, image bytes, batches, seconds from
    ``started`` to the first batch, when the last batch had arrived and when the epoch
    ended (``perf_counter``), whether the run stopped inside it (its steady window full),
    and the indices of batches that carry them."""

    samples: int = 0
    delivered: int = 0
    batches: int = 0
    first_batch_seconds: float = float("nan")
    last_batch_at: float = float("nan")
    first_batch_at: float = float("nan")
    first_samples: int = 0
    first_bytes: int = 0
    ended_at: float = float("nan")
    stopped: bool = False
    seen: list = field(default_factory=list)

    def indices(self) -> np.ndarray:
        return np.concatenate(self.seen) if self.seen else np.empty(0, dtype=np.int64)


def drain(loader, *, started: float, max_batches: int | None,
          window: SteadyWindow | None = None,
          minimum: SteadyMinimum | None = None) -> EpochTally:
    """Iterate ``loader`` to its end (or ``max_batches``), counting what it delivers; with
    ``window``, each batch's hand-out time goes to it, and with ``minimum`` too the epoch
    stops (``stopped``) once the window holds that much."""
    tally = EpochTally()
    for batch in loader:
        now = time.perf_counter()
        n, nbytes, indices = batch_size_bytes(batch)
        if tally.batches == 0:
            tally.first_batch_seconds = now - started
            tally.first_batch_at, tally.first_samples, tally.first_bytes = now, n, nbytes
        tally.samples += n
        tally.delivered += nbytes
        tally.batches += 1
        if indices is not None:
            tally.seen.append(np.array(indices))
        tally.last_batch_at = time.perf_counter()
        if window is not None:
            window.add(n, nbytes, now)
            if minimum is not None and window.met(minimum):
                tally.stopped = True
                break
        if max_batches is not None and tally.batches >= max_batches:
            break
    return tally


def epoch_ended(tally: EpochTally, max_batches: int | None) -> float:
    """When an epoch ended: now for a whole one (its loader's own end of epoch counts, as in
    training), at its last batch for one stopped at ``max_batches`` or inside its run's
    steady window: stopping a loader mid-epoch (in-flight batches, workers shut down early)
    is work no whole epoch does."""
    return (time.perf_counter() if max_batches is None and not tally.stopped
            else tally.last_batch_at)


def check_epoch(case: Case, tally: EpochTally, num_samples: int,
                max_batches: int | None) -> None:
    """A whole epoch (``max_batches`` None) delivered every sample once; one capped at
    ``max_batches`` (``Trial.batches_wanted``) delivered that many batches' samples (or the
    whole set, where they outnumber it), none twice; one its run stopped inside
    (``stopped``) delivered no sample twice."""
    if tally.stopped:
        indices = tally.indices()
        if len(np.unique(indices)) != len(indices):
            raise RuntimeError(f"{case.dataset}: an epoch cut at its steady window's end "
                               "delivered a sample twice")
        return
    if max_batches is None:
        if tally.samples != num_samples:
            raise RuntimeError(f"{case.dataset}: an epoch delivered {tally.samples} samples, "
                               f"the dataset has {num_samples}")
        if tally.seen and not np.array_equal(np.sort(tally.indices()), np.arange(num_samples)):
            raise RuntimeError(f"{case.dataset}: an epoch did not deliver every sample once")
        return
    wanted = min(max_batches * (case.batch_size or 256), num_samples)
    if tally.samples != wanted:
        raise RuntimeError(f"{case.dataset}: an epoch of {max_batches} batches delivered "
                           f"{tally.samples} samples, expected {wanted}")
    indices = tally.indices()
    if len(np.unique(indices)) != len(indices):
        raise RuntimeError(f"{case.dataset}: an epoch of {max_batches} batches delivered a "
                           "sample twice")


def order_quality(case: Case, reader) -> dict[str, tuple[float, str]]:
    """How well the case's epoch order is shuffled (``bench.shuffle_quality``), as
    ``shuffle.*`` metrics: a pure function of its sampler, computed apart from the timed
    epoch. Block measures only where the format has more than one block."""
    from storebench.bench.shuffle_quality import shuffle_quality

    boundaries = reader.blocks()
    quality = shuffle_quality(make_sampler(case, reader).indices(), num_samples=len(reader),
                              batch_size=case.batch_size or len(reader),
                              boundaries=boundaries if len(boundaries) > 2 else None)
    units = {"1": "ratio", "blocks": "count"}  # the results schema's units
    return {f"shuffle.{name}": (value, units.get(unit, unit))
            for name, (value, unit) in quality.items() if math.isfinite(value)}


# The most epochs one run reads: a guard for a steady minimum a tiny set cannot reach.
MAX_RUN_EPOCHS = 1000


@dataclass
class LoaderRun:
    """The epochs one loader delivered in a run, its steady window, the read-ahead it
    skipped and whether its workers persisted across the epochs."""

    epochs: list[EpochTally]
    window: SteadyWindow
    read_ahead: int
    persistent: bool

    @property
    def samples(self) -> int:
        return sum(epoch.samples for epoch in self.epochs)


def steady_minimum(case: Case, trial: Trial) -> SteadyMinimum | None:
    """What a timed repeat's steady window must hold (the case's ``steady_batches`` and
    ``steady_seconds``, from the plan); None in the warm-up, which reads its few batches."""
    if trial.warmup:
        return None
    return SteadyMinimum(case.steady_batches, case.steady_seconds)


def _epoch_source(case: Case, loader, num_samples: int):
    """``epoch(number)`` -> the batches of that epoch of ``loader``: a new pass over it, or
    for tf.data one stretch of ``num_samples`` samples of its pipeline repeated, so that its
    runtime and read-ahead run on across epochs (batches are made before the repeat and so
    never straddle two)."""
    if case.prefetcher != "tf_data":
        return lambda number: loader
    batches = iter(loader.repeat())

    def stretch(number: int):
        taken = 0
        while taken < num_samples:
            batch = next(batches)
            taken += batch_size_bytes(batch)[0]
            yield batch

    return stretch


def run_loader(case: Case, loader, sampler, *, started: float, num_samples: int,
               max_batches: int | None, minimum: SteadyMinimum | None) -> LoaderRun:
    """Epochs of ``loader`` (``sampler``'s epoch set before each) until its steady window
    holds ``minimum`` (see ``storebench.studies.steady``); one epoch where ``minimum`` is
    None (the warm-up) or a cold lazy read (a later epoch would read the cache). A path
    that starts its workers per pass skips its read-ahead again each epoch."""
    from .steady import PER_PASS_PATHS, persists_workers, read_ahead_batches

    skip = read_ahead_batches(loader, prefetcher=case.prefetcher,
                              batch_size=case.batch_size or 256,
                              # a buffer holds no more than an epoch's samples
                              shuffle_buffer=min(int(case.param("shuffle_buffer", 4096)),
                                                 num_samples),
                              shuffle=case.access != "sequential")
    run = LoaderRun([], SteadyWindow(skip=skip), skip,
                    persists_workers(case.prefetcher, case.workers))
    one_epoch = minimum is None or (case.cache == "cold" and case.loader != "preloaded")
    epoch = _epoch_source(case, loader, num_samples)
    while len(run.epochs) < MAX_RUN_EPOCHS:
        if run.epochs and case.prefetcher in PER_PASS_PATHS:
            run.window.restart()
        if sampler is not None:
            sampler.set_epoch(len(run.epochs))
        before = run.window.batches
        tally = drain(epoch(len(run.epochs)), max_batches=max_batches,
                      started=started if not run.epochs else time.perf_counter(),
                      window=run.window if minimum else None, minimum=minimum)
        tally.ended_at = epoch_ended(tally, max_batches)
        run.epochs.append(tally)
        if (one_epoch or tally.stopped or run.window.met(minimum) or not tally.batches
                or (case.prefetcher in PER_PASS_PATHS and run.window.batches == before)):
            break
    return run


def check_run(case: Case, run: LoaderRun, num_samples: int, max_batches: int | None) -> None:
    """Every epoch of the run delivered its samples once (``check_epoch``)."""
    for tally in run.epochs:
        check_epoch(case, tally, num_samples, max_batches)


def steady_span(first: EpochTally, window: SteadyWindow, *,
                ready: float) -> tuple[int, int, float]:
    """(samples, image bytes, seconds) a run's throughput is timed over: its steady window;
    where that holds no batch (a cold epoch shorter than the read-ahead), its first epoch
    after its first batch (``first.ended_at`` set); one batch alone, from ``ready``."""
    if window.batches:
        return window.samples, window.nbytes, window.seconds
    if first.batches > 1:
        return (first.samples - first.first_samples, first.delivered - first.first_bytes,
                first.ended_at - first.first_batch_at)
    # one batch: nothing after it to time
    return first.samples, first.delivered, first.ended_at - ready


def run_metrics(run: LoaderRun, *, started: float, ready: float,
                set_samples: int) -> dict[str, tuple[float, str]]:
    """A run's throughput over its steady window and what that window covered. A run whose
    window holds no batch (a cold epoch shorter than the read-ahead) falls back to its first
    epoch after its first batch, and says so with ``steady_batches`` 0."""
    first, window = run.epochs[0], run.window
    samples, nbytes, seconds = steady_span(first, window, ready=ready)
    rate = samples / seconds
    return {
        "samples_per_s": (rate, "samples/s"),
        "read_MBps": (nbytes / seconds / MB, "MB/s"),
        "epoch_seconds": (first.ended_at - ready, "s"),
        # An epoch of the whole set: its start-up (the dataset ready to the first batch),
        # then the set at the steady rate; what a preload is weighed against.
        "set_epoch_seconds": (first.first_batch_at - ready + set_samples / rate, "s"),
        "steady_batches": (window.batches, "count"),
        "steady_seconds": (window.seconds, "s"),
        "steady_epochs": (len(run.epochs), "count"),
        "read_ahead_batches": (run.read_ahead, "count"),
    }


def loader_epoch_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """Epochs through reader -> dataset -> sampler -> loader path, one fresh loader per
    repeat (its workers started in the timed region), start-up and steady state apart:
    ``time_to_first_batch_s`` from before the dataset is made (a preload counts, and is
    also reported alone as ``preload_seconds``) to the first batch; ``samples_per_s`` and
    ``read_MBps`` over the steady window only (``storebench.studies.steady``: the batches
    after the loader's read-ahead, ``steady_batches`` of them over ``steady_seconds``,
    across ``steady_epochs`` epochs of the same loader where its workers persist,
    ``persistent_workers``); ``epoch_seconds`` is the first epoch's own time and
    ``set_epoch_seconds`` an epoch of the whole set (start-up, then the steady rate)."""
    from storebench.formats import open_dataset

    from .steady import has_workers

    reader = open_dataset(case.dataset, verify=False, **open_options(case))
    max_batches = trial.batches_wanted(case.param("max_batches"), samples=len(reader))
    minimum = steady_minimum(case, trial)
    close = dataset = None
    orders = ram_orders(case)
    try:
        with trial.measure() as measurement:
            started = time.perf_counter()
            dataset = make_dataset(case, reader, warmup=trial.warmup)
            ready = time.perf_counter()
            sampler = make_sampler(case, reader, first=capped_samples(case, max_batches))
            loader, close = open_batches(case, dataset, sampler)
            run = run_loader(case, loader, sampler, started=started, num_samples=len(reader),
                             max_batches=max_batches, minimum=minimum)
        check_run(case, run, len(reader), max_batches)
        more = {} if trial.warmup else order_quality(case, reader)
        if orders and not trial.warmup:
            if close is not None:  # the timed run's loader stops before the next starts
                closing, close = close, None
                closing()
            more |= ram_order_epochs(case, orders, dataset, reader, max_batches, minimum)
    finally:
        release(reader, dataset=dataset, close=close)
    if trial.warmup:
        return {"samples": (run.samples, "count")}
    if has_workers(case.prefetcher, case.workers):
        more["persistent_workers"] = (float(run.persistent), "count")
    return {
        "samples": (run.samples, "count"),
        "time_to_first_batch_s": (run.epochs[0].first_batch_seconds, "s"),
        **run_metrics(run, started=started, ready=ready, set_samples=len(reader)),
        "preload_seconds": (ready - started, "s"),
        "cpu_utilisation": (measurement.cpu_seconds / measurement.wall_seconds, "ratio"),
        **more,
    }


def recipe_epoch_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """One epoch of a recipe's whole pipeline (``storebench.recipes``, named by the
    ``recipe`` param) over ``case.dataset``, a fresh pipeline per repeat: ``samples_per_s``
    from its start to the last batch read (at most the case's ``epoch_samples``), so its
    workers' start counts, as it does for a user's epoch."""
    from storebench.formats import read_manifest
    from storebench.recipes import get_recipe

    recipe = get_recipe(case.param("recipe"))
    num_samples = int(read_manifest(case.dataset)["num_samples"])
    max_batches = trial.batches_wanted(None, samples=num_samples)
    run = None
    try:
        with trial.measure():
            started = time.perf_counter()
            run = recipe.open(case.dataset, batch_size=case.batch_size or 64,
                              workers=case.workers or 0, seed=max(trial.repeat, 0))
            tally = drain(run.epoch(0), started=started, max_batches=max_batches)
            seconds = epoch_ended(tally, max_batches) - started
    finally:
        if run is not None:
            run.close()
    if tally.samples == 0:
        raise RuntimeError(f"recipe {recipe.name} over {case.dataset}: delivered no sample")
    return {"samples": (tally.samples, "count"),
            "time_to_first_batch_s": (tally.first_batch_seconds, "s"),
            "samples_per_s": (tally.samples / seconds, "samples/s")}
