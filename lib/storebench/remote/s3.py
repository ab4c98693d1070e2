"""Objects in S3 (or any S3-compatible store) through pyarrow's S3 filesystem.

pyarrow's S3 client is C++ (the AWS SDK): a ranged GET costs about a third of botocore's CPU
time here and releases the GIL, so a pool of threads keeps many requests in flight without
competing with decode for the interpreter.

Where to connect comes from an ``S3Config``, by default read from the usual environment
variables (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION`` or ``AWS_DEFAULT_REGION``):
point storebench at a real bucket the way the AWS CLI is pointed at one.

``ObjectStore`` holds only that configuration and a location, so it pickles to spawn and
forkserver workers; its client, thread pool and open objects are made lazily in each process
that reads (a forked child makes its own).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from ..formats.base import DatasetError

SCHEME = "s3://"
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# In-flight range requests per reader (per process): enough to hide a 20 ms round trip
# behind 2 cores' worth of decode.
DEFAULT_CONCURRENCY = 64
# The AWS SDK pools 25 connections per client and pyarrow does not expose the setting: a
# reader keeping more requests in flight spreads its threads over several clients.
REQUESTS_PER_CLIENT = 16


class ObjectStoreError(DatasetError):
    """An object cannot be read or written: missing, unreachable, or refused."""


class ReadAbandonedError(ObjectStoreError):
    """A read a stopping loader's thread asked for, not sent yet, was dropped: the loader
    will not take what it returns (``ObjectStore.abandoning``)."""


class S3Path(PurePosixPath):
    """``s3://bucket/key`` as a path: ``/`` and ``.name`` work as for local paths, ``str()``
    keeps the scheme (error messages name the object), and nothing opens it as a local file
    by mistake (``Path(S3Path)`` would drop a slash: readers keep it as it is)."""

    def __str__(self) -> str:
        return SCHEME + super().__str__()

    def __repr__(self) -> str:
        return f"S3Path({str(self)!r})"

    def relative_to(self, *other) -> PurePosixPath:
        """The relative part as a plain PurePosixPath (an object name, no scheme)."""
        base = [PurePosixPath(o.arrow_path if isinstance(o, S3Path) else o) for o in other]
        return PurePosixPath(self.arrow_path).relative_to(*base)

    @classmethod
    def parse(cls, url: str) -> S3Path:
        parts = urlsplit(str(url))
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"{url!r} is not an s3://bucket/prefix URL")
        if parts.query or parts.fragment:
            raise ValueError(f"{url!r}: an s3:// URL takes no query or fragment")
        if not _BUCKET_NAME.fullmatch(parts.netloc):
            raise ValueError(f"{url!r}: {parts.netloc!r} is not a valid bucket name (3 to 63 "
                             "lowercase letters, digits, dots and hyphens)")
        return cls(parts.netloc, parts.path.lstrip("/"))

    @property
    def bucket(self) -> str:
        return self.parts[0]

    @property
    def key(self) -> str:
        """The object key (or prefix) inside the bucket."""
        return "/".join(self.parts[1:])

    @property
    def arrow_path(self) -> str:
        """``bucket/key``, how pyarrow names it."""
        return super().__str__()


@dataclass(frozen=True)
class S3Config:
    """Where and how to reach the object store. ``endpoint_url`` None means AWS itself;
    ``concurrency`` is the number of range requests a reader keeps in flight."""

    endpoint_url: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    session_token: str | None = None
    region: str = "us-east-1"
    concurrency: int = DEFAULT_CONCURRENCY
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.endpoint_url is not None and urlsplit(self.endpoint_url).scheme not in (
            "http", "https"
        ):
            raise ValueError(f"endpoint_url must be http(s)://host:port, got {self.endpoint_url!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> S3Config:
        env = os.environ if environ is None else environ
        config = cls(
            endpoint_url=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
            access_key=env.get("AWS_ACCESS_KEY_ID") or None,
            secret_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
        )
        return replace(config, **overrides)

    def env(self) -> dict[str, str]:
        """The environment variables ``from_env`` reads back as this configuration (for a
        subprocess, or a user's shell)."""
        pairs = {
            "AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_SESSION_TOKEN": self.session_token,
            "AWS_REGION": self.region,
        }
        return {k: v for k, v in pairs.items() if v}

    def filesystem(self, *, allow_bucket_deletion: bool = False):
        """A new ``pyarrow.fs.S3FileSystem`` for this configuration."""
        from pyarrow import fs

        kwargs = {
            "region": self.region, "connect_timeout": self.connect_timeout_s,
            "request_timeout": self.request_timeout_s, "allow_bucket_creation": True,
            "allow_bucket_deletion": allow_bucket_deletion,
        }
        if self.endpoint_url is not None:
            parts = urlsplit(self.endpoint_url)
            kwargs.update(endpoint_override=parts.netloc, scheme=parts.scheme)
        if self.access_key is not None:
            kwargs.update(access_key=self.access_key, secret_key=self.secret_key,
                          session_token=self.session_token)
        return fs.S3FileSystem(**kwargs)


class ObjectStore:
    """Read and write the objects under one ``s3://bucket/prefix``.

    Names are relative to the prefix, as file names are relative to a dataset directory.
    ``read_ranges`` fetches many byte ranges at once with ``config.concurrency`` threads. A
    missing object or a refused request raises ``ObjectStoreError`` naming the object; a
    range past an object's end reads short (the caller knows what length to expect).
    """

    def __init__(self, root: S3Path | str, config: S3Config | None = None) -> None:
        self.root = root if isinstance(root, S3Path) else S3Path.parse(root)
        self.config = config if config is not None else S3Config.from_env()
        self._pid: int | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"root": self.root, "config": self.config}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["root"], state["config"])

    def __repr__(self) -> str:
        return f"ObjectStore({str(self.root)!r})"

    # -- per-process client ---------------------------------------------------------------
    def _ensure(self) -> None:
        pid = os.getpid()
        if self._pid == pid:
            return
        if getattr(self, "_lock_pid", None) != pid:
            self._lock = threading.Lock()  # a forked child: the parent's lock may be held
            self._lock_pid = pid
        with self._lock:
            if self._pid == pid:
                return
            self._fs = self.config.filesystem()
            self._clients = [self._fs] + [
                self.config.filesystem()
                for _ in range(1, -(-self.config.concurrency // REQUESTS_PER_CLIENT))
            ]
            self._thread_client = threading.local()
            self._next_client = 0
            self._pool = ThreadPoolExecutor(self.config.concurrency,
                                            thread_name_prefix="storebench-s3")
            self._files: dict[tuple[int, str], object] = {}  # (client, name): open object
            self._count_lock = threading.Lock()
            self._requests = self._bytes = 0
            self._abandoned: dict[int, int] = {}  # caller thread ident: depth
            self._pid = pid

    def _count(self, data: bytes) -> bytes:
        with self._count_lock:
            self._requests += 1
            self._bytes += len(data)
        return data

    @contextlib.contextmanager
    def abandoning(self, callers: Iterable[int]) -> Iterator[None]:
        """While inside: every read that a thread of ``callers`` (thread idents) asked for
        and that has not sent its request yet raises ``ReadAbandonedError`` instead; those
        in flight finish, and other threads read as usual. For a loader that stops mid-pass:
        the batches its threads are reading will be dropped, and a batch's GETs queued behind
        ``config.concurrency`` others would otherwise all be sent, a round trip per
        ``concurrency`` of them, before its thread could stop."""
        self._ensure()
        callers = list(callers)
        with self._count_lock:
            for caller in callers:
                self._abandoned[caller] = self._abandoned.get(caller, 0) + 1
        try:
            yield
        finally:
            with self._count_lock:
                for caller in callers:
                    self._abandoned[caller] -= 1
                    if not self._abandoned[caller]:
                        del self._abandoned[caller]

    def _check_not_abandoned(self, name: str, caller: int | None) -> None:
        """``caller``: the thread that asked for the read; None: the calling thread."""
        if (threading.get_ident() if caller is None else caller) in self._abandoned:
            raise ReadAbandonedError(f"{self.path(name)}: read abandoned: its loader is "
                                     "stopping")

    def traffic(self) -> tuple[int, int]:
        """(GET requests, bytes received) by this process since its client was made: what
        the capacity model needs (samples per request, bytes per request)."""
        if self._pid != os.getpid():
            return 0, 0
        return self._requests, self._bytes

    def close(self) -> None:
        if self._pid == os.getpid():
            for handle in self._files.values():
                handle.close()
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pid = None

    def path(self, name: str) -> S3Path:
        return self.root / name

    def _arrow(self, name: str) -> str:
        return self.path(name).arrow_path

    def _error(self, name: str, what: str, err: Exception) -> ObjectStoreError:
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        if isinstance(err, FileNotFoundError) or "NoSuchKey" in str(err):
            return ObjectStoreError(f"{self.path(name)}: no such object ({what})")
        return ObjectStoreError(f"{self.path(name)}: {what} failed: {text}")

    def _client(self) -> tuple[int, object]:
        """This thread's client (and its number): threads are spread over the clients."""
        local = self._thread_client
        if not hasattr(local, "number"):
            with self._count_lock:
                local.number = self._next_client % len(self._clients)
                self._next_client += 1
        return local.number, self._clients[local.number]

    def _file(self, name: str):
        number, client = self._client()
        handle = self._files.get((number, name))
        if handle is None:
            try:
                handle = client.open_input_file(self._arrow(name))
            except (OSError, FileNotFoundError) as err:
                raise self._error(name, "open", err) from err
            self._files[(number, name)] = handle
        return handle

    # -- reading --------------------------------------------------------------------------
    def size(self, name: str) -> int:
        self._ensure()
        return self._file(name).size()

    def sizes_of(self, names: Sequence[str]) -> list[int]:
        """The size of each named object (one HEAD each, concurrently; the handles stay
        open for ranged reads)."""
        self._ensure()
        return list(self._pool.map(self.size, names))

    def open_file(self, name: str):
        """A new pyarrow random-access file on the object, for libraries that read through a
        file object (h5py, pyarrow.parquet); each read is a ranged GET."""
        self._ensure()
        try:
            return self._fs.open_input_file(self._arrow(name))
        except (OSError, FileNotFoundError) as err:
            raise self._error(name, "open", err) from err

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """Every object under ``prefix`` (relative names) with its size, from one listing."""
        from pyarrow import fs

        self._ensure()
        base = self.root.arrow_path.rstrip("/")
        where = f"{base}/{prefix}".rstrip("/")
        try:
            infos = self._fs.get_file_info(fs.FileSelector(where, recursive=True,
                                                           allow_not_found=True))
        except OSError as err:
            raise self._error(prefix, "listing", err) from err
        return {info.path[len(base) + 1 :]: info.size for info in infos
                if info.type == fs.FileType.File}

    def read(self, name: str, *, caller: int | None = None) -> bytes:
        """The whole object (one GET). ``caller``: the thread that asked for it, where a
        pool thread reads on its behalf (``abandoning``)."""
        self._ensure()
        self._check_not_abandoned(name, caller)
        try:
            with self._client()[1].open_input_stream(self._arrow(name)) as stream:
                return self._count(stream.read())
        except (OSError, FileNotFoundError) as err:
            raise self._error(name, "read", err) from err

    def read_range(self, name: str, offset: int, length: int, *,
                   caller: int | None = None) -> bytes:
        """``length`` bytes at ``offset`` (one ranged GET); fewer only at the object's end.
        ``caller`` as for ``read``."""
        self._ensure()
        self._check_not_abandoned(name, caller)
        try:
            return self._count(self._file(name).read_at(length, offset))
        except OSError as err:
            raise self._error(name, f"ranged read of {length} bytes at {offset}", err) from err

    def read_ranges(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """``read_range`` of every ``(name, offset, length)``, ``config.concurrency`` at a
        time, in the order asked."""
        if len(requests) <= 1:
            return [self.read_range(*request) for request in requests]
        self._ensure()
        caller = threading.get_ident()
        return list(self._pool.map(
            lambda request: self.read_range(*request, caller=caller), requests))

    def read_many(self, names: Sequence[str]) -> list[bytes]:
        """Whole objects, ``config.concurrency`` at a time, in the order asked (pyarrow
        makes a HEAD before each GET: two round trips an object)."""
        if len(names) <= 1:
            return [self.read(name) for name in names]
        self._ensure()
        caller = threading.get_ident()
        return list(self._pool.map(lambda name: self.read(name, caller=caller), names))

    # -- writing --------------------------------------------------------------------------
    def ensure_bucket(self) -> None:
        self._ensure()
        try:
            self._fs.create_dir(self.root.bucket)
        except OSError as err:
            raise ObjectStoreError(f"s3://{self.root.bucket}: cannot create bucket: {err}") from err

    def delete_bucket(self) -> None:
        """Delete this store's bucket and every object in it."""
        try:
            self.config.filesystem(allow_bucket_deletion=True).delete_dir(self.root.bucket)
        except FileNotFoundError:
            pass
        except OSError as err:
            raise ObjectStoreError(f"s3://{self.root.bucket}: cannot delete bucket: {err}") from err

    def write(self, name: str, data: bytes) -> None:
        self._ensure()
        try:
            with self._fs.open_output_stream(self._arrow(name)) as stream:
                stream.write(data)
        except OSError as err:
            raise self._error(name, "write", err) from err

    def upload(self, local_path, name: str, *, chunk_bytes: int = 8 << 20) -> int:
        """Copy a local file to object ``name`` (multipart above the chunk size); returns the
        bytes written."""
        self._ensure()
        written = 0
        try:
            with open(local_path, "rb") as source, \
                    self._fs.open_output_stream(self._arrow(name)) as stream:
                while chunk := source.read(chunk_bytes):
                    stream.write(chunk)
                    written += len(chunk)
        except OSError as err:
            raise self._error(name, "upload", err) from err
        return written

    def delete(self, names: Sequence[str]) -> None:
        self._ensure()
        for name in names:
            try:
                self._fs.delete_file(self._arrow(name))
            except FileNotFoundError:
                pass
            except OSError as err:
                raise self._error(name, "delete", err) from err
