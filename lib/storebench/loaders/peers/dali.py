"""NVIDIA DALI's CPU pipelines over our ``rawfiles`` and ``tfrecord`` datasets.

What DALI recommends: a ``@pipeline_def`` graph of a reader (``fn.readers.file`` for a
directory of image files, ``fn.readers.tfrecord`` with ``tfrecord2idx`` index files for
TFRecord) feeding ``fn.decoders.image``, built once and run batch after batch, with the
reader named so that its epoch size can be asked (``pipe.epoch_size("Reader")``) and
``pad_last_batch=True`` so that an epoch ends on a batch boundary. Its framework iterators
(``DALIGenericIterator`` ...) wrap exactly this; here the batches come from ``pipe.run()``
and are turned into NumPy arrays, so that no framework is imported.

What is used: ``device_id=None`` (a CPU-only pipeline: this machine has no GPU),
``num_threads=max(1, options.workers)`` (DALI runs threads in this process, not worker processes),
``seed=options.seed``, the reader with ``random_shuffle=options.shuffle``,
``initial_fill=1024`` and ``pad_last_batch=True``, and for encoded images
``fn.decoders.image(device="cpu", output_type=types.RGB)`` (nvImageCodec's libjpeg-turbo for
JPEG: on the ci images every pixel equals simplejpeg's; the tests allow a mean absolute
difference of 1 grey level, as another IDCT could give). Raw-pixel datasets are read too:
``rawfiles`` raw through ``fn.readers.numpy`` (its ``.npy`` files), ``tfrecord`` raw by
reshaping the record's ``image`` bytes to (H, W, C).
``options.resize`` (images of different sizes) resizes with ``fn.resize`` (DALI's default
antialiased linear filter), not with our ``Resize``.

Epochs. Every ``iter(batches)`` is one epoch of the same pipeline: ``ceil(n / batch_size)``
runs, the last trimmed to the epoch's remaining samples (``pad_last_batch`` fills it with
copies of the epoch's last sample). The pipeline's generator is seeded once, so each epoch's
order is fixed by ``options.seed`` and the epoch's number, and differs from the previous
one's. An epoch left unfinished (a ``break``) is run to its end, its batches discarded, when
the next one begins.

Shuffle. ``random_shuffle`` is a shuffle buffer, not a permutation: the reader fills a
1,024-sample buffer in stored order and draws each sample at random from it, refilling from
the stored order. No sample comes out more than 1,024 places before its stored position, so
on a dataset much larger than the buffer the order stays close to stored order ("the buffer
shuffles the data only locally", DALI's docs say); on a dataset of at most 1,024 samples it
is a full shuffle. For TFRecord the shards are read in the order given, shard after shard,
records in stored order, into the buffer.

Sample indices and labels. DALI tags every sample with its source (``source_info()``),
which survives decoding: the file's path for ``readers.file`` / ``readers.numpy``
(``root/<class>/<index>.jpg``: the index is in the name) and ``"<shard> at index
<byte offset>"`` for ``readers.tfrecord`` (the record's offset, mapped to its sample index
through the ``.idx`` files the build writes beside the shards, which DALI reads too).
Labels are DALI's own: for ``readers.file`` the ``labels`` list passed with ``files``
(each file's class directory, the build's label), for TFRecord the record's ``label``
feature. ``readers.numpy`` has no labels: those come from the class directories.

Errors. DALI raises ``RuntimeError`` when a batch fails (a missing or unreadable file, a
shard shorter than its index says, an image its decoder refuses), after which the pipeline
is unusable; that is re-raised as ``DatasetError`` with the dataset's root and DALI's message,
plus the first file the manifest's sizes and fingerprints find damaged (some of DALI's
decoder errors name no sample). DALI does not check TFRecord CRCs: changed bytes inside an
image that still decodes give other pixels without an error. DALI 2.4 itself crashes
(SIGSEGV in a thread of ``ImageDecoder<CPUBackend>``) on most runs over an image whose
format its parser does not recognise at all (zeroed header, random or text bytes), after or
instead of raising "nvImageCodec failure"; a truncated JPEG is a clean error naming the file.
The DALI index files are checked against the manifest before DALI reads them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

import numpy as np

from ...formats import DatasetError, read_manifest
from ...formats.manifest import check_files, check_fingerprint
from ...formats.rawfiles import class_dirs
from ...formats.specs import fixed_size, spec_from_dict
from ...formats.tfrecord import dali_index_path, shard_paths
from ..batching import Batch
from ..paths import TRAINING_CROP, PathOptions
from ..train_transform import CROP_TRIES
from . import CROP_RATIO, CROP_SCALE, TRAIN

READER_NAME = "Reader"
INITIAL_FILL = 1024  # DALI's default shuffle buffer, in samples
_TFRECORD_SOURCE = " at index "


class DaliEpochs:
    """Batches of a DALI pipeline, one epoch per ``iter``; ``close()`` ends its threads.

    ``outputs`` turns one ``pipe.run()``'s outputs into (images, labels, indices) arrays.
    """

    def __init__(self, pipe, outputs: Callable, root: Path, manifest: dict) -> None:
        self._pipe = pipe
        self._outputs = outputs
        self.root = root
        self.manifest = manifest
        self.batch_size = int(pipe.max_batch_size)
        self.epoch_size = shard_size(pipe.reader_meta(READER_NAME))
        self.runs_per_epoch = math.ceil(self.epoch_size / self.batch_size)
        self._runs_left = 0  # of an epoch left unfinished
        self.epochs_begun = 0

    def __len__(self) -> int:
        return self.runs_per_epoch

    def _run(self):
        if self._pipe is None:
            raise RuntimeError(f"{self.root}: the DALI pipeline is closed")
        try:
            return self._pipe.run()
        except RuntimeError as err:
            raise DatasetError(
                f"{self.root}: DALI failed to read a batch{self._damaged_file()}: {err}"
            ) from err

    def _damaged_file(self) -> str:
        """Which file differs from the build (its size or fingerprint), as text: DALI's
        decoder errors do not name the sample. Only called once DALI has failed."""
        try:
            check_files(self.root, self.manifest)
        except DatasetError as err:
            return f" ({err})"
        return ""

    def __iter__(self) -> Iterator[Batch]:
        while self._runs_left:  # the rest of an epoch the previous iteration left
            self._run()
            self._runs_left -= 1
        self.epochs_begun += 1
        self._runs_left = self.runs_per_epoch
        remaining = self.epoch_size
        while self._runs_left:
            run = self._run()
            self._runs_left -= 1
            images, labels, indices = self._outputs(run)
            count = min(remaining, len(indices))  # pad_last_batch: drop the padding
            remaining -= count
            yield Batch(images[:count], labels[:count], indices[:count])

    def close(self) -> None:
        """Delete the pipeline, which stops its threads."""
        pipe, self._pipe = self._pipe, None
        del pipe


def shard_size(meta: dict) -> int:
    """Samples in this reader's shard for one epoch, as DALI cuts the set (shard ``s`` of
    ``k`` holds ``[n * s // k, n * (s + 1) // k)``); the whole set for one shard."""
    total, shards, shard = (int(meta[key]) for key in ("epoch_size", "number_of_shards",
                                                       "shard_id"))
    return total * (shard + 1) // shards - total * shard // shards


def _spec_and_manifest(root: Path):
    manifest = read_manifest(root)
    return spec_from_dict(manifest["spec"]), manifest


def _check_options(options: PathOptions, spec, root: Path) -> None:
    if options.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {options.batch_size}")
    if not fixed_size(spec) and options.resize is None and options.transform is None:
        raise ValueError(f"{root}: images of different sizes need options.resize to batch")
    if options.transform not in (None, TRAIN):
        raise ValueError(f"unknown transform {options.transform!r}; known: {TRAIN!r}")


def _pipeline_kwargs(options: PathOptions) -> dict:
    # Each rank's pipeline its own seed, as DALI's ImageNet example offsets it by the rank:
    # one seed would draw the same crops on every rank.
    return {"batch_size": options.batch_size, "num_threads": max(1, options.workers),
            "device_id": None, "seed": options.seed + options.rank}


def _reader_kwargs(options: PathOptions) -> dict:
    # Across ranks, DALI's readers shard the set themselves (shard_id / num_shards).
    return {"random_shuffle": options.shuffle, "initial_fill": INITIAL_FILL,
            "pad_last_batch": True, "name": READER_NAME, "shard_id": options.rank,
            "num_shards": options.world_size}


def _train_crop_kwargs() -> dict:
    """DALI's random resized crop drawn as torchvision's (``RandomResizedCropFlip``'s)."""
    return {"random_area": list(CROP_SCALE), "random_aspect_ratio": list(CROP_RATIO),
            "num_attempts": CROP_TRIES}


def _flip(images):
    """A horizontal flip with probability one half, as DALI's ImageNet examples flip:
    ``crop_mirror_normalize`` with a coin flip (``fn.flip`` drops the samples' source info,
    which names each sample's file)."""
    from nvidia.dali import fn, types

    return fn.crop_mirror_normalize(images, mirror=fn.random.coin_flip(probability=0.5),
                                    dtype=types.UINT8, output_layout="HWC")


def _decode(encoded, options: PathOptions):
    from nvidia.dali import fn, types

    if options.transform == TRAIN:
        # DALI's own crop op: it decodes only the crop's region (libjpeg-turbo's
        # partial decode), then resizes and flips: the training transform in DALI's ops.
        images = fn.decoders.image_random_crop(encoded, device="cpu", output_type=types.RGB,
                                               **_train_crop_kwargs())
        images = fn.resize(images, resize_x=TRAINING_CROP, resize_y=TRAINING_CROP,
                           dtype=types.UINT8)
        return _flip(images)
    images = fn.decoders.image(encoded, device="cpu", output_type=types.RGB)
    if options.resize is not None:
        height, width = options.resize
        images = fn.resize(images, resize_x=width, resize_y=height, dtype=types.UINT8)
    return images


def _build(pipeline, root: Path):
    pipe = pipeline()
    try:
        pipe.build()
    except RuntimeError as err:
        raise DatasetError(f"{root}: DALI could not build its reader: {err}") from err
    return pipe


def _as_array(tensors, root: Path) -> np.ndarray:
    try:
        return tensors.as_array()
    except (RuntimeError, TypeError, ValueError) as err:
        raise DatasetError(f"{root}: DALI's batch does not stack into one array: {err}") from err


def _sources(tensors) -> list[str]:
    return [tensors[k].source_info() for k in range(len(tensors))]


# -- rawfiles: fn.readers.file / fn.readers.numpy ------------------------------------------
def rawfiles_listing(root: Path, spec, manifest: dict) -> tuple[list[str], np.ndarray]:
    """Every sample's file (absolute path, in index order) and label, from the manifest's
    file list (``<class>/<index>.<ext>``)."""
    label_of_dir = {name: label for label, name in enumerate(class_dirs(spec))}
    n = spec.num_samples
    files: list[str | None] = [None] * n
    labels = np.full(n, -1, dtype=np.int64)
    for rel in manifest["files"]:
        parts = PurePosixPath(rel).parts
        stem = PurePosixPath(rel).stem
        if len(parts) != 2 or parts[0] not in label_of_dir or not stem.isdigit() or (
                int(stem) >= n) or files[int(stem)] is not None:
            raise DatasetError(f"{root / rel}: not a file of the rawfiles layout "
                               "(<class>/<index>.<ext>, one per sample)")
        files[int(stem)] = str(root / rel)
        labels[int(stem)] = label_of_dir[parts[0]]
    missing = [i for i, path in enumerate(files) if path is None]
    if missing:
        raise DatasetError(f"{root}: the manifest lists no file for sample {missing[0]} "
                           f"({len(missing)} missing)")
    return files, labels


def dali_file_batches(dataset, sampler, options: PathOptions):
    """DALI ``fn.readers.file`` (or ``fn.readers.numpy`` for raw pixels) over the rawfiles
    dataset at ``options.root``: ``(DaliEpochs, close)``."""
    from nvidia.dali import fn, pipeline_def

    root = Path(options.root)
    spec, manifest = _spec_and_manifest(root)
    if manifest["format"] != "rawfiles":
        raise DatasetError(f"{root}: dali_file reads rawfiles datasets, not "
                           f"{manifest['format']!r}")
    _check_options(options, spec, root)
    files, labels = rawfiles_listing(root, spec, manifest)
    index_of = {path: i for i, path in enumerate(files)}
    raw = spec.encoding == "raw"

    @pipeline_def(**_pipeline_kwargs(options))
    def pipeline():
        if raw and options.transform == TRAIN:
            images = fn.reshape(fn.readers.numpy(files=files, **_reader_kwargs(options)),
                                layout="HWC")
            return _flip(fn.random_resized_crop(images, size=[TRAINING_CROP, TRAINING_CROP],
                                                **_train_crop_kwargs()))
        if raw:
            return fn.readers.numpy(files=files, **_reader_kwargs(options))
        encoded, label = fn.readers.file(files=files, labels=labels.tolist(),
                                         **_reader_kwargs(options))
        return _decode(encoded, options), label

    def outputs(run):
        images = run[0]
        try:
            indices = np.array([index_of[path] for path in _sources(images)], dtype=np.int64)
        except KeyError as err:
            raise DatasetError(f"{root}: DALI delivered a sample from {err}, not a file of "
                               "this dataset") from None
        batch_labels = labels[indices] if raw else _as_array(run[1], root).reshape(-1)
        return _as_array(images, root), batch_labels.astype(np.int64), indices

    batches = DaliEpochs(_build(pipeline, root), outputs, root, manifest)
    return batches, batches.close


# -- tfrecord: fn.readers.tfrecord --------------------------------------------------------
def _tfrecord_offsets(root: Path, manifest: dict, shards: list[Path],
                      num_samples: int) -> dict[tuple[str, int], int]:
    """``(shard path, record offset) -> sample index``, from DALI's ``.idx`` files (checked
    against the manifest's fingerprints; shards hold consecutive index ranges in order)."""
    index_of: dict[tuple[str, int], int] = {}
    for shard in shards:
        path = dali_index_path(shard)
        recorded = manifest["fingerprints"].get(path.name)
        if recorded is None:
            raise DatasetError(f"{path}: no DALI index in the manifest (a dataset built "
                               "before the build wrote them: rebuild it)")
        try:
            data = path.read_bytes()
        except OSError as err:
            raise DatasetError(f"{path}: unreadable DALI index: {err}") from err
        check_fingerprint(path, recorded, data)
        for number, line in enumerate(data.decode("ascii", "replace").splitlines()):
            fields = line.split()
            if len(fields) != 2 or not all(field.isdigit() for field in fields):
                raise DatasetError(f"{path}: line {number + 1} is not 'offset size': {line!r}")
            index_of[(str(shard), int(fields[0]))] = len(index_of)
    if len(index_of) != num_samples:
        raise DatasetError(f"{root}: the DALI indexes list {len(index_of)} records, the "
                           f"dataset has {num_samples} samples")
    return index_of


def dali_tfrecord_batches(dataset, sampler, options: PathOptions):
    """DALI ``fn.readers.tfrecord`` over the TFRecord dataset at ``options.root``, with the
    ``.idx`` index files its build wrote: ``(DaliEpochs, close)``."""
    import nvidia.dali.tfrecord as tfrec
    from nvidia.dali import fn, pipeline_def

    root = Path(options.root)
    spec, manifest = _spec_and_manifest(root)
    if manifest["format"] != "tfrecord":
        raise DatasetError(f"{root}: dali_tfrecord reads tfrecord datasets, not "
                           f"{manifest['format']!r}")
    _check_options(options, spec, root)
    shards = shard_paths(root)
    index_of = _tfrecord_offsets(root, manifest, shards, spec.num_samples)
    raw = spec.encoding == "raw"
    features = {"image": tfrec.FixedLenFeature((), tfrec.string, ""),
                "label": tfrec.FixedLenFeature([1], tfrec.int64, -1)}

    @pipeline_def(**_pipeline_kwargs(options))
    def pipeline():
        record = fn.readers.tfrecord(
            path=[str(p) for p in shards], index_path=[str(dali_index_path(p)) for p in shards],
            features=features, **_reader_kwargs(options))
        if raw:
            images = fn.reshape(record["image"], shape=list(spec.image_shape))
        else:
            images = _decode(record["image"], options)
        return images, record["label"]

    def outputs(run):
        images, labels = run
        indices = []
        for source in _sources(images):
            shard, _, offset = source.rpartition(_TFRECORD_SOURCE)
            try:
                indices.append(index_of[(shard, int(offset))])
            except (KeyError, ValueError):
                raise DatasetError(f"{root}: DALI delivered a record from {source!r}, not a "
                                   "record of this dataset's index") from None
        return (_as_array(images, root), _as_array(labels, root).reshape(-1).astype(np.int64),
                np.array(indices, dtype=np.int64))

    batches = DaliEpochs(_build(pipeline, root), outputs, root, manifest)
    return batches, batches.close
