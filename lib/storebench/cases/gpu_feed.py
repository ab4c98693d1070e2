"""The gpu_feed study's case function, apart from its figures and findings so that a case
worker imports only what it runs. The grid lives in ``storebench.studies.gpu_feed``."""

from __future__ import annotations

from ..bench.cases import make_dataset, make_sampler, open_batches, open_options, release
from ..bench.runner import Case, Trial


def gpu_feed_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """The case's loader path feeding an accelerator through ``GpuFeeder`` to the device
    named by the ``device`` param, driven by an ``EmulatedAccelerator`` taking
    ``compute_ms`` per batch: AU, the stall split into waiting for data and host copy, and
    host-to-device GB/s: ``h2d_GBps`` from the loader's memory into the device buffer (a
    pinned copy's host staging included), ``h2d_device_GBps`` the device copy alone."""
    from storebench.formats import open_dataset
    from storebench.loaders import EmulatedAccelerator, GpuFeeder, run_feed

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
        with trial.measure():
            result = run_feed(feeder, accelerator, warmup_batches=int(case.param("warmup", 2)),
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
    }
