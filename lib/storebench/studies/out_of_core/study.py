"""The out_of_core study: epochs over a dataset k times larger than the memory the
case may use, so that the page cache cannot hold it.

k maps to "your dataset is k times your RAM": each case runs in a memory budget
(``bench.memory_budget``) of its own baseline plus ``dataset bytes / k``. The baseline is
what the case holds once its reader, loader and workers are up and have delivered a first
batch, or the most a first loader held besides page cache while it read, where that is more
(``cases.out_of_core._primed_loader``), so the room above it is what a training job's page
cache would have: 1/k of the dataset. k = 5 is MLPerf Storage's rule (the dataset at least
5x the host's memory); k = 0 is no cap (the dataset fits), measured in the same kind of
cgroup so that every row carries the same counters. Where no writable memory cgroup
exists the case is skipped with the reason (``runner.CaseSkipped``), never run
unconstrained.

Every row records the budget, k, the cgroup's peak, its page cache, major faults, bytes read
from the device, and per epoch (``epoch<n>.<metric>``) the time, throughput and the dataset's
resident fraction at start and end (``mincore``). A ``preloaded`` case that does not fit its
budget is a measured outcome, not a failure: ``PreloadedDataset`` refuses before reading and
the row says ``does_not_fit = 1`` with the bytes it needed and had (status ``ok``: ``skipped``
means "could not be measured here", which is not what happened).

Under a cap the grid's passes are windows (``CAPPED_EPOCH_SECONDS_LIMIT``): they screen
(param ``stage`` ``SCREEN``, labelled so) and never decide. A second stage
(``finalist_cases``, run by the study runner through ``Study.finalists``) times the
screen's fastest candidates at the largest k, ``FINALISTS`` per encoding, as whole epochs:
one case each, a warming pass and then one whole pass per repeat in the same cgroup, so its
``GUIDE_REPEATS`` passes are its repeats. An encoded set's finalist is also timed with the
set cached and no cap, and read undecoded: the targets' pairs. A finalist reads the set's
first ``SUBSET_SAMPLES`` samples where it has more, read in place: the set a build of that
many samples of the same spec would hold, since a sample depends only on its spec's seed and
index. Its cap is scaled to the subset's share of the stored bytes, not the whole set's.
Every row records the page cache's peak against the room its cap left (``cache_fill``); a
guide question calls its set k times the RAM only where every candidate's cache reached the
cap (``CACHE_REACHED``). Results from before the screen carry no stage and are read as they
are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...bench.case import Case
from ...bench.plan import plan_for
from ...bench.stats import MIN_DECISION_REPEATS
from ...formats import read_manifest, traits
from ...plots import (
    empty_figure,
    format_colours,
    legend_below,
    log_axis,
    summarise,
    titled,
)
from ...results import (
    Results,
    failed_cases,
    format_order,
    medians_table,
    ordered,
    params_of,
    ratio_interval,
    row_sources,
    select,
    sort_rows,
    stat,
    stat_columns,
    summary_table,
)
from ...text import (
    DASH,
    ENCODING_NAMES,
    format_percent,
    format_ratio,
    format_value,
    relative_text,
)
from ..base import FigureSpec, LiveComparison, Study, TargetMeasure, TargetSpec
from ..grid import (
    batch_size_for,
    dataset_fields,
    decode_params,
    is_imported_manifest,
    is_training_set,
    knob_params,
    profile_datasets,
)
from ..shared_rows import ooc_rows
from .cases import DEFAULT_EPOCHS, SCREEN, WHOLE_EPOCHS

CASES = "storebench.studies.out_of_core.cases"
NAME = "out_of_core"
K_VALUES = (0, 2, 5)  # 0: no cap, the dataset fits
# A cyclic scan gets nothing from any cache smaller than the set, so raw sequential reads
# run where the set fits and at the largest k only; the figure says so in the panels left
# out.
SEQUENTIAL_KS = (0, max(K_VALUES))
SEQUENTIAL_LEFT_OUT = ("not measured: a cyclic scan gains\nnothing from a cache smaller "
                       f"than the set\n(k = {max(K_VALUES)} shows it)")


# -- the grid -------------------------------------------------------------------------
PREFETCHER, WORKERS = "thread", 2  # the prefetch study's best path, raw and JPEG
# A thrashing pass is cut short after this long: memmap's default read-around under a k = 5
# cap took over 60 s for one shuffled pass of the small set (0.24 s cold when it fits, 2 s
# with MADV_RANDOM; one batch of 256 took about 5 s and read 1.8 GB). Its rate over the
# first second says as much, and bounds the study's time (under a cap a pass ends within
# one slice of the limit, or half the limit for a batch that ends sooner:
# ``cases.out_of_core``).
EPOCH_SECONDS_LIMIT = 1.0
# Under a cap (k > 0), half a second: the cap's room fills well within it (results/
# study-runs/README.md, "Constants and their evidence"). Where the set fits (k = 0) a pass
# keeps the second, or a cold epoch 1 would leave it partly uncached for epoch 2.
CAPPED_EPOCH_SECONDS_LIMIT = 0.5
PRELOADED_FORMAT = "memmap"
MB_BYTES = 1e6
GUIDE_REPEATS = MIN_DECISION_REPEATS
# The largest k's second stage (``finalist_cases``): per encoding, how many of the screen's
# best paths are timed over whole epochs (decoding paths for an encoded set), each as one
# warming pass and ``GUIDE_REPEATS`` whole timed passes in one case.
FINALISTS = {"raw": 5, "jpeg": 2}
# A finalist reads the set's first this many samples where it has more (``cases.
# subset_samples``), its cap scaled to their share of the stored bytes: a whole epoch of the
# slowest finalist then takes minutes, not the whole set's tens of minutes.
SUBSET_SAMPLES = 4000
# The page cache reached the cap when its peak filled this much of the room above the
# baseline (the cgroup reclaims before the room is quite full): below it, the set is not yet
# k times the memory the case used, whatever its cap.
CACHE_REACHED = 0.9
# Pages of the set that other processes (or the kernel's read-around just before a
# measurement) may hold outside the case's cgroup.
RESIDENT_TOLERANCE = 0.05


# The ImageNet-like set (``grid.is_training_set``): the targets are at k = 5, so k = 2
# is left out there (it decided no guide row the k = 5 row does not); the decoding cases
# read in batches of this many (a decoded batch of 256 takes about half a second on two
# cores, a whole capped pass), over the uncapped pass's time limit at both k, so the two
# rates they compare are timed alike.
TRAINING_K_VALUES = (0, max(K_VALUES))
TRAINING_DECODE_BATCH = 64
# The JPEG formats whose decoding path is measured on the ImageNet-like set: one per way of
# reading a sample (B-tree pages, a shard read through, a file per sample); each format is
# also read undecoded at k = 5, the I/O it can supply.
TRAINING_DECODE_FORMATS = ("lmdb", "tfrecord", "rawfiles")


def _case(path: Path, manifest: dict, *, access: str, k: int, repeats: int, timeout_s: float,
          loader: str = "lazy", params: dict | None = None, decoded: bool = True,
          batch_size: int | None = None, seconds_limit: float | None = None) -> Case:
    """One case; ``decoded``: the samples are decoded and transformed as training reads them
    (``grid.decode_params``), else delivered as stored (undecoded: the I/O alone)."""
    decoding = {k: v for k, v in decode_params(manifest).items() if v} if decoded else {}
    limit = seconds_limit or (CAPPED_EPOCH_SECONDS_LIMIT if k else EPOCH_SECONDS_LIMIT)
    # Under a cap, a window of each pass: a screen, which ranks paths and decides nothing.
    staged = {"stage": SCREEN} if k else {}
    return Case(
        function=f"{CASES}:out_of_core_epochs_case", loader=loader, prefetcher=PREFETCHER,
        workers=WORKERS, batch_size=batch_size or batch_size_for(manifest["num_samples"]),
        access=access, cache="cold", repeats=repeats, warmup=False, timeout_s=timeout_s,
        params={"k": k, "epoch_seconds_limit": limit, **decoding, **staged, **(params or {})},
        **dataset_fields(NAME, path, manifest),
    )


def _raw_cases(path: Path, manifest: dict, *, ks: tuple[int, ...], common: dict,
               guided: dict, decoded: bool) -> list[Case]:
    """A raw set's cases: sequential at no cap and the largest k, each shuffle order at
    every k of ``ks`` (``guided`` repeats under a cap), the format's out-of-core open
    options at no cap and the largest k, and a preload of the memmap set at every k."""
    fmt, top = manifest["format"], max(ks)
    one = {"decoded": decoded, **common}
    cases = [_case(path, manifest, access="sequential", k=k, **one) for k in SEQUENTIAL_KS]
    orders = ("block_shuffle",) if traits(fmt).block_only else ("shuffle", "block_shuffle")
    cases += [_case(path, manifest, access=access, k=k, decoded=decoded,
                    **(guided if k else common)) for access in orders for k in ks]
    for options, access in traits(fmt).out_of_core_options:
        params = {f"open_{name}": value for name, value in options.items()}
        cases += [_case(path, manifest, access=access, k=k, params=params, **one)
                  for k in (0, top)]
    if fmt == PRELOADED_FORMAT:
        cases += [_case(path, manifest, access="block_shuffle", k=k, loader="preloaded", **one)
                  for k in ks]
    return cases


def _training_jpeg_cases(path: Path, manifest: dict, *, common: dict, guided: dict,
                         compact: bool) -> list[Case]:
    """An ImageNet-like JPEG set's cases: undecoded at the largest k (the I/O it supplies)
    and, for ``TRAINING_DECODE_FORMATS``, decoded with the training transform at the
    largest k from cold and at no cap with the set cached (the rate out of core is held
    to), all with the guide's repeats."""
    fmt, top = manifest["format"], max(TRAINING_K_VALUES)
    access = "block_shuffle" if traits(fmt).block_only else "shuffle"
    shape = {"batch_size": min(TRAINING_DECODE_BATCH, batch_size_for(manifest["num_samples"])),
             "seconds_limit": EPOCH_SECONDS_LIMIT}
    cases = [_case(path, manifest, access=access, k=top, decoded=False, **shape, **guided)]
    if compact or fmt in TRAINING_DECODE_FORMATS:
        cases += [_case(path, manifest, access=access, k=0, params={"cached": True},
                        **shape, **guided),
                  _case(path, manifest, access=access, k=top, **shape, **guided)]
    return cases


def out_of_core_grid(
    *, profile: str, data_dir: Path | str, repeats: int | None = None
) -> list[Case]:
    """The out_of_core cases, each ``DEFAULT_EPOCHS`` epochs from cold under k in
    ``K_VALUES``, lazy reads through two prefetch threads:

    - raw, every format (``_raw_cases``): block shuffle and full shuffle at every k (no
      full shuffle where the format's ``TRAITS.shuffle_unit`` is a block); sequential at
      k = 0 and the largest k only (a cyclic scan gets nothing from any cache smaller than
      the set, so k = 2 adds nothing); the format's open knobs; a memmap preload;
    - JPEG, every format: shuffled (block-shuffled where the shuffle unit is a block) at
      k = 0 and the largest k (decode-bound: the order matters less);
    - knobs (each format's build variants where built) at k = 0 and the largest k on the
      order where they matter.

    On an ImageNet-like set (``grid.is_training_set``) k is ``TRAINING_K_VALUES``, raw
    arrays are read undecoded and untransformed (the I/O alone, which the cold-read target
    measures), build variants at the largest k only, and the JPEG sets as
    ``_training_jpeg_cases`` lays out (the decoding target's cases).

    Compact plans (``ci``) keep one raw format (memmap) and one JPEG format (lmdb) and the
    open knobs of those two. ``repeats=None`` means 1 (each case is already two epochs, and
    the effects compared here, cache or no cache, are large against run-to-run noise), except
    ``GUIDE_REPEATS`` for the shuffled cases at a capped k that the guide compares, and for
    the training set's JPEG cases, which the targets compare.
    """
    plan = plan_for(profile)
    guided = GUIDE_REPEATS if repeats is None and not plan.compact else repeats
    repeats = 1 if repeats is None else repeats
    common = {"repeats": repeats, "timeout_s": plan.timeout_s}
    guided = {"repeats": guided or repeats, "timeout_s": plan.timeout_s}
    cases = []
    for path, manifest in profile_datasets(profile, data_dir, variants=True):
        fmt, encoding = manifest["format"], manifest["encoding"]
        training = is_training_set(manifest)
        ks = TRAINING_K_VALUES if training else K_VALUES
        # An import's encoded copy (JPEG, PNG or both) stands where the profile's JPEG set does.
        encoding = "jpeg" if is_imported_manifest(manifest) and encoding != "raw" else encoding
        if plan.compact and (fmt, encoding) not in (("memmap", "raw"), ("lmdb", "jpeg")):
            continue
        if knob_params(path, manifest):
            access = traits(fmt).variant_access
            if not access or encoding != "raw" or plan.compact:
                continue
            cases += [_case(path, manifest, access=access, k=k, decoded=not training,
                            params=knob_params(path, manifest), **common)
                      for k in ((max(ks),) if training else (0, max(ks)))]
        elif encoding == "raw":
            cases += _raw_cases(path, manifest, ks=ks, common=common, guided=guided,
                                decoded=not training)
        elif encoding == "jpeg" and training:
            cases += _training_jpeg_cases(path, manifest, common=common, guided=guided,
                                          compact=plan.compact)
        elif encoding == "jpeg":
            access = "block_shuffle" if traits(fmt).block_only else "shuffle"
            cases += [_case(path, manifest, access=access, k=k, **common) for k in (0, max(ks))]
    return cases


# -- the second stage: whole epochs of the screen's best paths -----------------------------
def finalist_cases(results: Results, cases: list[Case]) -> list[Case]:
    """The study's second stage (``Study.finalists``), from its screens' rows in ``results``
    and the grid's ``cases``: at the largest k, per encoding, the ``FINALISTS`` fastest of
    the guide's candidates by the screen's last-epoch samples/s, each as whole epochs
    (``whole_epochs``); an encoded set's decoding path also with the set cached and no cap
    (the rate the decoding target holds it to) and read undecoded (the I/O it can supply,
    which the cold-read target reads too)."""
    by_id = {case.case_id: case for case in cases}
    screens = study_rows(results.df)
    screens = screens[(screens["stage"] == SCREEN) & screens["case_id"].isin(by_id)]
    rated = select(guide_candidates(screens), f"epoch{DEFAULT_EPOCHS}.samples_per_s")
    if rated.empty:
        return []
    rated = rated[rated["k"] == rated["k"].max()]
    finals: dict[str, Case] = {}
    for encoding, part in rated.groupby("encoding", sort=True):
        medians = part.groupby("case_id")["value"].median().sort_values(ascending=False,
                                                                         kind="stable")
        for case_id in medians.index[:FINALISTS.get(encoding, min(FINALISTS.values()))]:
            case = by_id[case_id]
            chosen = [case]
            if encoding != "raw":
                chosen += [_with_params(case, k=0, cached=True, stage=None),
                           _with_params(case, decode=None, transform=None, resize=None)]
            for final in map(whole_epochs, chosen):
                finals.setdefault(final.case_id, final)
    return list(finals.values())


def _with_params(case: Case, **changes) -> Case:
    """``case`` with params changed (a value of None removes the param)."""
    params = {**dict(case.params), **changes}
    return dataclasses.replace(case, params={k: v for k, v in params.items() if v is not None})


def whole_epochs(case: Case) -> Case:
    """``case`` as a finalist: one warming pass and ``GUIDE_REPEATS`` whole timed passes
    (one per repeat) of its set's first ``SUBSET_SAMPLES`` samples, in one process, its
    cache state set by the case itself (``cases._WholeEpochs``)."""
    samples = int(read_manifest(case.dataset)["num_samples"])
    changes = {"epoch_seconds_limit": None, "stage": WHOLE_EPOCHS,
               "subset_samples": SUBSET_SAMPLES if samples > SUBSET_SAMPLES else None}
    return dataclasses.replace(_with_params(case, **changes), repeats=GUIDE_REPEATS,
                               min_repeats=None, cache="", warmup=False)


# -- the one table figures, findings and the guide read ---------------------------------
def set_caption(rows: pd.DataFrame, encoding: str | None = None) -> str:
    """``"12,000 samples, about 151 kB each stored, raw"`` per encoding of ``rows`` (or
    ``encoding`` only): the set the cases read, from their own ``samples`` and
    ``dataset_bytes`` rows, whatever family or profile it came from."""
    parts = []
    encodings = [encoding] if encoding else ordered(rows["encoding"].dropna(),
                                                    ("raw", "png", "jpeg", "mixed"))
    for enc in encodings:
        mine = rows[rows["encoding"] == enc]
        count, size = select(mine, "samples"), select(mine, "dataset_bytes")
        if count.empty or size.empty:
            continue
        # The median layout's bytes: formats pad (LMDB's pages) or compress (zstd) them.
        n, total = float(count["value"].max()), float(size["value"].median())
        parts.append(f"{n:,.0f} samples, about {format_value(total / n, 'bytes')} each "
                     f"stored, {enc}")
    return "; ".join(parts) or "the study's sets"


def k_text(k: int) -> str:
    return "no cap (fits in RAM)" if k == 0 else f"k = {k}"


def _stages(df: pd.DataFrame) -> pd.Series:
    """Each row's stage (``SCREEN``, ``WHOLE_EPOCHS``; "" for a case of neither, and for
    every row of results from before the study screened)."""
    if df.empty:
        return pd.Series("", index=df.index, dtype=object)
    return params_of(df).map(lambda p: p.get("stage", ""))


def study_rows(df: pd.DataFrame) -> pd.DataFrame:
    """``ooc_rows`` with each row's ``stage``; a screen's label says so."""
    rows = ooc_rows(df)
    stage = _stages(rows)
    return rows.assign(stage=stage, label=[f"{label}, screen" if s == SCREEN else label
                                           for label, s in zip(rows["label"], stage)])


def _frame_stages(df: pd.DataFrame) -> pd.Series:
    """``_stages`` of this study's rows of ``df``; "" for any other study's."""
    stage = pd.Series("", index=df.index, dtype=object)
    mine = df["study"] == NAME
    stage[mine] = _stages(df[mine])
    return stage


def grid_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` less the whole-epochs finalists: the grid's rows, each measured alike (the
    figures and findings that set every path beside the others read these)."""
    return df[_frame_stages(df) != WHOLE_EPOCHS]


def screened(df: pd.DataFrame) -> bool:
    """Whether ``df`` holds this study's rows of a screened run (rows with a stage), not
    only rows from before the screen."""
    return bool((_frame_stages(df) != "").any())


def decision_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The rows a decision (a guide row, a target) may rest on: this study's whole-epochs
    finalists where the results screened (a screen's window never decides); results from
    before the screen, whose rows carry no stage, as they are."""
    stage = _frame_stages(df)
    if not (stage != "").any():
        return df
    return df[(df["study"] != NAME) | (stage == WHOLE_EPOCHS)]


def ooc_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per case: medians of each epoch's samples/s and delivered MB/s, epoch 2 over epoch 1,
    the highest resident fraction at an epoch's end, the budget and the cgroup's peak, the
    page cache's peak against the room the cap left it (``cache_fill``), the samples read
    (of ``set_samples`` where a subset), and whether a preload did not fit."""
    rows = study_rows(df)
    keys = ["format", "encoding", "loader", "access", "setting", "k", "reads", "stage",
            "label"]
    metrics = [f"epoch{n}.samples_per_s" for n in range(1, DEFAULT_EPOCHS + 1)] + [
        f"epoch{DEFAULT_EPOCHS}.read_MBps", "epoch2_over_epoch1", "budget_bytes",
        "cgroup_limit_bytes", "cgroup_peak_bytes", "effective_k", "does_not_fit",
        "device_read_bytes", f"epoch{DEFAULT_EPOCHS}.device_read_bytes",
        f"epoch{DEFAULT_EPOCHS}.seconds", f"epoch{DEFAULT_EPOCHS}.samples", "samples",
        "set_samples", "cache_room_bytes", "file_cache_peak_bytes", "cache_fill"]
    if rows.empty:
        return pd.DataFrame(columns=[*keys, *metrics, "resident_end_max"])
    table = medians_table(rows, metrics, keys).set_index(keys)
    resident = rows[rows["metric"].str.endswith(".resident_end")]
    resident = select(resident).groupby(keys)["value"].max().rename("resident_end_max")
    return sort_rows(table.join(resident, how="left").reset_index())


def _last_rate(table: pd.DataFrame) -> pd.Series:
    return table[f"epoch{DEFAULT_EPOCHS}.samples_per_s"]


def ooc_findings(df: pd.DataFrame, env: Mapping | None = None) -> list[str]:
    """What changes when the dataset no longer fits: the best and worst shuffled raw path
    at each k, what epoch 2 gains over epoch 1 at each k, whether the readahead knobs
    reverse, whether a preload fits, the cap's evidence, and the cold-read target."""
    table = ooc_table(grid_frame(df))
    sentences = []
    if table.empty:
        return sentences
    lazy_raw = table[(table["loader"] == "lazy") & (table["encoding"] == "raw")]
    shuffled = lazy_raw[lazy_raw["access"] != "sequential"].dropna(
        subset=[f"epoch{DEFAULT_EPOCHS}.samples_per_s"])
    for k, part in shuffled.groupby("k"):
        if len(part) < 2:
            continue
        best = part.loc[_last_rate(part).idxmax()]
        worst = part.loc[_last_rate(part).idxmin()]
        sentences.append(
            f"Raw arrays, shuffled epochs, {k_text(k)}: the fastest path in epoch "
            f"{DEFAULT_EPOCHS} is {best['label']} at "
            f"{format_value(_last_rate(part)[best.name], 'samples/s')}, the slowest "
            f"{worst['label']} at {format_value(_last_rate(part)[worst.name], 'samples/s')} "
            f"({format_ratio(_last_rate(part)[best.name] / _last_rate(part)[worst.name])} "
            f"apart; {len(part)} paths).")
    gains = shuffled.dropna(subset=["epoch2_over_epoch1"]).groupby("k")["epoch2_over_epoch1"]
    if len(gains):
        sentences.append(
            "Epoch 2 over epoch 1 (raw arrays, shuffled, median over formats and knobs): "
            + "; ".join(f"{k_text(k)} {format_ratio(g.median())}" for k, g in gains) + ".")
    for fmt, option in (("memmap", "madvise_random=True"), ("lmdb", "readahead=False")):
        knob = lazy_raw[(lazy_raw["format"] == fmt) & (lazy_raw["setting"] == option)]
        default = lazy_raw[(lazy_raw["format"] == fmt) & (lazy_raw["setting"] == "default")]
        parts = []
        for _, row in knob.iterrows():
            base = default[(default["access"] == row["access"]) & (default["k"] == row["k"])]
            if base.empty:
                continue
            ratio = (row[f"epoch{DEFAULT_EPOCHS}.samples_per_s"]
                     / base[f"epoch{DEFAULT_EPOCHS}.samples_per_s"].iloc[0])
            parts.append(f"{relative_text(ratio)} the default at {k_text(row['k'])}")
        if parts:
            sentences.append(f"{fmt} with {option}, {knob['access'].iloc[0].replace('_', ' ')}"
                             f", epoch {DEFAULT_EPOCHS}: " + "; ".join(parts) + ".")
    preloaded = table[table["loader"] == "preloaded"]
    if not preloaded.empty:
        fits = sorted(preloaded.loc[preloaded["does_not_fit"].fillna(0) < 1, "k"])
        refused = sorted(preloaded.loc[preloaded["does_not_fit"].fillna(0) >= 1, "k"])
        sentences.append(
            "PreloadedDataset fits at " + (", ".join(k_text(k) for k in fits) or "no k")
            + " and refuses, before reading, at " + (", ".join(k_text(k) for k in refused)
                                                     or "no k") + ".")
    capped = table[(table["k"] > 0) & table["resident_end_max"].notna()
                   & (table["loader"] == "lazy")]
    if not capped.empty:
        # What the cap lets stay resident: 1/k of the set, or all of it where the floor of
        # room above the baseline (MIN_ROOM_BYTES) is more than the set (tiny ci sets).
        allowed = np.minimum(1.0, 1.0 / capped["effective_k"].fillna(capped["k"]))
        held = int((capped["resident_end_max"] <= allowed + RESIDENT_TOLERANCE).sum())
        within = int((capped["cgroup_peak_bytes"] <= capped["cgroup_limit_bytes"]).sum())
        sentences.append(
            f"The cap held: in {held} of {len(capped)} capped cases the dataset resident at "
            f"every epoch's end stayed within what the cap allows (1/k of the set, plus "
            f"{format_percent(RESIDENT_TOLERANCE)}), and the cgroup's peak charge stayed within "
            f"its limit in {within} of {len(capped)}.")
    return sentences


# The issues' bars: at the largest k, the best shuffled path reading undecoded samples
# delivers at least this fraction of the same run's cold sequential read bandwidth, in bytes
# of samples per second; the best decoding path keeps at least ``DECODE_KEEP_TARGET`` of its
# own rate with the set cached.
COLD_READ_TARGET = 0.5
DECODE_KEEP_TARGET = 0.9
# The device read this many times the bytes delivered or more: read-around, not the reads'
# count, is what the pass pays for.
READ_AROUND_AMPLIFICATION = 1.5
LAST = f"epoch{DEFAULT_EPOCHS}"


def read_amplification(row) -> float:
    """Bytes the device read in the last epoch over the sample bytes it delivered (a row of
    ``ooc_table``); NaN where either is missing."""
    delivered = row[f"{LAST}.read_MBps"] * MB_BYTES * row[f"{LAST}.seconds"]
    return row[f"{LAST}.device_read_bytes"] / delivered if delivered else float("nan")


def io_limit_text(row) -> str:
    """What limits an undecoded shuffled read, from its row of ``ooc_table``: read-around
    where the device read ``READ_AROUND_AMPLIFICATION`` times the bytes delivered or more;
    the page cache, not the device, where it read less than half of them (a set the cap
    leaves cached); else the random reads a second (IOPS) of its sample size."""
    amplification = read_amplification(row)
    rate = row[f"{LAST}.samples_per_s"]
    size = row[f"{LAST}.read_MBps"] * MB_BYTES / rate if rate else float("nan")
    if np.isfinite(amplification) and amplification >= READ_AROUND_AMPLIFICATION:
        return (f"read-around: the device read {format_ratio(amplification)} the sample "
                f"bytes delivered")
    if np.isfinite(amplification) and amplification < 0.5:
        return (f"not the device: it read {format_percent(amplification)} of the bytes "
                "delivered, the page cache served the rest")
    return (f"IOPS: {format_value(rate, 'samples/s')} random reads of "
            f"{format_value(size, 'bytes')} each (the device read "
            f"{format_ratio(amplification)} the bytes delivered)")


def _last_epoch_table(results: Results) -> pd.DataFrame:
    table = ooc_table(decision_frame(results.df))
    return table[(table["loader"] == "lazy") & (table["access"] != "sequential")]


def cold_read_target(results: Results) -> TargetMeasure | None:
    """The best shuffled path reading undecoded samples (raw arrays, or encoded bytes left
    undecoded) at the largest k: its delivered MB/s in its last epoch over the run's cold
    sequential read limit (its repeats' range over the one limit)."""
    env = results.study_env(NAME)
    limit = ((env or {}).get("limits") or {}).get("cold_seq_read_GBps")
    rows = study_rows(decision_frame(results.df))
    top = int(rows["k"].max()) if not rows.empty else 0
    rows = rows[(rows["k"] == top) & (top > 0) & (rows["loader"] == "lazy")
                & (rows["reads"] == "undecoded") & (rows["access"] != "sequential")]
    table = summary_table(rows, f"{LAST}.read_MBps", ["label"])
    if not isinstance(limit, int | float) or not limit or table.empty:
        return None
    best = table.loc[table["median"].astype(float).idxmax()]
    table = _last_epoch_table(results)
    row = table[(table["label"] == best["label"]) & (table["k"] == top)].iloc[0]
    scale = limit * 1000.0
    return TargetMeasure(
        value=best["median"] / scale, low=best["low"] / scale, high=best["high"] / scale,
        repeats=int(best["repeats"]),
        sources=row_sources(select(rows[rows["label"] == best["label"]], f"{LAST}.read_MBps")),
        derived=True,
        limiting=(f"the best shuffled undecoded path at k = {top} ({best['label']}) delivers "
                  f"{format_value(best['median'], 'MB/s')} against a guest-cold sequential read "
                  f"limit of {format_value(limit, 'GB/s')}; its limit is "
                  f"{io_limit_text(row)}"))


def decode_pairs(results: Results) -> list[tuple[str, object, object]]:
    """(format, its decoding path's Stat at the largest k from cold, the same path's Stat
    with the set cached and no cap), for every decoding path measured both ways
    (``decision_frame``'s rows)."""
    rows = study_rows(decision_frame(results.df))
    rows = rows[(rows["loader"] == "lazy") & (rows["reads"] == "decoded")
                & (rows["encoding"] != "raw")]
    capped = rows[(rows["k"] > 0) & ~rows["cached"]]
    cached = rows[(rows["k"] == 0) & rows["cached"]]
    metric = f"{LAST}.samples_per_s"
    pairs = []
    for fmt in dict.fromkeys(capped["format"]):
        far = capped[(capped["format"] == fmt) & (capped["k"] == capped["k"].max())]
        near = cached[cached["format"] == fmt]
        if not select(far, metric).empty and not select(near, metric).empty:
            pairs.append((fmt, stat(far, metric), stat(near, metric)))
    return pairs


def undecoded_supply(results: Results, fmt: str):
    """The row of ``ooc_table`` of ``fmt``'s encoded set read undecoded at the largest k
    (the samples a second its I/O supplies there), None where it was not measured."""
    table = _last_epoch_table(results)
    top = table["k"].max() if not table.empty else 0
    undecoded = table[(table["format"] == fmt) & (table["reads"] == "undecoded")
                      & (table["encoding"] != "raw") & (table["k"] == top) & (top > 0)]
    return None if undecoded.empty else undecoded.iloc[0]


def decode_limit_text(results: Results, fmt: str, decoded_rate: float) -> str:
    """Whether ``fmt``'s decoding path at the largest k is decode-bound or I/O-bound: its
    undecoded read at the same k against the rate it decodes at with the set cached."""
    row = undecoded_supply(results, fmt)
    if row is None:
        return "no undecoded read of the same set at the same k to tell decode from I/O"
    supply = row[f"{LAST}.samples_per_s"]
    bound = "decode" if supply >= decoded_rate else "I/O"
    return (f"{bound}-bound: the same set read undecoded at k = {int(row['k'])} delivers "
            f"{format_value(supply, 'samples/s')} ({io_limit_text(row)}), decoding with the "
            f"set cached {format_value(decoded_rate, 'samples/s')}")


def decode_keep_target(results: Results) -> TargetMeasure | None:
    """The fastest decoding path at the largest k (decode and the training transform, from
    cold): its last epoch's samples/s over its own with the set cached, paired repeats."""
    pairs = decode_pairs(results)
    if not pairs:
        return None
    fmt, far, near = max(pairs, key=lambda pair: pair[1].median)
    ratio, low, high = ratio_interval(far, near)
    return TargetMeasure(
        value=ratio, low=low, high=high, repeats=min(far.count, near.count),
        sources=far.sources, against=near.sources,
        limiting=(f"the {fmt} decoding path out of core: {format_value(far.median, 'samples/s')} "
                  f"against {format_value(near.median, 'samples/s')} cached; "
                  + decode_limit_text(results, fmt, near.median)))


COLD_READ = TargetSpec(
    key="out_of_core_cold_read", name="Out of core: shuffled vs guest-cold sequential",
    description=f"the best shuffled path reading undecoded samples at k = {max(K_VALUES)}, "
                "bytes of samples per second over the same run's cold sequential read limit",
    threshold=COLD_READ_TARGET, is_fraction=True, measure=cold_read_target)
DECODE_KEEP = TargetSpec(
    key="out_of_core_decode_keep", name="Out of core: decoding path vs cached",
    description=f"the best decoding path (decode and the training transform) at k = "
                f"{max(K_VALUES)}, samples per second over its own rate with the set cached",
    threshold=DECODE_KEEP_TARGET, is_fraction=True, measure=decode_keep_target)


def _target_sentences(results: Results) -> list[str]:
    out = []
    for spec in (COLD_READ, DECODE_KEEP):
        measured = spec.measure(results)
        if measured is None:
            continue
        verdict = "met" if measured.low >= spec.threshold else (
            f"missed by {format_percent(max(0.0, 1 - measured.value / spec.threshold))}"
            if measured.value < spec.threshold else "not met by the interval's lower end")
        interval = (f"{format_percent(measured.low)}{DASH}{format_percent(measured.high)}"
                    if np.isfinite(measured.low) else "no interval")
        limiting = measured.limiting[:1].upper() + measured.limiting[1:]
        out.append(f"Target ({spec.name}): {format_percent(measured.value)} (over "
                   f"{measured.repeats} repeats, {interval}); threshold "
                   f"{format_percent(spec.threshold)}, {verdict}. {limiting}.")
    return out


# -- figures ----------------------------------------------------------------------------
# One marker and line style per format in the epoch figure, so that formats whose lines
# meet stay apart (Parquet's lay under HDF5's), and a small shift along the epoch axis.
EPOCH_MARKERS = "osD^vP*X"
EPOCH_LINESTYLES = ("-", "--", "-.", ":")
EPOCH_SHIFT = 0.03


def epochs_takeaway(rows: pd.DataFrame) -> str:
    """The epoch figure's answer from its rows (``ooc_rows``, default raw lazy cases): at
    the largest k, the shuffled case whose last epoch loses most against the same case
    where the set fits, and the one that loses least."""
    rates = summarise(rows[rows["access"] != "sequential"],
                      f"epoch{DEFAULT_EPOCHS}.samples_per_s", ["format", "access", "k"])
    if rates.empty or rates["k"].max() == 0:
        return ""
    k = int(rates["k"].max())
    by = rates.set_index(["format", "access", "k"])["median"]
    loss = (by.xs(0, level="k") / by.xs(k, level="k")).dropna()
    if loss.empty:
        return ""
    (fmt, access), (low_fmt, low_access) = loss.idxmax(), loss.idxmin()
    return (f"At k = {k}, {fmt} read in {access.replace('_', ' ')} runs "
            f"{relative_text(1 / loss.max())} when it fits; "
            f"{low_fmt} ({low_access.replace('_', ' ')}) {relative_text(1 / loss.min())} it")


def plot_ooc_epochs(df: pd.DataFrame) -> Figure:
    """Samples/s in each epoch (``DEFAULT_EPOCHS``) of raw arrays read lazily, one line per format
    (default knobs), one panel per access order (rows) and k (columns): where the cache
    helps epoch 2, and where it cannot (the grid's cases: under a cap, screens)."""
    rows = study_rows(grid_frame(df))
    rows = rows[(rows["encoding"] == "raw") & (rows["loader"] == "lazy")
                & (rows["setting"] == "default")]
    if rows.empty:
        return empty_figure("no out-of-core rows")
    orders = ordered(rows["access"], ("sequential", "block_shuffle", "shuffle"))
    ks = sorted(rows["k"].unique())
    colours = format_colours(rows["format"].unique())
    style = {fmt: (EPOCH_MARKERS[i % len(EPOCH_MARKERS)],
                   EPOCH_LINESTYLES[i % len(EPOCH_LINESTYLES)],
                   (i - (len(colours) - 1) / 2) * EPOCH_SHIFT)
             for i, fmt in enumerate(colours)}
    fig = Figure(figsize=(2.6 * len(ks) + 1.2, 2.3 * len(orders) + 1.4), layout="constrained")
    # Shared epochs: a panel left empty keeps the others' ticks rather than its own (0, 1).
    axes = fig.subplots(len(orders), len(ks), squeeze=False, sharex=True, sharey=True)
    medians = {n: summarise(rows, f"epoch{n}.samples_per_s", ["access", "k", "format"])
               .set_index(["access", "k", "format"])["median"].to_dict()
               for n in range(1, DEFAULT_EPOCHS + 1)}
    for r, access in enumerate(orders):
        for c, k in enumerate(ks):
            ax = axes[r][c]
            part = rows[(rows["access"] == access) & (rows["k"] == k)]
            if part.empty:
                left_out = access == "sequential" and k not in SEQUENTIAL_KS
                ax.text(0.5, 0.5, SEQUENTIAL_LEFT_OUT if left_out else "not measured",
                        ha="center", va="center", transform=ax.transAxes, color="grey",
                        fontsize="small")
            for fmt in ordered(part["format"], format_order()):
                points = [(n + style[fmt][2], medians[n].get((access, k, fmt)))
                          for n in range(1, DEFAULT_EPOCHS + 1)]
                points = [(n, m) for n, m in points if m is not None]
                if points:
                    ax.plot(*zip(*points), marker=style[fmt][0], linestyle=style[fmt][1],
                            color=colours[fmt], markersize=6, label=fmt)
            log_axis(ax)
            ax.set_xticks(range(1, DEFAULT_EPOCHS + 1))
            ax.set_xlim(0.7, DEFAULT_EPOCHS + 0.3)
            if r == 0:
                ax.set_title(k_text(k), fontsize="medium")
            if c == 0:
                # The grid gives these formats no full shuffle: say so where their line is
                # missing.
                absent = [f for f in colours if traits(f).block_only
                          and f in set(rows["format"])] if access == "shuffle" else []
                note = (f"\n({', '.join(absent)}: block shuffle only, so no line)"
                        if absent else "")
                ax.set_ylabel(f"{access.replace('_', ' ')}{note}\nsamples per second",
                              fontsize="small")
            if r == len(orders) - 1:
                ax.set_xlabel("epoch")
    legend_below(fig, [ax for row in axes for ax in row], ncols=len(colours) // 2 or 1)
    titled(fig, "What happens to each epoch when the dataset is k times the memory left "
                f"for it?\n({set_caption(rows)}; lazy reads, two prefetch threads)",
           epochs_takeaway(rows))
    return fig


def plot_ooc_knobs(df: pd.DataFrame) -> Figure:
    """Each knob against its format's default on the same access order (the default drawn
    once per format and access), where the set fits and at every k measured: epoch-2
    samples/s on a log axis, a dot per k joined by a line; labels carry each case's repeats
    (n), n = 1 meaning a single measurement with no spread."""
    df = grid_frame(df)
    table = ooc_table(df)
    table = table[(table["loader"] == "lazy") & (table["encoding"] == "raw")]
    knobbed = table[table["setting"] != "default"]
    caption = set_caption(ooc_rows(df).query("encoding == 'raw'"))
    unmeasured = _unmeasured_cases(df)
    # A knob case with no rate (failed, skipped) keeps its row, saying why.
    missing = [(fmt, access, setting, k) for (encoding, fmt, access, setting, k)
               in unmeasured if encoding == "raw" and setting != "default"]
    if knobbed.empty and not missing:
        return empty_figure("no out-of-core knob rows")
    column = f"epoch{DEFAULT_EPOCHS}.samples_per_s"
    keys = ["format", "access", "setting", "k"]
    repeats = summary_table(ooc_rows(df).query("encoding == 'raw' and loader == 'lazy'"),
                            column, keys).set_index(keys)["repeats"]
    knobs = [*zip(knobbed["format"], knobbed["access"], knobbed["setting"], knobbed["k"]),
             *missing]
    groups = list(dict.fromkeys((fmt, access) for fmt, access, _, _ in knobs))
    ks = sorted({k for *_, k in knobs})
    labels, values, formats, notes, counts = [], {k: [] for k in ks}, [], [], []
    for fmt, access in groups:
        settings = ["default", *dict.fromkeys(setting for f, a, setting, _ in knobs
                                              if (f, a) == (fmt, access))]
        for shown in settings:
            counts.append([int(repeats.get((fmt, access, shown, k), 0)) for k in ks])
            labels.append(f"{fmt}, {access.replace('_', ' ')}: {shown}")
            formats.append(fmt)
            for k in ks:
                hit = table[(table["format"] == fmt) & (table["access"] == access)
                            & (table["setting"] == shown) & (table["k"] == k)]
                values[k].append(float(hit[column].iloc[0]) if not hit.empty else np.nan)
                why = unmeasured.get(("raw", fmt, access, shown, k))
                if why and not np.isfinite(values[k][-1]):
                    notes.append((len(labels) - 1, k, why))
    # Repeats per case (n): said once where every case ran once, else on each label.
    single = all(c <= 1 for row in counts for c in row)
    if not single:
        labels = [f"{label} (n = {', '.join(str(c) for c in row)})"
                  for label, row in zip(labels, counts, strict=True)]
    n_text = ("one repeat per case (n = 1): no spread" if single else
              f"n: repeats at {', '.join(k_text(k) for k in ks)}")
    return _knob_dumbbells(labels, values, formats, notes, caption=caption, n_text=n_text)


def knob_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per dot of the knobs figure: each knob's case and its format's default on
    the same access order, at each k, with its epoch-2 samples/s (median, spread, n)."""
    column = f"epoch{DEFAULT_EPOCHS}.samples_per_s"
    keys = ["format", "access", "setting", "k"]
    table = summary_table(ooc_rows(grid_frame(df)).query("encoding == 'raw' and loader == 'lazy'"),
                          column, keys)
    knobbed = set(zip(table.loc[table["setting"] != "default", "format"],
                      table.loc[table["setting"] != "default", "access"]))
    out = [{"format": row["format"], "access": row["access"], "setting": row["setting"],
            "k": k_text(row["k"]), "metric": column, **stat_columns(row["stat"])}
           for _, row in table.iterrows() if (row["format"], row["access"]) in knobbed]
    return pd.DataFrame(out, columns=[*keys, "metric", "median", "spread", "n"])


def _knob_dumbbells(labels: list[str], values: dict, formats: list[str], notes: list,
                    *, caption: str, n_text: str) -> Figure:
    """``plot_ooc_knobs``' drawing: per label a dot per k (hollow: no cap), joined by a line
    in the format's colour, on a log axis; a case with no rate says why in its place."""
    ks = list(values)
    colours = format_colours(formats)
    fig = Figure(figsize=(7.5, 0.34 * len(labels) + 2.2), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(labels))
    for i, fmt in enumerate(formats):
        points = [values[k][i] for k in ks]
        ax.plot(points, [i] * len(ks), color=colours[fmt], linewidth=1.5)
        for k, value in zip(ks, points, strict=True):
            ax.plot(value, i, marker="o" if k == 0 else "s", markersize=7,
                    color=colours[fmt], markerfacecolor="white" if k == 0 else colours[fmt])
    for k in ks:
        ax.plot([], [], marker="o" if k == 0 else "s", linestyle="none", color="grey",
                markerfacecolor="white" if k == 0 else "grey", label=k_text(k))
    ax.set_yticks(y, labels, fontsize="small")
    ax.set_ylim(len(labels) - 0.5, -0.5)
    log_axis(ax, "x")
    shown = [v for k in ks for v in values[k] if np.isfinite(v)]
    if shown:
        ax.set_xlim(min(shown) / 2, max(shown) * 1.5)
    ax.grid(axis="y", color="lightgrey", linewidth=0.5)
    # A case that failed or was skipped has no mark: its place says why.
    for row, k, why in notes:
        ax.text(ax.get_xlim()[0] * 1.15, row, f"{k_text(k)}: {why}", va="center",
                fontsize="x-small", color="dimgrey")
    ax.set_xlabel(f"samples per second, epoch {DEFAULT_EPOCHS}\n{n_text}")
    legend_below(fig, [ax])
    drops = [(values[0][i] / values[ks[-1]][i], labels[i].split(" (n")[0])
             for i in range(len(labels)) if 0 in values and ks[-1] != 0
             and np.isfinite(values[0][i] / values[ks[-1]][i])]
    takeaway = ""
    if drops:
        low, high = min(drops), max(drops)
        takeaway = (f"At {k_text(ks[-1])}: {high[1]} runs {relative_text(1 / high[0])} "
                    f"when it fits; {low[1]} {relative_text(1 / low[0])} it")
    titled(fig, f"Which knobs keep a read fast out of core? ({caption})", takeaway)
    return fig


def _unmeasured_cases(df: pd.DataFrame) -> dict[tuple, str]:
    """Why each case that failed or was skipped (``results.failed_cases``) has no rate,
    keyed by (encoding, format, access, setting, k): a case the kernel killed for outgrowing
    its memory budget says so, any other its status and the first clause of its error."""
    cases = ooc_rows(grid_frame(df)).drop_duplicates("case_id").set_index("case_id")
    found = {}
    for failure in failed_cases(df, study=NAME).itertuples():
        if failure.case_id not in cases.index:
            continue
        case = cases.loc[failure.case_id]
        why = ("killed for outgrowing its memory budget" if "OOM killer" in failure.error
               else f"{failure.status}: {failure.error.split(':')[0][:60]}".rstrip(": "))
        found[(case["encoding"], case["format"], case["access"], case["setting"],
               case["k"])] = why
    return found


def budget_points(df: pd.DataFrame) -> pd.DataFrame:
    """The lazy cases' points of the budget figure: ``ooc_table``'s rows with the highest
    resident fraction at an epoch's end, and ``allowed``, what the cap lets stay resident
    (1/k of the set, or all of it where the set is smaller than the least room a case
    gets; NaN where the set fits)."""
    table = ooc_table(df)
    table = table[(table["loader"] == "lazy") & table["resident_end_max"].notna()].copy()
    effective = table["effective_k"].fillna(table["k"]).astype(float)
    table["allowed"] = np.where(table["k"] > 0, np.minimum(1.0, 1.0 / effective), np.nan)
    return table


def budget_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per point of the budget figure, by k: the case, the most of the dataset
    resident at an epoch's end, what the cap allows, and whether it held."""
    table = budget_points(df).sort_values(["k", "format", "access", "setting"], kind="stable")
    held = table["resident_end_max"] <= table["allowed"] + RESIDENT_TOLERANCE
    return pd.DataFrame({
        "k": [k_text(k) for k in table["k"]], "format": table["format"],
        "encoding": table["encoding"], "access": table["access"], "setting": table["setting"],
        "resident_end_max": [format_percent(v) for v in table["resident_end_max"]],
        "allowed": [format_percent(v) if np.isfinite(v) else DASH for v in table["allowed"]],
        "held": np.where(table["k"] > 0, np.where(held, "yes", "no"), DASH),
    }).reset_index(drop=True)


def plot_ooc_budget(df: pd.DataFrame) -> Figure:
    """The evidence the cap held: the largest fraction of the dataset resident at an
    epoch's end in each case, against k; the dashed line is 1/k."""
    table = budget_points(df)
    if table.empty:
        return empty_figure("no out-of-core rows")
    fig = Figure(figsize=(6, 3.6), layout="constrained")
    ax = fig.add_subplot()
    ks = sorted(table["k"].unique())
    for i, k in enumerate(ks):
        part = table[table["k"] == k]
        jitter = np.linspace(-0.15, 0.15, len(part)) if len(part) > 1 else np.zeros(1)
        ax.scatter(i + jitter, part["resident_end_max"], s=14, alpha=0.7,
                   label=f"{k_text(k)}: {len(part)} cases")
        if k > 0:
            allowed = float(part["allowed"].median())
            ax.plot([i - 0.3, i + 0.3], [allowed] * 2, color="black", linestyle="--")
    ax.set_xticks(range(len(ks)), [k_text(k) for k in ks])
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("most of the dataset resident\nat an epoch's end (fraction)")
    legend_below(fig, [ax], fontsize="x-small")
    fig.suptitle("Resident fraction against what the cap allows (dashed: 1/k of the set, or "
                 "all of it where the set is smaller than the least room a case gets)",
                 fontsize="small")
    return fig


def cache_fill_points(df: pd.DataFrame) -> pd.DataFrame:
    """Per capped lazy case a decision rests on (``decision_frame``: the finalists, or
    every case of results from before the screen), the most page cache its cgroup held
    against the room the cap left it above the baseline (``fill``, 1: the cap reached),
    and the samples its timed epochs read of those it reads (``epoch_samples_min``,
    ``samples``). Rows from before ``cache_fill`` was recorded take the page cache held at
    an epoch's end."""
    rows = study_rows(decision_frame(df))
    rows = rows[(rows["k"] > 0) & (rows["loader"] == "lazy")]
    keys = ["format", "encoding", "access", "setting", "k", "reads", "stage", "label"]
    table = medians_table(rows, ["cache_fill", "cgroup_limit_bytes", "baseline_bytes",
                                 "cache_room_bytes", "samples"], keys)
    if table.empty:
        return table.assign(fill=[], file_cache_peak_bytes=[], room_bytes=[],
                            epoch_samples_min=[])
    table = table.set_index(keys)
    cached = rows[rows["metric"].str.fullmatch(r"file_cache_peak_bytes|(epoch\d+\.)?"
                                               r"file_cache_bytes")]
    peak = select(cached).groupby(keys)["value"].max().rename("file_cache_peak_bytes")
    read = select(rows[rows["metric"].str.fullmatch(r"epoch\d+\.samples")])
    least = read.groupby(keys)["value"].min().rename("epoch_samples_min")
    table = table.join(peak, how="left").join(least, how="left").reset_index()
    room = table["cache_room_bytes"].fillna(table["cgroup_limit_bytes"]
                                            - table["baseline_bytes"])
    fill = select(rows, "cache_fill").groupby(keys)["value"].max()
    table["room_bytes"] = room
    table["fill"] = [fill.get(tuple(row[k] for k in keys), np.nan) for _, row in
                     table.iterrows()]
    table["fill"] = table["fill"].fillna(table["file_cache_peak_bytes"] / room)
    return sort_rows(table)


def cache_fill_rows(df: pd.DataFrame) -> pd.DataFrame:
    """One row per bar of the cache-fill figure: the case, k, its page cache's peak, the
    room the cap left it, their ratio, whether it reached the cap (``CACHE_REACHED``), and
    whether every timed epoch read the whole of what the case reads."""
    table = cache_fill_points(df)
    return pd.DataFrame({
        "label": table["label"], "k": [k_text(k) for k in table["k"]],
        "file_cache_peak": [format_value(v, "bytes") for v in table["file_cache_peak_bytes"]],
        "room": [format_value(v, "bytes") for v in table["room_bytes"]],
        "fill": [format_percent(v) for v in table["fill"]],
        "reached": np.where(table["fill"] >= CACHE_REACHED, "yes", "no"),
        "whole_epochs": np.where(table["epoch_samples_min"] >= table["samples"], "yes", "no"),
    }).reset_index(drop=True)


def plot_ooc_cache_fill(df: pd.DataFrame) -> Figure:
    """The regime's condition, per capped case a decision rests on: the page cache's peak
    over the room the cap left it, a bar per case in its format's colour; the line at 1 is
    the cap (a set is k times the memory only where its bar reaches it)."""
    table = cache_fill_points(df)
    if table.empty:
        return empty_figure("no capped out-of-core rows")
    colours = format_colours(table["format"].unique())
    fig = Figure(figsize=(7.5, 0.34 * len(table) + 2.2), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(table))
    ax.barh(y, table["fill"], color=[colours[f] for f in table["format"]], height=0.6)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1, label="the cap (room full)")
    ax.axvline(CACHE_REACHED, color="grey", linestyle=":", linewidth=1,
               label=f"reached ({format_percent(CACHE_REACHED)} of the room)")
    ax.set_yticks(y, [f"{label} ({k_text(k)})" for label, k in zip(table["label"],
                                                                    table["k"])],
                  fontsize="small")
    ax.set_ylim(len(table) - 0.5, -0.5)
    ax.set_xlim(0, max(1.1, float(table["fill"].max()) * 1.05))
    ax.set_xlabel("page cache's peak / room the cap left above the baseline")
    legend_below(fig, [ax])
    reached = int((table["fill"] >= CACHE_REACHED).sum())
    whole = int((table["epoch_samples_min"] >= table["samples"]).sum())
    caption = set_caption(study_rows(decision_frame(df))).replace("; ", ";\n")
    titled(fig, f"Did the page cache fill the room its cap left?\n({caption})",
           f"{reached} of {len(table)} cases reached it; {whole} of {len(table)} read whole "
           "epochs of their set")
    return fig


FIGURES = (
    FigureSpec("out_of_core_epochs", "Epoch by epoch, fits vs k times larger than memory",
               lambda r: plot_ooc_epochs(r.df)),
    FigureSpec("out_of_core_knobs", "Readahead, chunk and shard knobs out of core",
               lambda r: plot_ooc_knobs(r.df), rows=lambda r: knob_rows(r.df),
               rows_caption="One row per dot: a knob's case or its format's default, on the "
                            "same access order and k, with its epoch-2 rate (median, spread "
                            "and n, the repeats that ran)."),
    FigureSpec("out_of_core_budget", "Evidence that the memory cap held",
               lambda r: plot_ooc_budget(r.df), rows=lambda r: budget_rows(r.df),
               rows_caption="One row per point: the case, the most of the set resident at an "
                            "epoch's end, what the cap allows, and whether the cap held."),
    FigureSpec("out_of_core_cache_fill", "Page cache's peak against the room each cap left",
               lambda r: plot_ooc_cache_fill(r.df), rows=lambda r: cache_fill_rows(r.df),
               rows_caption="One row per bar: the case, k, its page cache's peak, the room "
                            "the cap left it and their ratio, whether it reached the cap, and "
                            "whether every timed epoch read all it reads."),
)


# -- guide ------------------------------------------------------------------------------
def guide_candidates(rows: pd.DataFrame) -> pd.DataFrame:
    """Of ``rows`` (``study_rows``), the guide's candidates at a capped k: every lazy
    shuffled path measured (format, order, knob); an encoded set's decoding paths (its
    undecoded reads are the cold-read target's, not a way to train)."""
    return rows[(rows["loader"] == "lazy") & (rows["access"] != "sequential")
                & ((rows["encoding"] == "raw") | (rows["reads"] == "decoded"))
                & (rows["k"] > 0)]


def cache_reached(rows: pd.DataFrame) -> bool:
    """Whether every case of ``rows`` (``study_rows``) filled the room its cap left for page
    cache (``CACHE_REACHED``): only then is its set k times the memory it could use.
    Results from before the fill was recorded say nothing against it."""
    fill = select(rows, "cache_fill")
    if fill.empty:
        return True
    return bool((fill.groupby("case_id")["value"].max() >= CACHE_REACHED).all())


def subset_text(rows: pd.DataFrame) -> str:
    """", whole epochs of the first 4,000 of 12,000 samples" where ``rows`` (study_rows)
    read a subset of their set; ", whole epochs" for whole-epochs rows of whole sets."""
    whole = rows[rows["stage"] == WHOLE_EPOCHS]
    if whole.empty:
        return ""
    count, total = select(whole, "samples"), select(whole, "set_samples")
    if count.empty or total.empty:
        return ", whole epochs"
    return (f", whole epochs of the first {count['value'].max():,.0f} of "
            f"{total['value'].max():,.0f} samples (cap scaled to them)")


def guide(results: Results) -> list:
    """Per capped k and encoding: the candidates of ``guide_candidates``, by their last
    epoch's samples/s. A question says the set is k times the RAM only where every
    candidate's page cache reached its cap (``cache_reached``)."""
    from ...guide import Candidate, choose

    metric = f"epoch{DEFAULT_EPOCHS}.samples_per_s"
    decided = study_rows(decision_frame(results.df))
    picked = guide_candidates(decided)
    out = []
    for (encoding, k), part in picked.groupby(["encoding", "k"], sort=True):
        rated = select(part, metric)
        candidates = [Candidate(label, label, stat(rated, metric, label=label))
                      for label in dict.fromkeys(rated["label"])]
        name = ENCODING_NAMES.get(encoding, encoding)
        how = ("read undecoded" if encoding == "raw" else "decoded"
               + (" with the training transform" if _transformed(part) else ""))
        scale = (f"{k}\u00d7 larger than the RAM left for the page cache"
                 if cache_reached(part) else
                 f"capped at 1/{k} of the set, its page cache never filling the cap")
        out.append(choose(
            NAME, f"{name[0].upper() + name[1:]} {scale}, shuffled epochs, {how}: which "
            f"format, order and knob? (epoch {DEFAULT_EPOCHS}{subset_text(part)}; "
            f"{set_caption(decided, encoding)})", metric, candidates,
            facets={"encoding": encoding, "k": int(k)}))
    return [row for row in out if row is not None]


def _transformed(rows: pd.DataFrame) -> bool:
    return bool(params_of(rows).map(lambda p: bool(p.get("transform"))).any())


def findings(results: Results) -> list[str]:
    return (ooc_findings(results.df, results.env) + decode_cost_findings(results)
            + default_knob_findings(results.df) + _target_sentences(results))


def decode_cost_findings(results: Results) -> list[str]:
    """Where out of core stops costing nothing: per decoding path, what it keeps at the
    largest k of its cached rate, and the decode rate past which the I/O it needs (its
    undecoded read at the same k) no longer keeps up."""
    out = []
    for fmt, far, near in decode_pairs(results):
        ratio, low, high = ratio_interval(far, near)
        interval = (f" ({format_percent(low)}{DASH}{format_percent(high)})"
                    if np.isfinite(low) else " (no interval: too few repeats)")
        text = (f"Decoding path over {fmt} out of core: {format_percent(ratio)}{interval} of "
                f"its rate with the set cached; {decode_limit_text(results, fmt, near.median)}")
        supply = undecoded_supply(results, fmt)
        if supply is not None:
            headroom = supply[f"{LAST}.samples_per_s"] / near.median
            text += (f". The I/O keeps up with decode until decode runs "
                     f"{format_ratio(headroom)} faster than here (more cores, a faster "
                     "decoder): past that, out of core is I/O-bound" if headroom >= 1 else
                     f". The I/O supplies {format_percent(headroom)} of what decode takes: "
                     "out of core is I/O-bound here")
        out.append(text + ".")
    return out


def default_knob_findings(df: pd.DataFrame) -> list[str]:
    """Why memmap's and LMDB's defaults win where the set fits and lose out of core: their
    shuffled rank among the formats' defaults at no cap and at the largest k, and the bytes
    the device read per byte delivered (read-around) beside their out-of-core knob's."""
    table = ooc_table(grid_frame(df))
    lazy = table[(table["loader"] == "lazy") & (table["encoding"] == "raw")
                 & (table["access"] == "shuffle")]
    if lazy.empty or lazy["k"].max() == 0:
        return []
    top = int(lazy["k"].max())
    column = f"{LAST}.samples_per_s"
    out = []
    for fmt, option in (("memmap", "madvise_random=True"), ("lmdb", "readahead=False")):
        mine = lazy[(lazy["format"] == fmt) & (lazy["setting"] == "default")].set_index("k")
        if not {0, top} <= set(mine.index):
            continue
        ranks = {}
        for k in (0, top):
            defaults = lazy[(lazy["k"] == k) & (lazy["setting"] == "default")]
            order = defaults.sort_values(column, ascending=False)["format"].tolist()
            ranks[k] = f"{order.index(fmt) + 1} of {len(order)}"
        amplification = read_amplification(mine.loc[top])
        text = (f"{fmt}'s default, shuffled: {format_value(mine.loc[0, column], 'samples/s')}"
                f" where the set fits (fastest {ranks[0]}), "
                f"{format_value(mine.loc[top, column], 'samples/s')} at k = {top} "
                f"({ranks[top]}); there the device read "
                f"{format_ratio(amplification)} the bytes delivered")
        knob = lazy[(lazy["format"] == fmt) & (lazy["setting"] == option) & (lazy["k"] == top)]
        if not knob.empty:
            text += (f", with {option} {format_ratio(read_amplification(knob.iloc[0]))} at "
                     f"{format_value(knob[column].iloc[0], 'samples/s')}")
        out.append(text + (
            ": the read-around that serves neighbours from RAM reads pages a shuffled epoch "
            "discards once the set no longer fits." if amplification >= READ_AROUND_AMPLIFICATION
            else ": no read-around shows here, the cap leaving most of the set cached."
            if amplification < 0.5 else ": no read-around shows here: the device read about "
            "the bytes delivered."))
    return out


# The live cell: block-shuffled against shuffled reads from a cold cache, no memory cap.
LIVE = LiveComparison(
    pair=("block_shuffle", "shuffle"),
    choices={order: {"format": "memmap", "loader": "lazy", "access": order, "param_k": 0,
                     "param_open_madvise_random": None}
             for order in ("block_shuffle", "shuffle", "sequential")},
    formats=("memmap",), encodings=("raw",), metric="epoch2.samples_per_s",
    settings={"workers": 2, "batch_size": None},
)


STUDY = Study(
    name=NAME,
    question="What changes when the dataset no longer fits in memory?",
    grid=out_of_core_grid,
    figures=FIGURES,
    findings=findings,
    guide=guide,
    notebook="06_out_of_core.ipynb",
    targets=(COLD_READ, DECODE_KEEP),
    finalists=finalist_cases,
    live=LIVE,
    cold_rate_metric="epoch1.samples_per_s",
)
