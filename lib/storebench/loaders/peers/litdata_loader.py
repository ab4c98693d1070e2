"""LitData's own loader pipeline over a storebench ``litdata`` dataset (chunks + index.json).

What LitData recommends (its README, "Stream the data during training"):
``StreamingDataset(input_dir, shuffle=..., seed=...)`` over the optimized chunks inside
``StreamingDataLoader(dataset, batch_size, num_workers)``, with the per-sample work either
passed as ``transform=`` or, as its "Use any data transforms" section shows, in a subclass
whose ``__getitem__`` calls ``super().__getitem__(index)`` and transforms the sample. Its image
type (``ld.Image``, kept as bytes) decodes through torchvision, whose import fails in this
environment, so the format stores plain ``bytes`` and the subclass decodes them.

What is used: exactly that. ``DecodingStreamingDataset(input_dir=root, shuffle=..., seed=...,
drop_last=False)`` decodes in the workers: ``decode="simplejpeg"`` by
``simplejpeg.decode_jpeg(data, colorspace="RGB")`` (``"GRAY"`` for one-channel specs),
``"pil"`` by Pillow, ``"auto"`` simplejpeg for JPEG and Pillow for the rest; ``decode=None``
yields raw pixels as stored (LitData's numpy serializer) and encoded images as ``bytes``.
``StreamingDataLoader(batch_size=options.batch_size, num_workers=options.workers)`` with
LitData's own collate, its defaults otherwise (non-persistent workers, prefetch factor 2,
``options.start_method`` when given). A sample's index is the first leaf of its stored
``(index, image, label)`` tuple; ``__getitem__`` checks it against the index LitData asked
for, so a chunk out of place is an error, not a duplicated sample.

Local files: for a local uncompressed ``input_dir`` LitData 0.2.76 maps the chunk files in
place ("POSIX-fast": no copy into a cache, nothing deleted, nothing written beside them).
``cache_dir`` still points at a temporary directory, removed by ``close()``, so that nothing
could land in ``~/.lightning``. LitData would lower ``num_workers`` where little memory is
free (a "POSIX-fast" cap of half of MemAvailable per 256 MiB worker); the path refuses to
run with fewer workers than asked rather than record a run under the wrong label.

Epochs and exactness. Every ``iter(batches)`` is one epoch: re-iterating the
StreamingDataLoader advances its epoch counter, which the dataset's shuffle seeds from
(``RandomState([seed, epoch])``), so epochs differ and a run is reproducible. With
``drop_last=False`` (LitData's default outside distributed runs, set explicitly) LitData
gives each worker a whole number of batches and the remainder to one worker, so an epoch
holds every sample exactly once and at most one short batch. Shuffle (LitData's
``FullShuffle`` on a local disk): the chunk order is permuted, the permuted chunk list is
cut into consecutive runs of samples per worker (a chunk may be split between two), and
within each chunk the samples are shuffled in blocks of 256 (blocks permuted, then the
samples inside each block: LitData's default ``item_shuffle_window``). Shuffle off: worker
``w`` reads a contiguous index range in stored order, and the DataLoader takes batches from
the workers in turn, so an epoch interleaves the workers' ranges batch by batch (plain
index order with ``workers <= 1``).

Corruption. LitData keeps no checksums and checks only each chunk's item count against
``index.json``; a damaged image is its decoder's error, raised here as a ``DatasetError``
naming the chunk and sample (through the DataLoader it arrives with the worker's traceback).
The manifest's file sizes and fingerprints are checked before the first epoch.
``close()`` shuts down the workers of an epoch left unfinished through the DataLoader
iterator's ``_shutdown_workers`` (what its ``__del__`` calls) and removes the cache dir.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ...formats import DatasetError
from ...formats.litdata_chunks import NAME as FORMAT_NAME
from ..batching import Batch
from ..paths import PathOptions
from . import (
    check_rank,
    decode_image,
    decoded_arrays,
    open_peer_dataset,
    shut_down_dataloader_workers,
    tracked_loader_class,
    training_crop,
)

DATASET_CLASS = "DecodingStreamingDataset"


def litdata_batches(dataset, sampler, options: PathOptions):
    """``(batches, close)`` over the ``litdata`` dataset at ``options.root``."""
    batches = LitDataBatches(Path(options.root), options)
    return batches, batches.close


def _make_dataset_class():
    """``DecodingStreamingDataset``, a ``litdata.StreamingDataset`` subclass, made on first
    use: LitData is imported only here (the main environment has none)."""
    from litdata import StreamingDataset
    from litdata.streaming.sampler import ChunkedIndex

    class DecodingStreamingDataset(StreamingDataset):
        """LitData's StreamingDataset, decoding each ``(index, image, label)`` sample in
        ``__getitem__`` (in the DataLoader's workers) as LitData's README shows."""

        def __init__(self, *args, decode: str | None, channels: int, resize=None, crop=None,
                     **kwargs):
            super().__init__(*args, **kwargs)
            self.decode = decode
            self.channels = channels
            self.resize = resize
            self.crop = crop

        def __getitem__(self, index):
            stored_index, image, label = super().__getitem__(index)
            expected = index.index if isinstance(index, ChunkedIndex) else index
            if isinstance(expected, int | np.integer) and stored_index != expected:
                raise DatasetError(
                    f"{self._chunk_file(index)}: sample {expected}: the item holds sample "
                    f"{stored_index}: chunk damaged or out of place"
                )
            if not isinstance(image, np.ndarray):  # raw pixels are already a copy
                try:
                    image = decode_image(image, self.decode, self.channels)
                except (ValueError, OSError, SyntaxError) as err:
                    raise DatasetError(
                        f"{self._chunk_file(index)}: sample {stored_index}: cannot decode: "
                        f"{err}") from err
                if self.resize is not None:
                    image = self.resize(image)
            if self.crop is not None:
                # LitData counts epochs from 1; storebench's transform from 0.
                image = self.crop(image, index=int(stored_index), epoch=self.current_epoch - 1)
            return stored_index, image, label

        def _chunk_file(self, index) -> str:
            try:
                if not isinstance(index, ChunkedIndex):
                    index = ChunkedIndex(*self.cache._get_chunk_index_from_index(index))
                return str(self.cache._reader.config[index][0])
            except Exception:  # only naming the file for a message: fall back to the dir
                return str(self.input_dir.path)

    DecodingStreamingDataset.__module__ = __name__
    DecodingStreamingDataset.__qualname__ = DATASET_CLASS
    globals()[DATASET_CLASS] = DecodingStreamingDataset
    return DecodingStreamingDataset


def __getattr__(name: str):
    # PEP 562: a spawned worker unpickling the dataset finds its class here by name.
    if name == DATASET_CLASS:
        return _make_dataset_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _make_loader_class():
    from litdata import StreamingDataLoader

    return tracked_loader_class(StreamingDataLoader)


def allow_plain_http(storage_options: dict) -> None:
    """Let LitData's obstore downloads reach an ``http://`` endpoint (an S3-compatible
    server without TLS, as a local one is): LitData builds obstore's client options from a
    fixed dict without obstore's ``allow_http``, so its chunk downloads refuse such an
    endpoint while its boto3 calls reach it. Changes nothing for https endpoints."""
    endpoint = str(storage_options.get("endpoint_url") or "")
    if not endpoint.startswith("http://"):
        return
    from litdata.streaming import downloader

    options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
    if isinstance(options, dict) and "allow_http" not in options:
        downloader._OBSTORE_CLIENT_OPTIONS = {**options, "allow_http": "true"}


class LitDataBatches:
    """Re-iterable epochs of ``Batch``es from LitData's pipeline (see the module doc)."""

    def __init__(self, root: Path, options: PathOptions, *, remote: str | None = None,
                 storage_options: dict | None = None, cache_dir: str | None = None) -> None:
        _, self.spec = open_peer_dataset(root, FORMAT_NAME, what="LitData chunks")
        self.root = root
        self.options = options
        decode = options.decode
        crop = training_crop(options)
        # refuses what cannot batch
        decoded_arrays(root, self.spec, decode, options.resize, cropped=crop is not None)
        resize = None
        if options.resize:
            from ..transforms import Resize

            resize = Resize(*options.resize)
        # A caller's cache dir is the caller's to remove; the path's own, close()'s.
        self._owns_cache = cache_dir is None
        self._cache_dir = cache_dir or tempfile.mkdtemp(prefix="storebench-litdata-cache-")
        try:
            if remote is not None:
                allow_plain_http(storage_options or {})
            # ``remote`` (``s3://...``): LitData downloads index.json and each chunk into
            # the (new, empty) cache dir before reading it there; later epochs read the
            # downloaded chunks. ``storage_options`` go to its boto3 client (endpoint_url,
            # keys), whose settings its obstore downloads copy.
            self.dataset = _make_dataset_class()(
                input_dir=str(remote or root), cache_dir=self._cache_dir,
                **({"storage_options": storage_options} if storage_options else {}),
                shuffle=bool(options.shuffle),
                seed=int(options.seed), drop_last=False, decode=decode,
                channels=self.spec.channels, resize=resize, crop=crop,
            )
            # LitData splits the chunks over the ranks it detects itself.
            env = self.dataset.distributed_env
            check_rank(root, "LitData", (env.global_rank, env.world_size), options)
            workers = max(int(options.workers), 0)
            extra = {"multiprocessing_context": options.start_method} if (
                workers and options.start_method) else {}
            self.loader = _make_loader_class()(
                self.dataset, batch_size=options.batch_size, num_workers=workers, **extra
            )
            if self.loader.num_workers != workers:
                raise RuntimeError(
                    f"LitData lowered num_workers from {workers} to {self.loader.num_workers} "
                    "(its POSIX-fast memory cap: too little MemAvailable); refusing to run "
                    "under a label that says otherwise"
                )
        except BaseException:
            if self._owns_cache:
                shutil.rmtree(self._cache_dir, ignore_errors=True)
            raise
        self.workers = workers

    @property
    def epoch(self) -> int:
        """Epochs started so far (LitData's own counter)."""
        return self.loader.current_epoch

    def __iter__(self) -> Iterator[Batch]:
        self._stop_workers()  # an epoch left unfinished
        return self._batches()

    def _batches(self) -> Iterator[Batch]:
        for indices, images, labels in self.loader:
            # PyTorch's collate stacks arrays into a tensor and leaves bytes as a sequence.
            images = list(images) if isinstance(images, list | tuple) else images.numpy()
            yield Batch(images, labels.numpy().astype(np.int64, copy=False),
                        indices.numpy().astype(np.int64, copy=False))

    def _stop_workers(self) -> None:
        iterator, self.loader.live_iterator = self.loader.live_iterator, None
        shut_down_dataloader_workers(iterator)

    def close(self) -> None:
        """Stop the current epoch's workers (if any are left) and remove the cache dir."""
        self._stop_workers()
        if self._owns_cache:
            shutil.rmtree(self._cache_dir, ignore_errors=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r}, workers={self.workers})"
