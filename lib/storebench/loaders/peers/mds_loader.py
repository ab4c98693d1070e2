"""MosaicML Streaming's own loader pipeline over a storebench ``mds`` dataset.

What streaming recommends (its README and "Dataset Conversion / Main Concepts" docs):
``StreamingDataset(local=..., remote=..., shuffle=True, batch_size=...)`` over the MDS shards
and ``index.json``, subclassed with a ``__getitem__`` that calls ``super().__getitem__(idx)``
and transforms the sample dict (its vision datasets decode and transform there), inside a
``torch.utils.data.DataLoader`` or its ``StreamingDataLoader`` (a DataLoader that also
counts samples for ``state_dict`` resumption), with the same ``batch_size`` for both.

What is used: exactly that. ``DecodingStreamingDataset(local=root, remote=None,
shuffle=options.shuffle, shuffle_algo="py1e", shuffle_seed=options.seed,
batch_size=options.batch_size, num_canonical_nodes=1)`` decodes in the DataLoader's
workers: ``decode="simplejpeg"`` by ``simplejpeg.decode_jpeg(data, colorspace="RGB")``
(``"GRAY"`` for one-channel specs), ``"pil"`` by Pillow, ``"auto"`` simplejpeg for JPEG and
Pillow for the rest; raw datasets come as the stored pixels (MDS's ``ndarray`` column). Then
``StreamingDataLoader(dataset, batch_size=options.batch_size, num_workers=options.workers)``
with ``options.start_method`` when given (the path's default: fork) and one compromise:
``collate_samples`` instead of torch's default collate, which stacks the pixels with
``np.stack`` (one copy, into a writable array) instead of first wrapping each read-only
MDS array in a tensor (torch warns about those). Non-persistent workers (the default).

streaming is imported through ``streaming_import.import_streaming()`` (torchvision cannot be
imported here; only streaming's vision dataset zoo is replaced, never the reader or loader).
A sample's ``index`` column is checked against the sample id streaming asked for, so a shard
out of place is an error, not a duplicated sample.

Epochs and exactness. Every ``iter(batches)`` is one epoch: StreamingDataset keeps its epoch
counter in shared memory and each ``__iter__`` (in the workers) starts the next epoch; with
``shuffle=True`` its shuffle (``sampling_method="balanced"``) seeds from ``shuffle_seed`` and
the epoch, so epochs differ and a run is reproducible. Streaming evens out its partitions of
an epoch in two ways: over canonical nodes by *repeating* samples when the dataset does not
divide evenly (``partition/orig.py``: "repeat the last ID"), and over workers and batches
by padding with ``-1``, which its iterator skips. ``num_canonical_nodes=1`` (also the py1e
default on one node) leaves no repeats, so an epoch is exact: every sample once, at most one
short batch (the padding falls at the end of the epoch's sample order). Each epoch is still
counted here: a sample seen twice, or missing when the epoch ends, is a ``DatasetError``.
``shuffle=False``: stored order (the workers' batches interleave back into it).

Shuffle (py1e, streaming's default): the sample order within each canonical node's span is
built shard by shard (shards in random order), then every sample is displaced by a random
amount within a window of ``shuffle_block_size`` samples (default ``max(4_000_000 //
num_canonical_nodes, 262_144)``): on datasets smaller than that, close to a full shuffle.

Shared memory and files it leaves. A StreamingDataset registers an integer prefix ``P`` and
creates ``/dev/shm/P_{locals, barrier, next_epoch, cache_usage, shard_states,
shard_access_times}`` (plus ``epoch_shape``/``epoch_data`` while an epoch starts, and
``resume`` after ``load_state_dict``) and file locks ``$TMPDIR/P_barrier_filelock`` and
``P_cache_filelock``. Streaming removes the shared memory only at interpreter exit and the
lock files never; ``clean_stale_shared_memory()`` removes every prefix's shared memory on
the machine, including that of other jobs' live datasets, so it is not called. ``close()``
stops the workers of an unfinished epoch, ends the dataset's threads, and removes exactly
this dataset's prefix: its shared memory (unregistering streaming's exit handlers) and its
lock files. Nothing is written beside the shards (local data is read in place). Python's
``multiprocessing`` resource tracker, started on the first shared-memory segment, is the
interpreter's and stays until exit.

Corruption. MDS keeps no per-sample checksums; the manifest's file sizes and fingerprints
are checked before the first epoch. A damaged image is its decoder's error, a shard whose
sample does not hold its own index is an error; both are raised as ``DatasetError`` naming
the shard and sample (through the DataLoader they arrive with the worker's traceback).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ...formats import DatasetError
from ...formats.mds import NAME as FORMAT_NAME
from ...processes import SHM_DIR
from ...streaming_import import import_streaming
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
SHUFFLE_ALGO = "py1e"


def mds_batches(dataset, sampler, options: PathOptions):
    """``(batches, close)`` over the ``mds`` dataset at ``options.root``."""
    batches = MDSBatches(Path(options.root), options)
    return batches, batches.close


def collate_samples(samples: list) -> tuple:
    """``(images, labels, indices)`` of a list of ``(image, label, index)``: images as one
    uint8 tensor (N, H, W, C) when they are arrays (a list of ``bytes`` otherwise), labels
    and indices as int64 tensors."""
    import torch

    images = [sample[0] for sample in samples]
    if isinstance(images[0], np.ndarray):
        images = torch.from_numpy(np.stack(images))
    labels = torch.tensor([sample[1] for sample in samples], dtype=torch.int64)
    indices = torch.tensor([sample[2] for sample in samples], dtype=torch.int64)
    return images, labels, indices


def _make_dataset_class():
    """``DecodingStreamingDataset``, a ``streaming.StreamingDataset`` subclass, made on
    first use: streaming is imported only here (the main environment has none)."""
    streaming = import_streaming()

    class DecodingStreamingDataset(streaming.StreamingDataset):
        """streaming's StreamingDataset, decoding each sample in ``__getitem__`` (in the
        DataLoader's workers) as streaming's docs show; yields ``(image, label, index)``."""

        def __init__(self, *, decode: str | None, channels: int, resize=None, crop=None,
                     **kwargs):
            super().__init__(**kwargs)
            self.decode = decode
            self.channels = channels
            self.resize = resize
            self.crop = crop

        def __getitem__(self, idx: int):
            try:
                sample = super().__getitem__(idx)
            except (OSError, ValueError, IndexError, KeyError) as err:
                raise DatasetError(f"{self.shard_file(idx)}: sample {idx}: streaming cannot "
                                   f"read it: {err!r}") from err
            stored_index, image, label = sample["index"], sample["image"], sample["label"]
            if stored_index != idx:
                raise DatasetError(
                    f"{self.shard_file(idx)}: sample {idx}: the record holds sample "
                    f"{stored_index}: shard damaged or out of place")
            if not isinstance(image, np.ndarray):
                if self.decode is None:
                    return bytes(image), label, stored_index
                try:
                    image = decode_image(image, self.decode, self.channels)
                except (ValueError, OSError, SyntaxError) as err:
                    raise DatasetError(
                        f"{self.shard_file(idx)}: sample {idx}: cannot decode: {err}") from err
            if self.resize is not None:
                image = self.resize(image)
            if self.crop is not None:
                # streaming starts epoch e by setting its shared counter to e + 1.
                image = self.crop(image, index=int(stored_index),
                                  epoch=int(self.next_epoch) - 1)
            return image, label, stored_index

        def shard_file(self, idx: int) -> str:
            """The shard holding sample ``idx`` (for messages)."""
            try:
                shard_id, _ = self.spanner[idx]
                shard = self.shards[shard_id]
                return os.path.join(shard.dirname, shard.raw_data.basename)
            except Exception:  # only naming the file for a message: fall back to the dir
                return str(self.streams[0].local)

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
    return tracked_loader_class(import_streaming().StreamingDataLoader)


class MDSBatches:
    """Re-iterable epochs of ``Batch``es from streaming's pipeline (see the module doc)."""

    def __init__(self, root: Path, options: PathOptions, *, remote: str | None = None,
                 cache_dir: str | None = None) -> None:
        _, self.spec = open_peer_dataset(root, FORMAT_NAME, what="MDS shards")
        self.root = root
        self.num_samples = self.spec.num_samples
        decode, resize = self._check_decode(options)
        if remote is not None and not cache_dir:
            raise ValueError(f"{root}: reading MDS shards from {remote} needs a cache_dir")
        # ``remote`` (``s3://...``, reached through S3_ENDPOINT_URL): streaming downloads
        # index.json and each shard into ``cache_dir`` before reading it there, as its
        # docs' remote/local pair does; later epochs read the downloaded shards.
        self.dataset = _make_dataset_class()(
            local=str(cache_dir if remote is not None else root), remote=remote,
            shuffle=bool(options.shuffle),
            shuffle_algo=SHUFFLE_ALGO, shuffle_seed=int(options.seed),
            batch_size=int(options.batch_size), num_canonical_nodes=1,
            decode=decode, channels=self.spec.channels, resize=resize,
            crop=training_crop(options),
        )
        try:
            # Streaming splits the samples over the ranks it reads from the environment.
            world = self.dataset._unique_rank_world
            check_rank(root, "MosaicML Streaming", (world.rank, world.num_ranks), options)
            self.workers = max(int(options.workers), 0)
            extra = {"multiprocessing_context": options.start_method} if (
                self.workers and options.start_method) else {}
            self.loader = _make_loader_class()(
                self.dataset, batch_size=int(options.batch_size), num_workers=self.workers,
                collate_fn=collate_samples, **extra)
        except BaseException:
            self._release_dataset()
            raise
        self._closed = False

    def _check_decode(self, options: PathOptions):
        """``(decode, resize transform)`` for this dataset, refusing combinations that
        cannot make one uint8 array per batch."""
        decode = options.decode
        decoded_arrays(self.root, self.spec, decode, options.resize,
                       cropped=options.transform is not None)
        if not options.resize:
            return decode, None
        from ..transforms import Resize

        return decode, Resize(*options.resize)

    @property
    def epoch(self) -> int:
        """Epochs started so far (streaming's own counter, in shared memory)."""
        return int(self.dataset.next_epoch)

    def __iter__(self) -> Iterator[Batch]:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        self._stop_workers()  # an epoch left unfinished
        return self._epoch()

    def _epoch(self) -> Iterator[Batch]:
        # One process reads every sample once. A rank reads streaming's share of the set
        # (its len()), which repeats as many samples as even shares need over every rank.
        ranks = self.dataset._unique_rank_world.num_ranks
        share = self.num_samples if ranks == 1 else len(self.dataset)
        padding = share * ranks - self.num_samples
        seen = np.zeros(self.num_samples, dtype=bool)
        count = repeats = 0
        for images, labels, indices in self.loader:
            indices = indices.numpy().astype(np.int64, copy=False)
            again = [int(i) for k, i in enumerate(indices) if seen[i] or i in indices[:k]]
            repeats += len(again)
            if repeats > padding:
                raise DatasetError(f"{self.root}: streaming delivered sample {again[0]} twice "
                                   "in one epoch")
            seen[indices] = True
            count += len(indices)
            if not isinstance(images, list):
                images = images.numpy()
            yield Batch(images, labels.numpy().astype(np.int64, copy=False), indices)
        if count != share:
            detail = (f"samples (first missing: {np.flatnonzero(~seen)[:5]})" if ranks == 1
                      else "samples of this rank's share")
            raise DatasetError(f"{self.root}: the epoch ended after {count} of {share} "
                               f"{detail}")

    def _stop_workers(self) -> None:
        iterator, self.loader.live_iterator = self.loader.live_iterator, None
        shut_down_dataloader_workers(iterator)

    def close(self) -> None:
        """Stop the current epoch's workers (if any), end the dataset's threads and remove
        its shared memory and lock files. Idempotent."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._stop_workers()
        self._release_dataset()

    def _release_dataset(self) -> None:
        dataset = self.dataset
        iterator = getattr(dataset, "_iterator", None)  # workers=0: threads in this process
        if iterator is not None:
            iterator.exit()
        executor = getattr(dataset, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        release_shared_state(dataset)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r}, workers={getattr(self, 'workers', 0)})"


def dataset_shared_names(prefix: int) -> tuple[list[str], list[Path]]:
    """The shared-memory names and lock files a StreamingDataset with shared-memory
    prefix ``prefix`` may create (streaming's own constants)."""
    import_streaming()
    from streaming.base.constant import BARRIER_FILELOCK, CACHE_FILELOCK, SHM_TO_CLEAN
    from streaming.base.shared.prefix import _get_path

    names = [_get_path(prefix, name) for name in SHM_TO_CLEAN]
    locks = [Path(tempfile.gettempdir()) / _get_path(prefix, name)
             for name in (BARRIER_FILELOCK, CACHE_FILELOCK)]
    return names, locks


def release_shared_state(dataset) -> None:
    """Remove what ``dataset`` (a StreamingDataset) holds beyond its own process: its shared
    memory segments (closed and unlinked through streaming's ``SharedMemory.cleanup``, whose
    exit handlers are then unregistered; any other segment of its prefix, made by a worker,
    unlinked by name) and its lock files. Only this dataset's prefix is touched."""
    prefix = getattr(dataset, "_shm_prefix_int", None)
    if prefix is None:
        return
    owned = [getattr(dataset, "_locals_shm", None), getattr(dataset, "_resume_shm", None)]
    barrier = getattr(dataset, "_shared_barrier", None)
    owned.append(getattr(getattr(barrier, "_arr", None), "shm", None))
    for name in ("_next_epoch", "_cache_usage"):
        owned.append(getattr(getattr(getattr(dataset, name, None), "arr", None), "shm", None))
    for name in ("_shard_states", "_shard_access_times"):
        owned.append(getattr(getattr(dataset, name, None), "shm", None))
    for shm in owned:
        if shm is None:
            continue
        atexit.unregister(shm.cleanup)
        with contextlib.suppress(BufferError, OSError):  # a view still exported: see below
            shm.cleanup()
    names, locks = dataset_shared_names(prefix)
    for path in [SHM_DIR / name for name in names] + locks:
        path.unlink(missing_ok=True)
