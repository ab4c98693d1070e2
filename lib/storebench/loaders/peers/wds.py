"""WebDataset's own loader pipeline over a storebench ``webdataset`` dataset (tar shards).

What WebDataset recommends (its README, "WebDataset + DataLoader"): a ``wds.WebDataset(urls,
shardshuffle=...)`` pipeline that splits the shard list between DataLoader workers
(``split_by_worker``), shuffles the shards a worker holds, streams their tars, shuffles
samples in a buffer (``.shuffle(1000)``), decodes by file extension (``.decode(...)``),
picks the fields (``.to_tuple(...)``) and batches in the worker (``.batched(batch_size)``),
inside ``torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=...)`` so that
workers hand over whole batches (``wds.WebLoader`` is that DataLoader with a fluent API).

What is used: exactly that, with ``torch.utils.data.DataLoader`` (non-persistent workers,
``options.start_method`` when given, PyTorch's defaults otherwise), ``shardshuffle`` = the
number of shards (a full permutation of each worker's shards), a 1,000-sample buffer, and
these decoders, all run in the workers: ``.npy`` raw pixels by WebDataset's default handler
(``numpy.lib.format``), JPEG through a custom handler calling
``simplejpeg.decode_jpeg(data, colorspace="RGB")`` (``"GRAY"`` for one-channel specs),
``decode="pil"`` through Pillow and ``decode="auto"`` simplejpeg for JPEG, Pillow for PNG
(``storebench.loaders.datasets``' rules); ``decode=None`` on an encoded set yields the
stored bytes. ``.cls`` is WebDataset's own int decoder; a sample's index is its key.

Epochs and shuffle. Each ``iter(batches)`` is one epoch: a fresh pipeline and DataLoader,
seeded with ``(options.seed, epoch number)`` for both the shard shuffle and the sample
buffer, so epochs differ and a run is reproducible. WebDataset's seeds are the same in every
worker (its own ``seed=`` design); the workers' shards differ. Worker ``w`` of ``W`` always
holds shards ``w, w + W, ...`` (``split_by_worker``): shuffling permutes shards within a
worker, then samples within a 1,000-sample window, never across workers. The DataLoader
takes batches from the workers in turn.

Shuffle off: ``shardshuffle=False`` and no buffer, so each worker yields its shards in
order, samples in stored order; the epoch interleaves the workers' batches (with 2 workers:
samples 0.. of shard 0, then those of shard 1, then the next batch of shard 0...). With
``workers <= 1`` that is plain index order.

Compromises. Batches are made in the workers, so each worker's last batch of an epoch may
be short: an epoch holds up to ``workers`` short batches, not one. ``split_by_worker`` gives
a worker without a shard nothing to do (and WebDataset then raises "No samples found"), so
the DataLoader runs ``min(options.workers, number of shards)`` workers (``batches.workers``).
WebDataset checks little: Python's ``tarfile`` takes a shard cut short at a member boundary
for the end of the archive (samples go missing silently), one cut inside a member gives a
partial sample (a missing field in ``to_tuple``), a damaged image is its decoder's error, and
none of these name the shard. So the manifest's file sizes and fingerprints are checked
before the first epoch, an epoch that delivers another number of samples than the dataset
holds is an error, and any failure is re-raised as ``DatasetError`` naming the damaged file
where the manifest's checks find one (the worker's exception chained).

``close()`` shuts down the workers of an epoch left unfinished, through the DataLoader
iterator's ``_shutdown_workers`` (what its ``__del__`` calls).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ...formats import DatasetError
from ...formats.manifest import check_files
from ...formats.webdataset_tar import (
    IMAGE_EXTS,
    LABEL_EXT,
    samples_per_shard_of,
    shard_bounds,
    shard_paths,
)
from ...formats.webdataset_tar import NAME as FORMAT_NAME
from ..batching import Batch
from ..paths import PathOptions
from . import (
    EpochCrop,
    check_rank,
    decoded_arrays,
    open_peer_dataset,
    shut_down_dataloader_workers,
    training_crop,
)

SHUFFLE_BUFFER = 1000  # samples: the size WebDataset's README uses


def webdataset_batches(dataset, sampler, options: PathOptions):
    """``(batches, close)`` over the ``webdataset`` dataset at ``options.root``."""
    batches = WebDatasetBatches(Path(options.root), options)
    return batches, batches.close


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of epoch ``epoch`` of a run seeded with ``seed``."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def decode_simplejpeg(data: bytes, *, colorspace: str) -> np.ndarray:
    import simplejpeg

    image = simplejpeg.decode_jpeg(data, colorspace=colorspace)
    return image.reshape(*image.shape[:2], -1)


def decode_pil(data: bytes, *, mode: str) -> np.ndarray:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        image = np.asarray(img if img.mode == mode else img.convert(mode))
    return image.reshape(*image.shape[:2], -1)


def image_handlers(decode: str | None, channels: int) -> list:
    """WebDataset decoder handlers (by extension) for ``decode``."""
    import webdataset as wds

    jpeg = functools.partial(decode_simplejpeg, colorspace="GRAY" if channels == 1 else "RGB")
    pil = functools.partial(decode_pil, mode="L" if channels == 1 else "RGB")
    if decode is None:
        return []
    if decode == "simplejpeg":
        return [wds.handle_extension("jpg", jpeg)]
    if decode == "pil":
        return [wds.handle_extension("jpg png", pil)]
    return [wds.handle_extension("jpg", jpeg), wds.handle_extension("png", pil)]  # auto


def _identity(x):
    return x


class CroppedSample:
    """An ``(image, label, index)`` sample with its image through ``crop``; picklable for
    spawned workers."""

    def __init__(self, crop: EpochCrop) -> None:
        self.crop = crop

    def __call__(self, sample: tuple) -> tuple:
        image, label, index = sample
        return self.crop(image, index), label, index


class WebDatasetBatches:
    """Re-iterable epochs of ``Batch``es from WebDataset's pipeline (see the module doc)."""

    def __init__(self, root: Path, options: PathOptions, *, urls=None,
                 cache_dir: str | None = None) -> None:
        manifest, self.spec = open_peer_dataset(root, FORMAT_NAME, what="tar shards")
        self.root = root
        self._manifest = manifest
        self.options = options
        local = [str(path) for path in shard_paths(root, manifest)]
        if urls is not None and len(urls) != len(local):
            raise ValueError(f"{root}: {len(urls)} shard URLs for {len(local)} shards")
        # Remote shards (``urls``, in the order of the local build's): WebDataset opens
        # each with gopen (curl for http(s)); with ``cache_dir`` its FileCache downloads a
        # shard whole before reading it, and later epochs read the cached copy.
        self.urls = list(urls) if urls is not None else local
        self.cache_dir = cache_dir
        if options.world_size > 1:
            import webdataset as wds

            # WebDataset's node split (split_by_node): every world_size-th shard.
            check_rank(root, "WebDataset", wds.utils.pytorch_worker_info()[:2], options)
        # This rank's shards (split_by_node's cut) and the samples they hold.
        mine = range(options.rank, len(self.urls), options.world_size)
        bounds = shard_bounds(self.spec.num_samples, samples_per_shard_of(manifest, root))
        self.share = int(sum(bounds[i + 1] - bounds[i] for i in mine))
        self.workers = min(max(int(options.workers), 0), len(mine))
        encoding, decode = self.spec.encoding, options.decode
        self._crop = training_crop(options)
        arrays = decoded_arrays(root, self.spec, decode, options.resize,
                                cropped=self._crop is not None)
        self._handlers = image_handlers(decode, self.spec.channels)
        self._arrays = arrays
        self._image_field = ";".join(IMAGE_EXTS[encoding])
        self.epoch = 0
        self._iterator = None

    def pipeline(self, epoch: int):
        """Epoch ``epoch``'s ``wds.WebDataset`` pipeline, as WebDataset's README builds it."""
        import webdataset as wds

        seed = epoch_seed(self.options.seed, epoch)
        shuffle = self.options.shuffle
        # Across ranks, WebDataset's README splits the shards by node; one process reads
        # them all (single_node_only, its default, refuses a distributed run).
        nodes = wds.split_by_node if self.options.world_size > 1 else wds.single_node_only
        dataset = wds.WebDataset(
            self.urls, shardshuffle=len(self.urls) if shuffle else False, seed=seed,
            nodesplitter=nodes, **({"cache_dir": self.cache_dir} if self.cache_dir else {}),
        )
        if shuffle:
            dataset = dataset.shuffle(SHUFFLE_BUFFER, seed=seed)
        transform = _identity
        if self.options.resize:
            from ..transforms import Resize

            transform = Resize(*self.options.resize)
        samples = (dataset.decode(*self._handlers)
                   .to_tuple(self._image_field, LABEL_EXT, "__key__")
                   .map_tuple(transform, _identity, int))
        if self._crop is not None:
            # The training crop in WebDataset's map step, keyed by the sample's index.
            samples = samples.map(CroppedSample(EpochCrop(self._crop, epoch)))
        return samples.batched(self.options.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        from torch.utils.data import DataLoader

        self.close()  # an epoch left unfinished
        epoch, self.epoch = self.epoch, self.epoch + 1
        extra = {"multiprocessing_context": self.options.start_method} if (
            self.workers and self.options.start_method) else {}
        loader = DataLoader(self.pipeline(epoch), batch_size=None, num_workers=self.workers,
                            **extra)
        self._iterator = iter(loader)
        return self._batches(self._iterator)

    def _batches(self, iterator) -> Iterator[Batch]:
        delivered = 0
        try:
            for images, labels, keys in iterator:
                if self._arrays:
                    images = images.numpy()
                delivered += len(labels)
                yield Batch(images, labels.numpy().astype(np.int64, copy=False),
                            keys.numpy().astype(np.int64, copy=False))
        except Exception as err:
            summary = (str(err).strip().splitlines() or [""])[-1]
            raise self._failure(
                f"WebDataset's pipeline failed: {type(err).__name__}: {summary}") from err
        finally:
            if self._iterator is iterator:
                self.close()
        if delivered != self.share:
            # tarfile takes a shard cut at a member boundary for its end: samples go missing
            # without an error from WebDataset.
            whose = ("the dataset has" if self.options.world_size == 1 else
                     f"rank {self.options.rank}'s shards hold")
            raise self._failure(f"an epoch delivered {delivered} samples, {whose} "
                                f"{self.share}")

    def _failure(self, reason: str) -> DatasetError:
        """``reason`` as a DatasetError naming the damaged file when the manifest's sizes
        and fingerprints find one (WebDataset's errors do not name the shard)."""
        try:
            check_files(self.root, self._manifest)
        except DatasetError as damaged:
            return DatasetError(f"{reason}; {damaged}")
        return DatasetError(f"{self.root}: {reason}")

    def close(self) -> None:
        """Stop the current epoch's workers (if any are left)."""
        iterator, self._iterator = self._iterator, None
        shut_down_dataloader_workers(iterator)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r}, workers={self.workers})"
