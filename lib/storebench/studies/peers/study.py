"""The peers study: storebench's loaders beside the libraries teams actually choose between
(WebDataset, LitData, MosaicML Streaming, DALI, FFCV, torchdata, SPDL, Ray Data on a local
Ray; Lance and Zarr as formats),
under the same rules.

Every path reads the same samples (the profile's JPEG set, decode-bound, and its raw set,
both cut to one count, ``peer_specs``), shuffled, 2 workers, batch 64, through its library's
own recommended pipeline over its own format (``storebench.loaders.peers``),
from a warm cache, and the JPEG set also cold (epoch 1 from evicted, verified files). Every
warm case runs two epochs or more on one loader
(``cases.peers``): time to first batch (start-up, JIT, index reading), each epoch's rate
after its first batch, peak PSS of the process tree, and shuffle quality measured from the
delivered order. A cold case stops after epoch 1, the epoch the cold state is about (its
later epochs would find the set cached: the warm case's measurement).
JPEGs are decoded with simplejpeg wherever the library lets us choose; DALI and FFCV decode
with their own libjpeg-turbo builds (the path's label says so). Our ProcessPrefetcher also
reads each peer format through its storebench Reader ("same files, our loader").

The sets every path of the study reads (ours over memmap, LMDB and TFRecord, each peer's own
format) live in ``<data>/peers/`` (``bench.plan.PEER_SETS_DIR``), apart from the profile's
whole sets: whole epochs are the study's unit (a peer's loader stopped mid-epoch pays for its
own stop), so its sets size its epochs. Both are cut to one count, the same bytes as the
whole sets' first samples: 2,048 on the default profile (``EPOCH_SAMPLES``, what every other
study's timed epoch reads), the smaller set's where that is less (256 on ci). A path that
pays per epoch (workers started again, an index read again) pays it more often per sample:
its later epochs' rate, boundaries included, reads lower than over a longer set
(``results/study-runs/README.md`` compares the epoch lengths).

The peer libraries live in the peers environment (``storebench.environments``): their cases
run with its interpreter, and ``prepare`` builds the peer formats with it. Where a library or
the environment is missing, its rows are ``skipped`` with the reason. torchvision, which
MDS's vision zoo imports, is recorded as unavailable (``UNAVAILABLE_HERE``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...bench.case import Case
from ...bench.plan import data_dir_family, peer_specs, plan_for
from ...bench.plan import peer_sets_dir as sets_dir
from ...loaders.paths import LOADER_PATHS, TRAINING_CROP, get_loader_path
from ...plots import (
    empty_figure,
    family_handles,
    linear_axis,
    log_axis,
    profile_caption,
    question_title,
)
from ...results import (
    MIN_PAIRED_REPEATS,
    Results,
    medians_table,
    ratio_interval,
    select,
    stat,
)
from ...text import (
    ENCODING_NAMES,
    MULTIPLY,
    bullets,
    format_percent,
    format_ratio,
    format_value,
)
from ..base import FigureSpec, LiveComparison, Study, TargetMeasure, TargetSpec
from ..grid import (
    TRAINING_TRANSFORM,
    StudyNotApplicableError,
    dataset_fields,
    is_imported_manifest,
    profile_datasets,
    repeat_fields,
    steady_fields,
)
from ..peer_sets import build_peer_formats
from ..shared_rows import median_of_latest, target_result, target_workers

NAME = "peers"
CASES = "storebench.studies.peers.cases"
WORKERS = 2
BATCH_SIZE = 64
# (loader path, format it reads) per encoding. Ours and the frameworks' over the formats
# they read best here; each peer's pipeline over its own format (DALI over our raw files
# and TFRecord shards; torchdata's loader over the same LMDB/memmap as ours).
# The common default the answer compares with: torch's DataLoader over one file per sample,
# what an ImageFolder reads.
DEFAULT_PATH = ("torch", "rawfiles")
STOREBENCH_PATHS = {
    "jpeg": (("process", "lmdb"), ("thread", "lmdb"), ("process", "tfrecord"),
             ("torch", "lmdb"), ("tf_data", "tfrecord"), DEFAULT_PATH),
    "raw": (("process", "memmap"), ("thread", "memmap"), ("torch", "memmap"), DEFAULT_PATH),
}
# Ray Data, the distributed engine users grow into, on a local Ray of the case's workers'
# cores, over each layout it reads without glue.
RAY_DATA_PATHS = (("ray_data_files", "rawfiles"), ("ray_data_parquet", "parquet"),
                  ("ray_data_webdataset", "webdataset"))
# The one the training-set and compact grids run (a Ray start costs seconds per repeat):
# over the files the common default reads, so it needs no set of its own.
RAY_DATA_PATH = RAY_DATA_PATHS[0]
RAY_DATA_PATH_NAMES = tuple(path for path, _ in RAY_DATA_PATHS)
# What a Ray case's peak memory counts (its param ``peak_memory_counts``): the harness
# samples the PSS of the case's process tree, and ray.init starts GCS, raylet and workers
# as its descendants; the object store's shared memory counts as they map it.
RAY_MEMORY_COUNTED = "driver+gcs+raylet+workers+object_store"
PEER_PATHS = {
    "jpeg": (("webdataset", "webdataset"), ("litdata", "litdata"), ("mds", "mds"),
             ("dali_file", "rawfiles"), ("dali_tfrecord", "tfrecord"), ("ffcv", "ffcv"),
             ("torchdata", "lmdb"), ("spdl", "lmdb"), ("spdl_io", "lmdb"),
             ("spdl_process", "lmdb"), *RAY_DATA_PATHS),
    "raw": (("webdataset", "webdataset"), ("litdata", "litdata"), ("mds", "mds"),
            ("ffcv", "ffcv"), ("torchdata", "memmap"), ("spdl", "memmap"),
            ("spdl_process", "memmap")),
}
# Our ProcessPrefetcher over every peer format that holds the encoding: the same files,
# our loader.
OUR_LOADER_OVER_PEER_FORMATS = "process"
# On a training-set family (the ImageNet-like JPEGs, decoded and cropped; the 224x224 raw
# copy, cropped): the cases that decide the guide rows and the target within the study's
# budget (``TRAINING_BUDGET_S``; the note on issue 46 has the arithmetic). Both sides of the
# target: our two prefetchers over a core format, the common default, and each peer that
# runs here over its own format. Left out: the cold rows (a cold read of the cut JPEG set,
# 134 MB at 2 GB/s, is a few percent of its decode: the out_of_core study measures cold),
# torchdata (torch's DataLoader over our dataset: the default's loop again), SPDL's
# spdl.io and subprocess variants, DALI over TFRecord (DALI over files decides for DALI),
# tf.data (the formats study's), and our loader over the peers' formats (a question about
# their files, not about which loader).
TRAINING_PATHS = {
    "jpeg": (("process", "lmdb"), ("thread", "lmdb"), DEFAULT_PATH,
             ("webdataset", "webdataset"), ("litdata", "litdata"), ("mds", "mds"),
             ("dali_file", "rawfiles"), ("ffcv", "ffcv"), ("spdl", "lmdb"),
             ("tf_data", "tfrecord"), RAY_DATA_PATH),
    "raw": (("process", "memmap"), ("thread", "memmap"), ("litdata", "litdata"),
            ("ffcv", "ffcv")),
}
# On a training-set family, storebench's own pipelines beside its whole-image decode: the
# crop-window decode resized straight into the batch (``decode="window"``), with each resize
# filter, so that each filter class has its storebench candidate (tf.data resizes plain).
TRAINING_VARIANTS = {
    "jpeg": ((("thread", "lmdb"), {"decode": "window"}),
             (("thread", "lmdb"), {"decode": "window", "crop_filter": "plain"})),
    "raw": (),
}
TRAINING_BUDGET_S = 250
# Peer paths whose library has a random resized crop op of its own (DALI's
# decoders.image_random_crop / random_resized_crop, FFCV's RandomResizedCropRGBImageDecoder):
# they crop with it (param ``crop="library"``: the same work, the library's own random
# draws); every other path applies storebench's seeded RandomResizedCropFlip.
OWN_CROP_PATHS = ("dali_file", "dali_tfrecord", "ffcv", "tf_data")
# Paths that apply storebench's crop but stand for a pipeline that resizes with Pillow, as
# torchvision's RandomResizedCrop does (the peers' docs and the common default use
# torchvision's transforms): param ``crop_resampler="pillow"``.
PILLOW_CROP_FAMILIES = ("peer", "baseline")
COMPACT_LATER_EPOCHS_MIN_S = 0.25
COMPACT = {"jpeg": (("process", "lmdb"), ("webdataset", "webdataset"), ("ffcv", "ffcv"),
                    ("dali_tfrecord", "tfrecord"), ("spdl", "lmdb"), RAY_DATA_PATH),
           "raw": (("process", "memmap"), ("litdata", "litdata"))}
ENCODINGS = ("jpeg", "raw")
COLD_ENCODINGS = ("jpeg",)
TARGET_RATIO = 1.2  # storebench's best path over the best peer
RAY_TARGET_RATIO = 1.2  # storebench's best path over Ray Data's best, at WORKERS cores
PLAIN_TARGET_RATIO = 1.0  # storebench's best plain-resize path: not slower than tf.data
# The warm rows the target compares (see peers_grid): a candidate of a second or two a
# repeat still gets 4 to 8 repeats; longer only let slow peers that decide nothing run all 9.
TARGET_REPEAT_BUDGET_S = 8.0
# JPEG decode against cores x one thread: measured once, by the targets study, which times
# the one-thread rate on each core beside the prefetchers, interleaved in one case.
DECODE_TARGET = "thread_vs_serial_decode"
RATE = "later_epochs_samples_per_s"  # epochs 2 and on: the steady state
COLD_RATE = "epoch1_samples_per_s"


def study_formats(family: str = "synthetic") -> tuple[str, ...]:
    """Every format the study reads: the core formats its own paths and the peers' read
    (torchdata over memmap and LMDB, DALI over raw files and TFRecord), then every peer
    format; on a training-set family, those ``TRAINING_PATHS`` read only."""
    from ...formats import FORMATS

    if family != "synthetic":
        read = {fmt for encoding in ENCODINGS for _, fmt in TRAINING_PATHS[encoding]}
        return (*sorted(read & set(FORMATS.core)),
                *(fmt for fmt in peer_formats() if fmt in read))
    paths = [path for encoding in ENCODINGS
             for path in STOREBENCH_PATHS[encoding] + PEER_PATHS[encoding]]
    ours = {fmt for _, fmt in paths} & set(FORMATS.core)
    return (*sorted(ours), *peer_formats())


def peer_formats() -> tuple[str, ...]:
    """The registered peer formats (``PEER = True``), in registry order."""
    from ...formats import FORMATS

    return tuple(name for name, module in FORMATS.items() if getattr(module, "PEER", False))


def decode_for(encoding: str) -> str | None:
    return "simplejpeg" if encoding == "jpeg" else None


def _needs_peers(path: str, fmt: str) -> bool:
    """Whether the case runs in the peers environment: its path's, or its format's where
    its path names none (Ray Data lives in the main one and reads a peer format there)."""
    from ...formats import FORMATS

    environment = get_loader_path(path).environment
    if environment:
        return environment == "peers"
    return bool(getattr(FORMATS.get(fmt), "PEER", False))


def _case(path: str, fmt: str, encoding: str, cache: str, built: dict, fields: dict,
          data_dir: Path | str, extra: dict) -> Case:
    from ...formats import FORMATS

    params = {"decode": decode_for(encoding), **extra}
    if params.get("transform") and path in OWN_CROP_PATHS:
        params["crop"] = "library"
    elif params.get("transform") and (get_loader_path(path).family in PILLOW_CROP_FAMILIES
                                      or (path, fmt) == DEFAULT_PATH):
        params["crop_resampler"] = "pillow"
    if cache == "cold":
        # Epoch 1 only: its later epochs would read a cached set, the warm row's measurement.
        params["later_epochs"] = False
    if _needs_peers(path, fmt):
        params["environment"] = "peers"
    if path in RAY_DATA_PATH_NAMES:
        params["peak_memory_counts"] = RAY_MEMORY_COUNTED
    if path == "process" and not getattr(FORMATS.get(fmt), "FORK_SAFE", True):
        params["start_method"] = "forkserver"  # Lance's runtime hangs in forked workers
    # No untimed warm-up: the first repeat measures start-up in a fresh process (imports,
    # FFCV's JIT), which a warm-up would hide.
    common = {"loader": "lazy", "prefetcher": path, "workers": WORKERS, "warmup": False,
              "batch_size": BATCH_SIZE, "access": "shuffle", "params": params, **fields}
    found = built.get((fmt, encoding))
    if found is None:
        # Not built (its library or the peers environment is missing): a skipped row that
        # says why, never a silently absent path.
        return Case(study=NAME, function=f"{CASES}:missing_dataset_case", format=fmt,
                    encoding=encoding, dataset=str(sets_dir(data_dir)
                                                   / f"{fmt}-{encoding}"),
                    cache="",
                    **{**common, "params": {**params, "cache_wanted": cache}})
    return Case(function=f"{CASES}:peer_epochs_case", cache=cache,
                **dataset_fields(NAME, *found), **common)


def peers_grid(*, profile: str, data_dir: Path | str, repeats: int | None = None
               ) -> list[Case]:
    """Per encoding (JPEG, raw): ours and the frameworks' paths, every peer's pipeline and
    our ProcessPrefetcher over each peer format, warm; the JPEG paths also cold. Compact
    plans (ci): ``COMPACT``, warm only. JPEG decode against the cores' one-thread rate is
    the targets study's (``DECODE_TARGET``), not measured again here."""
    plan = plan_for(profile)
    family = data_dir_family(data_dir)
    # Whole epochs (no ``epoch_fields``): a peer's loader stopped mid-epoch pays for its own
    # stop (FFCV polls its stop flag every 0.5 s), which no whole epoch does, and each
    # case's later epochs would be many short ones, each stopped so.
    fields = {**repeat_fields(profile, repeats), "timeout_s": plan.timeout_s,
              **steady_fields(profile)}
    # The warm target rows compare ours with the peers' own pipelines by the ratio's
    # interval: a longer budget, within which the fast candidates that decide it (a repeat
    # of a second or two) still reach a narrow interval, and a slow peer stops early. A
    # target's repeats come from the first pass: the top-up repeats guide questions only.
    target_fields = {**repeat_fields(profile, repeats, budget_s=TARGET_REPEAT_BUDGET_S,
                                     minimum=MIN_PAIRED_REPEATS),
                     "timeout_s": plan.timeout_s, **steady_fields(profile)}
    # Sets from their own directory only: where a profile's set is no longer than the cut,
    # its whole builds beside the directory have the same spec.
    datasets = profile_datasets(profile, data_dir, peers=True,
                                specs=peer_specs(profile, family))
    if any(is_imported_manifest(manifest) for _, manifest in datasets):
        raise StudyNotApplicableError(
            f"{data_dir}: the peers study reads its sets in the peer libraries' formats, "
            "built from a profile's sets (storebench build --peer-sets); storebench import "
            "writes storebench's formats only")
    built = {(m["format"], m["encoding"]): (p, m) for p, m in datasets
             if Path(p).parent == sets_dir(data_dir)}
    # ci-sized epochs: a quarter second of later epochs shows the path works.
    extra = {"later_epochs_min_s": COMPACT_LATER_EPOCHS_MIN_S} if plan.compact else {}
    training = family != "synthetic"
    if training:
        # Every path applies the standard training transform (``decode_params``).
        extra["transform"] = TRAINING_TRANSFORM
    from ...formats import FORMATS

    cases = []
    for encoding in ENCODINGS:
        ours_over_peers: tuple = ()
        if training:
            paths = TRAINING_PATHS[encoding]
        elif plan.compact:
            paths = COMPACT[encoding]
        else:
            ours_over_peers = tuple(
                (OUR_LOADER_OVER_PEER_FORMATS, fmt) for fmt in peer_formats()
                if encoding in getattr(FORMATS.get(fmt), "ENCODINGS", ()))
            paths = STOREBENCH_PATHS[encoding] + PEER_PATHS[encoding] + ours_over_peers
        caches = ("warm", "cold") if (encoding in COLD_ENCODINGS and not plan.compact
                                      and not training) else ("warm",)
        for cache in caches:
            for path, fmt in paths:
                targeted = cache == "warm" and (path, fmt) not in ours_over_peers
                cases.append(_case(path, fmt, encoding, cache, built,
                                   target_fields if targeted else fields, data_dir, extra))
            if training:
                for (path, fmt), variant in TRAINING_VARIANTS[encoding]:
                    cases.append(_case(path, fmt, encoding, cache, built, target_fields,
                                       data_dir, {**extra, **variant}))
    return cases


def prepare(*, profile: str, data_dir: Path | str, progress: bool = True,
            jobs: int | None = None, formats: tuple[str, ...] | None = None) -> None:
    """Build the study's sets in every format of ``study_formats()`` of ``data_dir``'s
    family that holds them (or in ``formats`` only: a quick study's), with the peers
    environment's interpreter (``peer_sets.build_peer_formats``)."""
    build_peer_formats(profile=profile, data_dir=data_dir, progress=progress, jobs=jobs,
                       formats=formats or study_formats(data_dir_family(data_dir)))


# -- reading the rows --------------------------------------------------------------------
def peers_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The study's rows with ``path``, ``family`` and ``label`` columns (the decode-rate
    rows have no path: empty strings)."""
    rows = df[df["study"] == NAME].copy()
    if rows.empty:
        return rows.assign(path="", family="", label="", transform="", crop="", variant="",
                           key="")
    rows["path"] = rows["prefetcher"].fillna("")
    rows["family"] = rows["path"].map(
        lambda p: LOADER_PATHS[p].family if p in LOADER_PATHS else "")
    params = [p if isinstance(p, dict) else json.loads(p) if isinstance(p, str) and p else {}
              for p in rows["params"]]
    rows["transform"] = [str(p.get("transform") or "") for p in params]
    rows["crop"] = [str(p.get("crop") or "") for p in params]
    rows["variant"] = [variant_of(p) for p in params]
    rows["key"] = [path_key(p, f, v) for p, f, v in
                   zip(rows["path"], rows["format"], rows["variant"])]
    rows["label"] = [path_text(p, f, crop=c, variant=v) for p, f, c, v in
                     zip(rows["path"], rows["format"], rows["crop"], rows["variant"])]
    return rows


# A case's variant of its path (``TRAINING_VARIANTS``), in its key and its label.
VARIANT_WORDS = {"window": "crop-window decode", "plain": "plain bilinear"}


def variant_of(params: dict) -> str:
    """``"window+plain"`` for a crop-window decode with the plain filter; "" for the path as
    the study runs it by default."""
    parts = []
    if params.get("decode") == "window":
        parts.append("window")
    if params.get("crop_filter") == "plain":
        parts.append("plain")
    return "+".join(parts)


def path_key(path: str, fmt: str, variant: str = "") -> str:
    """``"thread:lmdb"``, ``"thread:lmdb:window+plain"``: what candidates are keyed on."""
    return f"{path}:{fmt}" + (f":{variant}" if variant else "")


def key_parts(key: str) -> tuple[str, str, str]:
    """(path, format, variant) of a candidate's key."""
    path, fmt, *variant = key.split(":", 2)
    return path, fmt, variant[0] if variant else ""


def filter_class(key: str) -> str:
    """The resize filter class of a candidate: "plain" for tf.data's and storebench's
    plain variant, else "antialiased" (Pillow, FFCV's INTER_AREA, DALI's resize)."""
    path, _, variant = key_parts(key)
    return "plain" if path == "tf_data" or "plain" in variant.split("+") else "antialiased"


def path_text(path: str, fmt: str, *, crop: str = "", variant: str = "") -> str:
    """``"WebDataset + DataLoader ×2 (webdataset)"``: the path, its workers, what it reads;
    ``", own crop op"`` where it crops with its library's op (``crop="library"``); the
    variant's words (``"crop-window decode, plain bilinear"``)."""
    loader = LOADER_PATHS.get(path)
    label = loader.label if loader else path
    own = ", own crop op" if crop == "library" else ""
    parts = [part for part in variant.split("+") if part]
    if path == "tf_data" and "plain" not in parts:
        parts.append("plain")  # tf.image.resize without antialiasing
    words = "".join(f", {VARIANT_WORDS[part]}" for part in parts)
    return f"{label} {MULTIPLY}{WORKERS} ({fmt}{own}{words})"


def candidates(df: pd.DataFrame, encoding: str, cache: str, metric: str):
    """Every path measured for (encoding, cache): [(key, label, family, Stat)], best first."""
    rows = peers_rows(df)
    rows = rows[(rows["encoding"] == encoding) & (rows["cache"] == cache)]
    found = []
    for key, part in rows.groupby("key", sort=False):
        if select(part, metric).empty:
            continue
        found.append((key, part["label"].iloc[0], part["family"].iloc[0],
                      stat(part, metric)))
    return sorted(found, key=lambda c: -c[3].median)


def skipped_paths(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(path label, reason) of every skipped or failed path (latest run), once each."""
    rows = peers_rows(df)
    if rows.empty:
        return []
    whole = rows[(rows["metric"] == "case_seconds") & (rows["status"] != "ok")]
    seen = {}
    for _, row in whole.iterrows():
        label = f"{row['label']}, {row['encoding']}"
        reason = str(row["error"]).splitlines()[0] if row["error"] else row["status"]
        seen.setdefault(label, f"{row['status']}: {reason}")
    return list(seen.items())


def is_storebench_over_core(key: str, family: str) -> bool:
    """Whether a candidate is storebench's: one of its loader paths over one of its (core)
    formats. Our loader over a peer's format measures that format as much as our loader."""
    from ...formats import FORMATS

    return family == "storebench" and key_parts(key)[1] in FORMATS.core


def best_against_peers(df: pd.DataFrame, encoding: str, filter: str = "antialiased"):
    """(ours, peer, (ratio, low, high)) for storebench's best path over a storebench format
    against the best peer library's own pipeline or the tuned DataLoader (``DEFAULT_PATH``),
    both resizing with ``filter``'s class, warm, epochs 2 and on; None where either side is
    missing. The plain class's peer is tf.data (the framework that resizes plain)."""
    found = [c for c in candidates(df, encoding, "warm", RATE) if filter_class(c[0]) == filter]
    ours = [c for c in found if is_storebench_over_core(c[0], c[2])]
    # A peer library's own pipeline, over its own format or the core one it reads (DALI
    # over raw files, SPDL over LMDB), or the common default tuned.
    peers = [c for c in found if c[2] == "peer" or c[0] == ":".join(DEFAULT_PATH)
             or (filter == "plain" and key_parts(c[0])[0] == "tf_data")]
    if not ours or not peers:
        return None
    return ours[0], peers[0], ratio_interval(ours[0][3], peers[0][3])


def ours_over_peers_target(encoding: str, filter: str = "antialiased"):
    """``measure`` of the target for ``encoding``: storebench's best path over the best
    peer path of the same filter class, warm, epochs 2 and on."""

    def measure(results: Results) -> TargetMeasure | None:
        found = best_against_peers(results.df, encoding, filter)
        if found is None:
            return None
        ours, peer, interval = found
        return paired_target(ours, peer, interval, limiting_factor(results.df, encoding))

    return measure


def paired_target(ours, other, interval, limiting: str) -> TargetMeasure:
    """A target read as our path over ``other`` (each a ``candidates`` entry), with the
    ratio's ``interval`` and what limits it, naming both sides' rates."""
    ratio, low, high = interval
    return TargetMeasure(
        value=ratio, low=low, high=high, repeats=min(ours[3].count, other[3].count),
        sources=ours[3].sources, against=other[3].sources,
        limiting=f"{ours[1]} at {ours[3]} against {other[1]} at {other[3]}; {limiting}")


def limiting_factor(df: pd.DataFrame, encoding: str) -> str:
    """What bounds the ratio, from the rows: where every path decodes and crops each sample
    (the training transform), that work on the same cores bounds both sides, and the ratio
    can only come from how each loader keeps the cores busy; over small cached arrays, each
    loader's per-batch overhead."""
    rows = peers_rows(df)
    rows = rows[(rows["encoding"] == encoding) & (rows["transform"] != "")]
    if not rows.empty:
        work = "decode and crop" if encoding == "jpeg" else "crop"
        return (f"both sides {work} every sample (the training transform) on the same "
                f"{WORKERS} workers' cores: that work bounds both, the ratio is how fully "
                "each loader keeps the cores on it")
    if encoding == "jpeg":
        return "both sides decode every sample on the same cores: decode bounds both"
    return "small cached arrays: each loader's per-batch overhead decides"


def best_against_ray_data(df: pd.DataFrame, encoding: str = "jpeg"):
    """(ours, Ray Data, (ratio, low, high)): storebench's best path over a storebench format
    against Ray Data's best pipeline (``RAY_DATA_PATHS``), both resizing antialiased, warm,
    epochs 2 and on, both at ``WORKERS`` cores; None where either side is missing."""
    found = [c for c in candidates(df, encoding, "warm", RATE)
             if filter_class(c[0]) == "antialiased"]
    ours = [c for c in found if is_storebench_over_core(c[0], c[2])]
    ray = [c for c in found if key_parts(c[0])[0] in RAY_DATA_PATH_NAMES]
    if not ours or not ray:
        return None
    return ours[0], ray[0], ratio_interval(ours[0][3], ray[0][3])


def ours_over_ray_data_target(results: Results) -> TargetMeasure | None:
    """``measure`` of the Ray Data target: storebench's best path over Ray Data's best."""
    found = best_against_ray_data(results.df)
    if found is None:
        return None
    ours, ray, interval = found
    return paired_target(ours, ray, interval,
                         f"Ray's raylet and GCS share the {WORKERS} cores with its tasks")


PEER_TARGETS = (*(
    TargetSpec(key=f"peers_{encoding}", name=f"Ours vs the best peer, {encoding}",
               description=f"storebench's best path over a storebench format against the "
                           f"best peer library's own pipeline or the tuned DataLoader, both "
                           f"resizing antialiased, "
                           f"{ENCODING_NAMES.get(encoding, encoding)}, warm, epochs 2 and on",
               threshold=TARGET_RATIO, is_fraction=False,
               measure=ours_over_peers_target(encoding))
    for encoding in ENCODINGS),
    TargetSpec(key="peers_jpeg_plain", name="Ours vs tf.data, jpeg, plain resize",
               description="storebench's best path over a storebench format resizing with "
                           "the plain bilinear filter against tf.data over TFRecord "
                           "(decode_and_crop_jpeg, tf.image.resize without antialiasing), "
                           f"{ENCODING_NAMES.get('jpeg', 'jpeg')}, warm, epochs 2 and on",
               threshold=PLAIN_TARGET_RATIO, is_fraction=False,
               measure=ours_over_peers_target("jpeg", "plain")),
    TargetSpec(key="peers_jpeg_ray_data", name="Ours vs Ray Data, jpeg, 2 cores",
               description="storebench's best path over a storebench format against Ray "
                           "Data's best pipeline (read, decode and crop in map_batches, "
                           "iter_torch_batches) on a local Ray of the same "
                           f"{WORKERS} cores, both resizing antialiased, "
                           f"{ENCODING_NAMES.get('jpeg', 'jpeg')}, warm, epochs 2 and on",
               threshold=RAY_TARGET_RATIO, is_fraction=False,
               measure=ours_over_ray_data_target))


def decode_efficiency(df: pd.DataFrame):
    """The targets study's result for JPEG decode against cores x one thread
    (``DECODE_TARGET``: ``shared_rows.target_result``'s ``key``, ``value``, ``low``,
    ``high``, ``threshold``, ``met``, ``repeats``) and the faster prefetcher's label; None
    where the results have no such row.
    Measured there, not here: the prefetchers and the one-thread rate on each core take
    turns over the same batches in one case. Timed in a case of its own, minutes from the
    loader epochs it was set against, the one-thread rate read low, and the fraction rose
    above 100%."""
    row = target_result(df, DECODE_TARGET)
    if row is None:
        return None
    median = median_of_latest(df, DECODE_TARGET)
    rates = {path: median(f"{path}_prefetcher.samples_per_s") or 0.0
             for path in ("thread", "process")}
    faster = max(rates, key=rates.get)
    workers = target_workers(df, DECODE_TARGET)
    return row, LOADER_PATHS[faster].label + (f" {MULTIPLY}{workers}" if workers else "")


TABLE_METRICS = ("epoch1_samples_per_s", RATE, "fresh_process_first_batch_s",
                 "epoch1_first_batch_s", "epoch2_first_batch_s", "peak_pss_bytes",
                 "order_correlation", "shuffle_spread")


def peers_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per path, format, encoding and cache state: the medians of ``TABLE_METRICS``, the
    decoder and the path's stated shuffle semantics (beside the measured spread)."""
    rows = peers_rows(df)
    rows = rows[rows["path"].isin(list(LOADER_PATHS))]
    keys = ["encoding", "cache", "label", "path", "format"]
    if rows.empty or select(rows, RATE).empty:
        return pd.DataFrame(columns=[*keys, *TABLE_METRICS, "decoder", "shuffle"])
    table = medians_table(rows, TABLE_METRICS, keys)
    table["decoder"] = [
        ("none (raw)" if enc == "raw" else
         "simplejpeg" if LOADER_PATHS[p].decode == "dataset" else LOADER_PATHS[p].decode)
        for p, enc in zip(table["path"], table["encoding"])]
    table["shuffle"] = [LOADER_PATHS[p].shuffle for p in table["path"]]
    table = table.sort_values(["encoding", "cache", RATE], ascending=[True, False, False],
                              ignore_index=True)
    return table.drop(columns=["path"])


def sets_caption(rows: pd.DataFrame, encoding: str) -> str:
    """``profile_caption`` with the sample count the rows' epochs read (epoch 1 reads the
    whole set): the raw set here is cut shorter than the profile's."""
    mine = rows[rows["encoding"] == encoding]
    counts = select(mine, "samples")["value"]
    samples = int(counts.max()) if not counts.empty else None
    if "transform" in mine and (mine["transform"] != "").any():
        side = f"{TRAINING_CROP}{MULTIPLY}{TRAINING_CROP}"
        what = (f"ImageNet-like JPEGs of mixed sizes, decoded, crop-resized to {side}, flipped"
                if encoding == "jpeg" else
                f"ImageNet-like images stored decoded at {side}{MULTIPLY}3, crop-resized, "
                "flipped")
        return f"{samples:,} {what}" if samples else what
    return profile_caption(rows, encoding, samples=samples)


# -- figures ----------------------------------------------------------------------------
FAMILY_COLOURS = {"storebench": "C0", "framework": "C2", "peer": "C1", "baseline": "C7"}


FAMILY_NAMES = {"storebench": "storebench", "framework": "framework loaders (torch, tf.data)",
                "peer": "peer libraries", "baseline": "baseline"}
# A bar axis turns logarithmic only where its rates span more than this factor.
LOG_SPAN = 100.0


def _path_stat(rows: pd.DataFrame, key: str, metric: str):
    mine = rows[rows["key"] == key]
    return stat(mine, metric) if not select(mine, metric).empty else None


def _over_peer_format(key: str) -> bool:
    """Our ProcessPrefetcher over a peer library's format ("same files, our loader")."""
    path, fmt, _ = key_parts(key)
    return path == OUR_LOADER_OVER_PEER_FORMATS and fmt in peer_formats()


def _rate_bars(ax, rows: pd.DataFrame, found: list, metric: str, *, epoch1: bool,
               peer_own: dict | None = None) -> list[float]:
    """One bar per path (``metric``'s median, whiskers: the repeats' range), best on top;
    a tick at epoch 1's rate (``epoch1``), a diamond at the peer's own loader over the
    same files (``peer_own``: format -> Stat). Returns every value drawn."""
    y = np.arange(len(found))
    values = []
    for row, (key, _, family, _) in zip(y, found):
        value = _path_stat(rows, key, metric)
        if value is None:
            continue
        ax.barh(row, value.median, height=0.7, color=FAMILY_COLOURS.get(family, "C7"),
                edgecolor="black", linewidth=0.4,
                xerr=[[value.median - value.low], [value.high - value.median]],
                error_kw={"elinewidth": 0.8, "capsize": 2})
        values += [value.low, value.high]
        first = _path_stat(rows, key, COLD_RATE) if epoch1 else None
        if first is not None:
            ax.plot(first.median, row, marker="|", markersize=11, markeredgewidth=2,
                    color="black", linestyle="none", label="epoch 1 (after its first batch)")
            values.append(first.median)
        own = (peer_own or {}).get(key_parts(key)[1])
        if own is not None:
            ax.plot(own.median, row, marker="D", markersize=6, color="C1",
                    markeredgecolor="black", linestyle="none",
                    label="the peer library's own loader over the same files")
            values.append(own.median)
    return values


def _peer_own_rates(rows: pd.DataFrame, found: list, metric: str) -> dict:
    """format -> Stat of the peer library's own pipeline over its own format."""
    out = {}
    for key, _, family, _ in found:
        path, fmt, _ = key_parts(key)
        if family == "peer" and path == fmt:
            value = _path_stat(rows, key, metric)
            if value is not None:
                out[fmt] = value
    return out


def rate_takeaway(df: pd.DataFrame) -> str:
    """One sentence from the rows: storebench's best path over the best peer library's,
    warm, epochs 2 and on, per encoding."""
    parts = []
    for encoding in ENCODINGS:
        found = best_against_peers(df, encoding)
        if found is None:
            continue
        ours, peer, (ratio, _, _) = found
        what = ENCODING_NAMES.get(encoding, encoding)
        parts.append(f"{what}: storebench's best, {ours[1]}, reads {format_ratio(ratio)} the "
                     f"best peer's ({peer[1]})")
    return ("Warm, epochs 2 and on. " + "; ".join(parts) + ".") if parts else ""


def plot_peers(df: pd.DataFrame) -> Figure:
    """Samples/s of every path, one row of panels per set and cache state (JPEG warm, JPEG
    cold, raw warm): on the left each library's own pipeline over its own format (ours
    blue, the frameworks' green, the peers' orange), on the right our ProcessPrefetcher over
    each peer library's format beside that library's own loader (diamond). Warm bars are
    epochs 2 and on with a tick at epoch 1; cold bars are epoch 1. Linear axes unless a
    row's rates span more than ``LOG_SPAN``."""
    rows = peers_rows(df)
    # A panel wherever a rate was measured (an epoch of one batch has no epoch-1 rate).
    panels = [(enc, cache) for enc in ENCODINGS for cache in ("warm", "cold")
              if candidates(df, enc, cache, COLD_RATE) or candidates(df, enc, cache, RATE)]
    if not panels:
        return empty_figure("no peers rows")
    split = []
    for encoding, cache in panels:
        metric = RATE if cache == "warm" else COLD_RATE
        found = candidates(df, encoding, cache, metric) or candidates(df, encoding, cache,
                                                                       COLD_RATE)
        split.append(([c for c in found if not _over_peer_format(c[0])],
                      [c for c in found if _over_peer_format(c[0])], metric))
    heights = [0.24 * max(len(own), len(over), 1) + 0.9 for own, over, _ in split]
    fig = Figure(figsize=(11, sum(heights) + 1.8), layout="constrained")
    # The right column only where our loader read a peer's format (not on a training set).
    both = any(over for _, over, _ in split)
    grid = fig.subplots(len(panels), 2 if both else 1, height_ratios=heights, squeeze=False,
                        **({"width_ratios": (1.15, 1)} if both else {}))
    for axes, (encoding, cache), (own, over, metric) in zip(grid, panels, split):
        left = axes[0]
        mine = rows[(rows["encoding"] == encoding) & (rows["cache"] == cache)]
        values = _rate_bars(left, mine, own, metric, epoch1=cache == "warm")
        what = ENCODING_NAMES.get(encoding, encoding)
        epochs = "epochs 2 and on" if cache == "warm" else "epoch 1"
        left.set_title(f"{what}, {cache} cache, {epochs}: each library over its own format",
                       fontsize="small")
        left.set_yticks(range(len(own)), [c[1] for c in own], fontsize="x-small")
        if both:
            right = axes[1]
            values += _rate_bars(right, mine, over, metric, epoch1=False,
                                 peer_own=_peer_own_rates(mine, own, metric))
            right.set_title(f"{what}, {cache}: our ProcessPrefetcher {MULTIPLY}{WORKERS} over "
                            "the peers' formats", fontsize="small")
            right.set_yticks(range(len(over)), [f"over {c[0].split(':', 1)[1]} files"
                                                for c in over], fontsize="x-small")
        finite = [v for v in values if np.isfinite(v) and v > 0]
        for ax in axes:
            ax.invert_yaxis()
            ax.set_xlabel(f"samples per second ({sets_caption(rows, encoding)})",
                          fontsize="x-small")
            if finite and max(finite) / min(finite) > LOG_SPAN:
                log_axis(ax, "x")
                ax.set_xlim(min(finite) / 1.3, max(finite) * 1.3)
            else:
                linear_axis(ax, "x")
                ax.set_xlim(0, max(finite, default=1.0) * 1.05)
    handles = family_handles({f: FAMILY_COLOURS[f] for f in ("storebench", "framework", "peer")},
                             FAMILY_NAMES)
    marks = {}
    for ax in grid.ravel():
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            marks.setdefault(label, handle)
    fig.legend([*handles, *marks.values()], [h.get_label() for h in handles] + list(marks),
               loc="outside lower center", ncols=3, fontsize="small")
    missing = skipped_paths(df)
    takeaway = rate_takeaway(df)
    if missing:
        takeaway += f" Not measured here: {', '.join(label for label, _ in missing)}."
    question_title(fig, f"Which loader library feeds the most samples per second? "
                        f"(shuffled, {WORKERS} workers, batch {BATCH_SIZE}; whiskers: the "
                        "repeats' range)", takeaway)
    return fig


def plot_peers_startup(df: pd.DataFrame) -> Figure:
    """JPEG, warm: time to the first batch (bars: in a fresh process, imports and JIT
    included; dots: a loader made again in a process that has run one), peak PSS of the
    process tree, and shuffle spread (1: as spread as a uniform random permutation)."""
    rows = peers_rows(df)
    found = candidates(df, "jpeg", "warm", RATE)
    if not found:
        return empty_figure("no peers rows")
    fig = Figure(figsize=(12, 0.3 * len(found) + 2.4), layout="constrained")
    axes = fig.subplots(1, 3, sharey=True)
    y = np.arange(len(found))
    jpeg = rows[(rows["encoding"] == "jpeg") & (rows["cache"] == "warm")]

    def medians(metric: str, scale: float = 1.0) -> list[float]:
        values = []
        for key, _, _, _ in found:
            mine = jpeg[jpeg["key"] == key]
            values.append(stat(mine, metric).median / scale
                          if not select(mine, metric).empty else np.nan)
        return values

    colours = [FAMILY_COLOURS.get(family, "C7") for _, _, family, _ in found]
    axes[0].barh(y, medians("fresh_process_first_batch_s"), color=colours,
                 label="fresh process (imports, JIT)")
    axes[0].plot(medians("epoch1_first_batch_s"), y, "k|", markersize=12,
                 label="loader made again (median)")
    axes[0].set_title("time to first batch, epoch 1 (s)", fontsize="small")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower left", ncols=2, fontsize="x-small")
    log_axis(axes[0], "x")
    axes[1].barh(y, medians("peak_pss_bytes", 1e6), color=colours)
    axes[1].set_title("peak PSS of the process tree (MB)", fontsize="small")
    spreads = medians("shuffle_spread")
    axes[2].barh(y, spreads, color=colours)
    for row, spread in zip(y, spreads):
        if np.isnan(spread):
            axes[2].text(0.02, row, "not measured: its batches carry no sample indices",
                         va="center", fontsize="xx-small", color="grey")
    axes[2].axvline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes[2].set_title("shuffle spread, epoch 1 (1 = uniform permutation)", fontsize="small")
    axes[0].set_yticks(y, [label for _, label, _, _ in found], fontsize="x-small")
    axes[0].invert_yaxis()
    fig.suptitle(f"Start-up, memory and shuffle quality ({sets_caption(rows, 'jpeg')}, "
                 "warm cache)", fontsize="medium")
    return fig


# -- findings and guide -------------------------------------------------------------------
def _precise(ratio: float) -> str:
    """A ratio beside a threshold: three decimals, so 1.195 never reads as 1.2."""
    return f"{ratio:.3f}{MULTIPLY}"


def target_findings(results: Results) -> list[str]:
    """The issue's targets: our best path against the best peer (JPEG and raw, warm,
    epochs 2 and on), and JPEG decode against cores x one thread (``decode_efficiency``)."""
    df = results.df
    out = []
    for encoding, filter, threshold, against in (
            ("jpeg", "antialiased", TARGET_RATIO, "the best peer"),
            ("raw", "antialiased", TARGET_RATIO, "the best peer"),
            ("jpeg", "plain", PLAIN_TARGET_RATIO, "tf.data")):
        found = best_against_peers(df, encoding, filter)
        what = ENCODING_NAMES.get(encoding, encoding)
        if found is None:
            continue
        ours, peer, (ratio, low, high) = found
        met = "met" if low >= threshold else "not met"
        interval = (f"95% interval {_precise(low)}\u2013{_precise(high)}" if math.isfinite(low)
                    else f"fewer than {MIN_PAIRED_REPEATS} repeats on a side: no interval")
        workload = results.workload(NAME, encoding)
        on = f" ({workload})" if workload else ""
        resize = "" if encoding == "raw" else f", both resizing {filter}"
        out.append(
            f"{what}, warm, epochs 2 and on{on}{resize}: storebench's best path, {ours[1]} "
            f"at {ours[3]}, runs {_precise(ratio)} {against}, {peer[1]} at {peer[3]} "
            f"({interval}); the target of {format_ratio(threshold)} is {met} by its "
            "interval's lower end.")
    efficiency = decode_efficiency(df)
    if efficiency is None:
        out.append("JPEG decode against cores \u00d7 one thread: not in these results; the "
                   "targets study measures it (storebench run --study targets).")
    else:
        row, faster = efficiency
        workload = results.workload("targets", "jpeg")
        targets_set = f" on {workload} (a machine calibration)" if workload else ""
        met = ("met by its interval's lower end" if row["met"]
               else "not met by its interval's lower end")
        out.append(
            f"JPEG decode from RAM through the faster prefetcher, {faster}, reaches "
            f"{format_percent(row['value'])} (95% interval "
            f"{format_percent(row['low'])}\u2013{format_percent(row['high'])}, "
            f"{row['repeats']} repeats) of what one thread decodes on each core, summed, "
            f"both timed in one case of the targets study{targets_set}, interleaved over the "
            f"same batches; the goal of {format_percent(row['threshold'])} is {met}.")
    return out


SPDL_PATHS = ("spdl", "spdl_io", "spdl_process")


def spdl_findings(df: pd.DataFrame) -> list[str]:
    """Where storebench stands against SPDL, warm, epochs 2 and on, as ratios in the same run:
    our best path against SPDL's best, and our ThreadPrefetcher against SPDL's thread
    stages (the same design: thread pools, GIL-releasing decode, one process)."""
    out = []
    for encoding in ENCODINGS:
        # SPDL's pipelines resize with Pillow: ours of the same (antialiased) class.
        found = [c for c in candidates(df, encoding, "warm", RATE)
                 if filter_class(c[0]) == "antialiased"]
        ours = [c for c in found if is_storebench_over_core(c[0], c[2])]
        spdl = [c for c in found if key_parts(c[0])[0] in SPDL_PATHS]
        if not ours or not spdl:
            continue
        what = ENCODING_NAMES.get(encoding, encoding)
        pairs = [(ours[0], spdl[0], "storebench's best path")]
        thread = [c for c in ours if key_parts(c[0])[0] == "thread"]
        spdl_thread = [c for c in spdl if key_parts(c[0])[0] == "spdl"]
        if thread and spdl_thread and (thread[0], spdl_thread[0]) != (ours[0], spdl[0]):
            pairs.append((thread[0], spdl_thread[0], "our ThreadPrefetcher"))
        for mine, theirs, who in pairs:
            ratio, low, high = ratio_interval(mine[3], theirs[3])
            interval = (f"95% interval {_precise(low)}\u2013{_precise(high)}"
                        if math.isfinite(low) else
                        f"fewer than {MIN_PAIRED_REPEATS} repeats on a side: no interval")
            out.append(f"{what}, warm, epochs 2 and on: {who}, {mine[1]} at {mine[3]}, runs "
                       f"{_precise(ratio)} SPDL's {theirs[1]} at {theirs[3]} ({interval}).")
    return out


def findings(results: Results) -> list[str]:
    df = results.df
    out = target_findings(results) + spdl_findings(df)
    rows = peers_rows(df)
    jpeg = rows[(rows["encoding"] == "jpeg") & (rows["cache"] == "warm")]
    starts = []
    for _, mine in jpeg.groupby("key", sort=False):
        if not select(mine, "fresh_process_first_batch_s").empty:
            starts.append((stat(mine, "fresh_process_first_batch_s"), mine["label"].iloc[0]))
    if len(starts) > 1:
        starts.sort(key=lambda s: s[0].median)
        out.append(f"Time to the first batch in a fresh process (imports and JIT included; "
                   f"JPEG, warm) runs from {starts[0][0]} ({starts[0][1]}) to "
                   f"{starts[-1][0]} ({starts[-1][1]}); the rates above exclude it.")
    spreads = []
    for _, mine in jpeg.groupby("key", sort=False):
        if not select(mine, "shuffle_spread").empty:
            spreads.append((stat(mine, "shuffle_spread").median, mine["label"].iloc[0]))
    if spreads:
        spreads.sort()
        out.append(f"Shuffle quality, measured from the delivered order: the least spread "
                   f"shuffle is {spreads[0][1]}'s at {format_value(spreads[0][0], 'ratio')} "
                   f"of a uniform permutation's neighbour distance, the most spread "
                   f"{spreads[-1][1]}'s at {format_value(spreads[-1][0], 'ratio')}.")
    for label, reason in skipped_paths(df):
        out.append(f"Not measured: {label}: {reason}")
    return out


def guide(results: Results) -> list:
    """Which loader library: per encoding and cache state, every path measured."""
    from ...guide import Candidate, choose

    out = []
    rows = peers_rows(results.df)
    for encoding in ENCODINGS:
        for cache, metric, epoch in (("warm", RATE, "epochs 2 and on"),
                                      ("cold", COLD_RATE, "epoch 1")):
            every = candidates(results.df, encoding, cache, metric)
            # Speed is compared within one resize filter class (tf.data's is plain).
            classes = sorted({filter_class(c[0]) for c in every})
            for filter in classes:
                found = [c for c in every if filter_class(c[0]) == filter]
                what = ENCODING_NAMES.get(encoding, encoding)
                resize = (f", resizing {filter}" if len(classes) > 1 or filter == "plain"
                          else "")
                question = (f"{what}, {cache} cache, {epoch}, shuffled, {WORKERS} workers"
                            f"{resize}: which loader library and format? "
                            f"({sets_caption(rows, encoding)})")
                # The situation each row answers, for ``storebench advise``: whole
                # pipelines over a set in RAM.
                facets = {"encoding": encoding, "cache": cache, "filter": filter,
                          "workers": WORKERS}
                row = choose(NAME, question, metric,
                             [Candidate(key, label, value) for key, label, _, value in found],
                             facets=facets)
                if row is not None:
                    out.append(row)
    return out



def readme_text(results: Results, place) -> str:
    sentences = target_findings(results)
    if not sentences:
        return ""
    return ("**Against the peer libraries** (the `peers` study)\n\n" + bullets(sentences))


# The live cell: our process prefetcher against a peer library over the same JPEGs.
LIVE = LiveComparison(
    pair=("ProcessPrefetcher", "SPDL"),
    choices={"ProcessPrefetcher": {"function": "peer_epochs", "prefetcher": "process",
                                   "format": "lmdb",
                                   "encoding": "jpeg"},
             "ThreadPrefetcher": {"function": "peer_epochs", "prefetcher": "thread",
                                  "format": "lmdb", "encoding": "jpeg",
                                  "param_decode": "simplejpeg"},
             "SPDL": {"function": "peer_epochs", "prefetcher": "spdl", "format": "lmdb",
                      "encoding": "jpeg"}},
    formats=("lmdb",), encodings=("jpeg",), metric="later_epochs_samples_per_s",
)


STUDY = Study(
    name=NAME,
    question="Which loader library: storebench's, or WebDataset, LitData, MDS, DALI, FFCV, "
             "torchdata, SPDL, Lance or Zarr?",
    grid=peers_grid,
    figures=(
        FigureSpec("peers_rate", "Samples per second of every loader library over its own "
                   "format, and of our loader over the peers' formats: JPEG warm and cold, "
                   "raw warm.",
                   lambda results: plot_peers(results.df)),
        FigureSpec("peers_startup", "Time to first batch, peak memory and measured shuffle "
                   "spread of every path (JPEG, warm).",
                   lambda results: plot_peers_startup(results.df)),
    ),
    findings=findings,
    guide=guide,
    notebook="08_peers.ipynb",
    readme_figures=("peers_rate",),
    readme_text=readme_text,
    prepare=prepare,
    # It reads its cut sets only, which ``prepare`` builds.
    reads_profile_sets=False,
    targets=PEER_TARGETS,
    live=LIVE,
)
