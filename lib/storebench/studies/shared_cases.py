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
- params: ``decode`` (None | ``"simplejpeg"`` | ``"pil"`` | ``"auto"`` | ``"tf"``),
  ``resize`` (``"HxW"``: imported images of mixed sizes, resized before batching), ``start_method``,
  ``seed``, ``max_batches``, ``shuffle_buffer`` (tf_data), ``open_<option>`` (format open
  options), ``ram_orders`` (preloaded only: more access orders read from the same preload,
  ``"sequential,shuffle"``; see ``ram_order_epochs``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..bench.case import Case, Trial, open_options

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


def warmup_samples(case: Case, trial: Trial, max_batches: int | None) -> int | None:
    """In the warm-up, the samples of the ``max_batches`` batches it reads, for
    ``make_sampler(first=...)``: its loader then has no batch to read ahead that nobody
    takes (up to a prefetch window of decoded JPEG batches, which its stop waits for). None
    in a timed repeat: a sized epoch's loader keeps reading ahead past its last batch, as in
    the middle of a whole epoch (``epoch_ended``)."""
    if not trial.warmup or max_batches is None:
        return None
    return max_batches * (case.batch_size or 256)


def resize_size(case: Case) -> tuple[int, int] | None:
    """The case's ``resize`` param (``"224x224"``) as (height, width), None when unset."""
    text = case.param("resize")
    if not text:
        return None
    height, _, width = str(text).partition("x")
    return int(height), int(width or height)


def resize_transform(case: Case):
    """The per-sample resize an imported set of mixed sizes needs before batching."""
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
    transform = resize_transform(case)
    if case.loader == "lazy" or (warmup and case.loader == "preloaded"):
        return LazyDataset(reader, decode=decode, transform=transform)
    if case.loader == "preloaded":
        return PreloadedDataset(reader, decode=decode, transform=transform, progress=False)
    raise ValueError(f"case {case.case_id}: loader must be one of {LOADER_KINDS}")


def open_batches(case: Case, dataset, sampler):
    """``(batches, close)`` of the case's loader path (``case.prefetcher``)."""
    from storebench.loaders.paths import PathOptions, get_loader_path

    path = get_loader_path(case.prefetcher)
    options = PathOptions(
        batch_size=case.batch_size or 256, workers=case.workers or 0,
        start_method=case.param("start_method"), seed=int(case.param("seed", 0)),
        root=case.dataset, shuffle_buffer=int(case.param("shuffle_buffer", 4096)),
        resize=resize_size(case), shuffle=case.access != "sequential",
        decode=case.param("decode"), pin_memory=bool(case.param("pin_memory", False)))
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
                     max_batches: int | None) -> dict[str, tuple[float, str]]:
    """After a preloaded case's timed epoch (its loader stopped), an epoch of the same
    preload in each of ``orders``, timed alone: ``<order>.samples_per_s`` and
    ``<order>.epoch_seconds``. A preload reads the set in one order whatever the epoch's, so
    the orders share one instead of each case preloading the set again. They are timed
    outside ``trial.measure()``, whose memory and CPU figures stay the case's own epoch's,
    and after that epoch, so they find what it left warm (allocator, caches): compare them
    with each other first."""
    import dataclasses

    metrics = {}
    for order in orders:
        variant = dataclasses.replace(case, access=order)
        close = None
        try:
            loader, close = open_batches(variant, dataset, make_sampler(variant, reader))
            started = time.perf_counter()
            tally = drain(loader, started=started, max_batches=max_batches)
            ended = epoch_ended(tally, max_batches)
        finally:
            if close is not None:
                close()
        check_epoch(variant, tally, len(reader), max_batches)
        metrics[f"{order}.samples_per_s"] = (tally.samples / (ended - started), "samples/s")
        metrics[f"{order}.epoch_seconds"] = (ended - started, "s")
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
    ``started`` to the first batch, when the last batch had arrived (``perf_counter``), and
    the indices of batches that carry them."""

    samples: int = 0
    delivered: int = 0
    batches: int = 0
    first_batch_seconds: float = float("nan")
    last_batch_at: float = float("nan")
    seen: list = field(default_factory=list)

    def indices(self) -> np.ndarray:
        return np.concatenate(self.seen) if self.seen else np.empty(0, dtype=np.int64)


def drain(loader, *, started: float, max_batches: int | None) -> EpochTally:
    """Iterate ``loader`` to its end (or ``max_batches``), counting what it delivers."""
    tally = EpochTally()
    for batch in loader:
        n, nbytes, indices = batch_size_bytes(batch)
        if tally.batches == 0:
            tally.first_batch_seconds = time.perf_counter() - started
        tally.samples += n
        tally.delivered += nbytes
        tally.batches += 1
        if indices is not None:
            tally.seen.append(np.array(indices))
        tally.last_batch_at = time.perf_counter()
        if max_batches is not None and tally.batches >= max_batches:
            break
    return tally


def epoch_ended(tally: EpochTally, max_batches: int | None) -> float:
    """When an epoch ended: now for a whole one (its loader's own end of epoch counts, as in
    training), at its last batch for one stopped at ``max_batches``: stopping a loader
    mid-epoch (in-flight batches, workers shut down early) is work no whole epoch does."""
    return time.perf_counter() if max_batches is None else tally.last_batch_at


def check_epoch(case: Case, tally: EpochTally, num_samples: int,
                max_batches: int | None) -> None:
    """A whole epoch (``max_batches`` None) delivered every sample once; one capped at
    ``max_batches`` (``Trial.batches_wanted``) delivered that many batches' samples (or the
    whole set, where they outnumber it), none twice."""
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


def loader_epoch_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """One epoch (or ``max_batches`` batches) through reader -> dataset -> sampler ->
    loader path, timed from before the dataset is made: a preload counts in
    ``time_to_first_batch_s`` and is also reported alone as ``preload_seconds``; an epoch's
    own time is ``epoch_seconds`` and the throughput figures use it; ``set_epoch_seconds``
    is an epoch of the whole set at that rate (the same where the epoch was whole)."""
    from storebench.formats import open_dataset

    reader = open_dataset(case.dataset, verify=False, **open_options(case))
    max_batches = trial.batches_wanted(case.param("max_batches"), samples=len(reader))
    close = dataset = None
    orders = ram_orders(case)
    try:
        with trial.measure() as measurement:
            started = time.perf_counter()
            dataset = make_dataset(case, reader, warmup=trial.warmup)
            ready = time.perf_counter()
            sampler = make_sampler(case, reader,
                                   first=warmup_samples(case, trial, max_batches))
            loader, close = open_batches(case, dataset, sampler)
            tally = drain(loader, started=started, max_batches=max_batches)
            ended = epoch_ended(tally, max_batches)
        check_epoch(case, tally, len(reader), max_batches)
        more = {} if trial.warmup else order_quality(case, reader)
        if orders and not trial.warmup:
            if close is not None:  # the timed epoch's loader stops before the next starts
                closing, close = close, None
                closing()
            more |= ram_order_epochs(case, orders, dataset, reader, max_batches)
    finally:
        release(reader, dataset=dataset, close=close)
    samples = tally.samples
    epoch = ended - ready
    return {
        "samples": (samples, "count"),
        "samples_per_s": (samples / epoch, "samples/s"),
        "read_MBps": (tally.delivered / epoch / MB, "MB/s"),
        "time_to_first_batch_s": (tally.first_batch_seconds, "s"),
        "epoch_seconds": (epoch, "s"),
        # An epoch of the whole set at this repeat's rate: the epoch itself when it was
        # whole; what a preload (always of the whole set) is weighed against.
        "set_epoch_seconds": (epoch * len(reader) / samples, "s"),
        "preload_seconds": (ready - started, "s"),
        "cpu_utilisation": (measurement.cpu_seconds / measurement.wall_seconds, "ratio"),
        **more,
    }
