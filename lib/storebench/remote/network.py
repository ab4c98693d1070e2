"""Network distance in front of a TCP server: a delaying proxy, and a bandwidth cap.

This kernel has no ``netem``, so latency is added in user space: ``DelayProxy`` runs a TCP
proxy in its own process (its CPU work never shares the GIL of the process being measured)
that holds every chunk it reads for ``rtt_ms / 2`` before writing it on, in each direction.
Chunks are queued with their deadlines, so a stream is delayed, not serialised: many chunks
are in flight at once, and throughput at 20 ms stays what it is at 0 ms. A new connection
also pays one round trip before its first byte reaches the server, as a TCP handshake would.
``rtt_ms=0`` still goes through the proxy, forwarding straight, so that every row of a
latency sweep pays the same proxy overhead. What is *not* emulated: TCP's own dynamics over
a long path (slow start, a window bounded by bandwidth x delay), since the client's TCP
connection is to a proxy on this machine. Each direction of a connection holds at most
``QUEUE_HIGH_BYTES`` in flight, so one connection carries at most about that much per
``rtt_ms / 2`` (roughly 0.5 GB/s at 20 ms): more than a real TCP window usually allows.
Timers fire up to ~1 ms late (asyncio rounds its waits up to the millisecond), so a link
measures a few tenths of a millisecond above its ``rtt_ms``: record ``measure_rtt``'s value.

A bandwidth cap (``bandwidth_mbit=``) uses the real ``tbf`` qdisc: the proxy's listening
socket is made inside a fresh network namespace joined to this one by a veth pair that has
a ``tbf`` qdisc on each end, so both directions between client and proxy are shaped. Its
upstream sockets are made back in this process's own namespace (``setns``), so the server
may keep listening on 127.0.0.1; clients connect to the namespace's address, which
``DelayProxy.address`` gives. This needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), the ``ip``
and ``tc`` commands (iproute2) and veth and tbf in the kernel; where any is missing,
entering raises ``LinkUnavailableError`` with the reason, which a study reports as a
skipped row. Namespaces are named ``sb-<owner pid>-<tag>``; a killed run's leftovers are
removed by the next one (``remove_stale_links``).

The proxy stops on leaving the ``with`` block (also on an error or Ctrl-C in it) and when
its parent process dies (it watches its stdin for EOF); it then removes its namespace
itself. If it dies during the block, ``address`` and leaving the block raise ``LinkError``.

This module uses only the standard library, and runs as the proxy process:
``python -m storebench.remote.network --target 127.0.0.1:8333 --rtt-ms 20``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import ctypes
import fcntl
import ipaddress
import os
import re
import secrets
import selectors
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

READ_BYTES = 256 * 1024  # asyncio's socket transports read up to this much at a time
QUEUE_HIGH_BYTES = 8 << 20  # per direction: stop reading while this much waits for its time
QUEUE_LOW_BYTES = 6 << 20  # ... and read again below this
SINK_HIGH_BYTES = 4 << 20  # per socket: bytes written but not yet taken by the kernel
SINK_LOW_BYTES = 1 << 20
CONNECT_TIMEOUT_S = 10.0
READY = "storebench-proxy ready"
NETNS_DIR = Path("/run/netns")
LOCK_PATH = Path("/run/storebench-links.lock")
# veth addresses: one /30 per link, from a link-local block no host normally routes.
LINK_BLOCK = ipaddress.ip_network("169.254.200.0/22")
_NETNS_NAME = re.compile(r"^sb-(\d+)-([0-9a-f]{6})$")
_VETH_NAME = re.compile(r"^sbv([0-9a-f]{6})[rn]$")
_CAP_SYS_ADMIN, _CAP_NET_ADMIN = 21, 12
_CLONE_NEWNET = 0x40000000
_CLOSE = object()  # queue marker: close the sink (its source is gone), after the delay


class LinkUnavailableError(RuntimeError):
    """This machine cannot make the asked-for link (no root, no iproute2, no veth or tbf in
    the kernel); ``reason`` says which. A study reports the case as skipped."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class LinkError(RuntimeError):
    """The proxy process did not start, or died while in use."""


@dataclass(frozen=True)
class LinkSpec:
    """The network between a client and a server: round-trip time added by the proxy, and
    an optional bandwidth cap (megabits per second, 10**6 bit/s) in each direction."""

    rtt_ms: float = 0.0
    bandwidth_mbit: float | None = None

    def __post_init__(self) -> None:
        if not self.rtt_ms >= 0:
            raise ValueError(f"rtt_ms must be >= 0, got {self.rtt_ms!r}")
        if self.bandwidth_mbit is not None and not self.bandwidth_mbit > 0:
            raise ValueError(f"bandwidth_mbit must be > 0 or None, got {self.bandwidth_mbit!r}")
        object.__setattr__(self, "rtt_ms", float(self.rtt_ms))
        if self.bandwidth_mbit is not None:
            object.__setattr__(self, "bandwidth_mbit", float(self.bandwidth_mbit))

    def fields(self) -> dict[str, float | None]:
        """The link's knobs for a result row's params (``bandwidth_mbit`` None: no cap)."""
        return {"rtt_ms": self.rtt_ms, "bandwidth_mbit": self.bandwidth_mbit}


# --------------------------------------------------------------------------- measuring

HTTP_PROBE = b"HEAD / HTTP/1.1\r\nHost: storebench\r\nUser-Agent: storebench-rtt\r\n\r\n"


def measure_rtt(address: tuple[str, int], *, samples: int = 20, request: bytes = HTTP_PROBE,
                reply_end: bytes = b"\r\n\r\n", timeout_s: float = 5.0) -> float:
    """Median milliseconds from sending ``request`` to receiving the end of its reply
    (``reply_end``), over one open connection to ``address``, after one warm-up exchange.

    This is an application-level round trip: what a small request pays, the server's time
    to answer included (for ``HEAD /`` on a server on loopback, a fraction of a millisecond).
    A TCP connect time would measure nothing here: the kernel completes the handshake with
    the local proxy before the proxy sees it. The default request suits an HTTP server that
    keeps connections alive (S3); for an echo server pass ``request=reply_end=b"ping"``.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    times = []
    with socket.create_connection(address, timeout=timeout_s) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(samples + 1):
            start = time.perf_counter()
            sock.sendall(request)
            reply = b""
            while reply_end not in reply:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError(f"{address[0]}:{address[1]} closed the connection "
                                          f"before replying to {request[:40]!r}")
                reply += chunk
            if i:  # the first exchange also pays the connection's set-up
                times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


# --------------------------------------------------------------------------- the proxy process


class _Pipe:
    """One direction of a proxied connection: what is read from ``source`` is written to
    ``sink`` ``delay`` seconds after it was read (never before ``not_before``), in order.

    Reading pauses while more than ``QUEUE_HIGH_BYTES`` wait for their time or the sink's
    socket buffer is full, so memory stays bounded whatever the two ends do.
    """

    def __init__(self, connection: _Connection, delay: float, not_before: float) -> None:
        self.connection = connection
        self.loop = connection.loop
        self.delay = delay
        self.not_before = not_before
        self.queue: collections.deque = collections.deque()  # (deadline, bytes | None | _CLOSE)
        self.queued = 0
        self.timer: asyncio.TimerHandle | None = None
        self.source: asyncio.Transport | None = None
        self.sink: asyncio.Transport | None = None
        self.sink_full = False
        self.reading_paused = False
        self.done = False  # EOF or close delivered to the sink

    def feed(self, item) -> None:
        """Data (bytes), EOF (None) or _CLOSE read from the source."""
        if self.done:
            return
        if self.delay == 0 and not self.queue:
            self._deliver(item)
        else:
            deadline = max(self.loop.time(), self.not_before) + self.delay
            self.queue.append((deadline, item))
            if isinstance(item, bytes):
                self.queued += len(item)
            if self.timer is None:
                self.timer = self.loop.call_at(deadline, self._flush)
        self.check_pressure()

    def _flush(self) -> None:
        self.timer = None
        now = self.loop.time()
        queue = self.queue
        while queue and queue[0][0] <= now and not self.done:
            item = queue.popleft()[1]
            if isinstance(item, bytes):
                self.queued -= len(item)
            self._deliver(item)
        if queue and not self.done:
            self.timer = self.loop.call_at(queue[0][0], self._flush)
        self.check_pressure()

    def _deliver(self, item) -> None:
        sink = self.sink
        if sink is None or sink.is_closing():
            self.discard()
            return
        if isinstance(item, bytes):
            sink.write(item)
        elif item is None:
            self.done = True
            if sink.can_write_eof():
                sink.write_eof()
            self.connection.eof_delivered()
        else:
            self.done = True
            sink.close()

    def discard(self) -> None:
        """The sink is gone: drop what waits for it, and read (and drop) what comes."""
        self.done = True
        self.queue.clear()
        self.queued = 0
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.sink_full = False
        self.check_pressure()

    def check_pressure(self) -> None:
        source = self.source
        if source is None or source.is_closing():
            return
        if not self.reading_paused:
            if self.queued > QUEUE_HIGH_BYTES or self.sink_full:
                source.pause_reading()
                self.reading_paused = True
        elif self.queued <= QUEUE_LOW_BYTES and not self.sink_full:
            source.resume_reading()
            self.reading_paused = False


class _Side(asyncio.Protocol):
    """One socket of a proxied connection: feeds its outgoing pipe, is the sink of the other."""

    def __init__(self, connection: _Connection, role: str) -> None:
        self.connection = connection
        self.role = role

    def connection_made(self, transport) -> None:
        transport.set_write_buffer_limits(high=SINK_HIGH_BYTES, low=SINK_LOW_BYTES)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connection.side_made(self.role, transport)

    def data_received(self, data: bytes) -> None:
        self.connection.outgoing(self.role).feed(data)

    def eof_received(self) -> bool:
        self.connection.outgoing(self.role).feed(None)
        return True  # keep the socket open: the other direction may still carry data

    def pause_writing(self) -> None:
        pipe = self.connection.incoming(self.role)
        pipe.sink_full = True
        pipe.check_pressure()

    def resume_writing(self) -> None:
        pipe = self.connection.incoming(self.role)
        pipe.sink_full = False
        pipe.check_pressure()

    def connection_lost(self, exc) -> None:
        self.connection.side_lost(self.role)


class _Connection:
    """A client's connection and its upstream one, with a pipe for each direction."""

    def __init__(self, proxy: _ProxyServer) -> None:
        self.proxy = proxy
        self.loop = proxy.loop
        rtt = proxy.rtt_s
        accepted = self.loop.time()
        # A TCP handshake costs a round trip before the client's first byte can leave, and
        # the server's first byte leaves half a round trip after the connection was asked for.
        self.up = _Pipe(self, rtt / 2, accepted + rtt)
        self.down = _Pipe(self, rtt / 2, accepted + rtt / 2)
        self.transports: dict[str, asyncio.Transport] = {}
        self.lost: set[str] = set()
        self.connecting = True
        self.eofs = 0

    def outgoing(self, role: str) -> _Pipe:
        return self.up if role == "client" else self.down

    def incoming(self, role: str) -> _Pipe:
        return self.down if role == "client" else self.up

    def side_made(self, role: str, transport) -> None:
        self.transports[role] = transport
        self.outgoing(role).source = transport
        self.incoming(role).sink = transport
        if role == "client":
            self.proxy.connections.add(self)
            transport.pause_reading()  # until upstream is connected
            self.proxy.track(self.loop.create_task(self._connect_upstream()))

    async def _connect_upstream(self) -> None:
        host, port = self.proxy.target
        try:
            await asyncio.wait_for(self.loop.create_connection(
                lambda: _Side(self, "upstream"), host, port), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            # The client's connect succeeded already (to us); the nearest thing to "refused"
            # is a reset, a round trip later, as a refusal would come.
            self.loop.call_later(self.proxy.rtt_s, self._reset_client)
            return
        finally:
            self.connecting = False
            self.forget_if_over()
        client = self.transports.get("client")
        if client is None or client.is_closing():
            self.transports["upstream"].close()
            return
        client.resume_reading()

    def _reset_client(self) -> None:
        client = self.transports.get("client")
        if client is None or client.is_closing():
            return
        sock = client.get_extra_info("socket")
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.abort()

    def eof_delivered(self) -> None:
        self.eofs += 1
        if self.eofs == 2:  # both directions half-closed: the connection is over
            for transport in self.transports.values():
                transport.close()

    def side_lost(self, role: str) -> None:
        self.lost.add(role)
        self.incoming(role).discard()
        # The socket is gone (reset, or closed by us): close the other end once what was
        # read before has reached it, or now if its EOF has already.
        outgoing = self.outgoing(role)
        other = self.transports.get("upstream" if role == "client" else "client")
        if not outgoing.done:
            outgoing.feed(_CLOSE)
        elif other is not None:
            other.close()
        self.forget_if_over()

    def forget_if_over(self) -> None:
        if not self.connecting and self.lost >= self.transports.keys():
            self.proxy.connections.discard(self)

    def abort(self) -> None:
        for transport in self.transports.values():
            transport.abort()


class _ProxyServer:
    def __init__(self, loop, target: tuple[str, int], rtt_ms: float) -> None:
        self.loop = loop
        self.target = target
        self.rtt_s = rtt_ms / 1e3
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task] = set()

    def track(self, task: asyncio.Task) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def protocol(self) -> _Side:
        return _Side(_Connection(self), "client")

    def abort_all(self) -> None:
        for connection in list(self.connections):
            connection.abort()


def _libc_setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _listening_socket(host: str, netns: str | None) -> socket.socket:
    """A listening socket on ``host``, made inside network namespace ``netns`` when given.
    A socket keeps the namespace it was made in, so this thread goes back to its own
    namespace afterwards and every later socket (upstream) is made there."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY) if netns else -1
    try:
        if netns:
            target = os.open(NETNS_DIR / netns, os.O_RDONLY)
            try:
                _libc_setns(target)
            finally:
                os.close(target)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, 0))
            sock.listen(1024)
            sock.setblocking(False)
        finally:
            if netns:
                _libc_setns(own)
    finally:
        if own >= 0:
            os.close(own)
    return sock


async def _serve(args: argparse.Namespace) -> bool:
    """Run the proxy until told to stop; True when it stopped because its parent is gone."""
    loop = asyncio.get_running_loop()
    host, _, port = args.target.rpartition(":")
    proxy = _ProxyServer(loop, (host.strip("[]"), int(port)), args.rtt_ms)
    sock = _listening_socket(args.listen, args.netns)
    server = await loop.create_server(proxy.protocol, sock=sock)
    stopped = loop.create_future()

    def stop(orphaned: bool) -> None:
        if not stopped.done():
            stopped.set_result(orphaned)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, False)
    if args.watch_stdin:
        def stdin_readable() -> None:
            try:
                data = os.read(0, 4096)
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(0)
                stop(True)
        loop.add_reader(0, stdin_readable)
    bound_host, bound_port = sock.getsockname()[:2]
    print(f"{READY} {bound_host} {bound_port}", flush=True)
    orphaned = await stopped
    server.close()
    proxy.abort_all()
    for task in list(proxy.tasks):
        task.cancel()
    return orphaned


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m storebench.remote.network",
        description="A TCP proxy that adds a round-trip time; prints "
                    f"'{READY} HOST PORT' once it listens.")
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--rtt-ms", type=float, default=0.0,
                        help="round-trip time to add, half in each direction")
    parser.add_argument("--listen", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--netns", help="make the listening socket in this network namespace")
    parser.add_argument("--watch-stdin", action="store_true",
                        help="stop when stdin reaches EOF (the parent is gone)")
    parser.add_argument("--owned-netns", help="namespace (and its veth) to remove when "
                        "stopping because the parent is gone")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.rtt_ms < 0:
        print(f"--rtt-ms must be >= 0, got {args.rtt_ms}", file=sys.stderr)
        return 2
    orphaned = asyncio.run(_serve(args))
    if orphaned and args.owned_netns:
        _remove_link(args.owned_netns)
    return 0


# --------------------------------------------------------------------------- namespaces


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    completed = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and completed.returncode != 0:
        raise subprocess.CalledProcessError(completed.returncode, ["ip", *args],
                                            completed.stdout, completed.stderr)
    return completed


def _capabilities() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def link_unavailable_reason() -> str | None:
    """Why a bandwidth cap cannot be made here (cheap checks only), or None when it may:
    kernel support for veth and tbf shows only when a link is made."""
    caps = _capabilities()
    missing = [name for bit, name in ((_CAP_NET_ADMIN, "CAP_NET_ADMIN"),
                                      (_CAP_SYS_ADMIN, "CAP_SYS_ADMIN")) if not caps >> bit & 1]
    if missing:
        return (f"a bandwidth cap needs a network namespace, which needs root ("
                f"{' and '.join(missing)} missing; running as uid {os.geteuid()})")
    tools = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if tools:
        return (f"a bandwidth cap needs the {' and '.join(tools)} command(s) from iproute2 "
                f"(apt-get install iproute2)")
    return None


def _netns_names() -> list[str]:
    listing = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


def _veth_names() -> list[str]:
    listing = _ip("-o", "link", "show", "type", "veth", check=False).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in listing.splitlines()
            if line.count(":") >= 2]


def _remove_link(netns: str) -> None:
    """Remove namespace ``sb-<pid>-<tag>`` and its veth pair; missing parts are fine."""
    match = _NETNS_NAME.match(netns)
    if match:  # deleting one end of a veth removes both, at once (a namespace's: later)
        _ip("link", "del", f"sbv{match.group(2)}r", check=False)
    _ip("netns", "del", netns, check=False)


def remove_stale_links() -> list[str]:
    """Remove the namespaces and veths that runs whose process is dead left behind (a
    killed run's); return their names. Safe to call any time: live runs' links stay."""
    from storebench.processes import pid_alive  # not at the top: the proxy child runs
    # this file as a script, outside the package

    if shutil.which("ip") is None:
        return []
    removed = []
    live_tags = set()
    for name in _netns_names():
        match = _NETNS_NAME.match(name)
        if not match:
            continue
        if pid_alive(int(match.group(1))):
            live_tags.add(match.group(2))
        else:
            _remove_link(name)
            removed.append(name)
    for name in _veth_names():
        match = _VETH_NAME.match(name)
        if match and match.group(1) not in live_tags:
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def _used_networks() -> list[ipaddress.IPv4Network]:
    listing = _ip("-4", "-o", "addr", "show", check=False).stdout
    found = re.findall(r"\binet (\d+\.\d+\.\d+\.\d+/\d+)", listing)
    return [ipaddress.ip_interface(address).network for address in found]


@contextlib.contextmanager
def _links_lock():
    """Serialises choosing addresses and removing stale links between processes."""
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _tbf_args(bandwidth_mbit: float) -> list[str]:
    rate_bytes = bandwidth_mbit * 1e6 / 8
    burst = max(64 * 1024, int(rate_bytes / 100))  # 10 ms of the rate: timer slack
    return ["tbf", "rate", f"{int(bandwidth_mbit * 1000)}kbit", "burst", str(burst),
            "latency", "50ms"]


class _Namespace:
    """A network namespace joined to this one by a veth pair with ``tbf`` on both ends."""

    def __init__(self, bandwidth_mbit: float) -> None:
        reason = link_unavailable_reason()
        if reason:
            raise LinkUnavailableError(reason)
        tag = secrets.token_hex(3)
        self.name = f"sb-{os.getpid()}-{tag}"
        self.root_if, self.ns_if = f"sbv{tag}r", f"sbv{tag}n"
        self.closed = False
        with _links_lock():
            remove_stale_links()
            used = _used_networks()
            subnet = next((net for net in LINK_BLOCK.subnets(new_prefix=30)
                           if not any(net.overlaps(u) for u in used)), None)
            if subnet is None:
                raise LinkUnavailableError(f"no free /30 left in {LINK_BLOCK} for a veth pair")
            root_ip, ns_ip = (str(host) for host in list(subnet.hosts())[:2])
            self.host, self.listen_host = root_ip, ns_ip
            steps = [
                ["ip", "netns", "add", self.name],
                ["ip", "link", "add", self.root_if, "type", "veth", "peer", "name",
                 self.ns_if, "netns", self.name],
                ["ip", "addr", "add", f"{root_ip}/30", "dev", self.root_if],
                ["ip", "link", "set", self.root_if, "up"],
                ["ip", "-n", self.name, "addr", "add", f"{ns_ip}/30", "dev", self.ns_if],
                ["ip", "-n", self.name, "link", "set", self.ns_if, "up"],
                ["ip", "-n", self.name, "link", "set", "lo", "up"],
                ["tc", "-n", self.name, "qdisc", "add", "dev", self.ns_if, "root",
                 *_tbf_args(bandwidth_mbit)],
                ["tc", "qdisc", "add", "dev", self.root_if, "root", *_tbf_args(bandwidth_mbit)],
            ]
            try:
                for step in steps:
                    done = subprocess.run(step, capture_output=True, text=True, timeout=30)
                    if done.returncode != 0:
                        raise LinkUnavailableError(
                            f"could not make the bandwidth-capped link: `{' '.join(step)}` "
                            f"failed: {done.stderr.strip() or done.returncode}")
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            _remove_link(self.name)


# --------------------------------------------------------------------------- the parent's handle


class DelayProxy:
    """A delaying TCP proxy in a child process, in front of ``target`` (host, port).

    ``with DelayProxy(("127.0.0.1", 8333), rtt_ms=20) as proxy:`` connect to
    ``proxy.address`` instead of the target. ``bandwidth_mbit=`` also caps the link (needs
    root; else entering raises ``LinkUnavailableError``).
    """

    def __init__(self, target: tuple[str, int], *, rtt_ms: float = 0.0,
                 bandwidth_mbit: float | None = None, startup_timeout_s: float = 10.0) -> None:
        self.link = LinkSpec(rtt_ms=rtt_ms, bandwidth_mbit=bandwidth_mbit)
        self.target = (str(target[0]), int(target[1]))
        self.startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen | None = None
        self._namespace: _Namespace | None = None
        self._stderr = None
        self._address: tuple[str, int] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def address(self) -> tuple[str, int]:
        """Where to connect instead of the target; raises LinkError if the proxy died."""
        self.check()
        return self._address

    def check(self) -> None:
        """Raise LinkError unless the proxy process is running."""
        if self._process is None or self._address is None:
            raise LinkError("the proxy is not running (use it as a context manager)")
        if self._process.poll() is not None:
            raise LinkError(self._died_message())

    def _died_message(self) -> str:
        code = self._process.returncode
        if code is not None and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        return (f"the delay proxy for {self.target[0]}:{self.target[1]} (pid "
                f"{self._process.pid}, rtt {self.link.rtt_ms} ms) {how}{self._stderr_tail()}")

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace").strip()
        return f"; its stderr: {text[-2000:]}" if text else ""

    def __enter__(self) -> DelayProxy:
        if self._process is not None:
            raise LinkError("this DelayProxy is already running")
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        command = [sys.executable, "-I", str(Path(__file__).resolve()),
                   "--target", f"{self.target[0]}:{self.target[1]}",
                   "--rtt-ms", repr(float(self.link.rtt_ms)), "--watch-stdin"]
        if self.link.bandwidth_mbit is not None:
            self._namespace = _Namespace(self.link.bandwidth_mbit)
            command += ["--listen", self._namespace.listen_host,
                        "--netns", self._namespace.name,
                        "--owned-netns", self._namespace.name]
        # Held while the proxy runs (a stderr that nobody reads must not be a pipe).
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        # Its own session: a Ctrl-C at the terminal reaches this process, which stops it.
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._stderr, start_new_session=True)
        line = self._read_ready_line()
        host, port = line[len(READY):].split()
        self._address = (host, int(port))

    def _read_ready_line(self) -> str:
        deadline = time.monotonic() + self.startup_timeout_s
        received = b""
        with selectors.DefaultSelector() as selector:
            selector.register(self._process.stdout, selectors.EVENT_READ)
            while b"\n" not in received:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LinkError(f"the delay proxy for {self.target[0]}:{self.target[1]} "
                                    f"did not start within {self.startup_timeout_s} s"
                                    f"{self._stderr_tail()}")
                if selector.select(left):
                    chunk = os.read(self._process.stdout.fileno(), 4096)
                    if not chunk:
                        self._process.wait(timeout=5)
                        raise LinkError(self._died_message())
                    received += chunk
        line = received.split(b"\n", 1)[0].decode()
        if not line.startswith(READY):
            raise LinkError(f"the delay proxy printed {line!r} instead of its ready line")
        return line

    def close(self) -> None:
        """Stop the proxy and remove its namespace (idempotent)."""
        process, self._process = self._process, None
        try:
            if process is not None:
                if process.poll() is None:
                    process.terminate()
                    try:
                        process.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait()
                for pipe in (process.stdin, process.stdout):
                    if pipe is not None:
                        pipe.close()
        finally:
            if self._namespace is not None:
                self._namespace.close()
                self._namespace = None
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None
            self._address = None

    def __exit__(self, exc_type, exc, tb) -> None:
        died = None
        if self._process is not None and self._process.poll() is not None:
            died = self._died_message()
        self.close()
        if died is not None and exc_type is None:
            raise LinkError(died + " while in use: results measured through it are invalid")


if __name__ == "__main__":
    sys.exit(main())
