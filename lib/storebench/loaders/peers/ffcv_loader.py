"""The ``ffcv`` loader path: FFCV's own ``Loader`` over the dataset's ``data.beton``.

What FFCV recommends (docs.ffcv.io, its ImageNet example): a ``.beton`` written by
``DatasetWriter``, read by ``ffcv.loader.Loader(path, batch_size, num_workers, order,
os_cache, pipelines)`` with a decoder per field; with ``os_cache=True`` the file is memory
mapped and the page cache shared, the right choice when the data fits in RAM. This path uses
exactly that: ``order=OrderOption.RANDOM`` (a full permutation from ``seed + epoch``) when
``options.shuffle``, else ``SEQUENTIAL``; ``drop_last=False``; pipelines
``image: [SimpleRGBImageDecoder()]`` (raw pixels are copied, JPEGs decoded by FFCV's compiled
libjpeg-turbo ``imdecode``, whatever ``options.decode`` names), ``label`` and ``index``:
``[IntDecoder()]``, and no ``ToTensor``, so batches come out as NumPy arrays.

FFCV's ``imdecode`` uses libjpeg-turbo's fast integer DCT (``TJFLAG_FASTDCT``): its pixels are
exactly ``simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True)``'s, and differ from the
other paths' default (accurate DCT) simplejpeg decode by a mean absolute difference of about
1.0 per pixel value (up to ~1.4 for one 64x64 image of the ci set). FFCV offers no choice.

FFCV's workers are threads, not processes: ``num_workers`` is the size of the numba thread
pool its compiled pipeline runs batches on (``options.workers``; FFCV reads 0 as "every
core", so 0 becomes 1 here), and one ``EpochIterator`` thread per epoch prepares batches
ahead (``batches_ahead=3``). Building the ``Loader`` compiles its pipeline with numba (about
2.5 s, before the first batch: the case's time to first batch includes it).

FFCV reuses its output buffers (``batches_ahead + 2`` slots): each ``Batch`` here holds copies,
valid after the next batch arrives. Every ``iter()`` of the returned batches is one epoch of
the same ``Loader``; ``close()`` stops the epoch in flight and joins its thread.

FFCV stores no checksums and reads through a memory map with no bounds it reports, so the
dataset is first opened with storebench's reader (``verify=False``): the manifest, the file's
size and fingerprint, and the structure of the file's tables are checked, and a damaged or
truncated file is a ``DatasetError`` naming it before FFCV touches it. A damaged sample byte
inside a page goes unseen (FFCV's decoder ignores libjpeg-turbo's errors).

PNG and mixed datasets (``BytesField``) are refused: FFCV has no PNG decoder. Images of mixed
sizes are refused too: ``SimpleRGBImageDecoder`` needs one size, and FFCV's resizing decoders
crop (``RandomResizedCrop``/``CenterCrop``), unlike the other paths' resize.
"""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np

from ...formats import DatasetError, ffcv_beton, open_dataset, read_manifest
from ...formats.specs import fixed_size, spec_from_dict
from ..batching import Batch
from ..paths import TRAINING_CROP, Batches, PathOptions
from . import CROP_RATIO, CROP_SCALE, TRAIN, check_rank

# How long close() waits for FFCV's epoch thread to end (it polls its stop flag every 0.5 s).
_JOIN_SECONDS = 10.0
# While waiting for a batch, how often to check that FFCV's epoch thread is still alive.
_POLL_SECONDS = 1.0


def ffcv_batches(dataset, sampler, options: PathOptions) -> Batches:
    root = Path(options.root)
    manifest = read_manifest(root)
    if manifest["format"] != ffcv_beton.NAME:
        raise DatasetError(f"{root}: the ffcv path reads FFCV datasets, this one is "
                           f"{manifest['format']!r}")
    spec = spec_from_dict(manifest["spec"])
    if spec.encoding not in ("raw", "jpeg"):
        raise DatasetError(
            f"{root}: FFCV decodes JPEG (libjpeg-turbo) and raw pixels only; this dataset is "
            f"{spec.encoding} (stored as a BytesField, which FFCV has no image decoder for)")
    if options.transform not in (None, TRAIN):
        raise ValueError(f"unknown transform {options.transform!r}; known: {TRAIN!r}")
    if not fixed_size(spec) and options.transform is None:
        raise DatasetError(
            f"{root}: images of mixed sizes: FFCV's SimpleRGBImageDecoder needs one size, and "
            "its resizing decoders crop")
    with open_dataset(root, verify=False):
        pass  # manifest, size, fingerprint and table checks: refuse a damaged file here
    loader = _make_loader(root / ffcv_beton.FILENAME, options)
    batches = FFCVBatches(loader)
    return batches, batches.close


def _image_pipeline(options: PathOptions) -> list:
    """FFCV's image pipeline: the plain decode, or with ``options.transform`` "train" FFCV's
    own training ops (its random resized crop decoder, scale and ratio as torchvision's, and
    its random flip): the same work as storebench's seeded crop, FFCV's own random draws."""
    from ffcv.fields.decoders import RandomResizedCropRGBImageDecoder, SimpleRGBImageDecoder
    from ffcv.transforms import RandomHorizontalFlip

    if options.transform == TRAIN:
        return [RandomResizedCropRGBImageDecoder((TRAINING_CROP, TRAINING_CROP),
                                                 scale=CROP_SCALE, ratio=CROP_RATIO),
                RandomHorizontalFlip()]
    return [SimpleRGBImageDecoder()]


def _make_loader(path: Path, options: PathOptions):
    from ffcv.fields.decoders import IntDecoder
    from ffcv.loader import Loader, OrderOption

    distributed = options.world_size > 1
    if distributed:
        import torch.distributed as dist

        # FFCV's distributed order is torch's DistributedSampler, reading this rank.
        seen = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        check_rank(path.parent, "FFCV", seen, options)
    return Loader(
        str(path),
        batch_size=options.batch_size,
        num_workers=max(1, options.workers),
        order=OrderOption.RANDOM if options.shuffle else OrderOption.SEQUENTIAL,
        seed=options.seed,
        drop_last=False,
        os_cache=True,
        distributed=distributed,
        pipelines={
            "image": _image_pipeline(options),
            "label": [IntDecoder()],
            "index": [IntDecoder()],
        },
    )


class FFCVBatches:
    """An FFCV ``Loader`` as re-iterable epochs of ``Batch``es (copies of FFCV's buffers)."""

    def __init__(self, loader) -> None:
        self.loader = loader
        self._epochs: set = set()  # FFCV's EpochIterators (threads) of epochs in flight

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        epoch = iter(self.loader)  # starts FFCV's thread for the next epoch's order
        self._epochs.add(epoch)
        try:
            while (result := _next_result(epoch)) is not None:
                images, labels, indices = result
                yield Batch(np.array(images, dtype=np.uint8),
                            labels.reshape(-1).astype(np.int64),
                            indices.reshape(-1).astype(np.int64))
        finally:
            _stop(epoch)
            self._epochs.discard(epoch)

    def close(self) -> None:
        """Stop the epochs in flight, if any, and wait for their threads."""
        while self._epochs:
            _stop(self._epochs.pop())


def _stop(epoch) -> None:
    """End FFCV's epoch thread: set its stop flag, and drain its queue (a thread blocked
    putting its end marker into a full queue never sees the flag) until it has ended."""
    epoch.close()
    waited = 0.0
    while epoch.is_alive() and waited < _JOIN_SECONDS:
        _drain(epoch.output_queue)
        epoch.join(0.1)
        waited += 0.1
    _drain(epoch.output_queue)


def _drain(q: queue.Queue) -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


def _next_result(epoch):
    """``next(epoch)``, without hanging if FFCV's thread died (its own ``__next__`` waits
    forever then): the batch's arrays, or None at the end of the epoch."""
    while True:
        try:
            item = epoch.output_queue.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            if not epoch.is_alive() and epoch.output_queue.empty():
                raise DatasetError(
                    f"{epoch.loader.fname}: FFCV's loader thread ended before the epoch did "
                    "(its traceback is on stderr)") from None
            continue
        if item is None:
            return None
        return item[1]  # (buffer slot, arrays)
