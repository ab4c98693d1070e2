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
0 ms measurement; the figure draws both.
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
    MIN_PAIRED_REPEATS,
    Results,
    medians_table,
    params_of,
    ratio_interval,
    select,
    stat,
    summary_table,
)
from ...text import format_percent, format_ratio, format_value
from ..base import FigureSpec, LiveComparison, Study, TargetMeasure, TargetSpec
from ..grid import (
    batch_size_for,
    dataset_fields,
    decode_params,
    epoch_fields,
    is_training_set,
    pick,
    profile_datasets,
    repeat_fields,
)

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
    20 ms under a ``CAPPED_MBIT`` tbf cap.
    On an ImageNet-like set, ``TRAINING_PATHS`` at ``TRAINING_RTTS_MS``, the cap
    ``TRAINING_CAPPED_MBIT``. Compact plans (ci): ``COMPACT_PATHS`` at ``COMPACT_RTTS_MS``."""
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
    cases = []
    for fmt, access, concurrency, workers in paths:
        found = _encoded(datasets, fmt)
        if found is None:
            continue
        for rtt in rtts:
            for ranks in (1, 2) if (fmt, access, concurrency, workers) == RANKED_PATH else (1,):
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
        root = f"s3://{BUCKET}/{Path(remote[0]).parent.name}"
        for dataset in remote:
            upload_dataset(dataset, f"{root}/{Path(dataset).name}", s3=config)
        pid = server.process.pid if server.process is not None else None
        yield {**config.env(), REMOTE_ROOT_ENV: root,
               **({REMOTE_SERVER_PID_ENV: str(pid)} if pid else {})}
    finally:
        server.stop()


# -- the one table figures, findings and the guide read ---------------------------------
def remote_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The study's epoch rows with ``source``, ``rtt_ms``, ``ranks``, ``concurrency``,
    ``bandwidth_mbit`` (NaN: no cap), ``base_path`` (format, order, threads, requests in
    flight) and ``path`` (the base path, and its cap where it has one) columns."""
    rows = df[(df["study"] == NAME) & (df["case_id"].str.startswith("remote_epoch"))]
    params = params_of(rows) if not rows.empty else pd.Series(dtype=object)
    base = [f"{f}, {a.replace('_', ' ')}, {int(w)} threads"
            + (f", {p.get('concurrency')} in flight" if p.get("source", "s3") == "s3" else "")
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


def remote_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per path, RTT and rank count: medians of samples/s, per-rank samples/s, time to
    first batch, samples and bytes per request, measured RTT; and the model's prediction
    (from the same path's 0 ms row) with its ratio to the measurement."""
    rows = remote_rows(df)
    metrics = ["samples_per_s", "per_rank_samples_per_s", "time_to_first_batch_s",
               "samples_per_request", "bytes_per_request", "measured_rtt_s"]
    if rows.empty:
        return pd.DataFrame(columns=[*KEYS, *metrics, "predicted_samples_per_s"])
    table = medians_table(rows, metrics, KEYS)
    table["predicted_samples_per_s"] = [_predict(table, row) for _, row in table.iterrows()]
    table["predicted_over_measured"] = table["predicted_samples_per_s"] / table["samples_per_s"]
    return table.sort_values(["source", "path", "ranks", "rtt_ms"], ignore_index=True)


def pipeline_at_zero(table: pd.DataFrame, row) -> Pipeline | None:
    """The capacity model's inputs, from ``row``'s path measured at 0 ms without a cap
    (same ranks); None where that row is missing or its requests were not counted."""
    zero = table[(table["base_path"] == row["base_path"]) & (table["ranks"] == row["ranks"])
                 & (table["source"] == "s3") & (table["rtt_ms"] == 0)
                 & table["bandwidth_mbit"].isna()]
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
    return row["ranks"] * predicted_rate(pipeline, row["rtt_ms"] / 1e3, bandwidth_Bps=bandwidth)


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
    return f"{fmt}, {access.replace('_', ' ')}, {workers} threads"


def _s3_one_rank(table: pd.DataFrame) -> pd.DataFrame:
    return table[(table["source"] == "s3") & (table["ranks"] == 1)]


def _stat(df: pd.DataFrame, path: str, rtt: float, ranks: int = 1, source: str = "s3",
          metric: str = "samples_per_s"):
    rows = remote_rows(df)
    rows = rows[(rows["path"] == path) & (rows["rtt_ms"] == rtt) & (rows["ranks"] == ranks)
                & (rows["source"] == source)]
    return stat(rows, metric) if not select(rows, metric).empty else None


def keep_at(df: pd.DataFrame, path: str, rtt: float = TARGET_RTT_MS):
    """(ratio, low, high) of ``path``'s rate at ``rtt`` over its own 0 ms rate."""
    far, near = _stat(df, path, rtt), _stat(df, path, 0)
    if far is None or near is None:
        return None
    return ratio_interval(far, near)


def keep_target(results: Results) -> TargetMeasure | None:
    """The fastest one-rank S3 path at ``TARGET_RTT_MS``: its rate there over its own 0 ms
    rate, paired repeats."""
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
    reading the same store at the same RTT: None in every run of this build, since no
    streaming peer reads through the study's S3 server (``PEER_UNMEASURED``)."""
    return None


PEER_UNMEASURED = (
    "no streaming peer reads over S3 here: the peers study runs WebDataset, LitData and MDS "
    "over local files in the peers environment, and the remote study's S3 cases run only "
    "storebench's readers")
PEER = TargetSpec(
    key="remote_vs_streaming_peer", name=f"S3 at {TARGET_RTT_MS} ms vs the best streaming peer",
    description=f"the fastest one-rank S3 path at {TARGET_RTT_MS} ms over the fastest streaming "
                "peer (WebDataset, LitData, MDS) reading the same store at the same RTT",
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
    errors = (table.loc[(table["source"] == "s3") & (table["rtt_ms"] > 0),
                        "predicted_over_measured"] - 1).abs().dropna()
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


FIGURES = (
    FigureSpec("remote_rtt", "Object storage at 0, 2 and 20 ms, by format: measured and "
               "modelled; 1 and 2 ranks beside local disk",
               lambda r: plot_remote_rtt(r.df)),
    FigureSpec("remote_capacity", "The capacity model: loader workers to hide a distance, "
               "and scale-out, extrapolated from a machine whose S3 server shares its cores",
               lambda r: plot_remote_capacity(r.df,
                                              cores=r.study_env(NAME).get("cpus_usable"))),
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
    for source, path in (("s3", f"{_ranked_label()}, {RANKED_PATH[2]} in flight"),
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
    modelled = table[(table["source"] == "s3") & (table["rtt_ms"] > 0)]
    errors = (modelled["predicted_over_measured"] - 1).abs().dropna()
    if not errors.empty:
        worst = modelled.loc[errors.idxmax()]
        out.append(
            f"Capacity model vs measurement at 2 and 20 ms ({len(errors)} rows): median "
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
    out += local_gap_findings(df, cores=(env or {}).get("cpus_usable"))
    out.append(f"Target {PEER.name} (\u2265 {format_ratio(TARGET_PEER)}): not measured: "
               f"{PEER_UNMEASURED}.")
    return out


def local_gap_findings(df: pd.DataFrame, *, cores: int | None = None) -> list[str]:
    """Why S3 at 0 ms is slower than local disk: the ranked path's one-rank rate on both,
    and the cores the S3 server and the delaying proxy kept busy meanwhile (rows'
    ``server_cores``, ``proxy_cores``) beside the machine's usable cores."""
    path = f"{_ranked_label()}, {RANKED_PATH[2]} in flight"
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
    samples/s."""
    from ...guide import Candidate, choose

    rows = remote_rows(results.df)
    rows = rows[(rows["source"] == "s3") & (rows["ranks"] == 1) & rows["bandwidth_mbit"].isna()]
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
    targets=(KEEP, PEER),
    live=LIVE,
)
