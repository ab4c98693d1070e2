"""Count the HTTP requests and the bytes a client's S3 traffic costs, whatever client made
them: a TCP relay in its own process that parses the request heads passing through.

    with RequestCounter(("127.0.0.1", 9000)) as counter:     # relays to that address
        endpoint = "http://%s:%d" % counter.address          # the client's endpoint
        ...                                                  # the client reads
        traffic = counter.traffic()                          # Traffic(gets=..., ...)

storebench's own reader counts its GETs where it makes them (``remote.s3.ObjectStore``); a
library with its own S3 client (boto3, obstore, curl) is counted here instead, on the wire,
as an object store bills them: requests by method and the bytes the server sent back.
Plain HTTP/1.1 only (what an ``http://`` endpoint gets); a request body with no
``Content-Length`` (chunked uploads) stops the parsing of that connection, counted in
``unparsed_connections``.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import socket
from dataclasses import dataclass

START_TIMEOUT_S = 30.0
# Shared counters, in this order.
FIELDS = ("gets", "heads", "other_requests", "response_bytes", "request_bytes",
          "unparsed_connections")
MAX_HEAD_BYTES = 64 * 1024


class RequestCounterError(RuntimeError):
    """The counting relay did not start or died."""


@dataclass(frozen=True)
class Traffic:
    """What went through the counter: requests by method, bytes each way (headers
    included), and connections whose requests could not all be parsed."""

    gets: int
    heads: int
    other_requests: int
    response_bytes: int
    request_bytes: int
    unparsed_connections: int

    @property
    def requests(self) -> int:
        return self.gets + self.heads + self.other_requests

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(*(getattr(self, f) - getattr(other, f) for f in FIELDS))


class RequestHeads:
    """Parses a client-to-server byte stream into HTTP/1.1 requests, counting them by
    method; bodies are skipped by their ``Content-Length``."""

    def __init__(self) -> None:
        self.buffer = b""
        self.body_left = 0
        self.broken = False
        self.methods: list[str] = []

    def feed(self, data: bytes) -> list[str]:
        """The methods of the requests whose heads ``data`` completed."""
        if self.broken:
            return []
        found = []
        self.buffer += data
        while self.buffer:
            if self.body_left:
                taken = min(self.body_left, len(self.buffer))
                self.body_left -= taken
                self.buffer = self.buffer[taken:]
                continue
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    self.broken = True
                break
            head, self.buffer = self.buffer[:end], self.buffer[end + 4:]
            lines = head.split(b"\r\n")
            found.append(lines[0].split(b" ", 1)[0].decode("ascii", "replace").upper())
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
                self.broken = True
                break
            self.body_left = int(headers.get(b"content-length", b"0") or 0)
        return found


def _relay_main(listener: socket.socket, target: tuple[str, int], counters, ready) -> None:
    """The relay process: serve ``listener`` until the parent closes ``ready``'s pipe."""
    asyncio.run(_serve(listener, target, counters, ready))


async def _serve(listener: socket.socket, target, counters, ready) -> None:
    loop = asyncio.get_running_loop()
    index = {name: i for i, name in enumerate(FIELDS)}

    def add(name: str, amount: int) -> None:
        counters[index[name]] += amount  # one process writes: no lock needed

    async def pump(reader, writer, *, upstream: bool, heads: RequestHeads | None) -> None:
        try:
            while data := await reader.read(256 * 1024):
                if upstream:
                    add("request_bytes", len(data))
                    was_broken = heads.broken
                    for method in heads.feed(data):
                        add({"GET": "gets", "HEAD": "heads"}.get(method, "other_requests"), 1)
                    if heads.broken and not was_broken:
                        add("unparsed_connections", 1)
                else:
                    add("response_bytes", len(data))
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                if writer.can_write_eof():
                    writer.write_eof()

    async def handle(client_reader, client_writer) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            pump(client_reader, server_writer, upstream=True, heads=RequestHeads()),
            pump(server_reader, client_writer, upstream=False, heads=None))
        for writer in (client_writer, server_writer):
            writer.close()

    server = await asyncio.start_server(handle, sock=listener)
    ready.send(True)
    # The parent's end closing (its exit, or close()) stops the relay.
    await loop.run_in_executor(None, _wait_closed, ready)
    # Nothing to flush (the counts live in shared memory): leave without cancelling the
    # open connections' tasks one by one.
    server.close()
    os._exit(0)


def _wait_closed(connection) -> None:
    with contextlib.suppress(EOFError, OSError):
        while True:
            connection.recv()


class RequestCounter:
    """A counting relay to ``target`` (host, port) in a process of its own (started by
    entering, stopped by leaving); ``address`` is where clients connect."""

    def __init__(self, target: tuple[str, int], *, host: str = "127.0.0.1") -> None:
        self.target = (str(target[0]), int(target[1]))
        self.host = host
        self._process = None
        self._counters = None
        self._pipe = None
        self.address: tuple[str, int] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def __enter__(self) -> RequestCounter:
        context = multiprocessing.get_context("spawn")  # no inherited threads or loops
        listener = socket.create_server((self.host, 0))
        self.address = listener.getsockname()[:2]
        self._counters = context.Array("q", len(FIELDS), lock=False)
        parent, child = context.Pipe()
        self._pipe = parent
        self._process = context.Process(target=_relay_main, daemon=True,
                                        args=(listener, self.target, self._counters, child),
                                        name="storebench-request-counter")
        try:
            self._process.start()
            child.close()
            listener.close()
            if not parent.poll(START_TIMEOUT_S):
                raise RequestCounterError(
                    f"the request counter to {self.target} did not start within "
                    f"{START_TIMEOUT_S:g} s")
            parent.recv()
        except BaseException:
            self.close()
            raise
        return self

    def traffic(self) -> Traffic:
        """The counts so far (since the relay started)."""
        if self._counters is None:
            raise RequestCounterError("the request counter is not running")
        if not self._process.is_alive():
            raise RequestCounterError(
                f"the request counter died (exit code {self._process.exitcode})")
        return Traffic(*(int(v) for v in self._counters[:]))

    def close(self) -> None:
        process, self._process = self._process, None
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None
        if process is not None and process.pid is not None:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)

    def __exit__(self, *exc) -> None:
        self.close()
