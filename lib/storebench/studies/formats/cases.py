"""The formats study's case functions (build cost from the manifest, timed sequential and
random batched reads), apart from its figures and findings so that a case worker imports
numpy and the readers only. The grid lives in ``storebench.studies.formats.grid``."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ...bench.case import Case, Trial
from ..shared_cases import DIFFERS_FROM_BUILD, open_options

MB = 1e6
# A time-bounded read stops only after this many batches: enough for a rate.
MIN_TIMED_BATCHES = 4


def build_cost_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """What building the dataset cost and how big it is, from its manifest (no timing here:
    the build was timed when it ran, with ``os.sync`` included)."""
    from storebench.formats import read_manifest

    manifest = read_manifest(case.dataset)
    write_seconds = float(manifest["write_seconds"])
    raw = int(manifest["raw_bytes"])
    return {
        "write_seconds": (write_seconds, "s"),
        "write_MBps": (raw / write_seconds / MB, "MB/s"),
        "bytes_apparent": (manifest["bytes_apparent"], "bytes"),
        "bytes_allocated": (manifest["bytes_allocated"], "bytes"),
        "raw_bytes": (raw, "bytes"),
        "size_ratio": (manifest["bytes_apparent"] / raw, "ratio"),
        "file_count": (manifest["file_count"], "count"),
        # Per-sample figures divide by this: a set of many image sizes has no one shape.
        "samples": (manifest["num_samples"], "count"),
    }


def _timed_batched_reads(
    case: Case, trial: Trial, order_for: Callable[[int], np.ndarray], *,
    seconds: float | None = None,
) -> dict[str, tuple[float, str]]:
    """Read the samples ``order_for(len(dataset))`` names, in batches of ``case.batch_size``
    through ``Reader.read_many`` (raw batches into one reused buffer), without per-sample
    checksum verification, which the last batch gets afterwards instead; with ``seconds``,
    stop at the first batch that ends past that many seconds once ``MIN_TIMED_BATCHES``
    were read (``samples`` says how many were).

    A warm sequential read is then timed once more, right after, through a reader that
    checks every sample's CRC32C (``verify=True``, the library's default):
    ``verify_time_ratio`` is that pass's time over the first's, what the default mode costs
    on the same reads in the same cache state (``verified.samples_per_s`` its rate).

    Params named ``open_<option>`` are passed to ``open_dataset`` as ``<option>`` (e.g.
    ``open_madvise_random=True``).
    """
    from storebench.formats import open_dataset, read_manifest

    batch_size = case.batch_size or 256
    file_bytes = read_manifest(case.dataset)["bytes_apparent"]
    with open_dataset(case.dataset, verify=False, **open_options(case)) as reader:
        order = order_for(len(reader))
        wanted = trial.batches_wanted(None)
        if wanted is not None:
            order = order[: wanted * batch_size]
        batches_of = _batch_reader(reader, len(order), batch_size)
        samples = returned_bytes = batches = 0
        cut = False
        first_batch_seconds = float("nan")
        with trial.measure() as measurement:
            started = time.perf_counter()
            deadline = started + seconds if seconds is not None else float("inf")
            for start in range(0, len(order), batch_size):
                indices = order[start:start + batch_size]
                images, labels = batches_of(indices)
                if samples == 0:
                    first_batch_seconds = time.perf_counter() - started
                samples += len(indices)
                returned_bytes += (
                    images.nbytes if reader.is_raw else sum(len(image) for image in images)
                )
                batches += 1
                if batches >= MIN_TIMED_BATCHES and time.perf_counter() >= deadline:
                    cut = True
                    break
        reader.check_batch(indices, images, labels, problem=DIFFERS_FROM_BUILD)
    if not cut and samples != len(order):
        raise RuntimeError(f"{case.dataset}: read {samples} samples, asked for {len(order)}")
    seconds = measurement.wall_seconds
    verified = {}
    if case.cache == "warm" and case.access == "sequential" and not trial.warmup:
        verified_s = _verified_pass(case, order[:samples], batch_size)
        verified = {
            "verified.samples_per_s": (samples / verified_s, "samples/s"),
            "verify_time_ratio": (verified_s / seconds, "ratio"),
        }
    return {
        "samples": (samples, "count"),
        "samples_per_s": (samples / seconds, "samples/s"),
        "read_MBps": (returned_bytes / seconds / MB, "MB/s"),
        # The whole dataset's bytes per second of reading: for random batches, how much of
        # the file they cost, not what they delivered.
        "file_MBps": (file_bytes / seconds / MB, "MB/s"),
        "time_to_first_batch_s": (first_batch_seconds, "s"),
        "cpu_utilisation": (measurement.cpu_seconds / seconds, "ratio"),
        **verified,
    }


def _batch_reader(reader, count: int, batch_size: int) -> Callable:
    """``read_many`` for the batches of a ``count``-sample order: full raw batches go into
    one reused buffer (a fresh array per batch would time its allocation too)."""
    out = (np.empty((min(batch_size, count), *reader.spec.image_shape), dtype=np.uint8)
           if reader.is_raw else None)

    def read(indices: np.ndarray):
        full = out is not None and len(indices) == len(out)
        return reader.read_many(indices, out=out if full else None)

    return read


def _verified_pass(case: Case, order: np.ndarray, batch_size: int) -> float:
    """Seconds to read ``order`` as ``_timed_batched_reads`` does, through a reader that
    checks each sample's CRC32C (a mismatch raises ``CorruptSampleError``)."""
    from storebench.formats import open_dataset

    with open_dataset(case.dataset, verify=True, **open_options(case)) as reader:
        batches_of = _batch_reader(reader, len(order), batch_size)
        started = time.perf_counter()
        for start in range(0, len(order), batch_size):
            batches_of(order[start:start + batch_size])
        return time.perf_counter() - started


def sequential_read_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """Every sample in index order (see ``_timed_batched_reads``)."""
    return _timed_batched_reads(case, trial, lambda count: np.arange(count))


def random_read_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """``random_samples`` samples (param; default every sample) at shuffled indices, or
    fewer where ``random_seconds`` (param) ran out first (see ``_timed_batched_reads``):
    what a format's unit of I/O (chunk, row group, shard) costs a random batch."""

    def shuffled(count: int) -> np.ndarray:
        wanted = min(int(case.param("random_samples", count)), count)
        return np.random.default_rng(int(case.param("seed", 0))).permutation(count)[:wanted]

    seconds = case.param("random_seconds")
    return _timed_batched_reads(case, trial, shuffled,
                                seconds=None if seconds is None else float(seconds))
