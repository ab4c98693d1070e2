"""The remote study's streaming-peer rows: WebDataset, MosaicML Streaming (MDS) and LitData
each reading its own shards from the study's S3 server at ``PEER_RTT_MS``, beside
storebench's one-rank S3 paths reading the same images at the same RTT; the target "S3 at
20 ms vs the best streaming peer" compares the two sides.

The set. The peers' shards are the peers study's cut JPEG set (``bench.plan.peer_specs``:
the profile's JPEGs cut to 2,048, or 1,280 of a training-set family), built in the peer sets'
directory with the peers environment (``prepare_streaming_peers``); storebench's paths read
the same cut in their own formats from the same directory. Not the remote study's whole
set: building three peer formats of it would cost more than the rows, and a peer reads
whole epochs (its cache is the point), which the cut keeps to seconds at 20 ms.
Uploaded under ``<root>/peers/<format>-<encoding>`` (``store_key``).

How each peer reads S3 (its documented way, pointed at the delaying proxy so that every
request pays the RTT): MDS ``StreamingDataset(remote="s3://...", local=<cache>)`` with
``S3_ENDPOINT_URL``; LitData ``StreamingDataset("s3://...", cache_dir=<cache>,
storage_options={"endpoint_url": ...})``; WebDataset over presigned ``http://`` shard URLs
(its gopen opens them with curl) with ``cache_dir=<cache>``. Each with its own shuffle
(WebDataset's 1,000-sample buffer, MDS's py1e, LitData's chunk shuffle), 2 DataLoader
workers, the remote study's batch size, decode and training crop (Pillow-resized, as the
peers study's peer rows).

What a repeat measures: epoch 1 from an empty local cache (a new directory each repeat,
checked empty), timed from making the loader (index download included) to its last batch:
``epoch1_samples_per_s`` is its samples over that time; then ``LATER_EPOCHS`` epoch(s) on the
same loader, read from what epoch 1 cached (``later_epochs_samples_per_s``, apart). Requests
and bytes per epoch are counted on the wire (``remote.request_counter``, between the client
and the delaying proxy): ``epoch1_gets``, ``epoch1_fetched_bytes`` (response bytes, headers
included), and the same for the later epochs. The S3 server's CPU seconds per sample of
epoch 1 (``server_cpu_s_per_sample``): it shares the client's cores. storebench's side
(``cut_s3_epoch_case``) is the remote study's own epoch case over the cut, read whole,
with the same metric names (its GETs counted by its own client).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from ...bench.case import Case, CaseSkipped, Trial

PEER_RTT_MS = 20
# The streaming peers: each one's loader path and format share its name.
STREAMING_PEERS = ("webdataset", "mds", "litdata")
# storebench's formats read over the cut: the remote study's paths among these.
OUR_FORMATS = ("tfrecord", "rawfiles")
PEER_CASES = "storebench.studies.remote.peer_cases"
PEER_FUNCTION = f"{PEER_CASES}:streaming_peer_epochs_case"
OURS_FUNCTION = f"{PEER_CASES}:cut_s3_epoch_case"
MISSING_FUNCTION = f"{PEER_CASES}:missing_cut_case"
# Where the cut sets sit in the store, under the study's root: apart from the whole sets,
# whose directory names they share.
STORE_PREFIX = "peers"
LATER_EPOCHS = 1
WORKERS = 2
PRESIGNED_S = 3600
# Samples of epoch 1 compared with storebench's decode of the local build.
CHECKED_SAMPLES = 8
RATE = "epoch1_samples_per_s"


# -- the store -----------------------------------------------------------------------------
def store_key(dataset: Path | str) -> str:
    """The dataset's key under the study's root: ``peers/<name>`` for a set of the peer
    sets' directory, ``<name>`` for any other."""
    from ...bench.plan import PEER_SETS_DIR

    path = Path(dataset)
    return f"{STORE_PREFIX}/{path.name}" if path.parent.name == PEER_SETS_DIR else path.name


def data_dir_name(datasets) -> str:
    """The name of the data directory the datasets were built in (the store root's last
    part): the peer sets' directory is inside it."""
    from ...bench.plan import PEER_SETS_DIR

    first = Path(sorted(str(d) for d in datasets)[0])
    parent = first.parent
    return parent.parent.name if parent.name == PEER_SETS_DIR else parent.name


def _store_root() -> str:
    from .cases import store_root

    return store_root()


@contextlib.contextmanager
def environ(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set inside the block, as it was after it."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# -- the grid ------------------------------------------------------------------------------
def prepare_streaming_peers(*, profile: str, data_dir: Path | str,
                            progress: bool = True) -> None:
    """Build the cut set in the peer formats and ours (``OUR_FORMATS``) with the peers
    environment (``peer_sets.build_peer_formats``), where it is not built yet."""
    from ...bench.plan import peer_sets_dir
    from ..peer_sets import build_peer_formats

    wanted = (*OUR_FORMATS, *STREAMING_PEERS)
    missing = tuple(fmt for fmt in wanted
                    if not (peer_sets_dir(data_dir) / f"{fmt}-jpeg" / "manifest.json").exists())
    build_peer_formats(profile=profile, data_dir=data_dir, formats=missing, progress=progress)


def streaming_peer_cases(*, profile: str, data_dir: Path | str, repeats: int | None,
                         paths, make_case, batch_size_of,
                         rtt_ms: float = PEER_RTT_MS) -> list[Case]:
    """Each streaming peer over the cut JPEG set at ``rtt_ms``, and each one-rank path of
    ``paths`` ((format, order, in flight, threads), the remote grid's) whose format is among
    ``OUR_FORMATS`` over the same cut at the same RTT, made by ``make_case`` (the remote
    grid's). A set not built gives a ``skipped`` row saying so, with the batch size
    ``batch_size_of(manifest)`` and the decode its case would have had."""
    import dataclasses

    from ...bench.plan import data_dir_family, peer_sets_dir, peer_specs, plan_for
    from ...results import MIN_PAIRED_REPEATS
    from ..grid import StudyNotApplicableError, decode_params, profile_datasets, repeat_fields

    family = data_dir_family(data_dir)
    jpeg = peer_specs(profile, family)[1]
    try:
        datasets = profile_datasets(profile, data_dir, peers=True, specs=[jpeg])
    except StudyNotApplicableError:
        datasets = []
    built = {m["format"]: (p, m) for p, m in datasets
             if Path(p).parent == peer_sets_dir(data_dir)}
    timeout = {"timeout_s": plan_for(profile).timeout_s}
    # The target's rows: its verdict takes the decision's repeats from the first pass.
    fields = {**repeat_fields(profile, repeats, minimum=MIN_PAIRED_REPEATS), **timeout,
              "epoch_samples": None}
    wanted = [(fmt, access, concurrency, workers) for fmt, access, concurrency, workers
              in dict.fromkeys(paths) if fmt in OUR_FORMATS]
    wanted += [(peer, "shuffle", None, WORKERS) for peer in STREAMING_PEERS]
    cases = []
    for fmt, access, concurrency, workers in wanted:
        peer = fmt in STREAMING_PEERS
        found = built.get(fmt)
        if found is None:
            # No ``source``: nothing to upload, and no target's repeats for a skipped row.
            manifest = {"format": fmt, "encoding": "jpeg", "num_samples": jpeg.num_samples,
                        "spec": jpeg.to_dict()}
            cases.append(Case(
                study="remote", function=MISSING_FUNCTION, format=fmt, encoding="jpeg",
                dataset=str(peer_sets_dir(data_dir) / f"{fmt}-jpeg"), loader="lazy",
                prefetcher=fmt if peer else "thread", access=access, workers=workers,
                batch_size=batch_size_of(manifest),
                params={**decode_params(manifest), "rtt_ms": rtt_ms,
                        **({"environment": "peers"} if peer else
                           {"concurrency": concurrency})},
                **repeat_fields(profile, repeats), **timeout))
            continue
        path, manifest = found
        params = {"source": "s3", "rtt_ms": rtt_ms, "ranks": 1}
        if peer:
            params["environment"] = "peers"
        else:
            params["concurrency"] = concurrency
        case = make_case(path, manifest, access=access, workers=workers, params=params,
                         fields=fields)
        batches = math.ceil(manifest["num_samples"] / (case.batch_size or 256))
        if peer:
            crop = {"crop_resampler": "pillow"} if case.param("transform") else {}
            case = dataclasses.replace(case, function=PEER_FUNCTION, prefetcher=fmt,
                                       params={**dict(case.params), **crop})
        else:
            # More batches than an epoch holds: the steady window never stops the epoch, so
            # every repeat reads the whole cut, as a peer's epoch does.
            # It times whole epochs of the cut, not the whole set's steady window: a key
            # of its own (``results.measurement_key``).
            case = dataclasses.replace(case, function=OURS_FUNCTION,
                                       steady_batches=batches + 1, steady_seconds=0.0,
                                       params={**dict(case.params),
                                               "timed_region": "whole epochs of the cut"})
        cases.append(case)
    return cases


def missing_cut_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """The row of a streaming-peer comparison whose cut set is not built: skipped, why."""
    raise CaseSkipped(f"{case.dataset} is not built: storebench build --peer-sets --formats "
                      f"{case.format} (the peers environment builds the peer formats)")


# -- storebench's side ----------------------------------------------------------------------
def cut_s3_epoch_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """The remote study's epoch case (``cases.remote_epoch_case``) over the cut set in the
    store, its whole epoch read; adds the first pass's rate (``epoch1_samples_per_s``: its
    samples over opening and reading them), its GETs and bytes, and the S3 server's CPU
    seconds per sample."""
    from .cases import REMOTE_ROOT_ENV, remote_epoch_case

    with environ({REMOTE_ROOT_ENV: f"{_store_root()}/{STORE_PREFIX}"}):
        metrics = remote_epoch_case(case, trial)
    if trial.warmup:
        return metrics
    samples = metrics["samples"][0]
    seconds = metrics["open_seconds"][0] + metrics["epoch_seconds"][0]
    metrics[RATE] = (samples / seconds, "samples/s")
    metrics["epoch1_seconds"] = (seconds, "s")
    if "requests" in metrics:
        requests = metrics["requests"][0]
        metrics["epoch1_gets"] = (requests, "count")
        metrics["epoch1_fetched_bytes"] = (requests * metrics["bytes_per_request"][0], "bytes")
    if "server_cpu_s" in metrics and samples:
        metrics["server_cpu_s_per_sample"] = (metrics["server_cpu_s"][0] / samples, "s")
    return metrics


# -- the peers' side (runs in the peers environment) -----------------------------------------
def _peer_unavailable(case: Case) -> str | None:
    from ...environments import needs_text
    from ...formats import unavailable_reason
    from ...loaders.paths import get_loader_path

    path = get_loader_path(case.prefetcher)
    reason = (needs_text(path.libraries, what=f"loader path {path.name!r}")
              or unavailable_reason(case.format) or path.unavailable())
    if reason is None and case.prefetcher == "webdataset" and shutil.which("curl") is None:
        reason = "WebDataset opens http(s) shard URLs with curl, which is not installed"
    return reason


def _path_options(case: Case):
    from ...loaders.paths import PathOptions

    return PathOptions(batch_size=case.batch_size or 256, workers=case.workers or 0,
                       seed=int(case.param("seed", 0)), root=case.dataset, shuffle=True,
                       decode=case.param("decode"), transform=case.param("transform"))


def open_streaming_peer(case: Case, url: str, *, endpoint: str, config, cache_dir: str):
    """The case's peer loader (``case.prefetcher``) over the shards at ``url``
    (``s3://bucket/key``), through ``endpoint``, caching into ``cache_dir``."""
    options = _path_options(case)
    root = Path(case.dataset)
    if case.prefetcher == "mds":
        from ...loaders.peers.mds_loader import MDSBatches

        # streaming makes its own boto3 client from the environment (``environ`` below).
        return MDSBatches(root, options, remote=url, cache_dir=str(Path(cache_dir) / "mds"))
    if case.prefetcher == "litdata":
        from ...loaders.peers.litdata_loader import LitDataBatches

        storage = {"endpoint_url": endpoint, "aws_access_key_id": config.access_key,
                   "aws_secret_access_key": config.secret_key, "region_name": config.region}
        return LitDataBatches(root, options, remote=url, storage_options=storage,
                              cache_dir=cache_dir)
    if case.prefetcher == "webdataset":
        from ...formats import read_manifest
        from ...formats.webdataset_tar import shard_paths
        from ...loaders.peers.wds import WebDatasetBatches

        names = [Path(p).name for p in shard_paths(root, read_manifest(root))]
        return WebDatasetBatches(root, options, cache_dir=cache_dir,
                                 urls=presigned_urls(url, names, endpoint=endpoint,
                                                     config=config))
    raise ValueError(f"case {case.case_id}: {case.prefetcher!r} is not a streaming peer; "
                     f"known: {STREAMING_PEERS}")


def presigned_urls(url: str, names, *, endpoint: str, config) -> list[str]:
    """Presigned ``http(s)://`` GET URLs of ``url``/``name`` for each of ``names``, signed
    for ``endpoint``: what WebDataset's curl opens without S3 credentials."""
    import boto3

    from ...remote.s3 import S3Path

    base = S3Path.parse(url)
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=config.access_key,
                          aws_secret_access_key=config.secret_key, region_name=config.region)
    return [client.generate_presigned_url(
        "get_object", Params={"Bucket": base.bucket, "Key": f"{base.key}/{name}"},
        ExpiresIn=PRESIGNED_S) for name in names]


def peer_environment(endpoint: str, config) -> dict[str, str]:
    """The variables the peers' own S3 clients read: MDS's ``S3_ENDPOINT_URL``, boto3's
    endpoint and keys."""
    return {**config.env(), "AWS_ENDPOINT_URL": endpoint, "S3_ENDPOINT_URL": endpoint}


class _Epoch:
    def __init__(self, started: float) -> None:
        self.started = started
        self.first_batch_at = math.nan
        self.ended_at = math.nan
        self.samples = 0
        self.indices: list[np.ndarray] = []
        self.kept: tuple[np.ndarray, np.ndarray] | None = None

    def read(self, batches, max_batches: int | None = None, *, keep: bool = False) -> _Epoch:
        for count, batch in enumerate(batches, start=1):
            if count == 1:
                self.first_batch_at = time.perf_counter()
                if keep:
                    k = CHECKED_SAMPLES
                    self.kept = (np.array(batch.indices[:k]), np.array(batch.images[:k]))
            self.samples += len(batch.labels)
            self.indices.append(np.asarray(batch.indices, dtype=np.int64))
            if max_batches is not None and count >= max_batches:
                break
        self.ended_at = time.perf_counter()
        return self

    @property
    def seconds(self) -> float:
        return self.ended_at - self.started


def check_epoch(case: Case, epoch: _Epoch, number: int, num_samples: int) -> None:
    """Every sample of the set exactly once, and the first samples' pixels identical to
    storebench's decode (and crop) of the local build."""
    where = f"{case.dataset}: {case.prefetcher} over S3, epoch {number}"
    order = np.concatenate(epoch.indices) if epoch.indices else np.empty(0, np.int64)
    if not np.array_equal(np.sort(order), np.arange(num_samples)):
        raise RuntimeError(f"{where} delivered {len(order)} samples ({len(np.unique(order))} "
                           f"distinct), the set has {num_samples}")
    if epoch.kept is None:
        return
    from ...formats import CorruptSampleError, open_dataset
    from ...loaders import LazyDataset
    from ..shared_cases import sample_transform

    indices, images = epoch.kept
    with open_dataset(case.dataset, verify=False) as reader, LazyDataset(
            reader, decode=case.param("decode"), transform=sample_transform(case)) as reference:
        reference.set_epoch(number - 1)
        for index, image in zip(indices, images):
            want, _ = reference[int(index)]
            if image.shape != want.shape or not np.array_equal(image, want):
                raise CorruptSampleError(case.dataset, int(index),
                                         f"{case.prefetcher} over S3 delivered an image that "
                                         "differs from the build")


def streaming_peer_epochs_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """Epoch 1 of a streaming peer (``case.prefetcher``) from an empty local cache over the
    store at ``rtt_ms`` (param), then ``LATER_EPOCHS`` from its cache; see the module doc.
    The untimed warm-up reads a few batches through the same relay without the delay."""
    from urllib.parse import urlsplit

    from ...formats import read_manifest
    from ...remote.network import DelayProxy, LinkError, LinkUnavailableError
    from ...remote.request_counter import RequestCounter
    from ...remote.s3 import S3Config
    from .cases import _cpu_seconds, _server_pid

    reason = _peer_unavailable(case)
    if reason:
        raise CaseSkipped(reason)
    url = f"{_store_root()}/{store_key(case.dataset)}"
    num_samples = int(read_manifest(case.dataset)["num_samples"])
    config = S3Config.from_env()
    server = urlsplit(config.endpoint_url)
    target = (server.hostname, server.port)
    rtt_ms = 0.0 if trial.warmup else float(case.param("rtt_ms", PEER_RTT_MS))
    with contextlib.ExitStack() as stack:
        try:
            proxy = stack.enter_context(trial.kept(
                ("link", target, rtt_ms), lambda: DelayProxy(target, rtt_ms=rtt_ms)))
        except LinkUnavailableError as err:
            raise CaseSkipped(f"cannot emulate the link: {err}") from err
        except LinkError as err:
            raise RuntimeError(f"the delaying proxy did not start: {err}") from err
        counter = stack.enter_context(trial.kept(
            ("counter", proxy.address), lambda: RequestCounter(proxy.address)))
        endpoint = "http://{}:{}".format(*counter.address)
        cache_dir = stack.enter_context(
            tempfile.TemporaryDirectory(prefix="storebench-peer-cache-"))
        if any(Path(cache_dir).iterdir()):
            raise RuntimeError(f"{cache_dir}: the peer's cache is not empty before epoch 1")
        stack.enter_context(environ(peer_environment(endpoint, config)))
        server_pid = _server_pid()
        traffic0, cpu0 = counter.traffic(), _cpu_seconds(server_pid)
        started = time.perf_counter()
        batches = open_streaming_peer(case, url, endpoint=endpoint, config=config,
                                      cache_dir=cache_dir)
        stack.callback(batches.close)
        if trial.warmup:
            epoch = _Epoch(started).read(batches, trial.batches_wanted(None,
                                                                       samples=num_samples))
            return {"samples": (epoch.samples, "count")}
        first = _Epoch(started).read(batches, keep=True)
        traffic1, cpu1 = counter.traffic(), _cpu_seconds(server_pid)
        later = [_Epoch(time.perf_counter()).read(batches) for _ in range(LATER_EPOCHS)]
        traffic2 = counter.traffic()
        cached = sum(f.stat().st_size for f in Path(cache_dir).rglob("*") if f.is_file())
    for number, epoch in enumerate([first, *later], start=1):
        check_epoch(case, epoch, number, num_samples)
    epoch1, after = traffic1 - traffic0, traffic2 - traffic1
    if epoch1.gets == 0:
        raise RuntimeError(f"{case.dataset}: {case.prefetcher} made no GET through the "
                           "counting relay: it did not read from the store")
    later_seconds = sum(epoch.seconds for epoch in later)
    metrics = {
        "samples": (first.samples, "count"),
        RATE: (first.samples / first.seconds, "samples/s"),
        "epoch1_seconds": (first.seconds, "s"),
        "time_to_first_batch_s": (first.first_batch_at - first.started, "s"),
        "epoch1_gets": (epoch1.gets, "count"),
        "epoch1_requests": (epoch1.requests, "count"),
        "epoch1_fetched_bytes": (epoch1.response_bytes, "bytes"),
        "later_epochs": (len(later), "count"),
        "later_epochs_samples_per_s": (sum(e.samples for e in later) / later_seconds,
                                       "samples/s"),
        "later_epochs_gets": (after.gets, "count"),
        "later_epochs_fetched_bytes": (after.response_bytes, "bytes"),
        "cached_bytes": (cached, "bytes"),
    }
    if cpu0 is not None and cpu1 is not None:
        metrics["server_cpu_s"] = (cpu1 - cpu0, "s")
        metrics["server_cpu_s_per_sample"] = ((cpu1 - cpu0) / first.samples, "s")
    return metrics


# -- rows, target and findings (read by the study; pandas imported here only) ---------------
PEER_LABELS = {"webdataset": "WebDataset (presigned URLs, curl, cache_dir)",
               "mds": "MDS (remote + local cache)", "litdata": "LitData (s3:// + cache_dir)"}
UNMEASURED = (
    "no streaming-peer rows in these results: the peers (WebDataset, MDS, LitData) read "
    "the cut JPEG set from the study's S3 server in the peers environment, once it is "
    "built (storebench build --peer-sets)")


def streaming_peer_rows(df):
    """The remote study's streaming-peer comparison rows, with ``side`` ("peer" or
    "storebench") and ``label`` (the peer and how it reads S3, or our path) columns."""
    from ...results import params_of

    if df.empty or "case_id" not in df:
        return df.assign(side="", label="")
    ids = df["case_id"].astype(str)
    rows = df[(df["study"] == "remote") & (ids.str.startswith("streaming_peer_epochs")
                                           | ids.str.startswith("cut_s3_epoch"))]
    if rows.empty:
        return rows.assign(side="", label="")
    from .study import path_label

    params = params_of(rows)
    peer = rows["prefetcher"].isin(STREAMING_PEERS)
    labels = [PEER_LABELS.get(p, p) if is_peer else
              f"storebench: {path_label(f, a, w, par.get('concurrency'))}"
              for is_peer, p, f, a, w, par in zip(peer, rows["prefetcher"], rows["format"],
                                                  rows["access"], rows["workers"], params)]
    return rows.assign(side=np.where(peer, "peer", "storebench"), label=labels)


TABLE_METRICS = (RATE, "epoch1_seconds", "epoch1_gets", "epoch1_fetched_bytes",
                 "server_cpu_s_per_sample", "later_epochs_samples_per_s",
                 "later_epochs_gets")


def streaming_peer_table(df):
    """Per side and label: the medians of ``TABLE_METRICS`` (NaN where a side has none),
    fastest epoch 1 first."""
    import pandas as pd

    from ...results import medians_table

    rows = streaming_peer_rows(df)
    rows = rows[rows["status"] == "ok"] if "status" in rows else rows
    if rows.empty:
        return pd.DataFrame(columns=["side", "label", *TABLE_METRICS])
    table = medians_table(rows, list(TABLE_METRICS), ["side", "label"])
    return table.sort_values(RATE, ascending=False, ignore_index=True)


def _best(rows, side: str):
    """(label, Stat of ``RATE``) of the side's fastest label by median, or None."""
    from ...results import select, stat

    mine = rows[rows["side"] == side]
    found = [(label, stat(mine[mine["label"] == label], RATE))
             for label in dict.fromkeys(mine["label"])
             if not select(mine[mine["label"] == label], RATE).empty]
    return max(found, key=lambda pair: pair[1].median) if found else None


def streaming_peer_measure(df):
    """The target's measure: storebench's fastest one-rank S3 path over the fastest
    streaming peer, both reading the cut set at ``PEER_RTT_MS``, by their epoch-1 rates
    (two cases: unpaired repeats); None where either side has no rate."""
    from ...results import unpaired_ratio_interval
    from ...text import format_value
    from ..base import TargetMeasure

    rows = streaming_peer_rows(df)
    ours, peer = _best(rows, "storebench"), _best(rows, "peer")
    if ours is None or peer is None:
        return None
    ratio, low, high = unpaired_ratio_interval(ours[1], peer[1])
    return TargetMeasure(
        value=ratio, low=low, high=high, repeats=min(ours[1].count, peer[1].count),
        sources=ours[1].sources, against=peer[1].sources,
        limiting=(f"{ours[0]}: {format_value(ours[1].median, 'samples/s')} against "
                  f"{peer[0]}: {format_value(peer[1].median, 'samples/s')}, epoch 1 at "
                  f"{PEER_RTT_MS} ms from an empty cache"))


def streaming_peer_findings(df, *, threshold: float) -> list[str]:
    """Sentences on the streaming-peer rows: why any could not run, each label's epoch 1
    at ``PEER_RTT_MS`` (rate, GETs and bytes, the server's CPU per sample) and its later
    epochs, and the target against ``threshold``."""
    from ...results import MIN_PAIRED_REPEATS
    from ...text import format_ratio, format_value

    rows = streaming_peer_rows(df)
    out = []
    skipped = rows[rows["status"] != "ok"] if "status" in rows else rows.iloc[:0]
    for label in dict.fromkeys(skipped["label"]):
        row = skipped[skipped["label"] == label].iloc[0]
        lines = [line for line in str(row["error"]).splitlines() if line.strip()] or [""]
        if row["status"] == "skipped":
            out.append(f"{label} over S3 could not run here: {lines[0]}.")
        else:
            # A failed case's error ends with what the library raised; the file it names
            # lay in the case's temporary cache, so only its name is kept.
            raised = re.sub(r"(?<![\w.])/(?:[^\s/:]+/)+", "", lines[-1].strip())
            out.append(f"{label} over S3 {row['status']} here: {raised}")
    for _, row in streaming_peer_table(df).iterrows():
        if not np.isfinite(row[RATE]):
            continue
        text = (f"{row['label']} at {PEER_RTT_MS} ms, epoch 1 from an empty cache: "
                f"{format_value(row[RATE], 'samples/s')}")
        if np.isfinite(row["epoch1_gets"]):
            text += (f", {row['epoch1_gets']:.0f} GETs and "
                     f"{format_value(row['epoch1_fetched_bytes'], 'bytes')}")
        if np.isfinite(row["server_cpu_s_per_sample"]):
            text += (f", {format_value(row['server_cpu_s_per_sample'] * 1e3, 'ms')} of S3 "
                     "server CPU per sample")
        if np.isfinite(row["later_epochs_samples_per_s"]):
            text += (f"; later epochs from its cache "
                     f"{format_value(row['later_epochs_samples_per_s'], 'samples/s')}"
                     f" ({row['later_epochs_gets']:.0f} GETs)")
        out.append(text + ".")
    measured = streaming_peer_measure(df)
    name = f"S3 at {PEER_RTT_MS} ms vs the best streaming peer"
    if measured is None:
        out.append(f"Target {name} (\u2265 {format_ratio(threshold)}): not measured: "
                   f"{UNMEASURED}.")
        return out
    if measured.repeats < MIN_PAIRED_REPEATS or not np.isfinite(measured.low):
        verdict = f"undecided (fewer than {MIN_PAIRED_REPEATS} repeats a side)"
    else:
        verdict = "met" if measured.low >= threshold else "not met"
    out.append(f"Target {name} (\u2265 {format_ratio(threshold)} by the interval's lower "
               f"end): {format_ratio(measured.value)} (95% interval "
               f"{format_ratio(measured.low)}\u2013{format_ratio(measured.high)}): {verdict}; "
               f"{measured.limiting}.")
    return out
