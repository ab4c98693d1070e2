"""Loader paths: the registry of every way a training loop can receive batches here.

``LOADER_PATHS[name]`` maps a path name (what cases, result rows, plots and findings key on)
to its factory, display label, family (``storebench``, ``framework``, ``peer`` or
``baseline``), default start method and where decoding happens. Adding a path, a peer's
loader say, is one ``LoaderPath`` entry; nothing keys on the display label.

A factory takes the dataset (``LazyDataset`` / ``PreloadedDataset``), the sampler and the
knobs, and returns ``(batches, close)``: an iterable of batches and a function that releases
its workers (or ``None``).

Peer paths (family ``peer``) are the peer libraries' own recommended pipelines, in modules of
``storebench.loaders.peers`` imported only when used, run in the ``peers`` environment
(``storebench.environments``). Those that read a peer format's files themselves
(``reads_dataset_files``) get ``dataset=None, sampler=None`` and read ``options.root``;
every iteration of their batches is one epoch, reshuffled from ``options.seed`` and the
epoch number, and yields ``Batch(images, labels, indices)`` with each sample's index (kept
in the peer's files as its key), so that an epoch can be checked for exactly its samples.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

FAMILIES = ("storebench", "framework", "peer", "baseline")
# The training crop's side (``RandomResizedCropFlip``'s default size).
TRAINING_CROP = 224

Batches = tuple[Iterable, Callable[[], None] | None]


@dataclass(frozen=True)
class PathOptions:
    """The knobs a factory may use; ``root`` is the dataset's directory (for paths that read
    the files themselves, such as tf.data over TFRecord)."""

    batch_size: int
    workers: int = 0
    start_method: str | None = None
    seed: int = 0
    root: str = ""
    shuffle_buffer: int = 4096
    # (height, width) for imported images of mixed sizes: paths that decode themselves
    # resize to it before batching (datasets get a Resize transform instead).
    resize: tuple[int, int] | None = None
    # Peer paths that read files themselves: shuffle each epoch or read in stored order,
    # and the decoder for encoded samples (None: raw pixels).
    shuffle: bool = True
    decode: str | None = None
    # Page-lock the memory batches are delivered in, for in-place CUDA copies (paths whose
    # ``pins_memory`` is True; CUDA only).
    pin_memory: bool = False
    # Keep the workers of paths that can (torch DataLoader) across passes, so that every
    # epoch after the first runs on the same workers; the path's close() stops them.
    persistent_workers: bool = False
    # "train": the standard training crop and flip. Datasets carry it themselves; paths
    # that decode themselves (tf.data over TFRecord) apply their own library's version.
    transform: str | None = None
    # This process's rank of ``world_size``: peer paths that read their own files split
    # them with their library's own mechanism and check that it sees the same rank (paths
    # over storebench's reader get the split from their sampler). 1: the whole set.
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.world_size, int) and self.world_size >= 1
                and isinstance(self.rank, int) and 0 <= self.rank < self.world_size):
            raise ValueError(f"rank must be in [0, world_size) with world_size >= 1, got "
                             f"rank {self.rank!r} of {self.world_size!r}")


@dataclass(frozen=True)
class LoaderPath:
    """One way to feed batches. ``decode``: ``"dataset"`` when our dataset decodes (the
    case's ``decode`` param), ``"tensorflow"`` when the path decodes itself."""

    name: str
    label: str
    family: str
    factory: Callable[..., Batches]
    start_method: str | None = None
    decode: str = "dataset"
    reads_dataset_files: bool = False
    # Peer paths: the environment whose interpreter runs them, the modules they import, the
    # format they read ("": any, through our reader) and what their shuffle is.
    environment: str = ""
    libraries: tuple[str, ...] = ()
    dataset_format: str = ""
    shuffle: str = "full permutation (the sampler's)"
    # Whether the path delivers batches in page-locked memory when asked (pin_memory).
    pins_memory: bool = False
    # "module:function" returning why the path cannot run here beyond a missing module
    # (a system library its module loads lazily), or None.
    availability: str = ""
    # A path that decodes itself (``decode`` not "dataset"): what decodes and resizes, as
    # a user reads it; "" for paths our dataset decodes for.
    decoder_text: str = ""
    # A path that sizes its own parallelism (tf.data's AUTOTUNE): how; "" for a path
    # whose parallelism is a worker count.
    parallelism: str = ""

    def unavailable(self) -> str | None:
        if not self.availability:
            return None
        module, _, name = self.availability.partition(":")
        return getattr(importlib.import_module(module), name)()

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"loader path {self.name}: family must be one of {FAMILIES}")

    def display(self, workers: int | None = None, start_method: str | None = None) -> str:
        """``"ProcessPrefetcher ×2"``, ``"ProcessPrefetcher ×2 (spawn)"``."""
        text = self.label
        if not isinstance(start_method, str):
            start_method = None  # absent (None, or NaN from a results table)
        if workers:
            text += f" \u00d7{int(workers)}"
        if start_method and start_method != (self.start_method or start_method):
            text += f" ({start_method})"
        return text

    def open(self, dataset, sampler, options: PathOptions) -> Batches:
        if options.pin_memory and not self.pins_memory:
            able = sorted(name for name, path in LOADER_PATHS.items() if path.pins_memory)
            raise ValueError(f"loader path {self.name!r} cannot deliver batches in page-locked "
                             f"memory (pin_memory=True); paths that can: {', '.join(able)}")
        return self.factory(dataset, sampler, options)


def _serial(dataset, sampler, options: PathOptions) -> Batches:
    from .batching import batch_buffer
    from .samplers import BatchSampler

    shape = dataset.sample_shape
    out = batch_buffer(options.batch_size, shape, dataset.sample_dtype) if shape else None
    order = BatchSampler(sampler, options.batch_size)
    return _SerialBatches(dataset, order, out), None


@dataclass(frozen=True)
class _SerialBatches:
    """The one-thread path's batches: each ``iter()`` a pass over ``order``, as a
    prefetcher's (a generator would be spent after its first epoch)."""

    dataset: object
    order: Iterable
    out: object

    def __iter__(self):
        return (self.dataset.get_batch(indices, out=self.out) for indices in self.order)


def _thread(dataset, sampler, options: PathOptions, *, consumer_reads: bool = False
            ) -> Batches:
    from .prefetch import ThreadPrefetcher
    from .samplers import BatchSampler

    loader = ThreadPrefetcher(dataset, BatchSampler(sampler, options.batch_size),
                              workers=options.workers, consumer_reads=consumer_reads,
                              pin_memory=options.pin_memory)
    return loader, loader.close


def _thread_consumer_reads(dataset, sampler, options: PathOptions) -> Batches:
    return _thread(dataset, sampler, options, consumer_reads=True)


def _process(dataset, sampler, options: PathOptions) -> Batches:
    from .prefetch import ProcessPrefetcher
    from .samplers import BatchSampler

    loader = ProcessPrefetcher(dataset, BatchSampler(sampler, options.batch_size),
                               workers=options.workers, start_method=options.start_method,
                               pin_memory=options.pin_memory)
    return loader, loader.close


def _locked_list(dataset, sampler, options: PathOptions) -> Batches:
    from .baselines import BaselineLockedListPrefetcher
    from .samplers import BatchSampler

    loader = BaselineLockedListPrefetcher(dataset, BatchSampler(sampler, options.batch_size))
    return loader, loader.close


def _pickled(dataset, sampler, options: PathOptions) -> Batches:
    from .baselines import BaselinePickledQueuePrefetcher
    from .samplers import BatchSampler

    loader = BaselinePickledQueuePrefetcher(dataset, BatchSampler(sampler, options.batch_size),
                                            workers=options.workers,
                                            start_method=options.start_method)
    return loader, loader.close


def _torch(dataset, sampler, options: PathOptions) -> Batches:
    from .torch_adapter import close_workers, torch_dataloader

    persistent = options.persistent_workers and options.workers > 0
    loader = torch_dataloader(dataset, batch_size=options.batch_size, sampler=sampler,
                              num_workers=options.workers,
                              multiprocessing_context=options.start_method, seed=options.seed,
                              pin_memory=options.pin_memory, persistent_workers=persistent)
    return loader, (lambda: close_workers(loader)) if persistent else None


def _tf_data(dataset, sampler, options: PathOptions) -> Batches:
    from .tf_adapter import tfrecord_pipeline

    resize = {"resize": options.resize} if options.resize else {}
    if options.transform == "train":
        resize = {"resize": (TRAINING_CROP, TRAINING_CROP), "random_crop": True}
    elif options.transform:
        raise ValueError(f"tf.data: unknown transform {options.transform!r}; known: 'train'")
    pipeline = tfrecord_pipeline(Path(options.root), batch_size=options.batch_size,
                                 shuffle_buffer=options.shuffle_buffer, seed=options.seed,
                                 deterministic=False, **resize)
    return pipeline, None


def _tf_generator(dataset, sampler, options: PathOptions) -> Batches:
    import tensorflow as tf

    from .samplers import BatchSampler
    from .tf_adapter import gil_bound_generator_dataset

    pipeline = gil_bound_generator_dataset(dataset, BatchSampler(sampler, options.batch_size))
    return pipeline.prefetch(tf.data.AUTOTUNE), None


def _imported(target: str) -> Callable[..., Batches]:
    """A factory importing ``"module:function"`` only when called (peer libraries are
    heavy, and live in the peers environment only)."""

    def factory(dataset, sampler, options: PathOptions) -> Batches:
        module, _, name = target.partition(":")
        return getattr(importlib.import_module(module), name)(dataset, sampler, options)

    factory.__qualname__ = factory.__name__ = target.rpartition(":")[2]
    return factory


_PEERS = "storebench.loaders.peers"
SHARD_SHUFFLE = "shard order shuffled, then a {buffer}-sample shuffle buffer"

LOADER_PATHS: dict[str, LoaderPath] = {
    path.name: path for path in (
        LoaderPath("none", "one thread, no prefetcher", "storebench", _serial),
        LoaderPath("thread", "ThreadPrefetcher", "storebench", _thread, pins_memory=True),
        LoaderPath("thread_consumer_reads", "ThreadPrefetcher, consumer reads", "storebench",
                   _thread_consumer_reads, pins_memory=True),
        LoaderPath("process", "ProcessPrefetcher", "storebench", _process,
                   start_method="fork", pins_memory=True),
        LoaderPath("torch", "torch DataLoader", "framework", _torch, start_method="fork",
                   pins_memory=True),
        LoaderPath("tf_data", "tf.data TFRecord AUTOTUNE", "framework", _tf_data,
                   decode="tensorflow", reads_dataset_files=True, dataset_format="tfrecord",
                   decoder_text="TensorFlow (decode_and_crop_jpeg: the crop window only; "
                                "bilinear resize without antialiasing)",
                   parallelism="AUTOTUNE (tf.data sizes its own parallel calls)"),
        LoaderPath("tf_generator", "tf.data from_generator (GIL-bound)", "framework",
                   _tf_generator),
        LoaderPath("locked_list_baseline", "locked-list baseline", "baseline", _locked_list),
        LoaderPath("pickled_baseline", "pickled-queue baseline", "baseline", _pickled,
                   start_method="fork"),
        LoaderPath("webdataset", "WebDataset + DataLoader", "peer",
                   _imported(f"{_PEERS}.wds:webdataset_batches"), start_method="fork",
                   decode="simplejpeg", reads_dataset_files=True, environment="peers",
                   libraries=("webdataset", "torch"), dataset_format="webdataset",
                   shuffle=SHARD_SHUFFLE.format(buffer="1,000")),
        LoaderPath("litdata", "LitData StreamingDataLoader", "peer",
                   _imported(f"{_PEERS}.litdata_loader:litdata_batches"),
                   decode="simplejpeg", reads_dataset_files=True, environment="peers",
                   libraries=("litdata", "torch"), dataset_format="litdata",
                   shuffle="chunk order shuffled, then cut into per-worker runs; samples "
                           "shuffled within each chunk in blocks of 256"),
        LoaderPath("mds", "MDS StreamingDataset + DataLoader", "peer",
                   _imported(f"{_PEERS}.mds_loader:mds_batches"), start_method="fork",
                   decode="simplejpeg", reads_dataset_files=True, environment="peers",
                   libraries=("streaming", "torch"), dataset_format="mds",
                   shuffle="py1e: shards shuffled, samples shuffled within a window of "
                           "shards"),
        LoaderPath("dali_file", "DALI CPU readers.file", "peer",
                   _imported(f"{_PEERS}.dali:dali_file_batches"),
                   decode="dali (libjpeg-turbo)", reads_dataset_files=True,
                   environment="peers", libraries=("nvidia.dali",), dataset_format="rawfiles",
                   shuffle="random_shuffle: a 1,024-sample shuffle buffer over the file list"),
        LoaderPath("dali_tfrecord", "DALI CPU readers.tfrecord", "peer",
                   _imported(f"{_PEERS}.dali:dali_tfrecord_batches"),
                   decode="dali (libjpeg-turbo)", reads_dataset_files=True,
                   environment="peers", libraries=("nvidia.dali",), dataset_format="tfrecord",
                   shuffle="random_shuffle: a 1,024-sample shuffle buffer over the records"),
        LoaderPath("ffcv", "FFCV Loader", "peer",
                   _imported(f"{_PEERS}.ffcv_loader:ffcv_batches"),
                   decode="ffcv (libjpeg-turbo, fast DCT)", reads_dataset_files=True,
                   environment="peers", libraries=("ffcv",), dataset_format="ffcv",
                   shuffle="full permutation (OrderOption.RANDOM)"),
        LoaderPath("spdl", "SPDL pipeline (threads)", "peer",
                   _imported(f"{_PEERS}.spdl_loader:spdl_batches"), decode="simplejpeg",
                   environment="peers", libraries=("spdl.pipeline",)),
        LoaderPath("spdl_io", "SPDL pipeline + spdl.io decode", "peer",
                   _imported(f"{_PEERS}.spdl_loader:spdl_io_batches"),
                   decode="spdl.io (FFmpeg)", environment="peers",
                   libraries=("spdl.pipeline", "spdl.io"),
                   availability=f"{_PEERS}.spdl_loader:spdl_io_unavailable"),
        LoaderPath("spdl_process", "SPDL pipeline in a subprocess", "peer",
                   _imported(f"{_PEERS}.spdl_loader:spdl_process_batches"),
                   start_method="fork", decode="simplejpeg", environment="peers",
                   libraries=("spdl.pipeline",)),
        *(LoaderPath(name, f"Ray Data {reader}", "peer",
                     _imported(f"{_PEERS}.ray_data:ray_data_batches"), decode="simplejpeg",
                     reads_dataset_files=True, environment="main", libraries=("ray",),
                     dataset_format=layout,
                     shuffle="files shuffled, then a 1,000-sample local shuffle buffer")
          for name, reader, layout in (
              ("ray_data_files", "read_binary_files", "rawfiles"),
              ("ray_data_parquet", "read_parquet", "parquet"),
              ("ray_data_webdataset", "read_webdataset", "webdataset"))),
        LoaderPath("torchdata", "torchdata StatefulDataLoader", "peer",
                   _imported(f"{_PEERS}.torchdata_loader:torchdata_batches"),
                   start_method="fork", environment="peers",
                   libraries=("torchdata", "torch")),
    )
}


def get_loader_path(name: str) -> LoaderPath:
    try:
        return LOADER_PATHS[name]
    except KeyError:
        raise KeyError(f"unknown loader path {name!r}; known paths: {sorted(LOADER_PATHS)}"
                       ) from None


def path_label(name: str, workers: int | None = None, start_method: str | None = None) -> str:
    """The display label of a registered path (unknown names are shown as they are)."""
    path = LOADER_PATHS.get(name)
    if path is None:
        return name + (f" \u00d7{int(workers)}" if workers else "")
    return path.display(workers, start_method)
