"""The gpu_decode study's case functions and its data set, apart from its figures and
findings so that a case worker imports only what it runs (no pandas, no matplotlib).

Three families, each over the study's own ImageNet-like JPEG set (``decode_spec``: 375x500
images, ImageNet's most common size, in LMDB under ``<data>/gpu_decode``):

- ``decode_on_device_case``: one library decodes JPEG batches on the device and crops and
  flips them there (``storebench.loaders.device``); images/s, the CPU cores busy meanwhile
  (process CPU time over wall time, the library's own threads included) and the device's
  memory; each repeat checks one batch against the library's own CPU fallback and against
  our CPU decode.
- ``model_demand_case``: ResNet-50 training steps on data already on the device: the rate
  every feed path must sustain.
- ``cpu_decode_feed_case``: simplejpeg decodes (the whole image, or at a reduced DCT scale)
  in one of our prefetchers with a given number of workers: the rate it delivers alone, the
  CPU cores it keeps busy, then the accelerator utilisation (AU) it gives a model consuming
  ``demand_samples_per_s`` (the ResNet-50 rate where one was measured, else an emulated one).

Every device call goes through a ``Device`` (``storebench.loaders.device``); the param
``device_factory`` names another factory (a test's fake). Where no device is found, the
device cases are skipped rows saying why, and the CPU cases feed an emulated accelerator.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import time
from pathlib import Path

import numpy as np

from data_gen import DatasetSpec

from ...bench.case import Case, CaseSkipped, Trial
from ...loaders.device import DeviceUnavailableError, crop_plan, decode_crop_reference
from ..shared_cases import open_batches, release

DECODE_SET_DIR = "gpu_decode"
DECODE_FORMAT = "lmdb"
# ImageNet's most common image size (height x width); the samples are data_gen's synthetic
# shapes, smaller in bytes than photographs of that size (each row says how many).
DECODE_HEIGHT, DECODE_WIDTH = 375, 500
DECODE_SEED = 5
# Enough 256-sample batches for a steady state and little build time on a borrowed GPU.
DECODE_SAMPLES = {"ci": 128}
DEFAULT_DECODE_SAMPLES = 2048
DEVICE_FACTORY = "storebench.loaders.device:open_device"
# Untimed batches before each repeat (a decoder's first calls allocate; cudnn picks its
# kernels on the model's first steps).
DEVICE_WARMUP_BATCHES = 2
MODEL_WARMUP_STEPS = 3
MODEL_TIMED_STEPS = 20
# The crop's resize is ours on both sides: a mean difference of one grey level leaves room
# for another IDCT and chroma upsampling (nvJPEG, the hardware decoder) than libjpeg-turbo's.
FALLBACK_TOLERANCE_LEVELS = 1.0
# Batches a prefetcher feeds before timing starts, besides those it read ahead.
START_BATCHES = 2


def decode_spec(profile: str) -> DatasetSpec:
    """The study's JPEG set for ``profile``: ``DECODE_SAMPLES`` of it (2,048 by default)."""
    return DatasetSpec(DECODE_SAMPLES.get(profile, DEFAULT_DECODE_SAMPLES), DECODE_HEIGHT,
                       DECODE_WIDTH, encoding="jpeg", seed=DECODE_SEED)


def decode_set_path(data_dir: Path | str) -> Path:
    return Path(data_dir) / DECODE_SET_DIR / f"{DECODE_FORMAT}-jpeg"


# -- the device --------------------------------------------------------------------------
def resolve(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@contextlib.contextmanager
def case_device(case: Case):
    """The case's ``Device`` (param ``device_factory``, default ``open_device``), closed
    after; ``CaseSkipped`` with the reason where there is none."""
    try:
        device = resolve(case.param("device_factory", DEVICE_FACTORY))()
    except DeviceUnavailableError as err:
        raise CaseSkipped(str(err)) from err
    try:
        yield device
    finally:
        device.close()


def feed_device(case: Case) -> str:
    """Where the CPU decode cases copy their batches: the device's ``feed_device``, or
    ``"cpu"`` (an emulated accelerator) where there is no device."""
    try:
        with case_device(case) as device:
            return device.feed_device
    except CaseSkipped:
        return "cpu"


@contextlib.contextmanager
def opened(decoder):
    try:
        yield decoder
    finally:
        decoder.close()


# -- the data ----------------------------------------------------------------------------
def require_built(case: Case) -> None:
    """``CaseSkipped`` where the case's set is not built (``grid.prepare`` builds it)."""
    from storebench.formats import MANIFEST_NAME

    if not (Path(case.dataset) / MANIFEST_NAME).is_file():
        raise CaseSkipped(f"{case.dataset} is not built (storebench run --study gpu_decode "
                          "builds it)")


def load_encoded(case: Case) -> list[bytes]:
    """Every JPEG of the case's set, read (and checked) into memory before anything is
    timed: the decode cases measure decoding, not reading."""
    from storebench.formats import open_dataset

    require_built(case)
    reader = open_dataset(case.dataset, verify=True)
    try:
        images, _ = reader.read_many(np.arange(len(reader)))
        return [bytes(image) for image in images]
    finally:
        reader.close()


def batch_indices(num_samples: int, batch_size: int, samples: int, *, seed: int) -> list:
    """Index arrays of ``samples`` samples (at least one batch), in batches of
    ``batch_size``, from shuffled passes over the set (``default_rng([seed, pass])``)."""
    passes = max(1, math.ceil(samples / num_samples))
    order = np.concatenate([np.random.default_rng([seed, p]).permutation(num_samples)
                            for p in range(passes)])
    count = max(1, samples // batch_size)
    return [order[k * batch_size:(k + 1) * batch_size] for k in range(count)]


# -- decode on the device -----------------------------------------------------------------
def hw_decoder_load(case: Case) -> float | None:
    """The param ``hw_decoder_load``: a share of the work for the hardware JPEG decoder,
    or None (``"default"``) for DALI's own default."""
    value = case.param("hw_decoder_load", "default")
    return None if value == "default" else float(value)


def diff_metrics(prefix: str, got: np.ndarray, expected: np.ndarray) -> dict:
    if got.shape != expected.shape:
        raise RuntimeError(f"{prefix}: decoded to {got.shape}, expected {expected.shape}")
    diff = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    return {f"{prefix}_mean_diff_levels": (float(diff.mean()), "count"),
            f"{prefix}_max_diff_levels": (float(diff.max()), "count"),
            f"{prefix}_equal_fraction": (float((diff == 0).mean()), "ratio")}


def decode_on_device_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """Param ``library`` (``storebench.loaders.device.DECODE_LIBRARIES``) decodes
    ``timed_samples`` samples in ``case.batch_size`` batches on the device, crops and flips
    them there: ``samples_per_s`` (images/s), ``cpu_cores_busy``, the device's memory.
    Then one batch is decoded by the library's CPU fallback and by our CPU decode: the
    differences are metrics, and more than ``FALLBACK_TOLERANCE_LEVELS`` on average from
    the fallback fails the case."""
    library = str(case.param("library"))
    batch_size = case.batch_size or 256
    seed = int(case.param("seed", 0))
    with trial.kept("device", lambda: case_device(case)) as device:
        encoded = load_encoded(case)
        shape = (DECODE_HEIGHT, DECODE_WIDTH)
        options = {"batch_size": batch_size, "hw_decoder_load": hw_decoder_load(case)}
        decoder = trial.kept("decoder", lambda: opened(device.open_decoder(library, **options)))
        with decoder as decoder:
            batches = batch_indices(len(encoded), batch_size,
                                    int(case.param("timed_samples", len(encoded))), seed=seed)
            plans = [crop_plan([shape] * len(idx), seed=seed, batch=b)
                     for b, idx in enumerate(batches)]
            for b in range(DEVICE_WARMUP_BATCHES):
                decoder.run([encoded[i] for i in batches[b % len(batches)]],
                            plans[b % len(plans)])
            device.synchronize()
            device.reset_memory_peak()
            with trial.measure() as region:
                for idx, plan in zip(batches, plans, strict=True):
                    decoder.run([encoded[i] for i in idx], plan)
                device.synchronize()
            memory = device.memory()
            first = [encoded[i] for i in batches[0]]
            got = decoder.to_host(decoder.run(first, plans[0]))
        fallback = trial.kept("fallback",
                              lambda: opened(device.open_decoder(library, on_cpu=True, **options)))
        with fallback as fallback:
            expected = fallback.to_host(fallback.run(first, plans[0]))
    checks = {**diff_metrics("fallback", got, expected),
              **diff_metrics("ours", got, decode_crop_reference(first, plans[0]))}
    mean = checks["fallback_mean_diff_levels"][0]
    if mean > FALLBACK_TOLERANCE_LEVELS:
        raise RuntimeError(f"case {case.case_id}: {library} on the device differs from its own "
                           f"CPU fallback by {mean:.2f} grey levels on average (tolerance "
                           f"{FALLBACK_TOLERANCE_LEVELS})")
    samples = sum(len(idx) for idx in batches)
    return {
        "samples": (samples, "count"),
        "samples_per_s": (samples / region.wall_seconds, "samples/s"),
        "cpu_cores_busy": (region.cpu_seconds / region.wall_seconds, "ratio"),
        "torch_peak_bytes": (memory["torch_peak_bytes"], "bytes"),
        "device_used_bytes": (memory["device_used_bytes"], "bytes"),
        "jpeg_bytes_per_sample": (sum(map(len, encoded)) / len(encoded), "bytes"),
        **checks,
    }


# -- the model's demand -------------------------------------------------------------------
def model_demand_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """``MODEL_TIMED_STEPS`` ResNet-50 training steps of ``case.batch_size`` on the device,
    after ``MODEL_WARMUP_STEPS`` untimed: ``samples_per_s`` is what a feed must sustain."""
    batch_size = case.batch_size or 256
    with trial.kept("device", lambda: case_device(case)) as device:
        steps = trial.kept("model", lambda: contextlib.nullcontext(
            device.model_steps(batch_size=batch_size)))
        with steps as steps:
            steps(MODEL_WARMUP_STEPS)
            device.synchronize()
            device.reset_memory_peak()
            with trial.measure() as region:
                steps(MODEL_TIMED_STEPS)
                device.synchronize()
            memory = device.memory()
    samples = batch_size * MODEL_TIMED_STEPS
    return {
        "samples": (samples, "count"),
        "samples_per_s": (samples / region.wall_seconds, "samples/s"),
        "step_seconds": (region.wall_seconds / MODEL_TIMED_STEPS, "s"),
        "cpu_cores_busy": (region.cpu_seconds / region.wall_seconds, "ratio"),
        "torch_peak_bytes": (memory["torch_peak_bytes"], "bytes"),
        "device_used_bytes": (memory["device_used_bytes"], "bytes"),
    }


# -- CPU decode through our prefetcher ----------------------------------------------------
class PassesSampler:
    """``passes`` shuffled orders of ``num_samples`` indices, one after the other
    (``default_rng([seed, pass])``): enough batches for a prefetcher to reach its steady
    state, read ahead and be timed twice on a set of a few thousand samples."""

    def __init__(self, num_samples: int, *, passes: int, seed: int = 0) -> None:
        self.num_samples, self.passes, self.seed = num_samples, passes, seed

    def indices(self) -> np.ndarray:
        return np.concatenate([np.random.default_rng([self.seed, p]).permutation(
            self.num_samples) for p in range(self.passes)])

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples * self.passes


def timed_batches(least: int, workers: int) -> int:
    """Batches to time: at least ``least`` and four per worker, a whole number of rounds
    of ``workers``. Workers finish batches in waves, one each: a count that is not a whole
    number of waves, or only a few of them, times a wave's arrival and not its making."""
    rounds = max(1, workers)
    return rounds * max(math.ceil(least / rounds), 4)


def cpu_decoded_dataset(case: Case, reader):
    """The case's dataset: simplejpeg decodes each sample whole (param ``decode`` "full"),
    or at the smallest DCT scale that keeps the crop's size ("reduced")."""
    from storebench.loaders import LazyDataset
    from storebench.loaders.device import CROP_SIZE
    from storebench.loaders.transforms import ScaledJpegDecode

    decode = case.param("decode", "full")
    if decode == "full":
        return LazyDataset(reader, decode="simplejpeg")
    if decode != "reduced":
        raise ValueError(f"case {case.case_id}: decode must be 'full' or 'reduced', got "
                         f"{decode!r}")
    scaled = ScaledJpegDecode(CROP_SIZE, CROP_SIZE)
    return LazyDataset(reader, transform=scaled, output_shape=scaled.scaled_shape(reader[0][0]))


def cpu_decode_feed_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """Our prefetcher (``case.prefetcher`` with ``case.workers`` workers) decoding with
    simplejpeg: past ``START_BATCHES`` and its read-ahead, ``timed_batches`` drained as
    fast as it delivers them (``samples_per_s``, ``cpu_cores_busy`` of the process tree),
    then ``timed_batches`` fed through ``GpuFeeder`` to an accelerator consuming
    ``demand_samples_per_s`` (``accelerator_utilisation``, ``fed_samples_per_s``)."""
    from storebench.formats import open_dataset
    from storebench.loaders import EmulatedAccelerator, GpuFeeder, read_ahead_batches, run_feed
    from storebench.loaders.prefetch import default_depth
    from storebench.studies.shared_cases import drain

    require_built(case)
    demand = float(case.param("demand_samples_per_s"))
    # The feed runs at the demand's pace whatever the workers: its batches do not grow with
    # them (at the model's rate, 64 batches would take seconds a repeat).
    fed_batches = int(case.param("timed_batches", 8))
    timed = timed_batches(fed_batches, case.workers or 0)
    batch_size = case.batch_size or 256
    reader = open_dataset(case.dataset, verify=False)
    close = dataset = None
    try:
        dataset = cpu_decoded_dataset(case, reader)
        # Batches consumed: the start and the read-ahead, the drained ones, then the feed's
        # start and its timed ones; one more, so that no pass ends on the last.
        ahead = default_depth(case.workers) if case.workers else 0
        wanted = 2 * START_BATCHES + ahead + timed + fed_batches + 1
        sampler = PassesSampler(len(reader), passes=math.ceil(wanted * batch_size / len(reader)),
                                seed=int(case.param("seed", 0)))
        loader, close = open_batches(case, dataset, sampler)
        ahead = read_ahead_batches(loader)
        batches = iter(loader)
        drain(batches, started=time.perf_counter(), max_batches=START_BATCHES + ahead)
        with trial.measure() as region:
            tally = drain(batches, started=time.perf_counter(), max_batches=timed)
        # Only now, with the workers forked: a CUDA context is not to be inherited.
        target = feed_device(case)
        feeder = GpuFeeder(batches, device=target)
        fed = run_feed(feeder, EmulatedAccelerator.for_throughput(demand),
                       warmup_batches=START_BATCHES, max_batches=fed_batches)
        shape = dataset.sample_shape
    finally:
        release(reader, dataset=dataset, close=close)
    return {
        "samples": (tally.samples, "count"),
        "samples_per_s": (tally.samples / region.wall_seconds, "samples/s"),
        "cpu_cores_busy": (region.cpu_seconds / region.wall_seconds, "ratio"),
        "accelerator_utilisation": (fed.au, "ratio"),
        "fed_samples_per_s": (fed.samples_per_second, "samples/s"),
        "wait_for_data_fraction": (fed.wait_for_data_fraction, "ratio"),
        "demand_samples_per_s": (demand, "samples/s"),
        "device_copies": (float(target != "cpu"), "count"),
        "decoded_height": (shape[0], "count"),
        "decoded_width": (shape[1], "count"),
        "warmup_batches": (START_BATCHES + ahead, "count"),
    }
