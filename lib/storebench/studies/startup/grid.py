"""The startup study's grid: each loader path's start over the memory-mapped raw set, with its
index held as NumPy arrays and as Python lists."""

from __future__ import annotations

from pathlib import Path

from ...bench.case import Case
from ...bench.plan import plan_for
from ..grid import dataset_fields, profile_datasets, repeat_fields

NAME = "startup"
CASES = "storebench.studies.startup.cases"
WORKERS = 2
BATCH_SIZE = 256
START_METHODS = ("fork", "spawn", "forkserver")
INDEX_KINDS = ("arrays", "lists")


# (path, start method): the paths users start workers with.
STARTUP_PATHS = (("thread", None), *(("process", m) for m in START_METHODS),
                 *(("torch", m) for m in START_METHODS))
# Compact plans (ci): one process start method of each kind (inherited, pickled), torch
# under fork only (its spawned workers import torch: seconds each).
COMPACT_STARTUP_PATHS = (("thread", None), ("process", "fork"), ("process", "spawn"),
                         ("torch", "fork"))
# Paths whose workers import torch afresh: never the fastest to a first batch, so a fixed
# few repeats (the guide compares the best with the runner-up only).
SLOW_STARTS = {("torch", "spawn"), ("torch", "forkserver")}
SLOW_START_REPEATS = 3
# A whole epoch of the index per repeat: ours under fork, where copy-on-read can happen.
MEMORY_PATHS = (("process", "fork"),)


def memmap_raw_set(profile: str, data_dir: Path | str):
    for path, manifest in profile_datasets(profile, data_dir):
        if manifest["format"] == "memmap" and manifest["encoding"] == "raw":
            return path, manifest
    return None


def grid(*, profile: str, data_dir: Path | str, repeats: int | None = None) -> list[Case]:
    """See the module docstring."""
    plan = plan_for(profile)
    found = memmap_raw_set(profile, data_dir)
    if found is None:
        return []
    fields = {**dataset_fields(NAME, *found), "timeout_s": plan.timeout_s}
    startup = COMPACT_STARTUP_PATHS if plan.compact else STARTUP_PATHS
    cases = []
    for kind in INDEX_KINDS:
        common = {"index_kind": kind, "index_size": plan.index_entries}
        for (path, method), epoch in ([(p, False) for p in startup]
                                      + [(p, True) for p in MEMORY_PATHS]):
            params = {**common, **({"start_method": method} if method else {}),
                      **({"epoch": True} if epoch else {})}
            few = (path, method) in SLOW_STARTS and repeats is None and not plan.compact
            cases.append(Case(function=f"{CASES}:startup_case", loader="lazy",
                              prefetcher=path, workers=WORKERS, batch_size=BATCH_SIZE,
                              access="shuffle", cache="warm", warmup=False, params=params,
                              **repeat_fields(profile, SLOW_START_REPEATS if few else repeats),
                              **fields))
    return cases
