"""The peers study's case functions: epoch 1 and the later epochs through one loader path
(ours, a framework's or a peer library's own pipeline), and the skipped row of a peer
dataset that could not be built. The grid, figures and findings live in
``storebench.studies.peers``.

A case runs in the environment its path and format need (param ``environment``; the runner
picks the interpreter). It is timed from before the loader is made, so the first epoch's
time to first batch holds what a user waits for before training starts: worker start, index
reading, DALI's pipeline build. The case has no untimed warm-up: its first repeat runs in the
fresh process, so it also pays the library's imports and FFCV's JIT compilation, reported
as ``fresh_process_first_batch_s`` (that repeat only). Epoch 1's rate counts the samples
after its first batch over the time after it, so start-up and throughput are reported
apart. A loader that runs an engine beside its workers (Ray Data) adds the engine's own
metrics (``engine_metrics()``: its system processes' CPU seconds, its object store's spills).
The later epochs run on the same loader object, as a training loop's do, until they
took ``LATER_EPOCHS_MIN_S`` (a cached raw epoch lasts milliseconds):
``later_epochs_samples_per_s`` is all their samples over all their time, epoch boundaries
included (the steady state a training job sees); ``epoch2_first_batch_s`` is the wait at
the first boundary. A case with param ``later_epochs`` false (the study's cold rows) stops
after epoch 1: what its later epochs would read is cached by then, the warm row's
measurement again.

Shuffle quality is measured from the delivered order of epoch 1 (paths that report each
sample's index): ``order_correlation``, the Spearman correlation of delivery position with
sample index (0 for a random permutation, 1 for stored order), and ``shuffle_spread``, the
median distance between consecutively delivered samples over what a uniform random
permutation gives (1 - 1/sqrt 2 of the dataset): near 1 for a full permutation, small where
a shuffle buffer only mixes neighbours.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ...bench.case import Case, CaseSkipped, Trial
from ..shared_cases import (
    batch_size_bytes,
    make_dataset,
    make_sampler,
    open_batches,
    release,
    sample_transform,
)

# The median |i - j| of two independent uniform positions, as a fraction of n.
UNIFORM_SPREAD = 1 - 1 / math.sqrt(2)
# Epochs after the first run until they took LATER_EPOCHS_MIN_S and the case's steady
# minimum (``Case.steady_batches``, ``steady_seconds``; at least one epoch, at most
# LATER_EPOCHS_MAX): a 20 ms epoch of cached raw arrays is too short to time alone. A
# quarter second: a dozen epochs of the cached 4,000-sample raw set at 200k samples/s, and
# still one epoch of the cached JPEG set (about 0.5 s at the study's 2 workers), where half
# a second added a quarter second to every warm raw repeat and a whole second took two
# JPEG epochs.
LATER_EPOCHS_MIN_S = 0.25
# 100 epochs: a second of 10 ms epochs (2,048 cached raw samples at 200k samples/s). It
# binds on the synthetic raw set only: an epoch of the training-set cut (1,280 samples,
# decoded or cropped) lasts a large fraction of a second or more, so the steady minimum
# ends the loop after one to a few epochs, whatever this cap.
LATER_EPOCHS_MAX = 100
# Samples of the first batches of epochs 1 and 2 compared with the build after timing: a
# few, so that the copies kept for it add little to the peak memory measured.
CHECKED_BATCHES = 2
CHECKED_SAMPLES = 8
CHECKED_EPOCHS = 2
PEER_DECODER_TOLERANCE = 2.0  # mean absolute grey levels per image
# FFmpeg's swscale (spdl.io) upsamples chroma unlike libjpeg-turbo: small images with fine
# colour detail (the ci set's 64x64) differ by up to about 2.5 levels, 256x256 ones by < 1.
DECODER_TOLERANCE = {"spdl.io (FFmpeg)": 3.0}


def _path_unavailable(case: Case) -> str | None:
    from ...environments import needs_text
    from ...formats import unavailable_reason
    from ...loaders.paths import get_loader_path

    path = get_loader_path(case.prefetcher)
    return (needs_text(path.libraries, what=f"loader path {path.name!r}")
            or unavailable_reason(case.format) or path.unavailable())


def missing_dataset_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """The row of a path whose dataset is not built: ``skipped``, saying why."""
    reason = _path_unavailable(case)
    raise CaseSkipped(reason or f"{case.dataset} is not built: storebench build --formats "
                      f"{case.format} (in the environment that has its library)")


class _Epoch:
    """What one epoch delivered, and the first batches' images kept for checking."""

    def __init__(self, *, keep: bool) -> None:
        self.keep = keep
        self.samples = self.batches = 0
        self.first_samples = 0
        self.first_batch_at = self.ended_at = math.nan
        self.begun_at = math.nan
        self.indices: list[np.ndarray] = []
        self.kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, batch) -> None:
        n, _, indices = batch_size_bytes(batch)
        if self.batches == 0:
            self.first_batch_at = time.perf_counter()
            self.first_samples = n
        self.samples += n
        self.batches += 1
        if indices is not None:
            self.indices.append(np.array(indices, dtype=np.int64))
            if self.keep and len(self.kept) < CHECKED_BATCHES:
                k = CHECKED_SAMPLES
                self.kept.append((self.indices[-1][:k],
                                  np.array(batch.labels[:k], dtype=np.int64),
                                  np.array(batch.images[:k])))

    def order(self) -> np.ndarray:
        return np.concatenate(self.indices) if self.indices else np.empty(0, np.int64)

    def rate(self) -> float:
        after = self.samples - self.first_samples
        seconds = self.ended_at - self.first_batch_at
        return after / seconds if after and seconds > 0 else math.nan


def _enough_epochs(epochs: list[_Epoch], *, warmup: bool, min_seconds: float,
                   later_epochs: bool = True, min_batches: int = 1) -> bool:
    if warmup or not later_epochs:
        return len(epochs) >= 1
    later = epochs[1:]
    seconds = sum(epoch.ended_at - epoch.begun_at for epoch in later)
    batches = sum(epoch.batches for epoch in later)
    return bool(later) and ((seconds >= min_seconds and batches >= min_batches)
                            or len(later) >= LATER_EPOCHS_MAX)


def _run_epoch(loader, max_batches: int | None, *, keep: bool) -> _Epoch:
    epoch = _Epoch(keep=keep)
    for batch in loader:
        epoch.add(batch)
        if max_batches is not None and epoch.batches >= max_batches:
            break
    epoch.ended_at = time.perf_counter()
    return epoch


def shuffle_quality(order: np.ndarray, n: int) -> tuple[float, float]:
    """(order_correlation, shuffle_spread) of a delivered order of ``n`` samples."""
    if len(order) < 3:
        return math.nan, math.nan
    position = np.arange(len(order), dtype=np.float64)
    ranks = np.argsort(np.argsort(order)).astype(np.float64)
    correlation = float(np.corrcoef(position, ranks)[0, 1])
    gaps = np.abs(np.diff(order.astype(np.int64)))
    spread = float(np.median(gaps)) / (UNIFORM_SPREAD * n)
    return abs(correlation), spread


def _check_epoch(case: Case, reader, epoch: _Epoch, number: int, *, complete: bool) -> None:
    """Exactly the epoch's samples, and the build's labels and images in the first batches:
    identical to our decode, or within ``PEER_DECODER_TOLERANCE`` grey levels per image on
    average where the peer decodes with its own libjpeg-turbo build (FFCV's fast integer
    DCT differs from simplejpeg's default by about one level)."""
    from ...formats import CorruptSampleError
    from ...loaders import LazyDataset

    n = len(reader)
    where = f"{case.dataset}: {case.prefetcher} epoch {number}"
    if complete and epoch.samples != n:
        raise RuntimeError(f"{where} delivered {epoch.samples} samples, the dataset has {n}")
    if not epoch.indices:
        return
    order = epoch.order()
    if complete and not np.array_equal(np.sort(order), np.arange(n)):
        repeated = int(len(order) - len(np.unique(order)))
        raise RuntimeError(f"{where} did not deliver every sample once ({repeated} repeated)")
    from ...loaders.paths import get_loader_path

    decoder = get_loader_path(case.prefetcher).decode
    tolerance = (0 if decoder in ("dataset", "simplejpeg")
                 else DECODER_TOLERANCE.get(decoder, PEER_DECODER_TOLERANCE))
    # A library's own crop op draws its own crops: its images are checked for their
    # shape only. Every other path crops as storebench does, seeded by sample and epoch.
    own_crop = case.param("crop") == "library"
    transform = sample_transform(case)
    with LazyDataset(reader, decode=case.param("decode"),
                     transform=None if own_crop else transform) as reference:
        reference.set_epoch(number - 1)
        for indices, labels, images in epoch.kept:
            wanted = [reference[int(i)] for i in indices]
            if [label for _, label in wanted] != labels.tolist():
                raise RuntimeError(f"{where} delivered labels that differ from the build")
            want = np.stack([image for image, _ in wanted]) if not own_crop else np.empty(
                (len(indices), *transform.output_shape(None, images.shape[-1])), np.uint8)
            if images.shape != want.shape:
                raise RuntimeError(f"{where} delivered images of shape {images.shape}, "
                                   f"expected {want.shape}")
            if own_crop:
                continue
            difference = np.abs(images.astype(np.int16) - want.astype(np.int16))
            bad = difference.reshape(len(indices), -1).mean(axis=1) > tolerance
            if bad.any():
                raise CorruptSampleError(reader.root, int(indices[np.argmax(bad)]),
                                         f"{case.prefetcher} delivered an image that differs "
                                         "from the build")


def peer_epochs_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """Epoch 1, then the later epochs, of ``case.dataset`` through loader path
    ``case.prefetcher`` (ours over our reader and sampler, or a peer's pipeline over its
    own files), ``case.workers`` workers, batch ``case.batch_size``; see the module
    docstring for what is reported."""
    from ...formats import open_dataset

    reason = _path_unavailable(case)
    if reason:
        raise CaseSkipped(reason)
    fresh = trial.repeat == 0  # the case has no warm-up: nothing was imported or compiled
    reader = open_dataset(case.dataset, verify=False)
    max_batches = trial.batches_wanted(None, samples=len(reader))
    close = dataset = None
    epochs: list[_Epoch] = []
    try:
        with trial.measure():
            started = time.perf_counter()
            dataset = make_dataset(case, reader)
            sampler = make_sampler(case, reader) if dataset is not None else None
            loader, close = open_batches(case, dataset, sampler)
            while not _enough_epochs(epochs, warmup=trial.warmup, min_seconds=max(float(
                    case.param("later_epochs_min_s", LATER_EPOCHS_MIN_S)),
                    case.steady_seconds), min_batches=case.steady_batches,
                    later_epochs=bool(case.param("later_epochs", True))):
                if sampler is not None:
                    sampler.set_epoch(len(epochs))
                begun = started if not epochs else time.perf_counter()
                epochs.append(_run_epoch(loader, max_batches,
                                         keep=len(epochs) < CHECKED_EPOCHS))
                epochs[-1].begun_at = begun
        # An engine that runs beside its workers (Ray's GCS and raylet) reports its own CPU
        # and object store use, read before close() shuts it down.
        engine = getattr(loader, "engine_metrics", None)
        engine_metrics = engine() if engine is not None else {}
        complete = max_batches is None
        for number, epoch in enumerate(epochs, start=1):
            _check_epoch(case, reader, epoch, number, complete=complete)
    finally:
        release(reader, dataset=dataset, close=close)
    if trial.warmup:
        return {"samples": (epochs[0].samples, "count")}
    first, later = epochs[0], epochs[1:]
    metrics: dict[str, tuple[float, str]] = {
        "samples": (first.samples, "count"),
        "epoch1_samples_per_s": (first.rate(), "samples/s"),
        "epoch1_first_batch_s": (first.first_batch_at - first.begun_at, "s"),
        # The loader studies' name for it: a fresh loader's start-up, apart from any rate.
        "time_to_first_batch_s": (first.first_batch_at - first.begun_at, "s"),
        "later_epochs": (len(later), "count"),
    }
    if later:
        later_seconds = sum(epoch.ended_at - epoch.begun_at for epoch in later)
        # The later epochs are the steady state: every batch of epoch 1 (the read-ahead
        # of start-up among them) is left out.
        metrics["steady_batches"] = (sum(epoch.batches for epoch in later), "count")
        metrics["steady_seconds"] = (later_seconds, "s")
        metrics["epoch2_first_batch_s"] = (later[0].first_batch_at - later[0].begun_at, "s")
        metrics["later_epochs_samples_per_s"] = (sum(e.samples for e in later) / later_seconds,
                                                 "samples/s")
    if fresh:
        metrics["fresh_process_first_batch_s"] = metrics["epoch1_first_batch_s"]
    metrics.update(engine_metrics)
    if first.indices:
        correlation, spread = shuffle_quality(first.order(), len(reader))
        metrics["order_correlation"] = (correlation, "ratio")
        metrics["shuffle_spread"] = (spread, "ratio")
    return {name: value for name, value in metrics.items() if not math.isnan(value[0])}
