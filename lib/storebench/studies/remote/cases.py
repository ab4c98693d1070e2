"""The remote study's case functions: epochs read from the object store through an emulated
link, by 1 or more data-parallel ranks. The grid, figures and findings live in
``storebench.studies.remote``.

The study starts the object store (``studies.remote.object_store``) and passes it to every
case through the environment: ``AWS_*`` for the endpoint and keys, ``REMOTE_ROOT_ENV`` for
the prefix the datasets were uploaded under, or ``REMOTE_UNAVAILABLE_ENV`` with the reason
it could not start (every S3 case is then a ``skipped`` row with that reason).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import numpy as np

from ...bench.case import Case, CaseSkipped, Trial
from ..shared_cases import steady_minimum, warmup_samples
from ..steady import SteadyMinimum

REMOTE_ROOT_ENV = "STOREBENCH_REMOTE_ROOT"
REMOTE_UNAVAILABLE_ENV = "STOREBENCH_REMOTE_UNAVAILABLE"
# The S3 server's pid: a case reads its CPU time around the epoch, as it does the proxy's,
# since both share the client's cores.
REMOTE_SERVER_PID_ENV = "STOREBENCH_REMOTE_SERVER_PID"
MB = 1e6
RANK_TIMEOUT_S = 240.0
# Round trips timed per repeat for ``measured_rtt_s``: the proxy delays every one by the
# same configured time, so five give its median, where twenty took 0.46 s of each 20 ms
# repeat (and of its warm-up, which now measures none).
RTT_PROBES = 5


def store_root() -> str:
    """The prefix the study uploaded its datasets under, or ``CaseSkipped`` with why there
    is none."""
    reason = os.environ.get(REMOTE_UNAVAILABLE_ENV)
    if reason:
        raise CaseSkipped(reason)
    root = os.environ.get(REMOTE_ROOT_ENV)
    if not root:
        raise CaseSkipped(f"no object store: {REMOTE_ROOT_ENV} is not set (storebench study "
                          "starts SeaweedFS and uploads the datasets)")
    return root.rstrip("/")


def remote_url(case: Case) -> str:
    """Where the case's dataset was uploaded, or ``CaseSkipped`` with why there is none."""
    return f"{store_root()}/{Path(case.dataset).name}"


def remote_epoch_case(case: Case, trial: Trial) -> dict[str, tuple[float, str]]:
    """One epoch of ``case.dataset`` split across ``ranks`` (param) data-parallel ranks on
    ``torch.distributed`` (one rank: the case's own process, no group), each with its own
    rank-sharded sampler (``case.access``) and its
    own loader (``case.prefetcher``, ``case.workers``), read from the object store through
    a link of ``rtt_ms`` (param; ``bandwidth_mbit`` optional), or from local disk when
    param ``source`` is ``local``.

    Start-up apart from steady state (``storebench.studies.steady``): each rank times its
    own steady window (the batches after its loader's read-ahead) and, in a timed repeat,
    stops once that holds the case's ``steady_batches`` and ``steady_seconds`` (or at the
    epoch's cap, ``Trial.batches_wanted``). ``samples_per_s`` and ``read_MBps`` are the
    ranks' window samples and bytes over the slowest rank's window, since synchronous
    data-parallel steps wait for the slowest rank; ``per_rank_samples_per_s`` is the median
    rank's window rate. ``time_to_first_batch_s`` runs from opening the dataset (manifest,
    listing, fingerprints, indexes: several round trips) to the first batch, and
    ``epoch_seconds`` from the barrier to the slowest rank's last batch: neither is inside a
    rate. Rows record the measured RTT (the configured one and the bandwidth are params),
    and the GET requests and bytes the whole pass cost. The untimed warm-up reads its few
    batches through the same proxy without its delay.
    """
    from dataclasses import replace
    from urllib.parse import urlsplit

    from ...formats import read_manifest
    from ...remote.network import DelayProxy, LinkError, LinkUnavailableError, measure_rtt
    from ...remote.s3 import DEFAULT_CONCURRENCY, S3Config

    ranks = int(case.param("ranks", 1))
    local = case.param("source", "s3") == "local"
    # Before the manifest: a run without an object store skips with its reason.
    url = str(case.dataset) if local else remote_url(case)
    max_batches = trial.batches_wanted(
        None, samples=int(read_manifest(case.dataset)["num_samples"]), ranks=ranks)
    first = warmup_samples(case, trial, max_batches)  # each rank's
    minimum = steady_minimum(case, trial)  # None in the warm-up: it reads its few batches
    if local:
        per_rank = _run_ranks(case, ranks, url, None, max_batches, first, minimum)
        return _metrics(case, per_rank, ranks, max_batches)
    config = S3Config.from_env(concurrency=int(case.param("concurrency", DEFAULT_CONCURRENCY)))
    endpoint = urlsplit(config.endpoint_url)
    # The warm-up is there to import, allocate and start threads: the link's delay would
    # only add round trips to it (about half a second at 20 ms).
    rtt_ms = 0.0 if trial.warmup else float(case.param("rtt_ms", 0.0))
    bandwidth = case.param("bandwidth_mbit")
    target = (endpoint.hostname, endpoint.port)
    # One proxy per link for all the case's trials (starting one took 0.1-0.2 s a repeat):
    # it relays each repeat's own new connections, and holds nothing of one repeat's reads.
    with contextlib.ExitStack() as stack:
        try:
            proxy = stack.enter_context(trial.kept(
                ("link", target, rtt_ms, bandwidth),
                lambda: DelayProxy(target, rtt_ms=rtt_ms, bandwidth_mbit=bandwidth)))
        except LinkUnavailableError as err:
            raise CaseSkipped(f"cannot emulate the link: {err}") from err
        except LinkError as err:
            raise RuntimeError(f"the delaying proxy did not start: {err}") from err
        host, port = proxy.address
        measured = None if trial.warmup else measure_rtt(proxy.address, samples=RTT_PROBES)
        through = replace(config, endpoint_url=f"http://{host}:{port}")
        helpers = {"server": _server_pid(), "proxy": proxy.pid}
        before = {name: _cpu_seconds(pid) for name, pid in helpers.items()}
        began = time.monotonic()
        per_rank = _run_ranks(case, ranks, url, through, max_batches, first, minimum)
        wall = time.monotonic() - began
        after = {name: _cpu_seconds(pid) for name, pid in helpers.items()}
    # The configured RTT and bandwidth are the case's params (in every row already).
    metrics = _metrics(case, per_rank, ranks, max_batches)
    for name in helpers:
        if before[name] is not None and after[name] is not None and wall > 0:
            metrics[f"{name}_cpu_s"] = (after[name] - before[name], "s")
            metrics[f"{name}_cores"] = ((after[name] - before[name]) / wall, "ratio")
    if measured is not None:
        metrics["measured_rtt_s"] = (measured / 1e3, "s")
    return metrics


def _server_pid() -> int | None:
    text = os.environ.get(REMOTE_SERVER_PID_ENV, "")
    return int(text) if text.isdigit() else None


def _cpu_seconds(pid: int | None) -> float | None:
    """User and system CPU seconds process ``pid`` has used, None where it cannot be read
    (no pid, gone, or not ours to read)."""
    import psutil

    if pid is None:
        return None
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


def _run_ranks(case: Case, ranks: int, path: str, config, max_batches,
               first: int | None, minimum: SteadyMinimum | None) -> list[dict]:
    job = {"case": case.to_dict(), "path": path, "s3": config, "max_batches": max_batches,
           "first": first, "minimum": minimum}
    if ranks == 1:
        # One rank needs no process group: it reads here, and the case does not import
        # torch (a second per case).
        return [read_epoch_share(0, 1, job)]
    import torch.distributed  # noqa: F401 - imported once here, inherited by forked ranks

    from ...ranks import run_ranks

    # fork: ranks start in milliseconds; this worker has started no threads (the proxy is
    # a separate process and the dataset is opened in the ranks only).
    return run_ranks(read_epoch_share, ranks, args=(job,), start_method="fork",
                     timeout_s=RANK_TIMEOUT_S)


def read_epoch_share(rank: int, world_size: int, job: dict) -> dict:
    """One rank's share of an epoch (runs in a rank process, or in the case's own for a
    single rank; see ``remote_epoch_case``), its steady window timed apart from its start,
    the epoch stopped once that window holds ``job["minimum"]`` (None: never)."""
    from ...opening import open_dataset
    from ..shared_cases import (
        drain,
        epoch_ended,
        make_dataset,
        make_sampler,
        open_batches,
        release,
        steady_span,
    )
    from ..steady import SteadyWindow, read_ahead_batches

    case = Case.from_dict(job["case"])
    options = {"s3": job["s3"]} if job["s3"] is not None else {}
    started = time.perf_counter()
    reader = open_dataset(job["path"], verify=False, **options)
    sampler = make_sampler(case, reader, rank=rank, world_size=world_size, first=job["first"])
    dataset = close = None
    try:
        dataset = make_dataset(case, reader)
        opened = time.perf_counter()
        if world_size > 1:
            import torch.distributed as dist

            dist.barrier()
        began = time.perf_counter()
        loader, close = open_batches(case, dataset, sampler)
        skip = read_ahead_batches(
            loader, prefetcher=case.prefetcher, batch_size=case.batch_size or 256,
            shuffle_buffer=min(int(case.param("shuffle_buffer", 4096)), len(reader)),
            shuffle=case.access != "sequential")
        window = SteadyWindow(skip=skip)
        tally = drain(loader, started=began, max_batches=job["max_batches"], window=window,
                      minimum=job["minimum"])
        tally.ended_at = epoch_ended(tally, job["max_batches"])
        # The whole pass's GETs, start-up's included: per request, what a read costs.
        store = getattr(reader, "store", None)
        requests, fetched = store.traffic() if store is not None else (0, 0)
    finally:
        release(reader, dataset=dataset, close=close)
    steady_samples, steady_bytes, steady_seconds = steady_span(tally, window, ready=began)
    return {
        "samples": tally.samples, "delivered_bytes": tally.delivered,
        "seconds": tally.ended_at - began, "open_seconds": opened - started,
        "first_batch_seconds": tally.first_batch_seconds,
        "steady_samples": steady_samples, "steady_bytes": steady_bytes,
        "steady_seconds": steady_seconds, "steady_batches": window.batches,
        "read_ahead_batches": skip, "stopped": tally.stopped,
        "requests": requests, "fetched_bytes": fetched, "indices": tally.indices(),
        "expected": len(sampler), "num_samples": len(reader),
    }


def check_shares(case: Case, per_rank: list[dict], max_batches: int | None) -> None:
    """Each rank delivered its share (``max_batches`` None) or its capped batches' samples,
    except a rank its steady window stopped (``stopped``), which delivered fewer; a whole
    epoch no rank stopped covers the dataset, any other delivered no sample twice."""
    for rank, r in enumerate(per_rank):
        wanted = (r["expected"] if max_batches is None
                  else min(max_batches * (case.batch_size or 256), r["expected"]))
        if r["samples"] > wanted or (r["samples"] < wanted and not r["stopped"]):
            of = "its share" if max_batches is None else f"{max_batches} batches"
            raise RuntimeError(f"{case.dataset}: rank {rank} delivered {r['samples']} samples"
                               f" of {of}, expected {wanted}")
    everything = np.concatenate([r["indices"] for r in per_rank])
    if max_batches is None and not any(r["stopped"] for r in per_rank):
        if len(everything) and not np.array_equal(np.unique(everything),
                                                  np.arange(per_rank[0]["num_samples"])):
            raise RuntimeError(f"{case.dataset}: the ranks' epochs do not cover the dataset")
        return
    # A share padded as DistributedSampler pads repeats that many of the order's first
    # samples on the last rank: the only samples two ranks may both deliver.
    padding = max(0, sum(r["expected"] for r in per_rank) - per_rank[0]["num_samples"])
    if len(everything) - len(np.unique(everything)) > padding:
        raise RuntimeError(f"{case.dataset}: the ranks delivered a sample twice")


def _metrics(case: Case, per_rank: list[dict], ranks: int, max_batches) -> dict:
    check_shares(case, per_rank, max_batches)
    samples = sum(r["samples"] for r in per_rank)
    # Synchronous data-parallel steps wait for the slowest rank: the group's steady rate is
    # every rank's window samples over the slowest window.
    slowest_window = max(r["steady_seconds"] for r in per_rank)
    requests = sum(r["requests"] for r in per_rank)
    fetched = sum(r["fetched_bytes"] for r in per_rank)
    per_rank_rates = [r["steady_samples"] / r["steady_seconds"] for r in per_rank]
    # Requests are counted where storebench makes them (TFRecord, raw files); pyarrow and
    # libhdf5 make their own (Parquet, HDF5) and local disk none: no traffic rows then. They
    # count the whole pass (start-up too), over all the samples it delivered.
    traffic = {
        "requests": (requests, "count"),
        "samples_per_request": (samples / requests, "ratio"),
        "bytes_per_request": (fetched / requests, "bytes"),
    } if requests else {}
    return traffic | {
        "samples": (samples, "count"),
        # The set's size: the pass's counts scaled to one epoch of it (``cost_rows``).
        "dataset_samples": (per_rank[0]["num_samples"], "count"),
        "samples_per_s": (sum(r["steady_samples"] for r in per_rank) / slowest_window,
                          "samples/s"),
        "per_rank_samples_per_s": (float(np.median(per_rank_rates)), "samples/s"),
        "read_MBps": (sum(r["steady_bytes"] for r in per_rank) / slowest_window / MB, "MB/s"),
        "epoch_seconds": (max(r["seconds"] for r in per_rank), "s"),
        "time_to_first_batch_s": (
            max(r["open_seconds"] + r["first_batch_seconds"] for r in per_rank), "s"),
        "open_seconds": (max(r["open_seconds"] for r in per_rank), "s"),
        # The least any rank's window held (0: one fell back, as ``run_metrics`` says).
        "steady_batches": (min(r["steady_batches"] for r in per_rank), "count"),
        "steady_seconds": (slowest_window, "s"),
        "read_ahead_batches": (max(r["read_ahead_batches"] for r in per_rank), "count"),
        "ranks": (ranks, "count"),
    }
