"""The gpu_decode study's grid: device decode, the model's demand and the CPU cores curve,
and the JPEG set it reads (``prepare``)."""

from __future__ import annotations

import os
from pathlib import Path

from ...bench.case import Case
from ...bench.plan import plan_for
from ...loaders.paths import get_loader_path
from ..grid import repeat_fields
from . import cases as decode_cases
from .cases import decode_set_path, decode_spec

NAME = "gpu_decode"
CASES = "storebench.studies.gpu_decode.cases"
# "default": DALI's own default share for the hardware decoder.
HW_DECODER_LOADS = (0.0, 0.5, 1.0, "default")
LIBRARIES = ("nvimgcodec", "torchvision")
# MLPerf Storage's ResNet-50 workload: 1,786 samples/s per emulated H100.
EMULATED_DEMAND = 1786.0
CORE_COUNTS = (1, 2, 4, 8)
CPU_DECODES = ("full", "reduced")
PREFETCHERS = ("thread", "process")
COMPACT_PREFETCHERS = ("process",)
BATCH_SIZE = 256
COMPACT_BATCH_SIZE = 32
# Batches of BATCH_SIZE a cores case drains and then feeds (``cases.timed_batches`` takes
# at least four per worker): 1,024 ImageNet-like samples take over a second to decode on
# two cores, the steady minimum every loader case holds (``bench.plan.STEADY_SECONDS``).
CPU_TIMED_BATCHES = 4
COMPACT_CPU_TIMED_BATCHES = 2
FAMILIES = ("device", "demand", "cpu")
FUNCTIONS = {"device": "decode_on_device_case", "demand": "model_demand_case",
             "cpu": "cpu_decode_feed_case"}


def core_counts(cpus: int) -> tuple[int, ...]:
    """``CORE_COUNTS`` up to ``cpus``, and ``cpus`` itself."""
    return tuple(sorted({*(n for n in CORE_COUNTS if n < cpus), cpus}))


def grid(*, profile: str, data_dir: Path | str, repeats: int | None = None,
         demand_samples_per_s: float | None = None, demand_source: str | None = None,
         families: tuple[str, ...] = FAMILIES) -> list[Case]:
    """See the module docstring. ``demand_samples_per_s``: the rate the cores curve feeds
    (default ``EMULATED_DEMAND``), ``demand_source`` what it is; ``families``: which of
    ``FAMILIES`` to lay out. The set need not be built yet (``prepare`` builds it; a case
    finding it missing is skipped, saying so)."""
    compact = plan_for(profile).compact
    batch_size = COMPACT_BATCH_SIZE if compact else BATCH_SIZE
    spec = decode_spec(profile)
    fields = {"study": NAME, "format": decode_cases.DECODE_FORMAT, "encoding": "jpeg",
              "dataset": str(decode_set_path(data_dir)), "batch_size": batch_size,
              "warmup": False, **repeat_fields(profile, repeats)}
    cases = []
    if "device" in families:
        # Twice the set, in shuffled passes: a few seconds at the rates published for GPUs.
        timed = spec.num_samples * (1 if compact else 2)
        runs = [{"library": "dali", "hw_decoder_load": load} for load in HW_DECODER_LOADS]
        runs += [{"library": library} for library in LIBRARIES]
        cases += [Case(function=f"{CASES}:{FUNCTIONS['device']}",
                       params={**run, "timed_samples": timed}, **fields) for run in runs]
    if "demand" in families:
        cases.append(Case(function=f"{CASES}:{FUNCTIONS['demand']}",
                          params={"model": "resnet50", "precision": "bf16"},
                          **{**fields, "batch_size": BATCH_SIZE}))
    if "cpu" in families:
        cases += cores_cases(fields, compact=compact,
                             demand=demand_samples_per_s or EMULATED_DEMAND,
                             source=demand_source or "emulated")
    return cases


def cores_cases(fields: dict, *, compact: bool, demand: float, source: str) -> list[Case]:
    cases = []
    for decode in CPU_DECODES:
        for prefetcher in COMPACT_PREFETCHERS if compact else PREFETCHERS:
            path = get_loader_path(prefetcher)
            for workers in core_counts(len(os.sched_getaffinity(0))):
                params = {"decode": decode, "demand_samples_per_s": round(float(demand), 1),
                          "demand_source": source,
                          "timed_batches": COMPACT_CPU_TIMED_BATCHES if compact
                          else CPU_TIMED_BATCHES}
                if path.start_method:
                    params["start_method"] = path.start_method
                cases.append(Case(function=f"{CASES}:{FUNCTIONS['cpu']}", loader="lazy",
                                  prefetcher=prefetcher, workers=workers, access="shuffle",
                                  params=params, **fields))
    return cases


def prepare(*, profile: str, data_dir: Path | str, progress: bool = False) -> Path:
    """Build the study's JPEG set (``decode_spec``) in LMDB, where it is not built yet."""
    from ...formats import build_dataset

    path = decode_set_path(data_dir)
    build_dataset(decode_spec(profile), decode_cases.DECODE_FORMAT, path.parent,
                  progress=progress)
    return path
