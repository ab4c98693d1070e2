"""``storebench import --engine ray``: the import's reading, decoding, checking and resizing
done by Ray tasks, on this machine or on a cluster.

- **Deterministic assignment.** The listing is cut into blocks of ``images_per_task``
  consecutive images (block ``b`` holds images ``b*n .. b*n+n-1``); a task handles one block
  and the driver takes the blocks back in block order, whatever order Ray ran them in. What
  each task does and what the writers receive depend on the listing only.
- **The same bytes.** Every format is written by its own single writer in the driver, from
  the samples in listing order, exactly as the single-process import writes it: a format's
  shard boundaries, offsets and indexes come from that one sequential pass, and its
  single-file formats (HDF5, LMDB) can only have one writer. So the datasets are those of
  the single-process import, byte for byte (every writer is reproducible: TFRecord's
  feature maps in key order, HDF5 without object times, LMDB with zeroed pages). The
  manifest differs only in ``write_seconds``, ``generate_seconds``, ``created_utc`` and its
  own digest.
- **Local Ray binds to loopback.** Without an address, Ray starts here with ``num_cpus`` =
  ``workers``, no dashboard, its node on 127.0.0.1, no usage reports, Ray's default
  authentication (as the Ray Data loader path starts it: one process holds one Ray
  configuration) and a temporary directory that is removed afterwards. Its processes
  share the driver's fate (Ray's own Linux ``PR_SET_PDEATHSIG``): a killed import takes
  them with it, and a small guard process removes the temporary directory once the driver
  is gone.
- **A cluster.** ``address`` (or ``RAY_ADDRESS``) connects to an existing cluster instead
  (``ray start --head``, KubeRay); its nodes must see the source folder at the same path
  and run the same Pillow (the resized pixels are Pillow's). The cluster is left running,
  as is a session this process had already started (``ray.init()`` in a notebook).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

from .formats.base import DatasetError
from .formats.specs import ImportedSpec
from .importer import (
    ImportPlan,
    ScannedImage,
    SourceImageError,
    SourceListing,
    prepared_sample,
    scan_or_fail,
)

IMAGES_PER_TASK = 128
# Blocks submitted ahead of the one the driver waits for, per CPU of the cluster: enough
# to keep every CPU busy, few enough to bound the object store's use.
BLOCKS_IN_FLIGHT_PER_CPU = 2
INSTALL_HINT = "pip install 'storebench[ray]' (or make setup)"
# Set before Ray is imported: Ray reads them at import (the first) or at init.
LOCAL_RAY_ENVIRONMENT = {
    # Off: Ray would otherwise take this machine's private address for a one-node cluster.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}
# Removes Ray's temporary directory after a driver killed before it could (run by path, so
# that it imports nothing of storebench).
TEMP_DIR_GUARD = Path(__file__).with_name("ray_temp_guard.py")


class RayUnavailableError(DatasetError):
    """``--engine ray`` where Ray cannot be imported or the cluster cannot be reached."""


def import_ray():
    try:
        import ray
    except ImportError as err:
        raise RayUnavailableError(
            f"--engine ray needs Ray, which this Python cannot import ({err}): {INSTALL_HINT}"
        ) from None
    return ray


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set for the duration (Ray's processes inherit them)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def local_ray(num_cpus: int) -> Iterator[object]:
    """A one-node Ray on this machine, bound to loopback, shut down and its temporary
    directory removed on exit (see the module docstring); yields the ``ray`` module."""
    with environment(LOCAL_RAY_ENVIRONMENT):
        ray = import_ray()
        from ray._private import ray_constants

        # Read once, when Ray is first imported: a process that imported Ray before the
        # environment above was set has it on, and only this process's choice of node
        # address reads it (Ray's own processes read the environment), so it is off for the
        # start, as the Ray Data loader path does (``loaders.peers.ray_data.LocalRay``).
        cluster = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False
        # Short and in the system temp folder: Ray's socket paths under it must stay within
        # the 107 bytes of a Unix socket name.
        temp_dir = tempfile.mkdtemp(prefix="sb-ray-")
        guard = subprocess.Popen([sys.executable, str(TEMP_DIR_GUARD), temp_dir],
                                 stdin=subprocess.PIPE, start_new_session=True)
        try:
            try:
                ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=temp_dir,
                         logging_level="ERROR", log_to_driver=False)
            finally:
                ray_constants.ENABLE_RAY_CLUSTER = cluster
            try:
                yield ray
            finally:
                ray.shutdown()
        finally:
            shutil.rmtree(temp_dir, ignore_errors=True)
            guard.communicate(b"done")


def check_reachable(address: str) -> None:
    """Refuse a ``host:port`` address that takes no connection, in one line, before Ray
    would retry it for minutes (``auto`` and ``ray://`` addresses are left to Ray)."""
    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        raise RayUnavailableError(
            f"--address {address}: no Ray cluster answers there ({err.strerror or err}); "
            "start one with `ray start --head`, or leave --address out to run Ray here"
        ) from None


@contextmanager
def cluster_ray(address: str) -> Iterator[object]:
    """A connection to the Ray cluster at ``address``, closed on exit (the cluster stays)."""
    check_reachable(address)
    ray = import_ray()
    with environment({"RAY_USAGE_STATS_ENABLED": "0"}):
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def scan_block(root: str, paths: list[str], labels: list[int]
               ) -> list[ScannedImage | SourceImageError]:
    """A Ray task: each image of one block scanned (``importer.scan_or_fail``)."""
    return [scan_or_fail(Path(root) / rel, label) for rel, label in zip(paths, labels)]


def prepare_block(root: str, paths: list[str], labels: list[int], checksums: list[int],
                  spec: ImportedSpec) -> list[np.ndarray | bytes | SourceImageError]:
    """A Ray task: each sample of one block as the writers store it
    (``importer.prepared_sample``); a failing image ends the block with its error."""
    prepared: list[np.ndarray | bytes | SourceImageError] = []
    for rel, label, checksum in zip(paths, labels, checksums):
        try:
            prepared.append(prepared_sample(Path(root) / rel, label, checksum, spec))
        except SourceImageError as err:
            prepared.append(err)
            break
    return prepared


def block_starts(count: int, images_per_task: int) -> range:
    """Where each block begins: the assignment of images to tasks, a function of the
    listing's length only."""
    return range(0, count, images_per_task)


class RayImportEngine:
    """The import's engine on Ray (a context manager: it starts or joins Ray on entry and
    leaves on exit). ``workers``: CPUs of a local Ray (default: this machine's);
    ``address``: a cluster instead (default ``RAY_ADDRESS``, else a local Ray)."""

    def __init__(self, *, workers: int | None = None, progress: bool = False,
                 address: str | None = None, images_per_task: int = IMAGES_PER_TASK) -> None:
        if images_per_task < 1:
            raise ValueError(f"images_per_task must be at least 1, got {images_per_task}")
        self.workers = workers
        self.progress = progress
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.images_per_task = images_per_task
        self._ray = None
        self._session = None

    def __enter__(self) -> RayImportEngine:
        ray = sys.modules.get("ray")
        if self.address is not None:
            if self.workers is not None:
                raise ValueError("--workers sizes a local Ray: a cluster has its own CPUs "
                                 "(leave --workers out with --address)")
            self._session = cluster_ray(self.address)
        elif ray is not None and ray.is_initialized():
            # A session its caller started (a notebook, a test's): used, and left running.
            self._session = nullcontext(ray)
        else:
            self._session = local_ray(self.workers or os.cpu_count() or 1)
        self._ray = self._session.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        session, self._session, self._ray = self._session, None, None
        if session is not None:
            session.__exit__(*exc)

    def _ordered(self, task: Callable, listing: SourceListing,
                 extra: Callable[[int, int], tuple]) -> Iterator[tuple[int, list]]:
        """``(start, results)`` of ``task`` over every block, in block order, with a
        bounded number of blocks in flight. ``extra(start, stop)``: the block's further
        arguments."""
        ray = self._ray
        if ray is None:
            raise RuntimeError("RayImportEngine is used outside its with-block")
        remote = ray.remote(num_cpus=1)(task)
        root = str(listing.root)
        window = max(1, BLOCKS_IN_FLIGHT_PER_CPU * int(ray.cluster_resources().get("CPU", 1)))
        starts = iter(block_starts(len(listing), self.images_per_task))
        pending: deque = deque()

        def submit() -> None:
            start = next(starts, None)
            if start is None:
                return
            stop = min(start + self.images_per_task, len(listing))
            pending.append((start, remote.remote(
                root, list(listing.paths[start:stop]),
                [int(x) for x in listing.labels[start:stop]], *extra(start, stop))))

        for _ in range(window):
            submit()
        while pending:
            start, ref = pending.popleft()
            submit()
            yield start, ray.get(ref)

    def scan(self, listing: SourceListing) -> Iterator[ScannedImage | SourceImageError]:
        """Each image of ``listing`` scanned by Ray tasks, in listing order."""
        from tqdm.auto import tqdm

        with tqdm(total=len(listing), desc=f"check {listing.origin.name} (ray)", unit="img",
                  disable=None if self.progress else True, leave=False) as bar:
            for _, scanned in self._ordered(scan_block, listing, lambda start, stop: ()):
                bar.update(len(scanned))
                yield from scanned

    def samples(self, plan: ImportPlan, spec: ImportedSpec) -> Callable[[], Iterator]:
        """A factory of ``spec``'s samples, prepared by Ray tasks, in listing order."""
        listing = plan.listing

        def extra(start: int, stop: int) -> tuple:
            return ([int(c) for c in plan.checksums[start:stop]], spec)

        def samples() -> Iterator[tuple[np.ndarray | bytes, int]]:
            for start, prepared in self._ordered(prepare_block, listing, extra):
                for offset, item in enumerate(prepared):
                    if isinstance(item, SourceImageError):
                        raise item
                    yield item, int(listing.labels[start + offset])

        return samples
