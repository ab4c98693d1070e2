"""The lazy_vs_preloaded study's grid: every dataset read lazily and preloaded, cold and warm,
in the access orders it is read in, and the readahead knobs on and off."""

from __future__ import annotations

from pathlib import Path

from ...bench.cache import CacheState
from ...bench.case import Case
from ...bench.plan import plan_for
from ...formats import traits
from ..grid import (
    TRAINING_BATCH_SIZE,
    batch_size_for,
    dataset_fields,
    decode_params,
    is_training_set,
    profile_datasets,
    repeat_fields,
    steady_fields,
)
from ..shared_cases import ACCESS_ORDERS

CASES = "storebench.studies.lazy_vs_preloaded.cases"
# Encoded (PNG/JPEG) sets on compact plans: one set of many small files and one single-file
# store stand for the rest (they decode the same bytes).
COMPACT_ENCODED_FORMATS = ("rawfiles", "lmdb")
# The orders a preloaded raw case reads after its block-shuffled epoch, from the same preload
# (``shared_cases.ram_order_epochs``; ``loader_table`` gives them rows of their own).
RAM_ORDERS = ("sequential", "shuffle")


# The ImageNet-like set's raw copy's formats (its batch: ``grid.TRAINING_BATCH_SIZE``): an
# array file and a single-file store (lmdb, as on the JPEG set, so "store decoded or
# encoded?" compares one format); the access orders on the first only. The JPEG set's:
# ``COMPACT_ENCODED_FORMATS``. The read-ahead knobs are left to the out_of_core study: on a
# set that fits in RAM, read through the crop, they decide nothing that study does not
# measure where they matter.
TRAINING_RAW_FORMATS = ("memmap", "lmdb")


def training_cases(path: Path, manifest: dict) -> list[tuple[str, str, str, dict]]:
    """(loader, access, cache, params) of one ImageNet-like build, or none where its format
    is not among the few that stand for the rest. Each dataset's lazy and preloaded
    block-shuffled epochs cold and warm; the raw copy's first format also lazy sequential
    and shuffled, cold (the access-order question, where I/O can still show). A preload
    serves every order alike, and the transform, not the gather, decides a preloaded
    epoch: no ``ram_orders``."""
    raw = manifest["encoding"] == "raw"
    fmt = manifest["format"]
    if fmt not in (TRAINING_RAW_FORMATS if raw else COMPACT_ENCODED_FORMATS):
        return []
    decoding = {k: v for k, v in decode_params(manifest).items() if v}
    cases = [(loader, "block_shuffle", cache.value, decoding)
             for loader in ("lazy", "preloaded") for cache in CacheState]
    if raw and fmt == TRAINING_RAW_FORMATS[0]:
        cases += [("lazy", access, "cold", decoding) for access in ("sequential", "shuffle")]
    return cases


def synthetic_cases(path: Path, manifest: dict, *,
                    compact: bool) -> list[tuple[str, str, str, dict]]:
    """(loader, access, cache, params) of one synthetic (or imported) build: see the
    module docstring."""
    raw = manifest["encoding"] == "raw"
    if not raw and compact and manifest["format"] not in COMPACT_ENCODED_FORMATS:
        return []
    decoding = {k: v for k, v in decode_params(manifest).items() if v}
    cases = []
    for loader in ("lazy", "preloaded"):
        orders = ACCESS_ORDERS if raw and loader == "lazy" else ("block_shuffle",)
        # A preload reads the set in one order whatever the epoch's: one preloaded case
        # per cache state reads its raw arrays in every order from the same preload.
        more = ({"ram_orders": ",".join(RAM_ORDERS)}
                if raw and loader == "preloaded" else {})
        cases += [(loader, access, cache.value, {**decoding, **more})
                  for access in orders for cache in CacheState]
    option = traits(manifest["format"]).readahead_option
    if option and raw:
        cases += [("lazy", "shuffle", "cold", {f"open_{option}": on}) for on in (True, False)]
    return cases


def grid(*, profile: str, data_dir: Path | str, repeats: int | None = None) -> list[Case]:
    """See the module docstring; an ImageNet-like set's cases: ``training_cases``."""
    plan = plan_for(profile)
    repeats = {**repeat_fields(profile, repeats), **steady_fields(profile)}
    cases = []
    for path, manifest in profile_datasets(profile, data_dir):
        fields = dataset_fields("lazy_vs_preloaded", path, manifest)
        if is_training_set(manifest):
            layout = training_cases(path, manifest)
            batch_size = batch_size_for(manifest["num_samples"], TRAINING_BATCH_SIZE)
        else:
            layout = synthetic_cases(path, manifest, compact=plan.compact)
            batch_size = batch_size_for(manifest["num_samples"])
        cases += [Case(function=f"{CASES}:loader_epoch_case", loader=loader,
                       prefetcher="none", workers=0, batch_size=batch_size, access=access,
                       cache=cache, **repeats, params=params, **fields)
                  for loader, access, cache, params in layout]
    return cases
