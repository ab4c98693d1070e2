"""The gpu_feed study's case function, apart from its figures and findings so that a case
worker imports only what it runs. The grid lives in ``storebench.studies.gpu_feed.grid``."""

from __future__ import annotations

from ...bench.case import Case, Trial
from ..shared_cases import make_dataset, make_sampler, open_batches, open_options, release

# Batches fed before timing starts, besides those the loader read ahead: worker start-up
# and the first copies.
START_BATCHES = 2


def gpu_feed_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """The case's loader path feeding an accelerator through ``GpuFeeder`` to the device
    named by the ``device`` param, driven by an ``EmulatedAccelerator`` taking
    ``compute_ms`` per batch: AU, the stall split into waiting for data and host copy, and
    host-to-device GB/s: ``h2d_GBps`` from the loader's memory into the device buffer (a
    pinned copy's host staging included), ``h2d_device_GBps`` the device copy alone.

    Timed after ``warmup_batches`` (a metric): ``START_BATCHES`` (param ``warmup``) and as
    many as the loader reads ahead (``read_ahead_batches``), so that the batches timed
    are the steady state's, not a queue filled before the feed began."""
    from storebench.formats import open_dataset
    from storebench.loaders import EmulatedAccelerator, GpuFeeder, read_ahead_batches, run_feed

    device = case.param("device", "cpu")
    reader = open_dataset(case.dataset, verify=False, **open_options(case))
    accelerator = EmulatedAccelerator(float(case.param("compute_ms", 0.0)) / 1000.0)
    close = dataset = None
    try:
        dataset = make_dataset(case, reader)
        loader, close = open_batches(case, dataset, make_sampler(case, reader))
        feeder = GpuFeeder(loader, device=device, pinned=bool(case.param("pinned", False)),
                           non_blocking=bool(case.param("non_blocking", False)))
        if feeder.uses_cuda == bool(case.param("emulated", True)):
            raise RuntimeError(f"case {case.case_id}: says emulated={case.param('emulated')} "
                               f"but copies go to {feeder.device}")
        # Past the start-up batches, and past every batch the loader read ahead before the
        # feed began: timed from the third batch, a slow loader's first ``depth`` batches
        # were waiting already, and AU counted them as fed.
        warmup = int(case.param("warmup", START_BATCHES)) + read_ahead_batches(loader)
        with trial.measure():
            result = run_feed(feeder, accelerator, warmup_batches=warmup,
                              max_batches=trial.batches_wanted(case.param("max_batches"),
                                                                samples=len(reader)))
        stats = feeder.stats()
    finally:
        release(reader, dataset=dataset, close=close)
    copy, device_copy = stats["copy_seconds"], stats["device_copy_seconds"]
    return {
        "samples": (result.samples, "count"),
        "samples_per_s": (result.samples_per_second, "samples/s"),
        "accelerator_utilisation": (result.au, "ratio"),
        "stall_fraction": (result.stall_fraction, "ratio"),
        "wait_for_data_fraction": (result.wait_for_data_fraction, "ratio"),
        "host_copy_fraction": (result.host_copy_fraction, "ratio"),
        "host_overhead_fraction": (result.host_overhead_fraction, "ratio"),
        "h2d_GBps": (stats["bytes"] / copy / 1e9 if copy > 0 else 0.0, "GB/s"),
        "h2d_device_GBps": (stats["bytes"] / device_copy / 1e9 if device_copy > 0 else 0.0,
                            "GB/s"),
        "epoch_seconds": (result.wall_seconds, "s"),
        "warmup_batches": (warmup, "count"),
    }
