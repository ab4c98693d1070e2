"""Loader paths: the registry of every way a training loop can receive batches here.

``LOADER_PATHS[name]`` maps a path name (what cases, result rows, plots and findings key on)
to its factory, display label, family (``storebench``, ``framework``, ``peer`` or
``baseline``), default start method and where decoding happens. Adding a path, a peer's
loader say, is one ``LoaderPath`` entry; nothing keys on the display label.

A factory takes the dataset (``LazyDataset`` / ``PreloadedDataset``), the sampler and the
knobs, and returns ``(batches, close)``: an iterable of batches and a function that releases
its workers (or ``None``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

FAMILIES = ("storebench", "framework", "peer", "baseline")

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
        return self.factory(dataset, sampler, options)


def _serial(dataset, sampler, options: PathOptions) -> Batches:
    from .batching import batch_buffer
    from .samplers import BatchSampler

    shape = dataset.sample_shape
    out = batch_buffer(options.batch_size, shape, dataset.sample_dtype) if shape else None
    order = BatchSampler(sampler, options.batch_size)
    return (dataset.get_batch(indices, out=out) for indices in order), None


def _thread(dataset, sampler, options: PathOptions) -> Batches:
    from .prefetch import ThreadPrefetcher
    from .samplers import BatchSampler

    loader = ThreadPrefetcher(dataset, BatchSampler(sampler, options.batch_size),
                              workers=options.workers)
    return loader, loader.close


def _process(dataset, sampler, options: PathOptions) -> Batches:
    from .prefetch import ProcessPrefetcher
    from .samplers import BatchSampler

    loader = ProcessPrefetcher(dataset, BatchSampler(sampler, options.batch_size),
                               workers=options.workers, start_method=options.start_method)
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
    from .torch_adapter import torch_dataloader

    loader = torch_dataloader(dataset, batch_size=options.batch_size, sampler=sampler,
                              num_workers=options.workers,
                              multiprocessing_context=options.start_method, seed=options.seed)
    return loader, None


def _tf_data(dataset, sampler, options: PathOptions) -> Batches:
    from .tf_adapter import tfrecord_pipeline

    resize = {"resize": options.resize} if options.resize else {}
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


LOADER_PATHS: dict[str, LoaderPath] = {
    path.name: path for path in (
        LoaderPath("none", "one thread, no prefetcher", "storebench", _serial),
        LoaderPath("thread", "ThreadPrefetcher", "storebench", _thread),
        LoaderPath("process", "ProcessPrefetcher", "storebench", _process,
                   start_method="fork"),
        LoaderPath("torch", "torch DataLoader", "framework", _torch, start_method="fork"),
        LoaderPath("tf_data", "tf.data TFRecord AUTOTUNE", "framework", _tf_data,
                   decode="tensorflow", reads_dataset_files=True),
        LoaderPath("tf_generator", "tf.data from_generator (GIL-bound)", "framework",
                   _tf_generator),
        LoaderPath("locked_list_baseline", "locked-list baseline", "baseline", _locked_list),
        LoaderPath("pickled_baseline", "pickled-queue baseline", "baseline", _pickled,
                   start_method="fork"),
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
