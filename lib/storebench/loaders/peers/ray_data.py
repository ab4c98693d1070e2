"""Ray Data's own pipeline over a storebench set, on a local Ray bound to loopback.

What Ray Data's docs build for training ingest ("Data loading for ML training", "Iterating
over data", "Shuffling data", "Performance tips"): a ``ray.data.read_*`` source with its
files shuffled (``shuffle=FileShuffleConfig(seed)``), the decode and the training transform
in ``map_batches`` (tasks, one CPU each), and ``iter_torch_batches`` with a local shuffle
buffer and batches prefetched, on ``ray.init(num_cpus=..., object_store_memory=...)``.
Three sources, one per layout Ray reads without glue:

- ``rawfiles`` (one JPEG per sample): ``read_binary_files(paths, include_paths=True)``; the
  file name is the sample's index, its folder the class;
- ``parquet`` (one file, ``image`` and ``label`` columns): ``read_parquet(...,
  include_row_hash=True)``; the row's position is recovered from Ray's row hash, a bijection
  of (file path, row) that this module recomputes for every row of the file;
- ``webdataset`` (tar shards): ``read_webdataset(shards, decoder=None)``; the key is the
  index, ``.cls`` the label.

Decode is simplejpeg (or ``decode``'s rule, ``peers.decode_image``), the crop storebench's
seeded ``RandomResizedCropFlip`` resized with Pillow, keyed by sample index and epoch
(``EpochCrop``): the same pixels as every other path that applies it.

The local Ray (``LocalRay``): ``num_cpus`` = the case's workers, a bounded object store,
``include_dashboard=False``, node address 127.0.0.1 with every server bound to it (Ray
keeps a node on loopback only where it treats it as one machine,
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``; otherwise it swaps 127.0.0.1 for the machine's
address), no usage-stats reporting (``RAY_USAGE_STATS_ENABLED=0``), logs,
sockets and spill files under a temporary directory removed at close. ``close()`` calls
``ray.shutdown()``, waits for Ray's processes to exit (kills any left after
``REAP_TIMEOUT_S``) and removes the directory. Before it shuts down, ``engine_metrics()``
reads the engine's own CPU seconds (GCS, raylet and Ray's other system processes, not its
workers) and the object store's spill counters.

Epochs: each ``iter(batches)`` is one epoch: a fresh dataset, its file order and shuffle
buffer seeded with ``(options.seed, epoch)``. Ranks: Ray splits an epoch between ranks from
one driver (``Dataset.streaming_split``), which ``rank_epochs`` runs, each rank's iterator
read by a thread of its own as a trainer process would; a rank process cannot open its own
share (``open`` refuses ``world_size > 1``). Resume: Ray Data has no mid-epoch resume
(``NO_RESUME``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...formats import DatasetError, read_manifest
from ...formats.rawfiles import class_dirs
from ..batching import Batch
from ..paths import PathOptions
from . import EpochCrop, decode_image, decoded_arrays, open_peer_dataset, training_crop

# Loader path -> the layout it reads.
RAY_DATA_PATHS = {"ray_data_files": "rawfiles", "ray_data_parquet": "parquet",
                  "ray_data_webdataset": "webdataset"}
# Bounded so that a pipeline that outruns its consumer spills (and says so) rather than
# growing: a few hundred batches of 224x224 crops, far less than the machine's RAM.
OBJECT_STORE_BYTES = 512 * 2**20
# "Iterating over data" / "Data loading for ML training": prefetch a few batches, and shuffle
# locally in a buffer of some batches rather than globally (a global shuffle is an
# all-to-all exchange per epoch).
PREFETCH_BATCHES = 2
LOCAL_SHUFFLE_BUFFER = 1000
# map_batches' own batch (rows per call): what fits in a task's memory, as the performance
# tips advise; the training batch size is set apart, in iter_torch_batches.
MAP_BATCH_ROWS = 64
REAP_TIMEOUT_S = 10.0
# The ray#37633 statement every declaration and audit row gives as its reason.
NO_RESUME = ("Ray Data has no mid-epoch resume: an interrupted epoch restarts from its "
             "beginning (ray-project/ray#37633)")
# Ray's system processes, by executable name: the engine, apart from its workers.
ENGINE_PROCESSES = ("gcs_server", "raylet")
LOOPBACK = "127.0.0.1"
# Ray's directory: ``<TEMP_ROOT>/<TEMP_PREFIX><owner pid>-*``, so that one left by a process
# killed before its close (a timed-out rank) is known by its dead owner and removed.
TEMP_ROOT = "/tmp"
TEMP_PREFIX = "sb-ray-"
# Set before Ray is imported: one machine (servers on loopback), no usage reports.
RAY_ENVIRONMENT = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def ray_data_batches(dataset, sampler, options: PathOptions):
    """``(batches, close)``: Ray Data's pipeline over the set at ``options.root``."""
    if options.world_size > 1:
        raise DatasetError(
            f"{options.root}: Ray Data splits an epoch between ranks from one driver "
            "(Dataset.streaming_split, storebench.loaders.peers.ray_data.rank_epochs); a "
            "rank process cannot open its own share")
    batches = RayDataBatches(Path(options.root), options)
    return batches, batches.close


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of epoch ``epoch`` of a run seeded with ``seed`` (32 bits, as Ray wants)."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


# -- the local Ray -----------------------------------------------------------------------
@dataclass(frozen=True)
class EngineUse:
    """What the Ray runtime itself cost: CPU seconds of its system processes, and what its
    object store spilled to disk (or fell back to the filesystem for)."""

    cpu_seconds: float
    spilled_bytes: int
    spilled_objects: int
    fallback_bytes: int


class LocalRay:
    """A Ray runtime of ``num_cpus`` CPUs and an object store of ``object_store_bytes`` for
    this process, bound to loopback (see the module doc); a context manager."""

    def __init__(self, *, num_cpus: int, object_store_bytes: int = OBJECT_STORE_BYTES) -> None:
        self.num_cpus = max(1, int(num_cpus))
        self.object_store_bytes = int(object_store_bytes)
        self.temp_dir: str | None = None
        self.start_seconds = float("nan")
        self._saved_environment: dict[str, str | None] = {}

    def start(self) -> LocalRay:
        import time

        remove_stale_ray_dirs()
        # Ray's unix socket paths must stay under 107 bytes: a short directory in /tmp.
        self.temp_dir = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", dir=TEMP_ROOT)
        self._saved_environment = {name: os.environ.get(name) for name in RAY_ENVIRONMENT}
        os.environ.update(RAY_ENVIRONMENT)
        try:
            import ray
            from ray._private import ray_constants

            if ray.is_initialized():
                raise RuntimeError("a Ray runtime is already running in this process: "
                                   "storebench starts its own, bound to loopback")
            # Read once, when Ray is imported: a process that imported Ray earlier has it
            # set from its environment then. Only the node address is decided from it in
            # this process (services.get_node_ip_address); Ray's own processes read the
            # environment set above.
            cluster = ray_constants.ENABLE_RAY_CLUSTER
            ray_constants.ENABLE_RAY_CLUSTER = False
            started = time.perf_counter()
            try:
                ray.init(num_cpus=self.num_cpus, object_store_memory=self.object_store_bytes,
                         include_dashboard=False, _node_ip_address=LOOPBACK,
                         _temp_dir=self.temp_dir, configure_logging=False,
                         log_to_driver=False)
            finally:
                ray_constants.ENABLE_RAY_CLUSTER = cluster
            self.start_seconds = time.perf_counter() - started
            address = ray.util.get_node_ip_address()
            if address != LOOPBACK:
                raise RuntimeError(f"Ray took the node address {address}, not {LOOPBACK}")
            from ray.data import DataContext

            context = DataContext.get_current()
            context.enable_progress_bars = False
            context.print_on_execution_start = False
        except BaseException:
            self.stop()
            raise
        return self

    def engine_use(self) -> EngineUse:
        """The engine's CPU seconds so far and the object store's spill counters."""
        import psutil
        import ray
        from ray._private import internal_api

        cpu = 0.0
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.name() in ENGINE_PROCESSES:
                    times = child.cpu_times()
                    cpu += times.user + times.system
        stats = internal_api.get_memory_info_reply(
            # This runtime's own address: another Ray may run on the machine.
            internal_api.get_state_from_address(ray.get_runtime_context().gcs_address)
        ).store_stats
        return EngineUse(cpu, int(stats.spilled_bytes_total), int(stats.spilled_objects_total),
                         int(stats.object_store_bytes_fallback))

    def stop(self) -> None:
        """Shut Ray down, reap its processes, remove its directory, restore the
        environment; safe to call twice."""
        import psutil

        ours = []
        with contextlib.suppress(psutil.Error):
            ours = psutil.Process().children(recursive=True)
        try:
            import sys

            if "ray" in sys.modules:
                import ray

                ray.shutdown()
        finally:
            _gone, alive = psutil.wait_procs(
                [p for p in ours if _is_ray_process(p)], timeout=REAP_TIMEOUT_S)
            for process in alive:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            psutil.wait_procs(alive, timeout=REAP_TIMEOUT_S)
            if self.temp_dir is not None:
                _remove_tree(self.temp_dir)
                self.temp_dir = None
            for name, value in self._saved_environment.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            self._saved_environment = {}

    def __enter__(self) -> LocalRay:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def remove_stale_ray_dirs() -> list[Path]:
    """Remove the Ray directories (``TEMP_PREFIX<pid>-*``) whose owner process is dead and
    that no live process still uses; returns those removed."""
    import psutil

    removed = []
    for path in Path(TEMP_ROOT).glob(f"{TEMP_PREFIX}*-*"):
        owner = path.name.removeprefix(TEMP_PREFIX).split("-", 1)[0]
        if not owner.isdigit() or psutil.pid_exists(int(owner)) or _in_use(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _in_use(path: Path) -> bool:
    """Whether a live Ray process names ``path`` in its command line (an orphan whose owner
    died is still running there)."""
    import psutil

    text = str(path)
    for process in psutil.process_iter(["cmdline"]):
        if any(text in part for part in process.info["cmdline"] or ()):
            return True
    return False


def _remove_tree(path: str, *, tries: int = 5, pause_s: float = 0.2) -> None:
    """Remove ``path``, again while something still writes into it (a Ray process on its
    way out appends to its log); a tree that stays is an error naming it."""
    import time

    for _ in range(tries):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return
        time.sleep(pause_s)
    raise OSError(f"{path}: Ray's directory could not be removed")


def _is_ray_process(process) -> bool:
    """Whether ``process`` is one Ray started (its system processes and workers)."""
    import psutil

    try:
        name, command = process.name(), " ".join(process.cmdline()[:3])
    except psutil.Error:
        return False
    return (name in ENGINE_PROCESSES or name.startswith("ray::") or "/ray/" in command
            or command.startswith("ray::"))


def ray_processes() -> list:
    """This process's live descendants that Ray started (none once a ``LocalRay`` stopped)."""
    import psutil

    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE and _is_ray_process(child):
                found.append(child)
    return found


def ray_worker_pids() -> list[int]:
    """The pids of this process's Ray worker processes (``ray::IDLE``, ``ray::<task>``),
    Ray's agents left out, oldest first."""
    import psutil

    found = []
    for process in ray_processes():
        with contextlib.suppress(psutil.Error):
            name = process.name()
            if name.startswith("ray::") and not name.endswith("Agent"):
                found.append((process.create_time(), process.pid))
    return [pid for _, pid in sorted(found)]


# -- the map step ----------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeAndCrop:
    """``map_batches``' function: a batch of stored rows (``image`` bytes, ``label``,
    ``index``) decoded as ``decode`` says and through the training ``crop`` of ``epoch``
    (None: decoded only), as one uint8 array. Picklable: it travels to Ray's workers."""

    decode: str | None
    channels: int
    crop: object
    epoch: int

    def __call__(self, rows: dict) -> dict:
        crop = EpochCrop(self.crop, self.epoch) if self.crop is not None else None
        images = []
        for data, index in zip(rows["image"], rows["index"]):
            image = decode_image(data, self.decode, self.channels)
            images.append(crop(image, int(index)) if crop is not None else image)
        return {"image": np.stack(images), "label": np.asarray(rows["label"], np.int64),
                "index": np.asarray(rows["index"], np.int64)}


@dataclass(frozen=True)
class FileRows:
    """``read_binary_files`` rows (``bytes``, ``path``) as (image, label, index): the
    file's stem is its index, its folder's position in ``classes`` its label."""

    classes: tuple[str, ...]

    def __call__(self, rows: dict) -> dict:
        lookup = {name: label for label, name in enumerate(self.classes)}
        paths = [Path(str(p)) for p in rows["path"]]
        return {"image": rows["bytes"],
                "label": np.array([lookup[p.parent.name] for p in paths], np.int64),
                "index": np.array([int(p.stem) for p in paths], np.int64)}


def row_hashes(path: str, rows: int) -> np.ndarray:
    """Ray's ``row_hash`` of rows ``0..rows-1`` of the Parquet file at ``path``: MD5 of the
    path seeds a splitmix64 finalizer of the row's position (Ray's definition)."""
    seed = np.uint64(int.from_bytes(hashlib.md5(path.encode("utf-8")).digest()[:8], "little"))
    keys = seed + np.arange(rows, dtype=np.uint64)
    keys ^= keys >> np.uint64(30)
    keys *= np.uint64(0xBF58476D1CE4E5B9)
    keys ^= keys >> np.uint64(27)
    keys *= np.uint64(0x94D049BB133111EB)
    keys ^= keys >> np.uint64(31)
    return keys


@dataclass(frozen=True)
class ParquetRows:
    """``read_parquet`` rows (``image``, ``label``, ``row_hash``) with each row's position
    in the file as its index, found from its hash (``row_hashes``)."""

    path: str
    rows: int

    def __call__(self, batch: dict) -> dict:
        hashes = row_hashes(self.path, self.rows)
        order = np.argsort(hashes)
        wanted = np.asarray(batch["row_hash"], dtype=np.uint64)
        found = np.searchsorted(hashes, wanted, sorter=order)
        found = np.minimum(found, self.rows - 1)
        index = order[found]
        if not np.array_equal(hashes[index], wanted):
            raise DatasetError(f"{self.path}: Ray's row hash names no row of the file: its "
                               "definition changed, the sample index cannot be recovered")
        return {"image": batch["image"], "label": np.asarray(batch["label"], np.int64),
                "index": index.astype(np.int64)}


@dataclass(frozen=True)
class WebDatasetRows:
    """``read_webdataset`` rows (``__key__``, ``jpg``/``png``, ``cls``) as (image, label,
    index)."""

    image_field: str

    def __call__(self, rows: dict) -> dict:
        # decoder=None: every field is the member's bytes, the label's ASCII digits too.
        return {"image": rows[self.image_field],
                "label": np.array([int(bytes(c)) for c in rows["cls"]], np.int64),
                "index": np.array([int(k) for k in rows["__key__"]], np.int64)}


# -- the epochs --------------------------------------------------------------------------
class RayDataBatches:
    """Re-iterable epochs of ``Batch``es from Ray Data's pipeline (see the module doc). The
    local Ray starts with the first epoch (its start-up is the first batch's wait) and
    stops at ``close()``."""

    def __init__(self, root: Path, options: PathOptions, *, ray: LocalRay | None = None
                 ) -> None:
        self.root = root
        self.options = options
        fmt = read_manifest(root)["format"]
        if fmt not in RAY_DATA_PATHS.values():
            raise DatasetError(f"{root}: Ray Data's paths read {sorted(RAY_DATA_PATHS.values())}"
                               f" sets, this one is {fmt!r}")
        self.layout = fmt
        self.manifest, self.spec = open_peer_dataset(root, fmt, what=f"{fmt} files")
        if self.spec.encoding not in ("jpeg", "png", "mixed"):
            raise DatasetError(f"{root}: Ray Data's paths read encoded images, these samples "
                               f"are {self.spec.encoding}")
        self._crop = training_crop(options)
        decoded_arrays(root, self.spec, options.decode, options.resize,
                       cropped=self._crop is not None)
        if self._crop is None and options.decode is None:
            raise ValueError(f"{root}: Ray Data's paths decode in map_batches: pass decode=")
        self.ray = ray if ray is not None else LocalRay(num_cpus=max(1, options.workers))
        self._owns_ray = ray is None
        self.epoch = 0
        self.samples = int(self.spec.num_samples)

    # The dataset of one epoch.
    def dataset(self, epoch: int):
        import ray.data
        from ray.data.datasource import FileShuffleConfig

        seed = epoch_seed(self.options.seed, epoch)
        shuffle = FileShuffleConfig(seed=seed) if self.options.shuffle else None
        if self.layout == "rawfiles":
            files = sorted(self.manifest["files"])
            paths = [str(self.root / name) for name in files if "/" in name]
            source = ray.data.read_binary_files(paths, include_paths=True, shuffle=shuffle)
            rows = source.map_batches(FileRows(tuple(class_dirs(self.spec))),
                                      batch_size=MAP_BATCH_ROWS)
        elif self.layout == "parquet":
            path = str((self.root / "data.parquet").resolve())
            source = ray.data.read_parquet(path, columns=["image", "label"],
                                           include_row_hash=True, shuffle=shuffle)
            rows = source.map_batches(ParquetRows(path, self.samples),
                                      batch_size=MAP_BATCH_ROWS)
        else:
            from ...formats.webdataset_tar import IMAGE_EXTS, shard_paths

            shards = [str(p) for p in shard_paths(self.root, self.manifest)]
            source = ray.data.read_webdataset(shards, decoder=None, shuffle=shuffle)
            field = IMAGE_EXTS[self.spec.encoding][0]
            rows = source.map_batches(WebDatasetRows(field), batch_size=MAP_BATCH_ROWS)
        return rows.map_batches(
            DecodeAndCrop(self.options.decode, self.spec.channels, self._crop, epoch),
            batch_size=MAP_BATCH_ROWS)

    def iter_options(self, epoch: int) -> dict:
        """``iter_torch_batches``' knobs for ``epoch``."""
        shuffle = ({"local_shuffle_buffer_size": LOCAL_SHUFFLE_BUFFER,
                    "local_shuffle_seed": epoch_seed(self.options.seed, epoch)}
                   if self.options.shuffle else {})
        return {"batch_size": self.options.batch_size, "prefetch_batches": PREFETCH_BATCHES,
                "device": "cpu", **shuffle}

    def __iter__(self) -> Iterator[Batch]:
        if self._owns_ray and self.ray.temp_dir is None:
            self.ray.start()
        epoch, self.epoch = self.epoch, self.epoch + 1
        batches = self.dataset(epoch).iter_torch_batches(**self.iter_options(epoch))
        return self._batches(batches, expected=self.samples)

    def _batches(self, batches, *, expected: int | None) -> Iterator[Batch]:
        """``iter_torch_batches``' dicts as ``Batch``es; an epoch that delivers other than
        ``expected`` samples (None: a rank's share, unknown beforehand) is an error."""
        delivered = 0
        for batch in batches:
            labels = batch["label"].numpy()
            delivered += len(labels)
            yield Batch(batch["image"].numpy(), labels, batch["index"].numpy())
        if expected is not None and delivered != expected:
            raise DatasetError(f"{self.root}: an epoch delivered {delivered} samples, the "
                               f"dataset has {expected}")

    def engine_metrics(self) -> dict[str, tuple[float, str]]:
        """The engine's own use so far (``EngineUse``) and its start-up, as result metrics;
        empty before the local Ray started."""
        if self.ray.temp_dir is None:
            return {}
        use = self.ray.engine_use()
        return {"ray_engine_cpu_s": (use.cpu_seconds, "s"),
                "ray_spilled_bytes": (use.spilled_bytes, "bytes"),
                "ray_spilled_objects": (use.spilled_objects, "count"),
                "ray_fallback_bytes": (use.fallback_bytes, "bytes"),
                "ray_start_s": (self.ray.start_seconds, "s")}

    def close(self) -> None:
        if self._owns_ray:
            self.ray.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r}, cpus={self.ray.num_cpus})"


def rank_epochs(root: Path | str, world_size: int, options: PathOptions,
                epoch: int = 0) -> list[list[Batch]]:
    """Epoch ``epoch`` split between ``world_size`` ranks by ``Dataset.streaming_split``
    (``equal=False``: every sample once), each rank's iterator read to its end by a thread
    of its own (the splits stream together: one left unread stalls the others), on a local
    Ray of ``options.workers`` CPUs; each rank's batches, in delivery order."""
    batches = RayDataBatches(Path(root), options)
    try:
        batches.ray.start()
        splits = batches.dataset(epoch).streaming_split(world_size, equal=False)
        results: list[list[Batch]] = [[] for _ in range(world_size)]
        failures: list[BaseException] = []

        def read(rank: int) -> None:
            try:
                results[rank] = list(batches._batches(
                    splits[rank].iter_torch_batches(**batches.iter_options(epoch)),
                    expected=None))
            except BaseException as err:  # noqa: BLE001 - re-raised below, in the caller
                failures.append(err)

        threads = [threading.Thread(target=read, args=(rank,), name=f"ray-rank-{rank}")
                   for rank in range(world_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]
        return results
    finally:
        batches.close()


__all__ = ["NO_RESUME", "RAY_DATA_PATHS", "LocalRay", "ray_worker_pids", "RayDataBatches",
           "rank_epochs", "ray_data_batches", "ray_processes"]
