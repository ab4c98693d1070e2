"""Datasets in a real S3 server (SeaweedFS): the same bytes, the same checks, clear refusals."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path

import numpy as np
import psutil
import pytest

from storebench import open_dataset
from storebench.formats import (
    CorruptSampleError,
    DatasetError,
    ManifestError,
    remote_formats,
    tfrecord,
)
from storebench.loaders import (
    BatchSampler,
    BlockShuffleSampler,
    LazyDataset,
    ProcessPrefetcher,
    ShuffleSampler,
    ThreadPrefetcher,
)
from storebench.remote.dataset import download_dataset, upload_dataset
from storebench.remote.s3 import (
    ObjectStore,
    ObjectStoreError,
    ReadAbandonedError,
    S3Config,
    S3Path,
)
from storebench.remote.seaweed import (
    SeaweedServer,
    SeaweedUnavailableError,
    remove_stale_sockets,
)

REMOTE_CASES = [(f, e) for f in sorted(remote_formats()) for e in ("raw", "jpeg", "png")]


def same_samples(a, b) -> None:
    (images_a, labels_a), (images_b, labels_b) = a, b
    assert labels_a.tolist() == labels_b.tolist()
    if isinstance(images_a, np.ndarray):
        assert np.array_equal(images_a, images_b)
    else:
        assert [bytes(x) for x in images_a] == [bytes(y) for y in images_b]


@pytest.mark.parametrize("format_name,encoding", REMOTE_CASES)
def test_remote_reader_returns_the_local_bytes(uploaded, s3, format_name, encoding):
    local_path, url = uploaded(format_name, encoding)
    with open_dataset(local_path) as local, open_dataset(url, s3=s3) as remote:
        n = len(local)
        order = np.random.default_rng(3).permutation(n)
        assert str(remote.root) == url
        assert len(remote) == len(local)
        assert remote.blocks().tolist() == local.blocks().tolist()
        same_samples(remote.read_many(order), local.read_many(order))
        middle = np.arange(10, n - 10)
        same_samples(remote.read_many(middle), local.read_many(middle))
        image, label = remote[-1]
        expected_image, expected_label = local[n - 1]
        assert label == expected_label
        assert np.array_equal(np.asarray(image), np.asarray(expected_image)) if encoding == "raw" \
            else bytes(image) == bytes(expected_image)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_process_workers_read_the_bucket(uploaded, s3, start_method):
    local_path, url = uploaded("tfrecord", "jpeg")
    with LazyDataset(open_dataset(local_path), decode="simplejpeg") as local:
        batches = BatchSampler(ShuffleSampler(len(local), seed=5), 64)
        expected = [local.__getitems__(list(b)) for b in batches]
    remote = LazyDataset(open_dataset(url, s3=s3), decode="simplejpeg")
    got = []
    with ProcessPrefetcher(remote, batches, workers=2, start_method=start_method) as pf:
        for batch in pf:
            got.append((batch.images.copy(), batch.labels.copy()))
        pids = pf.pids
    assert len(got) == len(expected) == 4
    for (images, labels), want in zip(got, expected):
        want_images, want_labels = want.images, want.labels
        assert labels.tolist() == want_labels.tolist()
        assert np.array_equal(images, want_images)
    assert not [p for p in pids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("format_name", ["parquet", "hdf5", "tfrecord"])
def test_prefetch_threads_share_a_remote_reader(uploaded, s3, format_name):
    local_path, url = uploaded(format_name, "jpeg")
    with LazyDataset(open_dataset(local_path), decode="simplejpeg") as local:
        batches = BatchSampler(BlockShuffleSampler.from_reader(local.reader, seed=2), 32)
        expected = [local.__getitems__(list(b)) for b in batches]
    with LazyDataset(open_dataset(url, s3=s3), decode="simplejpeg") as remote, \
            ThreadPrefetcher(remote, batches, workers=3) as loader:
        got = [(batch.images.copy(), batch.labels.copy()) for batch in loader]
    assert len(got) == len(expected) == 8
    for (images, labels), want in zip(got, expected):
        assert labels.tolist() == want.labels.tolist()
        assert np.array_equal(images, want.images)


def damaged_copy(local_path: Path, tmp_path: Path, rel: str, offset: int) -> Path:
    copy = tmp_path / local_path.name
    shutil.copytree(local_path, copy)
    with open(copy / rel, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    return copy


def test_a_damaged_record_is_named_by_object_and_sample(uploaded, s3, tmp_path):
    local_path, _ = uploaded("tfrecord", "jpeg")
    shard = "data-00001-of-00004.tfrecord"
    with open_dataset(local_path) as local:
        first = int(local.blocks()[1])
    # 200 bytes into record 5 of the shard: inside sample first + 5's image bytes
    offset = int(tfrecord.read_index(local_path / shard.replace(".tfrecord", ".index"))[5, 0]) + 200
    copy = damaged_copy(local_path, tmp_path, shard, offset)
    url = "s3://ci-data/damaged/tfrecord-jpeg"
    upload_dataset(copy, url, s3=s3)
    for verify in (True, False):  # TFRecord's own CRC holds even without verify
        with open_dataset(url, s3=s3, verify=verify) as remote:
            remote.read_many(np.arange(first, first + 5))  # its neighbours stay readable
            with pytest.raises(CorruptSampleError) as caught:
                remote.read_many([first + 4, first + 5])
            assert str(caught.value.path) == f"{url}/{shard}"
            assert caught.value.index == first + 5


def test_a_replaced_sample_object_is_refused(uploaded, s3, tmp_path):
    local_path, _ = uploaded("rawfiles", "png")
    with open_dataset(local_path) as local:
        local.read_many([7])
        rel = local._locate(7).relative_to(local_path).as_posix()
    copy = damaged_copy(local_path, tmp_path, rel, 40)
    url = "s3://ci-data/damaged/rawfiles-png"
    upload_dataset(copy, url, s3=s3)
    with open_dataset(url, s3=s3, verify=False) as remote, \
            pytest.raises(CorruptSampleError, match="fingerprint differs") as caught:
        remote.read_many(np.arange(0, 16))
    assert str(caught.value.path) == f"{url}/{rel}" and caught.value.index == 7


def test_a_truncated_or_missing_object_is_refused_at_open(uploaded, s3):
    local_path, url = uploaded("parquet", "jpeg")
    store = ObjectStore("s3://ci-data/broken/parquet-jpeg", s3)
    upload_dataset(local_path, store.root, s3=s3)
    store.write("data.parquet", (local_path / "data.parquet").read_bytes()[:-10])
    with pytest.raises(ManifestError, match="bytes in the bucket, the manifest says"):
        open_dataset(str(store.root), s3=s3)
    store.delete(["data.parquet"])
    with pytest.raises(ManifestError, match="data.parquet: listed in the manifest but missing"):
        open_dataset(str(store.root), s3=s3)
    store.delete(["manifest.json"])  # what an interrupted upload leaves
    with pytest.raises(ManifestError, match="not an uploaded storebench dataset"):
        open_dataset(str(store.root), s3=s3)


@pytest.mark.parametrize("format_name,encoding", [("lmdb", "jpeg"), ("memmap", "raw")])
def test_local_only_formats_refuse_and_download_stages_them(
    uploaded, s3, tmp_path, format_name, encoding
):
    local_path, url = uploaded(format_name, encoding)
    with pytest.raises(DatasetError, match=f"no remote reader for {format_name}: stage it with "
                       f"`storebench download {url} DIR`"):
        open_dataset(url, s3=s3)
    staged = tmp_path / "staged"
    done = download_dataset(url, staged, s3=s3)
    assert done.target == str(staged) and not list(tmp_path.glob(".staged.tmp-*"))
    with open_dataset(staged) as copy, open_dataset(local_path) as local:
        everything = np.arange(len(local))
        same_samples(copy.read_many(everything), local.read_many(everything))
    with pytest.raises(FileExistsError):
        download_dataset(url, staged, s3=s3)


def test_cli_upload_and_download(uploaded, s3, tmp_path):
    local_path, _ = uploaded("hdf5", "jpeg")
    env = {**__import__("os").environ, **s3.env()}
    cli = [sys.executable, "-m", "storebench"]
    url = "s3://ci-data/cli/hdf5-jpeg"
    up = subprocess.run([*cli, "upload", str(local_path), url, "--quiet"], env=env,
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    assert f"-> {url}: " in up.stdout
    down = subprocess.run([*cli, "download", url, str(tmp_path / "back"), "--quiet"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert (tmp_path / "back" / "data.h5").read_bytes() == (local_path / "data.h5").read_bytes()
    missing = subprocess.run([*cli, "download", "s3://ci-data/cli/nothing", str(tmp_path / "x")],
                             env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2
    assert "s3://ci-data/cli/nothing/manifest.json: missing or unreadable" in missing.stderr


def test_wrong_credentials_are_a_clear_error(seaweed, uploaded):
    _, url = uploaded("tfrecord", "raw")
    config = seaweed[1]
    wrong = S3Config(endpoint_url=config.endpoint_url, access_key=config.access_key,
                     secret_key="not-the-secret")
    with pytest.raises(ManifestError, match=f"{url}/manifest.json: missing or unreadable"):
        open_dataset(url, s3=wrong)
    with pytest.raises(ObjectStoreError, match="ACCESS_DENIED"):
        ObjectStore(url, wrong).read("manifest.json")


def test_config_from_the_usual_environment_variables():
    config = S3Config.from_env({
        "AWS_ENDPOINT_URL": "http://10.0.0.1:9000", "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret", "AWS_DEFAULT_REGION": "eu-west-1",
    })
    assert (config.endpoint_url, config.access_key, config.secret_key, config.region) == (
        "http://10.0.0.1:9000", "id", "secret", "eu-west-1")
    assert S3Config.from_env(config.env()) == config
    s3_specific = S3Config.from_env({"AWS_ENDPOINT_URL_S3": "https://s3.example:443",
                                     "AWS_ENDPOINT_URL": "http://other:1"})
    assert s3_specific.endpoint_url == "https://s3.example:443"
    with pytest.raises(ValueError, match="endpoint_url must be http"):
        S3Config(endpoint_url="10.0.0.1:9000")


def test_s3_paths():
    path = S3Path.parse("s3://bucket/some/prefix")
    assert (path.bucket, path.key, str(path)) == ("bucket", "some/prefix", "s3://bucket/some/prefix")
    assert str(path / "data.h5") == "s3://bucket/some/prefix/data.h5"
    assert (path / "a" / "b.jpg").relative_to(path).as_posix() == "a/b.jpg"
    for bad in ("bucket/prefix", "s3:///prefix", "http://bucket/x", "s3://b1/x?versionId=1",
                "s3://ab/x", "s3://Bucket/x"):
        with pytest.raises(ValueError):
            S3Path.parse(bad)


def test_sockets_a_killed_server_left_are_removed_live_ones_kept(tmp_path):
    stale = tmp_path / "seaweedfs-s3-1.sock"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(stale))  # bound, never listening, then closed: what a SIGKILL leaves
    live = tmp_path / "seaweedfs-s3-2.sock"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(live))
        listening.listen()
        assert remove_stale_sockets(tmp_path) == [stale]
        assert live.exists() and not stale.exists()


def port_open(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


@pytest.mark.timeout(120)
def test_server_stops_on_ctrl_c_leaving_nothing():
    server = SeaweedServer()
    with pytest.raises(KeyboardInterrupt), server as config:
        pid, data_dir, ports = server.process.pid, server.data_dir, list(server.ports)
        assert port_open(config.endpoint_url)
        raise KeyboardInterrupt
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not port_open(config.endpoint_url)
    assert not data_dir.exists()
    assert not [p for port in ports for p in Path("/tmp").glob(f"seaweedfs-*-{port}.sock")]


@pytest.mark.timeout(120)
def test_the_volume_server_is_accepted_at_its_first_heartbeat():
    """A lone master leads at once: no heartbeat or client is turned away while it waits
    for Raft peers (which left the volume server to try again 5 s later)."""
    server = SeaweedServer()
    with server:
        log = server.log_path.read_text(errors="replace")
        assert "Start Seaweed volume server" in log
        assert "Not current leader" not in log


@pytest.fixture
def nearly_full_disk(tmp_path, monkeypatch):
    """The temporary directory on a real ext4 file system (a sparse loop image) of 300 GiB
    with 2 GiB free: under the 1% weed keeps free by default, above its absolute floor."""
    if shutil.which("mkfs.ext4") is None or shutil.which("mount") is None:
        pytest.skip("needs mkfs.ext4 and mount")
    image, disk = tmp_path / "disk.img", tmp_path / "disk"
    disk.mkdir()
    with open(image, "wb") as f:
        f.truncate(300 << 30)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E",
                    "lazy_itable_init=1,lazy_journal_init=1", str(image)], check=True)
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot loop-mount a file system here: {mounted.stderr.strip()}")
    try:
        filler = disk / "filler"
        with open(filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, shutil.disk_usage(disk).free - (2 << 30))
        monkeypatch.setattr(tempfile, "tempdir", str(disk))
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.timeout(180)
def test_a_disk_under_one_percent_free_still_serves_a_bucket(nearly_full_disk):
    usage = shutil.disk_usage(nearly_full_disk)
    assert usage.free < usage.total / 100
    payload = np.random.default_rng(3).bytes(10 << 20)
    server = SeaweedServer()
    with server as config:
        ports = list(server.ports)
        store = ObjectStore("s3://bench/x", config)
        store.ensure_bucket()
        store.write("blob", payload)
        assert store.read("blob") == payload
    # weed's logs went into its data directory, removed with it; its sockets are gone too
    assert sorted(p.name for p in nearly_full_disk.iterdir()) == ["filler", "lost+found"]
    assert not [p for port in ports for p in Path("/tmp").glob(f"seaweedfs-*-{port}.sock")]


def test_too_little_free_disk_is_refused_before_the_server_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    too_much = shutil.disk_usage(tmp_path).free // 2**20 + 1024
    with pytest.raises(SeaweedUnavailableError,
                       match=rf"cannot start weed server: {tmp_path} has \d+ MiB free, less "
                             rf"than the {too_much} MiB the server keeps free"):
        SeaweedServer(min_free_mib=too_much).start()
    assert list(tmp_path.iterdir()) == []


def test_reads_not_yet_sent_fail_at_once_while_abandoning(uploaded, s3):
    local_path, url = uploaded("tfrecord", "jpeg")
    store = ObjectStore(url, s3)
    name = sorted(n for n in store.sizes() if n.endswith(".tfrecord"))[0]
    stopping = f"{url}/{name}: read abandoned: its loader is stopping"
    stored = (local_path / name).read_bytes()
    try:
        with store.abandoning([threading.get_ident()]):
            with pytest.raises(ReadAbandonedError, match=re.escape(stopping)):
                store.read_range(name, 0, 16)
            with pytest.raises(ReadAbandonedError, match=re.escape(stopping)):
                store.read_ranges([(name, 16 * i, 16) for i in range(8)])
            with pytest.raises(ReadAbandonedError, match=re.escape(stopping)):
                store.read_many([name, name])
            assert store.traffic()[0] == 0  # nothing was sent
            # Another thread (another loader on the same store) reads on.
            with ThreadPoolExecutor(1) as other:
                assert other.submit(store.read_range, name, 0, 16).result() == stored[:16]
            assert store.traffic()[0] == 1
        # Outside the block this thread's reads are sent again.
        assert store.read_ranges([(name, 0, 8), (name, 8, 8)]) == [stored[:8], stored[8:16]]
        assert store.traffic()[0] == 3
    finally:
        store.close()


@pytest.mark.timeout(120)
def test_a_thread_loader_stopped_mid_pass_sends_none_of_its_queued_reads(uploaded, s3):
    """The batch a ThreadPrefetcher is reading when it stops is dropped: its GETs not sent
    yet are abandoned, not sent a round trip at a time; later reads read every byte."""
    from dataclasses import replace as with_fields
    from urllib.parse import urlsplit

    from storebench.remote.network import DelayProxy

    local_path, url = uploaded("tfrecord", "jpeg")
    with LazyDataset(open_dataset(local_path)) as local:
        batches = BatchSampler(ShuffleSampler(len(local), seed=11), 32)
        expected = [local.__getitems__(list(b)) for b in batches]
    endpoint = urlsplit(s3.endpoint_url)
    # Two requests in flight and 100 ms round trips: a shuffled batch of 32 records takes
    # about 16 round trips, so the second batch has sent only a few when the first arrives.
    with DelayProxy((endpoint.hostname, endpoint.port), rtt_ms=100) as proxy:
        host, port = proxy.address
        slow = with_fields(s3, endpoint_url=f"http://{host}:{port}", concurrency=2)
        with LazyDataset(open_dataset(url, s3=slow)) as remote:
            store = remote.reader.store
            loader = ThreadPrefetcher(remote, batches, workers=1, depth=2)
            with loader:
                passing = iter(loader)
                first = next(passing)  # the second batch is being read now
                got = ([bytes(x) for x in first.images], first.labels.tolist())
                sent_when_stopped = store.traffic()[0]
                del passing  # leaving the pass early stops its thread
            sent_after = store.traffic()[0]
            # At most what was in flight then (2) finished; without abandoning, the rest of
            # the second batch (about 28 GETs) would have been sent first.
            assert sent_after - sent_when_stopped <= 2 * slow.concurrency
            assert got == ([bytes(x) for x in expected[0].images],
                           expected[0].labels.tolist())
            # Abandoning ended with the loader: the dropped batch reads whole again.
            second = remote.__getitems__(list(next(islice(iter(batches), 1, None))))
            assert [bytes(x) for x in second.images] == [bytes(x) for x in expected[1].images]
            assert second.labels.tolist() == expected[1].labels.tolist()
