"""The remote study: the training set in object storage, at a distance, read by 1 or 2
data-parallel ranks.

A real S3 server (SeaweedFS, ``remote.seaweed``) is started for the study and the JPEG
datasets are uploaded to it (``object_store``, the study's services). Every case reads
through a delaying TCP proxy (``remote.network``) at an emulated round-trip time of 0, 2 or
20 ms (0 ms goes through the proxy too, so every row pays its overhead), into ranks on
``torch.distributed`` (gloo), each with its own rank-sharded sampler and prefetch threads
(2, or 4 where the capacity model says that hides 20 ms) decoding with simplejpeg. The
same epochs from local disk give the reference.

Per path (format, access order, requests in flight) the rows give the aggregate and per-rank
steady throughput (each rank's batches after its loader's read-ahead, its epoch stopped once
that window holds the plan's steady minimum: ``studies.steady``), time to first batch apart
from it (opening included: manifest, listing, fingerprints and indexes are round trips too),
GET requests and bytes per request over the whole pass, and the measured RTT.
The capacity model (``remote.capacity``) predicts each path's rate at 2 and 20 ms from its
0 ms measurement; the figure draws both. One path is swept over the GETs a rank keeps in
flight at 20 ms and read once at 150 ms (``SWEEP_IN_FLIGHT``, ``FAR_PATH``), beside the
model's Little's-law prediction; every S3 row also says what an epoch costs: GETs and bytes
(the pass's, scaled to the set) and the S3 server's CPU a sample (``cost_rows``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ...bench.case import Case
from ...bench.plan import plan_for
from ...plots import empty_figure, legend_below, log_axis, question_title
from ...remote.capacity import Pipeline, predicted_rate, scale_out, workers_to_keep
from ...results import (
    DECISION_MARGIN,
    MIN_PAIRED_REPEATS,
    Results,
    mark_drawn,
    medians_table,
    ok_repeats,
    params_of,
    ratio_interval,
    select,
    stat,
    summary_table,
)
from ...text import format_percent, format_ratio, format_value, markdown_table
from ..base import FigureSpec, LiveComparison, Study, TargetMeasure, TargetSpec
from ..grid import (
    batch_size_for,
    dataset_fields,
    decode_params,
    epoch_fields,
    is_imported_manifest,
    is_training_set,
    pick,
    profile_datasets,
    repeat_fields,
)
from .peer_cases import prepare_streaming_peers, streaming_peer_findings

NAME = "remote"
CASES = "storebench.studies.remote.cases"
RTTS_MS = (0, 2, 20)
# (format, access order, requests in flight, prefetch threads): each read by one rank at
# every RTT. Parquet and HDF5 read whole row groups and chunks: their natural order is the
# block shuffle. Four threads: what the capacity model says hides 20 ms (two batches wait on
# the network while two decode).
PATHS = (
    ("tfrecord", "shuffle", 64, 2), ("tfrecord", "shuffle", 64, 4),
    ("tfrecord", "block_shuffle", 64, 2), ("tfrecord", "shuffle", 16, 2),
    ("rawfiles", "shuffle", 64, 2), ("rawfiles", "shuffle", 64, 4),
    ("parquet", "block_shuffle", 64, 2), ("hdf5", "block_shuffle", 64, 2),
)
COMPACT_PATHS = (("tfrecord", "shuffle", 64, 2), ("rawfiles", "shuffle", 64, 2))
COMPACT_RTTS_MS = (0, 20)
RANKED_PATH = ("tfrecord", "shuffle", 64, 2)  # also at 2 ranks, and from local disk
# The ranked path also at 20 ms through a tbf bandwidth cap below its 0 ms need (1.6k
# samples/s of 16 kB JPEGs is about 200 Mbit/s): the model's bandwidth term, measured.
CAPPED_MBIT = 100
# On an ImageNet-like set (``grid.is_training_set``): the RTTs the targets name, the paths
# whose GETs are counted (the capacity model's inputs; Parquet's and HDF5's are made inside
# pyarrow and libhdf5), batches of this many (a steady window of 20 decoded batches of 32
# lasts about a second at the 0 ms rate, the steady minimum, and each of two ranks' halves
# of an epoch's cap still holds it; batches of 64 doubled every repeat's reads), and a cap
# below the decoding path's need
# (about 800 samples/s of 105 kB JPEGs is about 670 Mbit/s).
TARGET_RTT_MS = 20
TRAINING_RTTS_MS = (0, TARGET_RTT_MS)
TRAINING_PATHS = (("tfrecord", "shuffle", 64, 2), ("tfrecord", "shuffle", 64, 4),
                  ("rawfiles", "shuffle", 64, 2), ("rawfiles", "shuffle", 64, 4))
TRAINING_BATCH = 32
TRAINING_CAPPED_MBIT = 400
PREFETCHER = "thread"
TARGET_KEEP = 0.8  # of a path's own 0 ms rate, at 20 ms
TARGET_PEER = 1.2  # over the best streaming peer reading the same store at the same RTT
# The in-flight sweep: the target path (format, order, prefetch threads) at TARGET_RTT_MS
# with each of these GETs in flight. ``concurrency`` sizes the reader's pool of request
# threads, one pool a rank shared by its prefetch threads, so it bounds a rank's GETs in
# flight. Little's law (in flight = request rate x round trip): a few hundred samples/s at
# 20 ms, a sample a GET, need fewer than ten; the sweep brackets that.
SWEEP_PATH = ("tfrecord", "shuffle", 2)
SWEEP_IN_FLIGHT = (1, 2, 4, 8, 16, 64)
COMPACT_SWEEP_IN_FLIGHT = (8, 64)
# One point far away (not on compact plans). At 150 ms Little's law asks about 60 samples
# in flight of a few hundred samples/s: 4 threads each waiting on a whole batch of 32 hold
# 128, and 128 GETs in flight let every thread's batch go out in one round.
FAR_RTT_MS = 150
FAR_PATH = ("tfrecord", "shuffle", 128, 4)
BUCKET = "storebench"


# -- the grid -------------------------------------------------------------------------
def _case(path: Path, manifest: dict, *, access: str, params: dict, fields: dict,
          workers: int = 2) -> Case:
    preferred = TRAINING_BATCH if is_training_set(manifest) else 256
    return Case(
        function=f"{CASES}:remote_epoch_case", loader="lazy", prefetcher=PREFETCHER,
        workers=workers, batch_size=batch_size_for(manifest["num_samples"], preferred),
        access=access,
        params={**decode_params(manifest), **params}, **fields,
        **dataset_fields(NAME, path, manifest),
    )


def remote_grid(*, profile: str, data_dir: Path | str, repeats: int | None = None
                ) -> list[Case]:
    """One rank over S3 for every path of ``PATHS`` at every RTT of ``RTTS_MS``;
    ``RANKED_PATH`` also with 2 ranks, and from local disk with 1 and 2; ``RANKED_PATH`` at
    20 ms under a ``CAPPED_MBIT`` tbf cap; ``SWEEP_PATH`` at ``TARGET_RTT_MS`` with each of
    ``SWEEP_IN_FLIGHT`` GETs in flight, and ``FAR_PATH`` at ``FAR_RTT_MS``.
    On an ImageNet-like set, ``TRAINING_PATHS`` at ``TRAINING_RTTS_MS``, the cap
    ``TRAINING_CAPPED_MBIT``. Compact plans (ci): ``COMPACT_PATHS`` at ``COMPACT_RTTS_MS``,
    the sweep at ``COMPACT_SWEEP_IN_FLIGHT``, no far point."""
    plan = plan_for(profile)
    fields = {**repeat_fields(profile, repeats), **epoch_fields(profile),
              "timeout_s": plan.timeout_s}
    # One rank over S3 at each RTT: the targets' rows (a path at 20 ms against its own
    # 0 ms), whose verdicts take the decision's repeats from the first pass (the top-up
    # repeats guide questions only).
    target_fields = {**fields, **repeat_fields(profile, repeats, minimum=MIN_PAIRED_REPEATS)}
    datasets = profile_datasets(profile, data_dir)
    training = any(is_training_set(manifest) for _, manifest in datasets)
    paths = COMPACT_PATHS if plan.compact else TRAINING_PATHS if training else PATHS
    rtts = COMPACT_RTTS_MS if plan.compact else TRAINING_RTTS_MS if training else RTTS_MS
    cap = TRAINING_CAPPED_MBIT if training else CAPPED_MBIT
    # (format, order, in flight, threads, RTT, ranks): every path at every RTT, then the
    # sweep and the far point, each once.
    runs = {(*path, rtt, ranks): None for path in paths for rtt in rtts
            for ranks in ((1, 2) if path == RANKED_PATH else (1,))}
    fmt, access, workers = SWEEP_PATH
    for concurrency in COMPACT_SWEEP_IN_FLIGHT if plan.compact else SWEEP_IN_FLIGHT:
        runs.setdefault((fmt, access, concurrency, workers, TARGET_RTT_MS, 1))
    if not plan.compact:
        runs.setdefault((*FAR_PATH, FAR_RTT_MS, 1))
    cases = []
    for fmt, access, concurrency, workers, rtt, ranks in runs:
        found = _encoded(datasets, fmt)
        if found is None:
            continue
        cases.append(_case(*found, access=access, workers=workers,
                           fields=target_fields if ranks == 1 else fields,
                           params={"source": "s3", "rtt_ms": rtt, "ranks": ranks,
                                   "concurrency": concurrency}))
    found = _encoded(datasets, RANKED_PATH[0])
    if found is not None:
        fmt, access, concurrency, workers = RANKED_PATH
        cases.append(_case(*found, access=access, fields=fields, workers=workers, params={
            "source": "s3", "rtt_ms": TARGET_RTT_MS, "ranks": 1, "concurrency": concurrency,
            "bandwidth_mbit": cap}))
        for ranks in (1, 2):
            cases.append(_case(*found, access=RANKED_PATH[1], fields=fields,
                               params={"source": "local", "ranks": ranks}))
    # The streaming peers read the profile's cut set: a study of your own images has none.
    if not any(is_imported_manifest(manifest) for _, manifest in datasets):
        cases += _streaming_peer_cases(profile=profile, data_dir=data_dir, repeats=repeats,
                                       paths=paths)
    return cases


def _encoded(datasets, fmt: str):
    for encoding in ("jpeg", "mixed", "png"):
        found = pick(datasets, encoding, (fmt,))
        if found is not None and found[1]["format"] == fmt:
            return found
    return None


@contextlib.contextmanager
def object_store(cases):
    """The study's services: a SeaweedFS server holding the datasets the S3 cases read,
    named to the cases by environment variables (``cases.remote``); where it cannot start,
    the reason, which makes every S3 case a ``skipped`` row."""
    from ...remote.dataset import upload_dataset
    from ...remote.seaweed import SeaweedServer, SeaweedUnavailableError
    from ..remote.cases import REMOTE_ROOT_ENV, REMOTE_SERVER_PID_ENV, REMOTE_UNAVAILABLE_ENV

    remote = sorted({c.dataset for c in cases if c.param("source") == "s3"})
    if not remote:
        yield {}
        return
    server = SeaweedServer()
    try:
        config = server.start()
    except (SeaweedUnavailableError, OSError) as err:
        yield {REMOTE_UNAVAILABLE_ENV: f"no S3 server: {err}".splitlines()[0]}
        return
    try:
        from .peer_cases import data_dir_name, store_key

        # The streaming peers' cut sets go under <root>/peers/ (``peer_cases.store_key``).
        root = f"s3://{BUCKET}/{data_dir_name(remote)}"
        for dataset in remote:
            upload_dataset(dataset, f"{root}/{store_key(dataset)}", s3=config)
        pid = server.process.pid if server.process is not None else None
        yield {**config.env(), REMOTE_ROOT_ENV: root,
               **({REMOTE_SERVER_PID_ENV: str(pid)} if pid else {})}
    finally:
        server.stop()


# -- the one table figures, findings and the guide read ---------------------------------
def path_label(fmt: str, access: str, workers: int, concurrency: int | None = None) -> str:
    """``"tfrecord, shuffle, 2 threads sharing 64 GETs in flight"``: a rank's prefetch
    threads share its reader's ``concurrency`` request threads (None: local disk, no GETs)."""
    label = f"{fmt}, {access.replace('_', ' ')}, {int(workers)} threads"
    return label if concurrency is None else f"{label} sharing {concurrency} GETs in flight"


def remote_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The study's epoch rows with ``source``, ``rtt_ms``, ``ranks``, ``concurrency``,
    ``bandwidth_mbit`` (NaN: no cap), ``base_path`` (format, order, threads, requests in
    flight) and ``path`` (the base path, and its cap where it has one) columns."""
    rows = df[(df["study"] == NAME) & (df["case_id"].str.startswith("remote_epoch"))]
    params = params_of(rows) if not rows.empty else pd.Series(dtype=object)
    base = [path_label(f, a, w, p.get("concurrency") if p.get("source", "s3") == "s3" else None)
            for f, a, w, p in zip(rows["format"], rows["access"], rows["workers"], params)]
    caps = params.map(lambda p: float(p.get("bandwidth_mbit") or np.nan))
    return rows.assign(
        source=params.map(lambda p: p.get("source", "s3")),
        rtt_ms=params.map(lambda p: float(p.get("rtt_ms", 0.0))),
        ranks=params.map(lambda p: int(p.get("ranks", 1))),
        concurrency=params.map(lambda p: int(p.get("concurrency", 0))),
        bandwidth_mbit=caps,
        base_path=base,
        path=[b if np.isnan(c) else f"{b}, {c:g} Mbit/s" for b, c in zip(base, caps)],
    )


KEYS = ["path", "base_path", "format", "access", "source", "concurrency", "ranks", "rtt_ms",
        "batch_size", "workers", "bandwidth_mbit"]


# Per repeat, from its pass's rows (``cost_rows``): GETs and bytes scaled to one epoch of
# the set, and the S3 server's CPU seconds per sample delivered.
COST_METRICS = {"epoch_requests": "count", "epoch_bytes": "bytes",
                "server_cpu_s_per_sample": "s"}


def cost_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``COST_METRICS``, one a timed repeat that recorded their inputs, alike in
    every other column to the repeat's ``samples`` row. A pass may stop once its steady
    window is full, so its counts are scaled to one epoch: ``epoch_requests`` is
    ``requests`` times ``dataset_samples`` over the pass's ``samples``, ``epoch_bytes``
    that times ``bytes_per_request``; ``server_cpu_s_per_sample`` is ``server_cpu_s`` over
    ``samples`` (opening included in both)."""
    ok = ok_repeats(rows)
    keys = ["run_id", "study", "case_id", "repeat"]
    if ok.empty:
        return rows.iloc[:0]
    wide = ok.pivot_table(index=keys, columns="metric", values="value", aggfunc="first")
    base = ok[ok["metric"] == "samples"].drop_duplicates(keys).set_index(keys)
    derived = {}
    if {"requests", "bytes_per_request", "dataset_samples", "samples"} <= set(wide.columns):
        epoch = wide["requests"] * wide["dataset_samples"] / wide["samples"]
        derived["epoch_requests"] = epoch
        derived["epoch_bytes"] = epoch * wide["bytes_per_request"]
    if {"server_cpu_s", "samples"} <= set(wide.columns):
        derived["server_cpu_s_per_sample"] = wide["server_cpu_s"] / wide["samples"]
    parts = []
    for metric, values in derived.items():
        values = values.dropna()
        values = values[values.index.isin(base.index)]
        parts.append(base.loc[values.index].assign(
            metric=metric, value=values, unit=COST_METRICS[metric]).reset_index())
    return pd.concat(parts, ignore_index=True)[rows.columns] if parts else rows.iloc[:0]


def remote_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per path, RTT and rank count: medians of samples/s, per-rank samples/s, time to
    first batch, samples and bytes per request, measured RTT, and of ``COST_METRICS``
    (GETs and bytes per epoch, the S3 server's CPU seconds per sample); and the model's
    prediction (from the 0 ms row of the same path or, for a path measured at one RTT
    only, the same format, order and threads: ``pipeline_at_zero``) with its ratio to the
    measurement."""
    rows = remote_rows(df)
    metrics = ["samples_per_s", "per_rank_samples_per_s", "time_to_first_batch_s",
               "samples_per_request", "bytes_per_request", "measured_rtt_s", *COST_METRICS]
    if rows.empty:
        return pd.DataFrame(columns=[*KEYS, *metrics, "predicted_samples_per_s"])
    table = medians_table(pd.concat([rows, cost_rows(rows)], ignore_index=True), metrics,
                          KEYS)
    table["predicted_samples_per_s"] = [_predict(table, row) for _, row in table.iterrows()]
    table["predicted_over_measured"] = table["predicted_samples_per_s"] / table["samples_per_s"]
    return table.sort_values(["source", "path", "ranks", "rtt_ms"], ignore_index=True)


def pipeline_at_zero(table: pd.DataFrame, row) -> Pipeline | None:
    """The capacity model's inputs, from ``row``'s path measured at 0 ms without a cap
    (same ranks), or where it was not (a point of the in-flight sweep), from the same
    format, order and threads with the most GETs in flight: at 0 ms the CPU, not the
    requests in flight, sets the rate. None where no such row is, or its requests were not
    counted."""
    zero = table[(table["format"] == row["format"]) & (table["access"] == row["access"])
                 & (table["workers"] == row["workers"]) & (table["ranks"] == row["ranks"])
                 & (table["source"] == "s3") & (table["rtt_ms"] == 0)
                 & table["bandwidth_mbit"].isna()]
    zero = zero.assign(own=zero["base_path"] == row["base_path"]).sort_values(
        ["own", "concurrency"], ascending=False)
    if zero.empty or not np.isfinite(zero["samples_per_s"].iloc[0]):
        return None
    z = zero.iloc[0]
    if not np.isfinite(z["samples_per_request"]):
        return None  # requests made inside pyarrow or libhdf5: not counted, not modelled
    k = float(z["samples_per_request"])
    sample_bytes = float(z["bytes_per_request"]) / k
    return Pipeline(rate0=float(z["per_rank_samples_per_s"]), workers=int(z["workers"]),
                    batch_size=int(row["batch_size"]), samples_per_request=float(k),
                    concurrency=int(z["concurrency"]), sample_bytes=float(sample_bytes))


def _predict(table: pd.DataFrame, row) -> float:
    if row["source"] != "s3":
        return float("nan")
    pipeline = pipeline_at_zero(table, row)
    if pipeline is None:
        return float("nan")
    cap = row["bandwidth_mbit"]
    bandwidth = math.inf if np.isnan(cap) else cap * 1e6 / 8 / row["ranks"]
    return row["ranks"] * predicted_rate(pipeline, row["rtt_ms"] / 1e3, bandwidth_Bps=bandwidth,
                                         concurrency=int(row["concurrency"]))


# -- the in-flight sweep and the far point ----------------------------------------------
def in_flight_sweep(df: pd.DataFrame) -> pd.DataFrame:
    """``remote_table``'s rows of ``SWEEP_PATH`` at ``TARGET_RTT_MS`` (one rank, no cap),
    one per GETs in flight, fewest first, with ``stat`` (the repeats' samples/s)."""
    table = remote_table(df)
    fmt, access, workers = SWEEP_PATH
    sweep = table[(table["source"] == "s3") & (table["ranks"] == 1)
                  & (table["format"] == fmt) & (table["access"] == access)
                  & (table["workers"] == workers) & (table["rtt_ms"] == TARGET_RTT_MS)
                  & table["bandwidth_mbit"].isna()]
    sweep = sweep.sort_values("concurrency", ignore_index=True)
    return sweep.assign(stat=[_stat(df, path, TARGET_RTT_MS) for path in sweep["path"]])


def far_point(df: pd.DataFrame) -> pd.Series | None:
    """``remote_table``'s row of ``FAR_PATH`` at ``FAR_RTT_MS`` with its ``stat``; None
    where these rows hold none."""
    table = remote_table(df)
    fmt, access, concurrency, workers = FAR_PATH
    far = table[(table["source"] == "s3") & (table["ranks"] == 1)
                & (table["base_path"] == path_label(fmt, access, workers, concurrency))
                & (table["rtt_ms"] == FAR_RTT_MS) & table["bandwidth_mbit"].isna()]
    if far.empty:
        return None
    row = far.iloc[0].copy()
    row["stat"] = _stat(df, row["path"], FAR_RTT_MS)
    return row


def littles_law_in_flight(table: pd.DataFrame, row, rtt_ms: float) -> float:
    """GETs in flight that carry ``row``'s path's 0 ms rate at ``rtt_ms`` by Little's law
    (in flight = GETs a second x round trip); NaN where the model has no 0 ms inputs."""
    pipeline = pipeline_at_zero(table, row)
    if pipeline is None:
        return float("nan")
    return pipeline.rate0 / pipeline.samples_per_request * rtt_ms / 1e3


def fewest_within_margin(sweep: pd.DataFrame) -> int | None:
    """The fewest GETs in flight of ``sweep`` whose rate is within ``DECISION_MARGIN`` of
    the most GETs' (the lower end of their ratio's interval clears 1 / (1 + margin), two
    cases compared unpaired); None where none can be told (too few repeats)."""
    if sweep.empty or sweep["stat"].iloc[-1] is None:
        return None
    most = sweep["stat"].iloc[-1]
    for concurrency, found in zip(sweep["concurrency"], sweep["stat"]):
        if found is not None and ratio_interval(found, most)[1] >= 1 / (
                1 + DECISION_MARGIN):
            return int(concurrency)
    return None


def sweep_takeaway(sweep: pd.DataFrame, table: pd.DataFrame) -> str:
    """Little's law's count beside the fewest GETs in flight measured within the margin
    of the most GETs' rate (``in_flight_sweep``'s rows, ``remote_table``)."""
    needed = littles_law_in_flight(table, sweep.iloc[-1], TARGET_RTT_MS)
    text = (f"Little's law from the 0 ms rate asks {needed:.1f} in flight; "
            if np.isfinite(needed) else "")
    fewest = fewest_within_margin(sweep)
    most = int(sweep["concurrency"].iloc[-1])
    margin = format_percent(DECISION_MARGIN)
    text += (f"the fewest within {margin} of {most}'s rate: {fewest}." if fewest is not None
             else f"which count comes within {margin} of {most}'s rate is undecided (fewer "
                  f"than {MIN_PAIRED_REPEATS} repeats a side, or none does).")
    return text[0].upper() + text[1:]


def sweep_sentences(df: pd.DataFrame) -> list[str]:
    """The sweep's findings: each point's rate beside the model's, Little's law's count,
    the fewest GETs in flight within the margin of the most, what an epoch costs, and the
    far point."""
    sweep = in_flight_sweep(df)
    out = []
    if len(sweep) > 1:
        table = remote_table(df)
        label = path_label(*SWEEP_PATH)
        points = "; ".join(
            f"{int(row['concurrency'])}: {format_value(row['samples_per_s'], 'samples/s')}"
            + (f" (model {format_value(row['predicted_samples_per_s'], 'samples/s')})"
               if np.isfinite(row["predicted_samples_per_s"]) else "")
            for _, row in sweep.iterrows())
        out.append(f"Samples/s by GETs in flight at {TARGET_RTT_MS} ms ({label}, one rank): "
                   f"{points}. {sweep_takeaway(sweep, table)}")
        costs = sweep.iloc[-1]
        if np.isfinite(costs["epoch_requests"]):
            out.append(
                f"An epoch of the set over S3 ({costs['path']}, {TARGET_RTT_MS} ms; the "
                f"pass's counts scaled to the set's size) costs "
                f"{format_value(costs['epoch_requests'], 'count')} GETs and "
                f"{format_value(costs['epoch_bytes'], 'bytes')}"
                + (f", and the S3 server "
                   f"{format_value(costs['server_cpu_s_per_sample'], 's')} of CPU a "
                   "sample" if np.isfinite(costs["server_cpu_s_per_sample"]) else "") + ".")
    far = far_point(df)
    if far is not None:
        text = (f"At {FAR_RTT_MS} ms, {far['path']} reads "
                f"{format_value(far['samples_per_s'], 'samples/s')}")
        if np.isfinite(far["predicted_samples_per_s"]):
            text += (f" (the model, from the same threads' 0 ms row: "
                     f"{format_value(far['predicted_samples_per_s'], 'samples/s')})")
        out.append(text + ".")
    return out


def in_flight_page_text(results: Results) -> str:
    """The study page's generated block: the sweep and the far point as a table (rate,
    the model's, what an epoch costs), then the sweep's sentences; where the rows hold no
    sweep, a sentence saying so."""
    df = results.df
    sweep = in_flight_sweep(df)
    far = far_point(df)
    rows = [*sweep.to_dict("records"), *([far.to_dict()] if far is not None else [])]
    if not rows:
        return ("These results hold no in-flight sweep: `storebench study` with the remote "
                "study measures it.\n")
    table = pd.DataFrame({
        "round trip": [f"{r['rtt_ms']:g} ms" for r in rows],
        "path": [r["path"] for r in rows],
        "samples/s (median, range, n)": [
            f"{r['stat']} ({r['stat'].spread}, n = {r['stat'].count})" if r["stat"] else ""
            for r in rows],
        "capacity model": [format_value(r["predicted_samples_per_s"], "samples/s")
                           for r in rows],
        "GETs an epoch (scaled)": [format_value(r["epoch_requests"], "count") for r in rows],
        "bytes an epoch (scaled)": [format_value(r["epoch_bytes"], "bytes") for r in rows],
        "S3 server CPU a sample": [format_value(r["server_cpu_s_per_sample"], "s")
                                   for r in rows],
    })
    sentences = "".join(f"- {line}\n" for line in sweep_sentences(df))
    return markdown_table(table) + "\n" + (f"\n{sentences}" if sentences else "")


def sample_caption(rows: pd.DataFrame) -> str:
    """``"jpeg, 105 kB a sample fetched"``: the encoding the rows read and the bytes a GET
    fetched per sample (where the requests were counted), whatever family or profile the
    set came from."""
    parts = []
    for encoding in dict.fromkeys(rows["encoding"].dropna()):
        mine = rows[rows["encoding"] == encoding]
        fetched, per = select(mine, "bytes_per_request"), select(mine, "samples_per_request")
        if fetched.empty or per.empty or not per["value"].median():
            parts.append(str(encoding))
            continue
        size = fetched["value"].median() / per["value"].median()
        parts.append(f"{encoding}, {format_value(size, 'bytes')} a sample fetched")
    return "; ".join(parts) or "the study's set"


def _ranked_label() -> str:
    fmt, access, _, workers = RANKED_PATH
    return path_label(fmt, access, workers)


def _ranked_args() -> tuple:
    fmt, access, concurrency, workers = RANKED_PATH
    return fmt, access, workers, concurrency


def _at_every_rtt(table: pd.DataFrame) -> pd.DataFrame:
    """The S3 rows of paths also measured at 0 ms (the same ranks, no cap): every path the
    RTTs compare, without the in-flight sweep's and the far point's own paths."""
    zero = table[(table["source"] == "s3") & (table["rtt_ms"] == 0)
                 & table["bandwidth_mbit"].isna()]
    measured = set(zip(zero["base_path"], zero["ranks"]))
    keep = [(s == "s3" and (b, r) in measured) for s, b, r
            in zip(table["source"], table["base_path"], table["ranks"])]
    return table[np.asarray(keep, dtype=bool)]


def _s3_one_rank(table: pd.DataFrame) -> pd.DataFrame:
    """One rank over S3, the paths measured at every RTT (``_at_every_rtt``)."""
    table = _at_every_rtt(table)
    return table[table["ranks"] == 1]


def _stat(df: pd.DataFrame, path: str, rtt: float, ranks: int = 1, source: str = "s3",
          metric: str = "samples_per_s"):
    rows = remote_rows(df)
    rows = rows[(rows["path"] == path) & (rows["rtt_ms"] == rtt) & (rows["ranks"] == ranks)
                & (rows["source"] == source)]
    return stat(rows, metric) if not select(rows, metric).empty else None


def keep_at(df: pd.DataFrame, path: str, rtt: float = TARGET_RTT_MS):
    """(ratio, low, high) of ``path``'s rate at ``rtt`` over its own 0 ms rate: two cases,
    so each side's repeats are resampled on their own (``ratio_interval``)."""
    far, near = _stat(df, path, rtt), _stat(df, path, 0)
    if far is None or near is None:
        return None
    return ratio_interval(far, near)


def keep_target(results: Results) -> TargetMeasure | None:
    """The fastest one-rank S3 path at ``TARGET_RTT_MS``: its rate there over its own 0 ms
    rate (two cases: unpaired repeats)."""
    table = _s3_one_rank(remote_table(results.df))
    far = table[(table["rtt_ms"] == TARGET_RTT_MS) & table["bandwidth_mbit"].isna()]
    if far.empty:
        return None
    best = far.sort_values("samples_per_s", ascending=False).iloc[0]
    kept = keep_at(results.df, best["path"])
    near = _stat(results.df, best["path"], 0)
    far_stat = _stat(results.df, best["path"], TARGET_RTT_MS)
    if kept is None or near is None or far_stat is None:
        return None
    ratio, low, high = kept
    per_get = (f", {best['samples_per_request']:.2g} samples per GET"
               if np.isfinite(best["samples_per_request"]) else "")
    return TargetMeasure(
        value=ratio, low=low, high=high, repeats=near.count,
        sources=far_stat.sources, against=near.sources,
        limiting=(f"{best['path']} at {TARGET_RTT_MS} ms: "
                  f"{format_value(best['samples_per_s'], 'samples/s')} against "
                  f"{format_value(near.median, 'samples/s')} at 0 ms{per_get}; the requests "
                  "in flight do not cover the round trip, and the S3 server shares the "
                  "client's cores"))


KEEP = TargetSpec(
    key="remote_keep_at_20ms", name=f"S3 at {TARGET_RTT_MS} ms vs 0 ms",
    description=f"the fastest one-rank S3 path's rate at {TARGET_RTT_MS} ms round trip over "
                "its own rate at 0 ms",
    threshold=TARGET_KEEP, is_fraction=True, measure=keep_target)


def streaming_peer_target(results: Results) -> TargetMeasure | None:
    """Our fastest one-rank S3 path at ``TARGET_RTT_MS`` over the fastest streaming peer
    (WebDataset, MDS, LitData) reading the same images from the same store at the same RTT,
    by epoch 1's rate from an empty cache (``peer_cases.streaming_peer_measure``); None
    where either side has no row."""
    from .peer_cases import streaming_peer_measure

    return streaming_peer_measure(results.df)


def _streaming_peer_cases(*, profile: str, data_dir: Path | str, repeats: int | None,
                          paths) -> list[Case]:
    """The streaming peers' rows and ours over the same cut set at ``TARGET_RTT_MS``
    (``peer_cases.streaming_peer_cases``), cases made as the rest of the grid's."""
    from .peer_cases import streaming_peer_cases

    return streaming_peer_cases(
        profile=profile, data_dir=data_dir, repeats=repeats, paths=paths, make_case=_case,
        batch_size_of=_case_batch_size, rtt_ms=TARGET_RTT_MS)


def _case_batch_size(manifest: dict) -> int:
    """The batch size ``_case`` gives a case over a set of ``manifest``."""
    preferred = TRAINING_BATCH if is_training_set(manifest) else 256
    return batch_size_for(manifest["num_samples"], preferred)


def _peer_unmeasured() -> str:
    from .peer_cases import UNMEASURED

    return UNMEASURED


PEER_UNMEASURED = _peer_unmeasured()
PEER = TargetSpec(
    key="remote_vs_streaming_peer", name=f"S3 at {TARGET_RTT_MS} ms vs the best streaming peer",
    description=f"the fastest one-rank S3 path at {TARGET_RTT_MS} ms over the fastest streaming "
                "peer (WebDataset, LitData, MDS) reading the same images from the same store "
                "at the same RTT, by epoch 1 from an empty local cache",
    threshold=TARGET_PEER, is_fraction=False, measure=streaming_peer_target,
    unmeasured=PEER_UNMEASURED)


# -- figures ----------------------------------------------------------------------------
def path_colours(paths) -> dict:
    """One colour per path, in order of first appearance."""
    palette = [f"C{i}" for i in range(10)]
    return {path: palette[i % 10] for i, path in enumerate(dict.fromkeys(paths))}


# At most this many one-rank paths share a panel of ``plot_remote_rtt``.
SERIES_PER_PANEL = 3


def rtt_panels(one: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """(format, paths) per panel: one-rank paths grouped by the format they read, at most
    ``SERIES_PER_PANEL`` to a panel."""
    panels = []
    for fmt in dict.fromkeys(path.split(",")[0] for path in one["path"]):
        paths = [p for p in dict.fromkeys(one["path"]) if p.split(",")[0] == fmt]
        panels += [(fmt, paths[i:i + SERIES_PER_PANEL])
                   for i in range(0, len(paths), SERIES_PER_PANEL)]
    return panels


def _rtt_panel(ax, rows: pd.DataFrame, one: pd.DataFrame, paths: list[str], fmt: str,
               xs: dict, colours: dict) -> None:
    """Measured samples/s (dots, whiskers: the repeats' range) and the capacity model from
    0 ms (dashed, crosses) of ``paths``, one rank each; a legend under the panel."""
    for path in paths:
        summary = summary_table(rows[(rows["path"] == path) & (rows["ranks"] == 1)
                                     & (rows["source"] == "s3")], "samples_per_s", ["rtt_ms"])
        summary = summary.sort_values("rtt_ms")
        x = [xs[r] for r in summary["rtt_ms"]]
        ax.errorbar(x, summary["median"], yerr=[summary["median"] - summary["low"],
                                                summary["high"] - summary["median"]],
                    marker="o", color=colours[path], capsize=3,
                    label=path.removeprefix(f"{fmt}, "))
        model = one[one["path"] == path].sort_values("rtt_ms")
        ax.plot([xs[r] for r in model["rtt_ms"]], model["predicted_samples_per_s"],
                linestyle="--", marker="x", color=colours[path], alpha=0.8)
    ax.set_title(fmt, fontsize="medium")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize="x-small",
              frameon=False)


def _ranks_panel(ax, table: pd.DataFrame, xs: dict) -> None:
    """The ranked path: 1 and 2 ranks on S3 at every RTT, and on local disk (left), side by
    side so that equal rates stay visible."""
    ranked = table[table["path"].str.startswith(_ranked_label())]
    s3 = ranked[(ranked["source"] == "s3") & (ranked["concurrency"] == RANKED_PATH[2])
                & ranked["bandwidth_mbit"].isna()]
    local = ranked[ranked["source"] == "local"]
    for ranks, marker, offset, colour in ((1, "o", -0.08, "C0"), (2, "s", 0.08, "C3")):
        mine = s3[s3["ranks"] == ranks].sort_values("rtt_ms")
        near = local[local["ranks"] == ranks]
        x = [-1 + offset] * len(near) + [xs.get(r, np.nan) + offset for r in mine["rtt_ms"]]
        y = list(near["samples_per_s"]) + list(mine["samples_per_s"])
        if not y:
            continue
        name = f"{ranks} rank{'s' * (ranks > 1)}"
        ax.plot(x[len(near):], y[len(near):], marker=marker, color=colour,
                label=f"{name}, all ranks")
        ax.plot(x[:len(near)], y[:len(near)], marker=marker, color=colour, linestyle="none")
        if ranks > 1:
            ax.plot([v for v in x[len(near):]], mine["per_rank_samples_per_s"], marker=marker,
                    color=colour, linestyle=":", markerfacecolor="white",
                    label=f"{name}, each rank")
            ax.plot(x[:len(near)], near["per_rank_samples_per_s"], marker=marker,
                    color=colour, linestyle="none", markerfacecolor="white")
    ax.axvline(-0.5, color="grey", linewidth=0.6)
    ax.set_title(f"ranks: {_ranked_label()}", fontsize="medium")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize="x-small",
              frameon=False)


def remote_takeaway(df: pd.DataFrame) -> str:
    """One sentence from the rows: the best one-rank path at the largest RTT and the share
    of its 0 ms rate it keeps; the capacity model's median error."""
    table = remote_table(df)
    one = _s3_one_rank(table)
    one = one[one["bandwidth_mbit"].isna()]
    if one.empty:
        return ""
    far = one[one["rtt_ms"] == one["rtt_ms"].max()].sort_values("samples_per_s",
                                                                  ascending=False).iloc[0]
    kept = keep_at(df, far["path"], far["rtt_ms"])
    text = (f"At {far['rtt_ms']:g} ms the fastest path is {far['path']}, "
            f"{format_value(far['samples_per_s'], 'samples/s')}")
    if kept is not None:
        text += f" ({format_percent(kept[0])} of its 0 ms rate)"
    modelled = _at_every_rtt(table)
    errors = (modelled.loc[modelled["rtt_ms"] > 0, "predicted_over_measured"] - 1
              ).abs().dropna()
    if not errors.empty:
        text += f"; the capacity model is off by a median {format_percent(float(errors.median()))}"
    return text + "."


def plot_remote_rtt(df: pd.DataFrame) -> Figure:
    """Samples/s against RTT, small multiples: one-rank paths grouped by format, at most
    ``SERIES_PER_PANEL`` a panel (measured: dots with the repeats' range; the capacity
    model from the 0 ms row: dashed), and 1 vs 2 ranks of the ranked path, local disk
    beside S3."""
    table = remote_table(df)
    if table.empty:
        return empty_figure("no remote rows")
    rows = remote_rows(df)
    one = _s3_one_rank(table)
    rtts = sorted(one["rtt_ms"].unique())
    xs = {rtt: i for i, rtt in enumerate(rtts)}
    colours = path_colours(table["path"])
    panels = rtt_panels(one)
    columns = 3
    count = len(panels) + 1
    fig = Figure(figsize=(11, 3.6 * math.ceil(count / columns) + 1.0), layout="constrained")
    axes = fig.subplots(math.ceil(count / columns), columns, sharey=True,
                        squeeze=False).ravel()
    for ax, (fmt, paths) in zip(axes, panels):
        _rtt_panel(ax, rows, one, paths, fmt, xs, colours)
    ranks_ax = axes[len(panels)]
    _ranks_panel(ranks_ax, table, xs)
    for ax in axes[count:]:
        ax.set_visible(False)
    for i, ax in enumerate(axes[:count]):
        labels = [f"{r:g} ms" for r in rtts]
        if ax is ranks_ax:
            ax.set_xticks([-1, *range(len(rtts))], ["local", *labels])
        else:
            ax.set_xticks(range(len(rtts)), labels)
            ax.set_xlim(-0.3, len(rtts) - 0.7)
        ax.set_xlabel("emulated round-trip time", fontsize="small")
        if i % columns == 0:
            ax.set_ylabel("samples per second")
    log_axis(axes[0])
    # Neutral entries: colour belongs to the path, the line style to measured or modelled.
    fig.legend([Line2D([], [], color="grey", marker="o"),
                Line2D([], [], color="grey", marker="x", linestyle="--")],
               ["measured (whiskers: the repeats' range)", "capacity model from the 0 ms row"],
               loc="outside lower center", ncols=2, fontsize="small")
    question_title(fig, "How much of its 0 ms rate does each path keep as the S3 store moves "
                        f"away? ({sample_caption(rows)}; SeaweedFS; a thread prefetcher per "
                        "rank)", remote_takeaway(df))
    return fig


def plot_remote_capacity(df: pd.DataFrame, *, cores: int | None = None) -> Figure:
    """The capacity model used forwards: loader workers needed to keep 80% of the 0 ms
    rate as RTT grows, per measured path; and nodes against aggregate throughput at 20 ms.
    ``cores``: the measuring machine's, named in the caption (its S3 server shared them)."""
    table = remote_table(df)
    zero = _s3_one_rank(table)
    zero = zero[zero["rtt_ms"] == 0]
    if zero.empty:
        return empty_figure("no remote rows at 0 ms")
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    colours = path_colours(table["path"])
    rtts = np.geomspace(1, 200, 40)
    needed_at = {}
    for _, row in zero.iterrows():
        pipeline = pipeline_at_zero(table, row)
        if pipeline is None:
            continue
        needed = [workers_to_keep(pipeline, r / 1e3, TARGET_KEEP) for r in rtts]
        needed_at[row["path"]] = workers_to_keep(pipeline, TARGET_RTT_MS / 1e3, TARGET_KEEP)
        left.plot(rtts, needed, color=colours[row["path"]], label=row["path"])
    log_axis(left, "x")
    log_axis(left, "y")
    keep = format_percent(TARGET_KEEP)
    left.set_xlabel("round-trip time (ms)")
    left.set_ylabel(f"loader workers to keep {keep}\nof the 0 ms rate")
    left.set_title(f"Loader workers that keep {keep} of the 0 ms rate\n(each with its "
                   "measured requests in flight)", fontsize="medium")
    legend_below(fig, [left], loc="outside lower left", fontsize="x-small", ncols=2)
    modelled = [(row["samples_per_s"], row) for _, row in zero.iterrows()
                if pipeline_at_zero(table, row) is not None]
    machine = (f"a {cores}-core machine" if cores else "the measuring machine") + \
        " whose S3 server shares the cores with the loader"
    if not modelled:
        right.text(0.5, 0.5, "no path with counted requests", ha="center", va="center",
                   transform=right.transAxes, color="grey")
        return fig
    best = max(modelled, key=lambda pair: pair[0])[1]
    pipeline = pipeline_at_zero(table, best)
    nodes = np.unique(np.geomspace(1, 1024, 30).astype(int))
    for store_gbps, style, colour in ((math.inf, "-", "tab:blue"), (100.0, "--", "tab:orange"),
                                      (10.0, ":", "tab:red")):
        label = "unlimited store" if math.isinf(store_gbps) else f"store serves {store_gbps:g} GB/s"
        right.plot(nodes, [scale_out(pipeline, TARGET_RTT_MS / 1e3, int(n),
                                     store_bandwidth_Bps=store_gbps * 1e9) for n in nodes],
                   linestyle=style, color=colour, label=label)
    log_axis(right, "x")
    log_axis(right)
    right.set_xlabel("nodes (one rank each, this machine's measured pipeline)")
    right.set_ylabel("samples per second, all nodes")
    right.set_title(f"Samples per second of N nodes at {TARGET_RTT_MS} ms\n({best['path']})",
                    fontsize="medium")
    legend_below(fig, [right], loc="outside lower right", fontsize="x-small", ncols=1)
    most = max(needed_at.items(), key=lambda kv: kv[1]) if needed_at else None
    takeaway = (f"At {TARGET_RTT_MS} ms, {most[0]} needs {most[1]} loader "
                f"worker{'s' * (most[1] != 1)} for {keep}. "
                if most else "")
    question_title(fig, "How many loader workers hide a round trip, and how far do nodes "
                        "scale out? (the capacity model, from this run's 0 ms rows)",
                   takeaway + f"Extrapolated from {machine}.")
    return fig


def plot_remote_in_flight(df: pd.DataFrame) -> Figure:
    """Samples/s against GETs in flight at ``TARGET_RTT_MS`` (log2 x) for ``SWEEP_PATH``:
    measured (dots, whiskers: the repeats' range) beside the capacity model from the 0 ms
    row (dashed, crosses at the measured counts), the 0 ms rate, Little's law's count, and
    the far point (``FAR_PATH`` at ``FAR_RTT_MS``) with its model."""
    sweep = in_flight_sweep(df)
    far = far_point(df)
    if sweep.empty and far is None:
        return empty_figure("no in-flight sweep rows")
    table = remote_table(df)
    fig = Figure(figsize=(8, 5.2), layout="constrained")
    ax = fig.subplots()
    stats = []
    if not sweep.empty:
        rows = remote_rows(df)
        summary = summary_table(rows[rows["path"].isin(sweep["path"])
                                     & (rows["rtt_ms"] == TARGET_RTT_MS)
                                     & (rows["ranks"] == 1)],
                                "samples_per_s", ["concurrency"]).sort_values("concurrency")
        stats += list(summary["stat"])
        ax.errorbar(summary["concurrency"], summary["median"],
                    yerr=[summary["median"] - summary["low"],
                          summary["high"] - summary["median"]],
                    marker="o", linestyle="none", color="C0", capsize=3,
                    label=f"measured at {TARGET_RTT_MS} ms (whiskers: the repeats' range)")
        pipeline = pipeline_at_zero(table, sweep.iloc[-1])
        if pipeline is not None:
            counts = np.arange(1, int(sweep["concurrency"].max()) + 1)
            ax.plot(counts, [predicted_rate(pipeline, TARGET_RTT_MS / 1e3, concurrency=int(c))
                             for c in counts],
                    linestyle="--", color="C0", alpha=0.7,
                    label=f"capacity model at {TARGET_RTT_MS} ms, from the 0 ms row")
            ax.plot(sweep["concurrency"], sweep["predicted_samples_per_s"], marker="x",
                    linestyle="none", color="C0")
            ax.axhline(pipeline.rate0, color="grey", linestyle=":", linewidth=1,
                       label="0 ms rate (the model's ceiling)")
            needed = littles_law_in_flight(table, sweep.iloc[-1], TARGET_RTT_MS)
            ax.axvline(needed, color="C2", linestyle=":", linewidth=1,
                       label=f"Little's law at {TARGET_RTT_MS} ms: {needed:.1f} in flight")
    if far is not None:
        stats.append(far["stat"])
        ax.plot([far["concurrency"]], [far["samples_per_s"]], marker="D", linestyle="none",
                color="C3", label=f"measured at {FAR_RTT_MS} ms ({far['path']})")
        if np.isfinite(far["predicted_samples_per_s"]):
            ax.plot([far["concurrency"]], [far["predicted_samples_per_s"]], marker="D",
                    linestyle="none", color="C3", markerfacecolor="white",
                    label=f"capacity model at {FAR_RTT_MS} ms")
    mark_drawn(stats)
    ax.set_xscale("log", base=2)
    most = max([*sweep["concurrency"].astype(int),
                *([int(far["concurrency"])] if far is not None else [])])
    ticks = [2 ** i for i in range(int(math.log2(most)) + 1)]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("GETs in flight a rank (its reader's request threads, shared by its "
                  "prefetch threads)")
    ax.set_ylabel("samples per second")
    ax.set_ylim(bottom=0)
    legend_below(fig, [ax], fontsize="x-small", ncols=2)
    question_title(fig, f"How many GETs in flight does one rank need at {TARGET_RTT_MS} ms? "
                        f"({path_label(*SWEEP_PATH)}; {sample_caption(remote_rows(df))})",
                   sweep_takeaway(sweep, table) if len(sweep) > 1 else "")
    return fig


FIGURES = (
    FigureSpec("remote_rtt", "Object storage at 0, 2 and 20 ms, by format: measured and "
               "modelled; 1 and 2 ranks beside local disk",
               lambda r: plot_remote_rtt(r.df)),
    FigureSpec("remote_capacity", "The capacity model: loader workers to hide a distance, "
               "and scale-out, extrapolated from a machine whose S3 server shares its cores",
               lambda r: plot_remote_capacity(r.df,
                                              cores=r.study_env(NAME).get("cpus_usable"))),
    FigureSpec("remote_in_flight", f"GETs in flight at {TARGET_RTT_MS} ms, measured beside "
               f"the capacity model (Little's law), and one point at {FAR_RTT_MS} ms",
               lambda r: plot_remote_in_flight(r.df)),
)


# -- findings and guide -----------------------------------------------------------------
def remote_findings(df: pd.DataFrame, env: Mapping | None = None) -> list[str]:
    table = remote_table(df)
    skipped = df[(df["study"] == NAME) & (df["status"] == "skipped")]
    out = []
    if not skipped.empty:
        reason = str(skipped["error"].iloc[0]).splitlines()[0]
        out.append(f"{skipped['case_id'].nunique()} remote cases could not run here: {reason}.")
    one = _s3_one_rank(table)
    one = one[one["bandwidth_mbit"].isna()]  # the capped row has its own sentence
    if one.empty:
        return out or ["No remote rows."]
    far = one[one["rtt_ms"] == one["rtt_ms"].max()].sort_values("samples_per_s",
                                                                  ascending=False)
    best = far.iloc[0]
    kept = keep_at(df, best["path"], best["rtt_ms"])
    if kept is not None:
        ratio, low, high = kept
        met = "met" if low >= TARGET_KEEP else "not met"
        out.append(
            f"Best one-rank path at {best['rtt_ms']:g} ms: {best['path']} at "
            f"{format_value(best['samples_per_s'], 'samples/s')}, "
            f"{format_percent(ratio)} of its own 0 ms rate (95% interval "
            f"{format_percent(low)}\u2013{format_percent(high)}; target \u2265 "
            f"{format_percent(TARGET_KEEP)} by the interval's lower end: {met}).")
    for _, row in far.iloc[1:].iterrows():
        kept = keep_at(df, row["path"], row["rtt_ms"])
        if kept is not None:
            per_get = (f" ({row['samples_per_request']:.2g} samples per GET)"
                       if np.isfinite(row["samples_per_request"]) else "")
            out.append(f"{row['path']}: {format_value(row['samples_per_s'], 'samples/s')} at "
                       f"{row['rtt_ms']:g} ms, {format_percent(kept[0])} of its 0 ms rate"
                       f"{per_get}.")
    for source, path in (("s3", path_label(*_ranked_args())),
                         ("local", _ranked_label())):
        rtts = sorted(table[(table["source"] == source) & (table["path"] == path)]["rtt_ms"]
                      .unique())
        for rtt in rtts:
            two, one_rank = _stat(df, path, rtt, 2, source), _stat(df, path, rtt, 1, source)
            if two is None or one_rank is None:
                continue
            ratio, low, high = ratio_interval(two, one_rank)
            where = "local disk" if source == "local" else f"S3 at {rtt:g} ms"
            out.append(f"2 ranks vs 1 ({where}): {format_ratio(ratio)} the aggregate "
                       f"(interval {format_ratio(low)}\u2013{format_ratio(high)}) on this "
                       "machine's 2 cores, which the ranks share.")
    for _, row in table[table["bandwidth_mbit"].notna()].iterrows():
        link_MBps = row["bandwidth_mbit"] / 8
        out.append(
            f"Through a {row['bandwidth_mbit']:g} Mbit/s tbf cap ({link_MBps:g} MB/s) at "
            f"{row['rtt_ms']:g} ms, {row['base_path']} reads "
            f"{format_value(row['samples_per_s'], 'samples/s')}; the model, with the cap as "
            f"its bandwidth term, predicts "
            f"{format_value(row['predicted_samples_per_s'], 'samples/s')}.")
    modelled = _at_every_rtt(table)
    modelled = modelled[modelled["rtt_ms"] > 0]
    errors = (modelled["predicted_over_measured"] - 1).abs().dropna()
    if not errors.empty:
        worst = modelled.loc[errors.idxmax()]
        rtts = " and ".join(f"{r:g}" for r in sorted(modelled.loc[errors.index, "rtt_ms"]
                                                      .unique()))
        out.append(
            f"Capacity model vs measurement at {rtts} ms ({len(errors)} rows): median "
            f"error {format_percent(float(errors.median()))}, worst "
            f"{format_percent(float(errors.max()))} ({worst['path']}, {worst['ranks']} "
            f"rank(s), {worst['rtt_ms']:g} ms).")
    ttfb = one.pivot_table(index="path", columns="rtt_ms", values="time_to_first_batch_s")
    if not ttfb.empty and len(ttfb.columns) > 1:
        low_rtt, high_rtt = ttfb.columns.min(), ttfb.columns.max()
        out.append(
            f"Time to first batch (open included) grows from a median "
            f"{format_value(float(ttfb[low_rtt].median()), 's')} at {low_rtt:g} ms to "
            f"{format_value(float(ttfb[high_rtt].median()), 's')} at {high_rtt:g} ms "
            "across paths: opening is a chain of round trips.")
    out += sweep_sentences(df)
    out += local_gap_findings(df, cores=(env or {}).get("cpus_usable"))
    out += streaming_peer_findings(df, threshold=TARGET_PEER)
    return out


def local_gap_findings(df: pd.DataFrame, *, cores: int | None = None) -> list[str]:
    """Why S3 at 0 ms is slower than local disk: the ranked path's one-rank rate on both,
    and the cores the S3 server and the delaying proxy kept busy meanwhile (rows'
    ``server_cores``, ``proxy_cores``) beside the machine's usable cores."""
    path = path_label(*_ranked_args())
    s3, local = _stat(df, path, 0), _stat(df, _ranked_label(), 0, source="local")
    if s3 is None or local is None:
        return []
    text = (f"S3 at 0 ms vs local disk ({_ranked_label()}, one rank): "
            f"{format_value(s3.median, 'samples/s')} against "
            f"{format_value(local.median, 'samples/s')} "
            f"({format_ratio(local.median / s3.median)} slower)")
    helpers = [(_stat(df, path, 0, metric=f"{name}_cores"), what)
               for name, what in (("server", "the S3 server"), ("proxy", "the proxy"))]
    busy = [f"{what} kept {value.median:.2f} cores busy" for value, what in helpers if value]
    if busy:
        machine = f"this machine's {cores}" if cores else "this machine's"
        text += ("; meanwhile " + " and ".join(busy) + f" of {machine} cores, which the "
                 "client's decoding threads share")
    else:
        text += ("; these rows did not record the S3 server's CPU time, which shares the "
                 "client's cores")
    return [text + "."]


def guide(results: Results) -> list:
    """Per RTT: every one-rank S3 path measured without a bandwidth cap is a candidate, by
    samples/s (the in-flight sweep's too); not the far point, one path alone at its RTT."""
    from ...guide import Candidate, choose

    rows = remote_rows(results.df)
    rows = rows[(rows["source"] == "s3") & (rows["ranks"] == 1) & rows["bandwidth_mbit"].isna()
                & (rows["rtt_ms"] != FAR_RTT_MS)]
    out = []
    for rtt, part in rows.groupby("rtt_ms", sort=True):
        candidates = []
        for path in dict.fromkeys(part["path"]):
            mine = part[part["path"] == path]
            if not select(mine, "samples_per_s").empty:
                candidates.append(Candidate(path, path, stat(mine, "samples_per_s")))
        out.append(choose(
            NAME, f"Data in object storage at {rtt:g} ms round trip, one rank: which format, "
            f"order and concurrency? ({', '.join(dict.fromkeys(part['encoding'].dropna()))})",
            "samples_per_s", candidates,
            facets={"rtt_ms": float(rtt)}))
    return [row for row in out if row is not None]


def findings(results: Results) -> list[str]:
    return remote_findings(results.df, results.env)


# The live cell: the same epoch from local disk and from an S3 server on this machine.
LIVE = LiveComparison(
    pair=("local disk", "S3 at 0 ms"),
    choices={"local disk": {"format": "tfrecord", "param_source": "local", "param_ranks": 1},
             "S3 at 0 ms": {"format": "tfrecord", "param_source": "s3", "param_rtt_ms": 0,
                            "param_ranks": 1, "param_bandwidth_mbit": None}},
    formats=("tfrecord",), encodings=("jpeg",),
    settings={"workers": 2, "batch_size": None},
)


STUDY = Study(
    name=NAME,
    question="How fast can training read its data from object storage at a distance, by "
             "one rank or several?",
    grid=remote_grid,
    figures=FIGURES,
    findings=findings,
    guide=guide,
    notebook="07_remote.ipynb",
    services=object_store,
    # The streaming peers' shards (and ours) of the peers study's cut set, built in the
    # peers environment before the study runs.
    prepare=prepare_streaming_peers,
    page_text=in_flight_page_text,
    targets=(KEEP, PEER),
    live=LIVE,
)
