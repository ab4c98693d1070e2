"""SPDL's own pipeline (``spdl.pipeline``) over our datasets: thread stages, and optionally
the whole pipeline in one multi-threaded subprocess.

What SPDL recommends (its docs, "Getting started" and the ImageNet example): a
``PipelineBuilder`` whose source yields what to load, ``pipe`` stages that do the I/O and the
GIL-releasing decode in a thread pool (``concurrency=`` tasks at a time), and a sink buffer;
``build(num_threads=...)`` runs it on one event loop in a background thread.
``run_pipeline_in_subprocess(config, num_threads=...)`` runs the same pipeline in one
subprocess, created once and reused across epochs ("MTP", its multi-threaded-process mode).

What is used: the source is ``BatchSampler(our sampler, batch_size)`` (one epoch per pass:
the source sets the sampler's epoch itself, so that a subprocess, which holds a pickled copy,
reshuffles as the main process would); stage ``read`` calls our reader's ``read_many`` for a
batch's indices (encoded bytes, or raw pixels); stage ``decode`` turns a batch of encoded
images into one (B, H, W, C) uint8 array, with simplejpeg (``spdl`` and ``spdl_process``) or
with SPDL's own FFmpeg-based ``spdl.io`` (``spdl_io``: ``demux_image`` +
``decode_packets`` + ``convert_frames``). Each stage runs ``options.workers`` tasks at a
time with ``output_order="input"`` (batches leave in the sampler's order), on a pool of
``options.workers`` threads; the sink holds 2 batches.

Decoders. spdl.io converts FFmpeg's YUV output to RGB with swscale, whose chroma upsampling
and rounding differ from libjpeg-turbo's; with ``SPDL_IO_FILTER`` (bicubic, full chroma
interpolation, accurate rounding) a 256x256 quality-90 image differs from simplejpeg's by
under one grey level on average, a 64x64 one by up to about 2.5. spdl.io needs FFmpeg's
shared libraries (apt: libavcodec, libavformat, libavfilter, libavdevice, libswscale,
libswresample, libavutil); where it cannot load them, ``spdl_io_unavailable()`` says why
and the path's rows are ``skipped`` with that reason.

``close()`` stops a pipeline left mid-epoch (its event loop thread and pool joined) and
shuts down the subprocess.
"""

from __future__ import annotations

import numpy as np

from ..batching import Batch
from ..paths import PathOptions
from . import decode_image, training_crop

SINK_BUFFER = 2
# swscale flags that bring FFmpeg's YUV -> RGB closest to libjpeg-turbo's (see the doc).
SPDL_IO_FILTER = "scale=flags=accurate_rnd+full_chroma_int+bicubic,format=pix_fmts=rgb24"
DECODERS = ("simplejpeg", "spdl.io")


class EpochSource:
    """The batches of one epoch, as ``(epoch, index array)``, each pass the next epoch's
    order. It keeps its own epoch count: in SPDL's subprocess the pickled sampler never sees
    the main process's ``set_epoch``; the decode stage's training crop takes it from here."""

    def __init__(self, sampler, batch_size: int) -> None:
        self.sampler = sampler
        self.batch_size = batch_size
        self.epoch = 0

    def __iter__(self):
        from ..samplers import BatchSampler

        epoch = self.epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        self.epoch += 1
        for indices in BatchSampler(self.sampler, self.batch_size):
            yield epoch, np.asarray(indices, dtype=np.int64)


class StageError:
    """A reader's or decoder's error carried through the stages as an item. SPDL raises a
    failed task as its own ``PipelineFailure`` (out of its subprocess, only "pipeline stages
    failed"): the file and sample our error names would be lost."""

    def __init__(self, message: str) -> None:
        self.message = message


def raised(item):
    """``item``, or the ``DatasetError`` a stage carried (see ``StageError``)."""
    from ...formats import DatasetError

    if isinstance(item, StageError):
        raise DatasetError(item.message)
    return item


class ReadStage:
    """Stage ``read``: (indices, stored images, labels) of one batch, from our reader."""

    def __init__(self, reader) -> None:
        self.reader = reader

    def __call__(self, item: tuple[int, np.ndarray]):
        from ...formats import DatasetError

        epoch, indices = item
        try:
            images, labels = self.reader.read_many(indices)
        except DatasetError as err:
            return StageError(str(err))
        return epoch, indices, images, np.asarray(labels, dtype=np.int64)


class DecodeStage:
    """Stage ``decode``: one batch's encoded images into one (B, H, W, C) uint8 array, each
    image through ``crop`` (the training crop, seeded by sample and epoch) where given."""

    def __init__(self, decoder: str, channels: int, crop=None) -> None:
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
        self.decoder = decoder
        self.channels = channels
        self.crop = crop

    def __call__(self, item) -> Batch | StageError:
        if isinstance(item, StageError):
            return item
        epoch, indices, images, labels = item
        if isinstance(images, np.ndarray) and self.crop is None:  # raw pixels: nothing to do
            return Batch(images, labels, indices)
        decoded = []
        for index, data in zip(indices.tolist(), images):
            try:
                image = (data if isinstance(images, np.ndarray) else spdl_io_decode(data)
                         if self.decoder == "spdl.io" else
                         decode_image(data, "simplejpeg", self.channels))
            except (ValueError, RuntimeError, OSError) as err:
                return StageError(f"sample {index}: {self.decoder} cannot decode it: {err}")
            decoded.append(image if self.crop is None
                           else self.crop(image, index=index, epoch=epoch))
        return Batch(np.stack(decoded), labels, indices)


def spdl_io_decode(data: bytes) -> np.ndarray:
    """One JPEG decoded by SPDL's FFmpeg-based I/O, as (H, W, 3) uint8."""
    import spdl.io

    packets = spdl.io.demux_image(data)
    frames = spdl.io.decode_packets(packets, filter_desc=SPDL_IO_FILTER)
    return spdl.io.to_numpy(spdl.io.convert_frames(frames))


def spdl_io_unavailable() -> str | None:
    """Why spdl.io cannot decode here (its FFmpeg libraries missing), or None."""
    try:
        from spdl.io.lib import _import_libspdl

        _import_libspdl()  # what spdl.io's first decode does: load one FFmpeg build
    except (ImportError, RuntimeError) as err:
        return f"spdl.io cannot load FFmpeg's libraries: {err}"
    return None


class SpdlBatches:
    """Re-iterable epochs of ``Batch``es from an SPDL pipeline (see the module doc)."""

    def __init__(self, dataset, sampler, options: PathOptions, *, decoder: str,
                 subprocess: bool) -> None:
        from spdl.pipeline import PipelineBuilder

        from ..samplers import SequentialSampler

        if dataset is None:
            raise ValueError("the SPDL paths read through our dataset: dataset is None")
        if dataset.spec.encoding != "raw" and options.decode is None:
            raise ValueError(f"{dataset.reader.root}: the SPDL paths deliver decoded images; "
                             "pass decode='simplejpeg'")
        workers = max(int(options.workers), 1)
        self.workers = workers
        self.subprocess = subprocess
        self.source = EpochSource(sampler if sampler is not None
                                  else SequentialSampler(len(dataset)), options.batch_size)
        self.config = (PipelineBuilder()
                       .add_source(self.source)
                       .pipe(ReadStage(dataset.reader), concurrency=workers,
                             output_order="input", name="read")
                       .pipe(DecodeStage(decoder, dataset.spec.channels,
                                         crop=training_crop(options)),
                             concurrency=workers, output_order="input", name="decode")
                       .add_sink(SINK_BUFFER)
                       .get_config())
        self._pipeline = None
        self._remote = None
        if subprocess:
            from spdl.pipeline import run_pipeline_in_subprocess

            extra = {"mp_context": options.start_method} if options.start_method else {}
            self._remote = run_pipeline_in_subprocess(self.config, num_threads=workers,
                                                      max_failures=0,
                                                      **extra)

    def __iter__(self):
        self._stop_pipeline()  # an epoch left unfinished
        return self._epoch()

    def _epoch(self):
        from spdl.pipeline import build_pipeline

        if self._remote is not None:
            yield from map(raised, self._remote)
            return
        self._pipeline = build_pipeline(self.config, num_threads=self.workers,
                                        max_failures=0)
        with self._pipeline.auto_stop():
            yield from map(raised, self._pipeline)
        self._pipeline = None

    def _stop_pipeline(self) -> None:
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            pipeline.stop()

    def close(self) -> None:
        """Stop a pipeline left mid-epoch and shut down the subprocess, if any."""
        self._stop_pipeline()
        remote, self._remote = self._remote, None
        if remote is not None:
            remote._shutdown()  # what its finalizer calls at exit; joins the subprocess

    def __repr__(self) -> str:
        where = "subprocess" if self.subprocess else "threads"
        return f"{type(self).__name__}(workers={self.workers}, {where})"


def _open(dataset, sampler, options: PathOptions, *, decoder: str, subprocess: bool):
    batches = SpdlBatches(dataset, sampler, options, decoder=decoder, subprocess=subprocess)
    return batches, batches.close


def spdl_batches(dataset, sampler, options: PathOptions):
    """SPDL thread stages, simplejpeg decode."""
    return _open(dataset, sampler, options, decoder="simplejpeg", subprocess=False)


def spdl_io_batches(dataset, sampler, options: PathOptions):
    """SPDL thread stages, spdl.io (FFmpeg) decode."""
    reason = spdl_io_unavailable()
    if reason:
        raise RuntimeError(reason)
    return _open(dataset, sampler, options, decoder="spdl.io", subprocess=False)


def spdl_process_batches(dataset, sampler, options: PathOptions):
    """SPDL's pipeline in one multi-threaded subprocess, simplejpeg decode."""
    return _open(dataset, sampler, options, decoder="simplejpeg", subprocess=True)
