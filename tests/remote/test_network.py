"""The delaying proxy and the bandwidth-capped link, on real sockets.

Bytes arrive unchanged and in order, EOF and close propagate, a refused upstream resets only
its own connection, the added round trip is at least what was asked for (a lower bound is
the proxy's behaviour; no test bounds time from above), the ``tbf`` cap holds, and nothing
(process, port, namespace) outlives the proxy. Tests that need a network namespace skip
with the reason where one cannot be made.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from storebench.remote import network
from storebench.remote.network import (
    DelayProxy,
    LinkError,
    LinkSpec,
    LinkUnavailableError,
    link_unavailable_reason,
    measure_rtt,
    remove_stale_links,
)

pytestmark = pytest.mark.timeout(60)
LIB = Path(network.__file__).resolve().parents[2]
MiB = 1 << 20
PING = {"request": b"ping", "reply_end": b"ping"}


# --------------------------------------------------------------------------- servers


class Server:
    """A TCP server on 127.0.0.1 that runs ``handler(conn)`` in a thread per connection."""

    def __init__(self, handler, sock: socket.socket | None = None) -> None:
        self.handler = handler
        self.sock = sock or socket.create_server(("127.0.0.1", 0))
        self.address = self.sock.getsockname()[:2]
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            self.handler(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def echo(conn: socket.socket) -> None:
    """Send back what comes, then half-close once the client has."""
    while data := conn.recv(256 * 1024):
        conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)


@pytest.fixture(scope="module")
def echo_server():
    server = Server(echo)
    yield server.address
    server.close()


def payload(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def exchange(address, data: bytes, *, piece: int = 64 * 1024, pause_s: float = 0.0) -> bytes:
    """Send ``data`` (in pieces, optionally spaced) while reading, half-close, and return
    everything read up to EOF."""
    received = bytearray()
    with socket.create_connection(address, timeout=20) as sock:
        def send() -> None:
            for start in range(0, len(data), piece):
                sock.sendall(data[start:start + piece])
                if pause_s:
                    time.sleep(pause_s)
            sock.shutdown(socket.SHUT_WR)
        sender = threading.Thread(target=send)
        sender.start()
        while chunk := sock.recv(1 << 20):
            received += chunk
        sender.join()
    return bytes(received)


def proxy_gone(proxy_pid: int, address, netns: str | None = None) -> None:
    """Assert that nothing of a proxy is left: its process, its port, its namespace."""
    assert wait_gone(proxy_pid), f"proxy process {proxy_pid} still running"
    assert proxy_pid not in {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(OSError), socket.create_connection(address, timeout=2):
        pass
    if netns is not None:
        assert netns not in netns_list()
        tag = netns.rsplit("-", 1)[1]
        assert f"sbv{tag}r" not in subprocess.run(
            ["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def netns_list() -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def netns_unavailable() -> str | None:
    """Why no bandwidth-capped link can be made here, or None: tried once."""
    reason = link_unavailable_reason()
    if reason is None:
        try:
            with DelayProxy(("127.0.0.1", 9), bandwidth_mbit=1000):
                pass
        except LinkUnavailableError as error:
            reason = error.reason
    return reason


@pytest.fixture
def needs_netns(netns_unavailable) -> None:
    if netns_unavailable:
        pytest.skip(netns_unavailable)


# --------------------------------------------------------------------------- bytes


@pytest.mark.parametrize("rtt_ms", [0.0, 20.0])
def test_bytes_identical_both_ways_on_concurrent_connections(echo_server, rtt_ms):
    data = [payload(3 * MiB + i * 4099, seed=i) for i in range(6)]
    results: dict[int, bytes] = {}
    with DelayProxy(echo_server, rtt_ms=rtt_ms) as proxy:
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(
            i, exchange(proxy.address, data[i]))) for i in range(len(data))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert [results.get(i) == data[i] for i in range(len(data))] == [True] * len(data)


def test_order_kept_for_many_small_spaced_writes(echo_server):
    # Pieces of odd sizes, spaced out: each is a separate chunk in the proxy's queue.
    data = payload(400 * 1237, seed=7)
    with DelayProxy(echo_server, rtt_ms=10) as proxy:
        assert exchange(proxy.address, data, piece=1237, pause_s=0.0005) == data


def test_eof_propagates_both_ways():
    saw_eof = threading.Event()

    def greet_then_wait_for_eof(conn: socket.socket) -> None:
        conn.sendall(b"hello")
        conn.shutdown(socket.SHUT_WR)  # server's EOF first
        while conn.recv(65536):
            pass
        saw_eof.set()

    server = Server(greet_then_wait_for_eof)
    try:
        with DelayProxy(server.address, rtt_ms=10) as proxy, \
                socket.create_connection(proxy.address, timeout=10) as sock:
            received = b""
            while chunk := sock.recv(100):
                received += chunk
            assert received == b"hello"  # and then EOF, while our side is still open
            sock.sendall(b"bye")
            sock.shutdown(socket.SHUT_WR)
            assert saw_eof.wait(10), "the client's EOF did not reach the server"
    finally:
        server.close()


def test_refused_upstream_resets_only_that_connection():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening: connecting to it is refused
    try:
        with DelayProxy(sock.getsockname(), rtt_ms=5) as proxy:
            with socket.create_connection(proxy.address, timeout=10) as client, \
                    contextlib.suppress(ConnectionResetError):  # a reset, or EOF
                assert client.recv(100) == b""
            sock.listen()
            server = Server(echo, sock=sock)
            assert exchange(proxy.address, b"still here") == b"still here"
            server.close()
    finally:
        sock.close()


# --------------------------------------------------------------------------- round trips


def test_round_trip_is_at_least_the_link_rtt(echo_server):
    with DelayProxy(echo_server, rtt_ms=0) as near:
        rtt_near = measure_rtt(near.address, samples=5, **PING)
    with DelayProxy(echo_server, rtt_ms=40) as far:
        rtt_far = measure_rtt(far.address, samples=5, **PING)
        # A new connection pays a round trip for its handshake before its first exchange.
        with socket.create_connection(far.address, timeout=10) as sock:
            start = time.perf_counter()
            sock.sendall(b"x")
            assert sock.recv(1) == b"x"
            first_ms = (time.perf_counter() - start) * 1e3
    assert rtt_far >= 38.0
    assert rtt_near < rtt_far
    assert first_ms >= 78.0


def test_measure_rtt_default_probe_speaks_http():
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as S3 servers do

        def do_HEAD(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with DelayProxy(server.server_address, rtt_ms=20) as proxy:
            assert measure_rtt(proxy.address, samples=3) >= 19.0
    finally:
        server.shutdown()
        server.server_close()


def test_link_spec_fields_and_validation():
    assert LinkSpec(rtt_ms=20).fields() == {"rtt_ms": 20.0, "bandwidth_mbit": None}
    assert LinkSpec(2, 80).fields() == {"rtt_ms": 2.0, "bandwidth_mbit": 80.0}
    assert json.loads(json.dumps(LinkSpec(0).fields())) == {"rtt_ms": 0.0,
                                                           "bandwidth_mbit": None}
    with pytest.raises(ValueError, match="rtt_ms"):
        LinkSpec(rtt_ms=-1)
    with pytest.raises(ValueError, match="bandwidth_mbit"):
        LinkSpec(rtt_ms=1, bandwidth_mbit=0)
    assert DelayProxy(("127.0.0.1", 1), rtt_ms=2, bandwidth_mbit=80).link == LinkSpec(2, 80)


# --------------------------------------------------------------------------- bandwidth


def test_bandwidth_cap_shapes_both_directions_to_a_server_on_loopback(needs_netns):
    data = payload(8_000_000, seed=3)

    def send_all_then_count(conn: socket.socket) -> None:
        conn.sendall(data)
        received = 0
        while chunk := conn.recv(1 << 20):
            received += len(chunk)
        conn.sendall(str(received).encode())

    server = Server(send_all_then_count)  # listens on 127.0.0.1 only
    try:
        proxy = DelayProxy(server.address, rtt_ms=0, bandwidth_mbit=80).__enter__()
    except BaseException:
        server.close()
        raise
    try:
        assert proxy.address[0] != "127.0.0.1"  # the namespace's side of the veth
        with socket.create_connection(proxy.address, timeout=20) as sock:
            start = time.perf_counter()
            received = bytearray()
            while len(received) < len(data):
                chunk = sock.recv(1 << 20)
                assert chunk, "EOF before the whole payload"
                received += chunk
            down_s = time.perf_counter() - start
            start = time.perf_counter()
            sock.sendall(bytes(4_000_000))
            sock.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := sock.recv(100):
                reply += chunk
            up_s = time.perf_counter() - start
    finally:
        proxy.__exit__(None, None, None)
        server.close()
    assert bytes(received) == data
    assert reply == b"4000000"
    assert down_s >= 0.7  # 8 MB at 80 Mbit/s: 0.8 s
    assert up_s >= 0.35  # 4 MB: 0.4 s


def test_unavailable_link_is_a_clear_error(monkeypatch, echo_server):
    monkeypatch.setattr(network.shutil, "which", lambda name: None)
    monkeypatch.setattr(network, "_capabilities", lambda: (1 << 64) - 1)  # every one
    with pytest.raises(LinkUnavailableError, match="iproute2") as caught:
        DelayProxy(echo_server, rtt_ms=0, bandwidth_mbit=80).__enter__()
    assert "ip" in caught.value.reason
    monkeypatch.setattr(network, "_capabilities", lambda: 0)
    proxy = DelayProxy(echo_server, rtt_ms=0, bandwidth_mbit=80)
    with pytest.raises(LinkUnavailableError, match="CAP_NET_ADMIN"):
        proxy.__enter__()
    assert proxy.pid is None  # nothing was started


# --------------------------------------------------------------------------- nothing left


@pytest.mark.parametrize("capped", [False, True], ids=["plain", "capped"])
@pytest.mark.parametrize("ending", ["normal", "error", "ctrl_c"])
def test_nothing_left_after_the_block(echo_server, netns_unavailable, capped, ending):
    if capped and netns_unavailable:
        pytest.skip(netns_unavailable)
    proxy = DelayProxy(echo_server, rtt_ms=2, bandwidth_mbit=1000 if capped else None)
    raised = {"normal": None, "error": RuntimeError, "ctrl_c": KeyboardInterrupt}[ending]
    with pytest.raises(raised) if raised else contextlib.nullcontext(), proxy:
        pid, address = proxy.pid, proxy.address
        netns = proxy._namespace.name if capped else None
        assert exchange(address, b"abc") == b"abc"
        if raised:
            raise raised("in the body")
    proxy_gone(pid, address, netns)


def test_killed_proxy_is_a_clear_error_and_leaves_nothing(echo_server, netns_unavailable):
    bandwidth = None if netns_unavailable else 1000.0
    with pytest.raises(LinkError, match="(?s)SIGKILL.*while in use"), \
            DelayProxy(echo_server, rtt_ms=2, bandwidth_mbit=bandwidth) as proxy:
        pid, address = proxy.pid, proxy.address
        netns = proxy._namespace.name if proxy._namespace else None
        os.kill(pid, signal.SIGKILL)
        assert wait_gone(pid)
        with pytest.raises(LinkError, match=f"pid {pid}.*SIGKILL"):
            proxy.address  # noqa: B018 (the property checks the process)
    proxy_gone(pid, address, netns)


PARENT = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {lib!r})
    from storebench.remote.network import DelayProxy
    bandwidth = {bandwidth!r}
    with DelayProxy(("127.0.0.1", {port}), rtt_ms=2, bandwidth_mbit=bandwidth) as proxy:
        netns = proxy._namespace.name if proxy._namespace else None
        print(json.dumps([proxy.pid, list(proxy.address), netns]), flush=True)
        time.sleep(60)
""")


@pytest.mark.parametrize("how", ["sigkill", "sigint"])
def test_proxy_stops_with_its_parent(echo_server, netns_unavailable, how):
    bandwidth = None if netns_unavailable else 1000.0
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(lib=str(LIB), bandwidth=bandwidth,
                                             port=echo_server[1])],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        pid, address, netns = json.loads(parent.stdout.readline())
        assert exchange(tuple(address), b"abc") == b"abc"
        parent.send_signal(signal.SIGKILL if how == "sigkill" else signal.SIGINT)
        parent.wait(timeout=20)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    assert wait_gone(pid)
    if netns is not None:  # the orphaned proxy removes it; give it the time to
        deadline = time.monotonic() + 10
        while netns in netns_list() and time.monotonic() < deadline:
            time.sleep(0.05)
    proxy_gone(pid, tuple(address), netns)


def test_stale_links_of_dead_runs_are_removed_on_the_next_start(echo_server, needs_netns):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tag = os.urandom(3).hex()
    stale = f"sb-{dead.pid}-{tag}"
    live = f"sb-{os.getpid()}-{os.urandom(3).hex()}"
    for command in (["ip", "netns", "add", stale],
                    ["ip", "link", "add", f"sbv{tag}r", "type", "veth", "peer", "name",
                     f"sbv{tag}n", "netns", stale],
                    ["ip", "netns", "add", live]):
        subprocess.run(command, check=True, capture_output=True)
    try:
        with DelayProxy(echo_server, bandwidth_mbit=1000):
            pass
        names = netns_list()
        assert stale not in names
        assert live in names  # its owner (this process) is alive
        assert f"sbv{tag}r" not in subprocess.run(
            ["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        assert remove_stale_links() == []
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
