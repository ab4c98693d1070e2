"""The remote study's streaming-peer rows: the grid lays them out on the cut set, each peer
reads its own shards from a real SeaweedFS server through the delaying proxy and a counting
relay (its epoch exact, its cache empty before epoch 1), and the request counter counts
what a client sent."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from storebench.bench.case import CASE_REPEAT, Trial
from storebench.bench.plan import peer_sets_dir
from storebench.remote.request_counter import RequestCounter, RequestHeads
from storebench.studies.remote import peer_cases
from storebench.studies.remote.peer_cases import (
    MISSING_FUNCTION,
    OURS_FUNCTION,
    PEER_FUNCTION,
    STREAMING_PEERS,
    store_key,
)


def test_request_heads_count_methods_and_skip_bodies():
    heads = RequestHeads()
    put = b"PUT /b/k HTTP/1.1\r\nContent-Length: 9\r\n\r\nGET x\r\n\r\n"
    assert heads.feed(put[:20]) == []
    # The body looks like a request head: skipped by its length, not counted.
    assert heads.feed(put[20:] + b"GET /b/k HTTP/1.1\r\nHost: h\r\n\r\nHEAD /b") == ["PUT", "GET"]
    assert heads.feed(b"/k HTTP/1.1\r\n\r\n") == ["HEAD"]
    assert not heads.broken
    # A chunked body has no length to skip: the connection's later requests go uncounted,
    # and the counter says so.
    assert heads.feed(b"PUT /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n") == [
        "PUT"]
    assert heads.broken and heads.feed(b"GET /d HTTP/1.1\r\n\r\n") == []


def _echo_http_server():
    """A loopback server answering every request head with a 5-byte body; (address,
    stop)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                data = b""
                while data.count(b"\r\n\r\n") < 2:
                    data += conn.recv(4096)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello" * 2)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def close():
        stop.set()
        thread.join(5)
        listener.close()

    return listener.getsockname()[:2], close


@pytest.mark.timeout(60)
def test_request_counter_counts_requests_and_response_bytes_and_leaves_no_process():
    address, close = _echo_http_server()
    try:
        with RequestCounter(address) as counter:
            pid = counter.pid
            with socket.create_connection(counter.address) as client:
                client.sendall(b"GET /a HTTP/1.1\r\n\r\nHEAD /b HTTP/1.1\r\n\r\n")
                answer = b""
                while len(answer) < 2 * 43:
                    answer += client.recv(4096)
            traffic = counter.traffic()
    finally:
        close()
    assert (traffic.gets, traffic.heads, traffic.other_requests) == (1, 1, 0)
    assert traffic.response_bytes == len(answer) == 86
    import psutil

    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_store_keys_put_the_cut_sets_apart_from_the_whole_sets(tmp_path):
    assert store_key(tmp_path / "tfrecord-jpeg") == "tfrecord-jpeg"
    assert store_key(peer_sets_dir(tmp_path) / "tfrecord-jpeg") == "peers/tfrecord-jpeg"
    assert peer_cases.data_dir_name([peer_sets_dir(tmp_path) / "mds-jpeg",
                                     tmp_path / "tfrecord-jpeg"]) == tmp_path.name


def test_the_ci_grid_holds_each_streaming_peer_and_our_paths_over_the_cut(ci_data_root):
    from storebench.studies.remote.study import COMPACT_PATHS, TARGET_RTT_MS, remote_grid

    cases = remote_grid(profile="ci", data_dir=ci_data_root)
    mine = [c for c in cases if c.function in (PEER_FUNCTION, OURS_FUNCTION, MISSING_FUNCTION)]
    peers = {c.format: c for c in mine if c.format in STREAMING_PEERS}
    assert sorted(peers) == sorted(STREAMING_PEERS)
    for fmt, case in peers.items():
        assert case.param("environment") == "peers" and case.param("rtt_ms") == TARGET_RTT_MS
        assert Path(case.dataset) == peer_sets_dir(ci_data_root) / f"{fmt}-jpeg"
        built = (Path(case.dataset) / "manifest.json").exists()
        assert case.function == (PEER_FUNCTION if built else MISSING_FUNCTION)
    ours = [c for c in mine if c.function == OURS_FUNCTION]
    assert sorted((c.format, c.access, c.param("concurrency"), c.workers) for c in ours) == \
        sorted(COMPACT_PATHS)
    for case in ours:
        assert Path(case.dataset).parent == peer_sets_dir(ci_data_root)
        assert case.param("source") == "s3" and case.epoch_samples is None
        # Every repeat reads the whole cut: the steady window cannot fill first.
        assert case.steady_batches * case.batch_size > 256
        assert case.min_repeats is None or case.min_repeats >= 5 or case.repeats >= 3
    assert len({c.case_id for c in cases}) == len(cases)


def test_findings_say_the_target_is_unmeasured_without_rows():
    import pandas as pd

    from storebench.bench.schema import COLUMNS
    from storebench.text import format_ratio

    sentences = peer_cases.streaming_peer_findings(pd.DataFrame(columns=COLUMNS),
                                                   threshold=1.2)
    assert sentences == [f"Target S3 at 20 ms vs the best streaming peer (\u2265 "
                         f"{format_ratio(1.2)}): not measured: {peer_cases.UNMEASURED}."]


def _rows(case_id: str, values, **fields):
    from result_rows import case_rows

    return case_rows("remote", case_id, {"epoch1_samples_per_s": values,
                                         "epoch1_gets": [3] * len(values)},
                     encoding="jpeg", workers=2, **fields)


def test_the_target_divides_our_fastest_path_by_the_fastest_peer_unpaired():
    from result_rows import frame

    from storebench.results import unpaired_ratio_interval
    from storebench.studies.remote.study import PEER, TARGET_PEER

    ours = [300.0, 310, 320, 330, 340]
    best_peer = [100.0, 110, 120, 130, 140]
    df = frame(
        _rows("cut_s3_epoch:tfrecord", ours, prefetcher="thread", format="tfrecord",
              access="shuffle", params={"source": "s3", "rtt_ms": 20, "concurrency": 64}),
        _rows("cut_s3_epoch:rawfiles", [50.0] * 5, prefetcher="thread", format="rawfiles",
              access="shuffle", params={"source": "s3", "rtt_ms": 20, "concurrency": 64}),
        _rows("streaming_peer_epochs:mds", best_peer, prefetcher="mds", format="mds",
              access="shuffle", params={"source": "s3", "rtt_ms": 20}),
        _rows("streaming_peer_epochs:webdataset", [90.0] * 5, prefetcher="webdataset",
              format="webdataset", access="shuffle", params={"source": "s3", "rtt_ms": 20}),
        _rows("remote_epoch:tfrecord", [9999.0] * 5, prefetcher="thread", format="tfrecord",
              access="shuffle", params={"source": "s3", "rtt_ms": 20}),
    )

    class Results:  # what a TargetSpec's measure reads
        pass

    results = Results()
    results.df = df
    measured = PEER.measure(results)
    from storebench.results import Stat

    expected = unpaired_ratio_interval(
        Stat.of(df[(df["case_id"] == "cut_s3_epoch:tfrecord")
                   & (df["metric"] == "epoch1_samples_per_s")]),
        Stat.of(df[(df["case_id"] == "streaming_peer_epochs:mds")
                   & (df["metric"] == "epoch1_samples_per_s")]))
    assert (measured.value, measured.low, measured.high) == expected
    assert measured.value == 320 / 120 and measured.repeats == 5
    assert {case for _, case, _ in measured.sources} == {"cut_s3_epoch:tfrecord"}
    assert {case for _, case, _ in measured.against} == {"streaming_peer_epochs:mds"}
    sentence = peer_cases.streaming_peer_findings(df, threshold=TARGET_PEER)[-1]
    assert sentence.startswith("Target S3 at 20 ms vs the best streaming peer")
    assert sentence.count("met") == 1 and "not met" not in sentence


# -- each peer over the real server (peers environment) --------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(S3Config, store root, data dir, server pid): a SeaweedFS server holding the ci cut
    sets of the streaming peers under ``<root>/peers/``, as ``object_store`` uploads them."""
    from data_gen import PROFILES
    from storebench.bench.plan import peer_specs
    from storebench.formats import build_dataset, unavailable_reason
    from storebench.remote.dataset import upload_dataset
    from storebench.remote.seaweed import SeaweedServer

    # The peers' libraries live in the peers environment (`make test` runs these there).
    missing = [reason for reason in map(unavailable_reason, STREAMING_PEERS) if reason]
    if missing:
        pytest.skip(missing[0])
    data = tmp_path_factory.mktemp("cut") / "data"
    jpeg = peer_specs("ci")[1]
    assert jpeg.num_samples == PROFILES["ci"].spec_for("jpeg").num_samples
    built = [build_dataset(jpeg, fmt, peer_sets_dir(data), workers=1).path
             for fmt in STREAMING_PEERS]
    server = SeaweedServer()
    config = server.start()
    try:
        root = f"s3://storebench/{peer_cases.data_dir_name(built)}"
        for path in built:
            upload_dataset(path, f"{root}/{store_key(path)}", s3=config)
        yield config, root, data, server.process.pid
    finally:
        server.stop()


def _peer_case(data: Path, fmt: str):
    from storebench.studies.remote.study import _case, _case_batch_size

    cases = peer_cases.streaming_peer_cases(profile="ci", data_dir=data, repeats=1,
                                            paths=(), make_case=_case,
                                            batch_size_of=_case_batch_size)
    return next(c for c in cases if c.format == fmt)


@pytest.mark.peers
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", STREAMING_PEERS)
def test_a_streaming_peer_reads_its_shards_over_s3_from_an_empty_cache(
        store, fmt, monkeypatch, tmp_path):
    import tempfile

    import psutil

    from storebench.bench.worker import _check_metrics
    from storebench.studies.remote.cases import (
        REMOTE_ROOT_ENV,
        REMOTE_SERVER_PID_ENV,
        REMOTE_UNAVAILABLE_ENV,
    )

    config, root, data, server_pid = store
    for name, value in config.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(REMOTE_ROOT_ENV, root)
    monkeypatch.setenv(REMOTE_SERVER_PID_ENV, str(server_pid))
    monkeypatch.delenv(REMOTE_UNAVAILABLE_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the peer's cache dir lands here
    case = _peer_case(data, fmt)
    assert case.function == PEER_FUNCTION
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    warm = peer_cases.streaming_peer_epochs_case(case, Trial(case, CASE_REPEAT))
    assert 0 < warm["samples"][0] <= 256
    metrics = peer_cases.streaming_peer_epochs_case(case, Trial(case, 0))
    _check_metrics(case, metrics, {})
    # Epoch 1 delivered the whole set (checked index by index, and its first images
    # against storebench's decode of the local build) from the store: GETs counted on the
    # wire; the later epoch read what epoch 1 cached, with no GET.
    assert metrics["samples"] == (256, "count")
    assert metrics["epoch1_gets"][0] > 0
    assert metrics["epoch1_fetched_bytes"][0] > 0.9 * metrics["cached_bytes"][0] > 0
    assert metrics["later_epochs_gets"] == (0, "count")
    assert metrics["epoch1_samples_per_s"][0] > 0 and metrics["later_epochs"] == (1, "count")
    # Read from the server process (clock ticks: a small epoch may cost it none).
    assert metrics["server_cpu_s_per_sample"][0] >= 0
    # The cache went with the case, and so did the proxy, the relay and the workers.
    assert not any(tmp_path.iterdir())
    # (multiprocessing's resource tracker is the interpreter's: it stays until exit.)
    left = {p.pid for p in psutil.Process().children(recursive=True)} - children
    assert not [psutil.Process(p).cmdline() for p in left if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                and "resource_tracker" not in " ".join(psutil.Process(p).cmdline())]


def test_a_peer_that_failed_over_s3_is_named_with_what_its_library_raised():
    from result_rows import frame

    failed = _rows("streaming_peer_epochs:mds", [1.0], prefetcher="mds", format="mds",
                   access="shuffle", status="failed",
                   params={"source": "s3", "rtt_ms": 20})
    sentences = peer_cases.streaming_peer_findings(frame(failed), threshold=1.2)
    label = peer_cases.streaming_peer_rows(frame(failed))["label"].iloc[0]
    assert sentences[0] == f"{label} over S3 failed here: RuntimeError: boom"
    # The file it names lay in the case's temporary cache: its name only.
    rows = frame(failed).assign(error="Traceback ...\nDatasetError: /tmp/case-1/cache/"
                                      "mds/shard.00008.mds: sample 661: cannot read it")
    assert peer_cases.streaming_peer_findings(rows, threshold=1.2)[0] == (
        f"{label} over S3 failed here: DatasetError: shard.00008.mds: sample 661: cannot "
        "read it")
