"""The remote study's parts that need no S3 server: the capacity model's arithmetic, the
study's services reaching its cases, a missing server becoming skipped rows, and the rate
and checks of an epoch's rank results (start-up apart from the steady rate)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

from storebench.bench.case import Case
from storebench.bench.runner import run_case, run_cases
from storebench.bench.schema import read_results
from storebench.remote import seaweed
from storebench.remote.capacity import Pipeline, predicted_rate, scale_out, workers_to_keep
from storebench.studies.remote import study as remote
from storebench.studies.remote.cases import REMOTE_ROOT_ENV, REMOTE_UNAVAILABLE_ENV, _metrics

HERE = Path(__file__).resolve().parent.parent / "bench"
PIPELINE = Pipeline(rate0=1000.0, workers=2, batch_size=100, samples_per_request=1.0,
                    concurrency=50, sample_bytes=1000.0)


def test_the_model_adds_one_round_trip_per_round_of_requests():
    # 0.2 s of work a batch per worker at 0 ms; 100 requests, 25 in flight per worker:
    # 4 rounds of 10 ms.
    assert predicted_rate(PIPELINE, 0.0) == 1000.0
    assert predicted_rate(PIPELINE, 0.010) == pytest.approx(200 / 0.24)
    assert predicted_rate(PIPELINE, 0.010, concurrency=200) == pytest.approx(200 / 0.21)
    # More workers share the cores (0.4 s a batch each) but keep more batches waiting.
    assert predicted_rate(PIPELINE, 0.010, workers=4) == pytest.approx(400 / 0.44)
    # A 1 MB/s link adds 0.1 s a batch of 100 kB.
    assert predicted_rate(PIPELINE, 0.0, bandwidth_Bps=1e6) == pytest.approx(200 / 0.3)


def test_the_model_sizes_workers_and_nodes():
    assert workers_to_keep(PIPELINE, 0.010, 0.8) == 2  # 1 worker: 100 / 0.14 = 714 < 800
    assert workers_to_keep(PIPELINE, 0.0, 0.8) == 1
    assert workers_to_keep(PIPELINE, 10.0, 0.99, most=8) == 9  # out of reach: most + 1
    assert scale_out(PIPELINE, 0.010, 10) == pytest.approx(10 * 200 / 0.24)
    assert scale_out(PIPELINE, 0.010, 10, store_bandwidth_Bps=1e6) == pytest.approx(1000.0)


@contextlib.contextmanager
def counted_services(entered: list, value: str):
    entered.append(value)
    yield {"STOREBENCH_TEST_VALUE": value}


def test_a_study_s_services_reach_its_cases_and_start_only_when_needed(tmp_path):
    cases = [Case(study="svc", function="bench_case_functions:environment_value_case",
                  repeats=1, warmup=False, params={"variable": "STOREBENCH_TEST_VALUE", "n": n})
             for n in range(2)]
    results = tmp_path / "svc.csv"
    entered = []
    run_cases(cases, results, python_path=[HERE], progress=False,
              services=lambda todo: counted_services(entered, str(len(todo) * 21)))
    rows = read_results(results)
    values = rows[(rows["metric"] == "samples") & (rows["repeat"] == 0)]["value"]
    assert values.tolist() == [42.0, 42.0] and entered == ["42"]
    run_cases(cases, results, python_path=[HERE], progress=False,
              services=lambda todo: counted_services(entered, "never"))
    assert entered == ["42"]  # every case done: nothing started


def test_without_a_server_the_s3_cases_are_skipped_rows_with_the_reason(monkeypatch, tmp_path):
    def missing():
        raise seaweed.SeaweedUnavailableError("SeaweedFS's weed binary is not installed")

    monkeypatch.setattr(seaweed, "weed_binary", missing)
    case = Case(study="remote", function="storebench.studies.remote.cases:remote_epoch_case",
                dataset=str(tmp_path / "tfrecord-jpeg"), access="shuffle", repeats=1,
                warmup=False, params={"source": "s3", "rtt_ms": 20, "ranks": 1})
    with remote.object_store([case]) as env:
        assert env == {REMOTE_UNAVAILABLE_ENV: "no S3 server: SeaweedFS's weed binary is "
                                               "not installed"}
        outcome = run_case(case, env=env)
    assert outcome.status == "skipped" and outcome.error == env[REMOTE_UNAVAILABLE_ENV]
    no_store = run_case(case, env={REMOTE_ROOT_ENV: ""})
    assert no_store.status == "skipped" and "no object store" in no_store.error


def test_no_s3_case_no_server():
    local = Case(study="remote", function="storebench.studies.remote.cases:remote_epoch_case",
                 dataset="x", params={"source": "local"})
    with remote.object_store([local]) as env:
        assert env == {}


def test_the_ci_study_started_and_stopped_its_own_s3_server(ci_study):
    """The ci study (``make study``'s path) ran the remote cases against a SeaweedFS it
    started, and left no server behind: any ``weed`` still running is this test session's
    own (the remote tests' fixture), never an orphan of the study."""
    import os

    import psutil

    from storebench.bench.schema import read_results

    rows = read_results(ci_study[0] / "remote.csv")
    s3_rows = rows[rows["params"].str.contains('"source": "s3"') & (rows["status"] == "ok")]
    assert not s3_rows.empty
    leftovers = [p for p in psutil.process_iter(["name", "cmdline", "ppid"])
                 if "storebench-seaweed-" in " ".join(p.info["cmdline"] or ())
                 and p.info["ppid"] != os.getpid()]
    assert leftovers == []


def test_every_timed_s3_repeat_of_the_ci_study_records_its_links_measured_rtt(ci_study):
    from storebench.bench.schema import read_results

    rows = read_results(ci_study[0] / "remote.csv")
    # storebench's reader through the proxy; the streaming peers' own clients are counted
    # on the wire instead (tests/test_remote_peers.py).
    rows = rows[~rows["case_id"].str.startswith("streaming_peer_epochs")]
    s3 = rows[rows["params"].str.contains('"source": "s3"') & (rows["status"] == "ok")
              & (rows["repeat"] >= 0)]
    per_repeat = s3.groupby(["case_id", "repeat"])["metric"].apply(set)
    assert not per_repeat.empty and all("measured_rtt_s" in m for m in per_repeat)
    # The S3 server shares the client's cores: every repeat says how many it kept busy.
    assert all({"server_cores", "proxy_cores"} <= m for m in per_repeat)
    rtt = s3[s3["metric"] == "measured_rtt_s"]
    configured = rtt["params"].map(lambda p: json.loads(p)["rtt_ms"] / 1e3)
    assert (rtt["value"] >= configured * 0.95).all()
    # A probe's median also holds the server's own time, on cores the study shares: the
    # upper bound catches a doubled round trip, not a busy server.
    assert (rtt["value"] < 2 * configured + 0.25).all()


def remote_epoch(source, rtt, value, *, ranks=1, extra=None):
    """One remote-study case's rows over the ranked path (samples/s per repeat)."""
    from result_rows import case_rows

    fmt, access, concurrency, workers = remote.RANKED_PATH
    params = {"source": source, "ranks": ranks,
              **({"rtt_ms": rtt, "concurrency": concurrency} if source == "s3" else {})}
    return case_rows("remote", f"remote_epoch:{source}/{rtt}/{ranks}",
                     {"samples_per_s": [value] * 5, **(extra or {})}, format=fmt,
                     encoding="jpeg", loader="lazy", prefetcher="thread", workers=workers,
                     batch_size=64, access=access, params=params)


def test_s3_at_0_ms_against_local_disk_names_the_cores_its_server_kept_busy():
    from result_rows import frame

    df = frame(remote_epoch("local", 0, 700.0),
               remote_epoch("s3", 0, 350.0, extra={"server_cores": [0.6] * 5,
                                                   "proxy_cores": [0.2] * 5}))
    assert remote.local_gap_findings(df, cores=2) == [
        "S3 at 0 ms vs local disk (tfrecord, shuffle, 2 threads, one rank): 350 samples/s "
        "against 700 samples/s (2.00\u00d7 slower); meanwhile the S3 server kept 0.60 cores "
        "busy and the proxy kept 0.20 cores busy of this machine's 2 cores, which the "
        "client's decoding threads share."]
    unrecorded = remote.local_gap_findings(frame(remote_epoch("local", 0, 700.0),
                                                 remote_epoch("s3", 0, 350.0)))
    assert "did not record the S3 server's CPU time" in unrecorded[0]


def test_the_streaming_peer_target_is_listed_with_why_it_is_not_measured():
    from result_rows import frame

    from storebench.report import targets
    from storebench.results import Results

    results = Results(frame(remote_epoch("s3", 0, 350.0), remote_epoch("s3", 20, 300.0)))
    table = targets.all_targets_table(results).set_index("key")
    peer = table.loc[remote.PEER.key]
    assert not peer["measured"] and peer["limiting"] == remote.PEER_UNMEASURED
    assert (f"| {remote.PEER.name} |  | not measured: {remote.PEER_UNMEASURED} | "
            "\u2265 1.20\u00d7 "
            "| not measured |") in targets.targets_markdown(results)
    assert any(remote.PEER_UNMEASURED in s for s in remote.remote_findings(results.df))


def test_on_the_imagenet_like_set_the_grid_reads_at_the_targets_rtts_in_small_batches(
        tmp_path, monkeypatch):
    import dataclasses

    from storebench.bench import plan
    from storebench.bench.plan import family_data_dir
    from storebench.study import build_profile

    root = family_data_dir(tmp_path / "ci", "imagenet")
    build_profile("ci", root, formats=["tfrecord"], family="imagenet", knob_variants=False,
                  progress=False)
    # The compact (ci) grid keeps its own paths; the small profile's on this set:
    full = dataclasses.replace(plan.plan_for("ci"), compact=False)
    monkeypatch.setattr(remote, "plan_for", lambda profile: full)
    cases = remote.remote_grid(profile="ci", data_dir=root)
    s3 = [c for c in cases if c.param("source") == "s3"]
    # The targets' RTTs, and the far point's (``test_remote_sweep``).
    assert {c.param("rtt_ms") for c in s3} == {*remote.TRAINING_RTTS_MS, remote.FAR_RTT_MS}
    assert {c.batch_size for c in cases} == {min(remote.TRAINING_BATCH, 64 // 8)}
    assert {c.param("transform") for c in cases} == {"train"}
    capped = [c for c in s3 if c.param("bandwidth_mbit")]
    assert [c.param("bandwidth_mbit") for c in capped] == [remote.TRAINING_CAPPED_MBIT]
    sweep = {(*remote.SWEEP_PATH[:2], n, remote.SWEEP_PATH[2]) for n in remote.SWEEP_IN_FLIGHT}
    assert {(c.format, c.access, c.param("concurrency"), c.workers) for c in s3} == {
        p for p in (*remote.TRAINING_PATHS, *sweep, remote.FAR_PATH) if p[0] == "tfrecord"}


# -- start-up apart from the steady rate (``cases._metrics``), on fabricated rank results ---
def rank_result(indices, *, expected, stopped=False, open_seconds=0.5,
                first_batch_seconds=0.5, seconds=3.0, steady_samples=640,
                steady_seconds=1.0, steady_batches=10, num_samples=4096):
    """What ``read_epoch_share`` returns for one rank, made up: ``indices`` delivered."""
    indices = np.asarray(indices, dtype=np.int64)
    return {"samples": len(indices), "delivered_bytes": 1000 * len(indices),
            "seconds": seconds, "open_seconds": open_seconds,
            "first_batch_seconds": first_batch_seconds, "steady_samples": steady_samples,
            "steady_bytes": 1000 * steady_samples, "steady_seconds": steady_seconds,
            "steady_batches": steady_batches, "read_ahead_batches": 4, "stopped": stopped,
            "requests": 10, "fetched_bytes": 20_000, "indices": indices,
            "expected": expected, "num_samples": num_samples}


REMOTE_CASE = Case(study="remote", function="storebench.studies.remote.cases:remote_epoch_case",
                   dataset="tfrecord-jpeg", batch_size=64, access="shuffle")


def test_a_slow_start_stays_out_of_the_remote_rate():
    # 2 s to open and 8 s more to the first batch (round trips, workers starting), then
    # 1,280 samples in a 2 s steady window: the rate is the window's, start-up its own row.
    share = rank_result(np.arange(2048), expected=4096, open_seconds=2.0,
                        first_batch_seconds=8.0, seconds=11.0, steady_samples=1280,
                        steady_seconds=2.0, steady_batches=20)
    metrics = _metrics(REMOTE_CASE, [share], 1, 32)
    assert metrics["samples_per_s"] == (640.0, "samples/s")
    assert metrics["per_rank_samples_per_s"][0] == 640.0
    assert metrics["read_MBps"][0] == pytest.approx(1280 * 1000 / 2.0 / 1e6)
    assert metrics["time_to_first_batch_s"] == (10.0, "s")
    assert metrics["open_seconds"] == (2.0, "s")
    assert metrics["epoch_seconds"] == (11.0, "s")
    assert metrics["steady_batches"] == (20, "count")
    assert metrics["steady_seconds"] == (2.0, "s")
    # The whole pass's traffic: 2,048 samples over 10 requests.
    assert metrics["samples_per_request"][0] == pytest.approx(204.8)


def test_ranks_steady_rate_is_their_window_samples_over_the_slowest_window():
    fast = rank_result(np.arange(0, 1024), expected=2048, first_batch_seconds=9.0,
                       seconds=12.0, steady_samples=640, steady_seconds=1.0)
    slow = rank_result(np.arange(2048, 3072), expected=2048, first_batch_seconds=3.0,
                       seconds=12.0, steady_samples=640, steady_seconds=1.25)
    metrics = _metrics(REMOTE_CASE, [fast, slow], 2, 16)
    assert metrics["samples_per_s"][0] == pytest.approx(1280 / 1.25)
    assert metrics["per_rank_samples_per_s"][0] == pytest.approx((640 + 512) / 2)
    assert metrics["time_to_first_batch_s"][0] == pytest.approx(9.5)
    assert metrics["steady_seconds"] == (1.25, "s")


def test_an_epoch_its_window_stopped_may_be_short_an_unstopped_one_may_not():
    # Capped at 32 batches of 64 (2,048 samples): stopped by its window at 1,600.
    stopped = rank_result(np.arange(1600), expected=4096, stopped=True)
    assert _metrics(REMOTE_CASE, [stopped], 1, 32)["samples"] == (1600, "count")
    with pytest.raises(RuntimeError, match="delivered 1600 samples of 32 batches"):
        _metrics(REMOTE_CASE, [rank_result(np.arange(1600), expected=4096)], 1, 32)
    # A whole epoch (no cap) stopped inside: fine; an unstopped one short of its share: not.
    whole = rank_result(np.arange(1600), expected=4096, stopped=True)
    assert _metrics(REMOTE_CASE, [whole], 1, None)["samples"] == (1600, "count")
    with pytest.raises(RuntimeError, match="delivered 1600 samples of its share"):
        _metrics(REMOTE_CASE, [rank_result(np.arange(1600), expected=4096)], 1, None)


def test_a_stopped_epoch_delivers_no_sample_twice_across_ranks():
    first = rank_result(np.arange(0, 640), expected=2048, stopped=True)
    overlapping = rank_result(np.arange(600, 1240), expected=2048, stopped=True)
    with pytest.raises(RuntimeError, match="a sample twice"):
        _metrics(REMOTE_CASE, [first, overlapping], 2, None)
    with pytest.raises(RuntimeError, match="a sample twice"):
        _metrics(REMOTE_CASE, [rank_result(np.r_[0:600, 0:40], expected=4096, stopped=True)],
                 1, 32)
    # The one sample a padded epoch of an odd set repeats on its last rank is allowed.
    odd = 4095
    head = rank_result(np.arange(0, 64), expected=2048, stopped=True, num_samples=odd)
    tail = rank_result(np.r_[2048:odd, 0], expected=2048, num_samples=odd)
    assert _metrics(REMOTE_CASE, [head, tail], 2, None)["samples"] == (2112, "count")


def test_an_unstopped_whole_epoch_still_covers_the_dataset():
    halves = [rank_result(np.arange(0, 2048), expected=2048),
              rank_result(np.arange(2048, 4096), expected=2048)]
    assert _metrics(REMOTE_CASE, halves, 2, None)["samples"] == (4096, "count")
    twice = [rank_result(np.arange(0, 2048), expected=2048),
             rank_result(np.arange(0, 2048), expected=2048)]
    with pytest.raises(RuntimeError, match="do not cover the dataset"):
        _metrics(REMOTE_CASE, twice, 2, None)
