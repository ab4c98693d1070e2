"""Map-style datasets over a Reader: read per access (lazy) or everything once (preloaded).

Both are PyTorch-compatible map-style datasets (``__len__``, ``__getitem__``, ``__getitems__``)
without importing torch, and both add an optional decode step and a per-sample transform:

- ``decode=None``: samples as stored (raw (H, W, C) arrays, or encoded ``bytes``);
- ``decode="simplejpeg"``: libjpeg-turbo through simplejpeg, which releases the GIL for the
  whole decode, so threads scale; JPEG only;
- ``decode="pil"``: Pillow (JPEG or PNG); holds the GIL for part of the work;
- ``decode="auto"``: per sample, simplejpeg for JPEG bytes and Pillow for anything else: the
  decoder for "mixed" sets (a folder of JPEG and PNG files), allowed for any encoded set;
- ``decode="reduced"``: with the training transform (``RandomResizedCropFlip``) only, a JPEG
  decoded at the smallest DCT scale that still covers the crop (``train_transform``);
- ``decode="window"``: with the training transform only, a JPEG decoded only where its crop
  lies and resized straight into the batch, without the GIL (``train_transform``); the same
  pixels as a full decode. PNGs and CMYK JPEGs are decoded whole (Pillow), then cropped.

A transform with ``seeded = True`` (``RandomResizedCropFlip``) is called with each sample's
index and the dataset's ``epoch`` (``set_epoch``; prefetchers and ``torch_dataloader`` set
it in their workers from the sampler's epoch), so its random crop repeats on every path.

In imported sets, CMYK (and YCCK) JPEGs are decoded by Pillow whichever decoder is asked
for: simplejpeg converts them to RGB too, but with its own rounding (off by one from Pillow
and TensorFlow), and one dataset should decode to the same pixels on every path. (Synthetic
sets hold no such JPEG, so their simplejpeg decodes skip the header check.)

Batched access (``get_batch`` / ``__getitems__``) goes through ``Reader.read_many`` and writes
fixed-size samples into one (B, H, W, C) buffer, the caller's when ``out`` is given. With
``gather_threads=k`` a raw batch is gathered in k parts at once (``SplitGather``): a shuffled
gather of small rows waits on memory latency, and k threads keep k streams of misses in
flight. The default, 1, leaves parallelism to the prefetcher's workers.

Imported datasets of encoded images of different sizes (``ImportedSpec`` with
``fixed_size`` False) decode each image to its own (H, W, 3) RGB shape, whatever its mode
(greyscale, CMYK, palette, RGBA). To batch them into one array, give a transform with a fixed
output (``Resize(224, 224)``, or ``Compose(ResizeShorter(256), CenterCrop(224, 224))``);
without one, a decoded batch's ``images`` is a list of differently shaped arrays (see
``collate_padded``).
"""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Callable, Sequence

import numpy as np

from storebench.buffers import batch_empty
from storebench.formats.base import (
    CorruptSampleError,
    DatasetError,
    Reader,
    check_index,
    check_indices,
    sniff_encoding,
)
from storebench.formats.confine import check_pixels
from storebench.formats.specs import fixed_size, is_imported
from storebench.gather import take_rows

from .batching import Batch, stack_into
from .split_gather import SplitGather
from .train_transform import JPEG_ONLY_PILLOW, is_seeded, jpeg_header, jpeg_window_module
from .transforms import ImageTransform, transform_output_shape

DECODERS = ("auto", "pil", "simplejpeg", "reduced", "window")
# What simplejpeg.decode_jpeg_header calls the JPEG colour spaces that Pillow decodes instead.
PIL_ONLY_JPEG_COLORSPACES = frozenset({"CMYK", "YCCK"})


class InsufficientMemoryError(MemoryError):
    """Preloading would need more RAM than is available; raised before reading anything."""


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


class _MapDataset:
    """Template for both datasets: subclasses say how stored samples are fetched
    (``_stored_one`` / ``_stored_many``); decoding, transforms and batching live here."""

    def __init__(
        self,
        reader: Reader,
        *,
        decode: str | None = None,
        transform: Callable[[np.ndarray | bytes], np.ndarray] | None = None,
        output_shape: Sequence[int] | None = None,
        gather_threads: int = 1,
    ) -> None:
        spec = reader.spec
        if decode is not None:
            if decode not in DECODERS:
                raise ValueError(f"decode must be None or one of {DECODERS}, got {decode!r}")
            if spec.encoding == "raw":
                raise ValueError(
                    f"{reader.root}: samples are raw pixels, there is nothing to decode; "
                    "pass decode=None"
                )
            if decode == "reduced" and (spec.encoding != "jpeg" or not is_seeded(transform)):
                raise ValueError(
                    f"{reader.root}: decode='reduced' decodes JPEGs at the scale the training "
                    "crop needs: it takes JPEG samples and transform=RandomResizedCropFlip(), "
                    f"got {spec.encoding} samples and transform={transform!r}"
                )
            if decode == "window":
                if not is_seeded(transform):
                    raise ValueError(
                        f"{reader.root}: decode='window' decodes only the training crop's "
                        "window: it takes transform=RandomResizedCropFlip(), got "
                        f"transform={transform!r}")
                jpeg_window_module()  # an install without the decoder says so now
            if decode == "simplejpeg" and spec.encoding != "jpeg":
                raise ValueError(
                    f"{reader.root}: simplejpeg decodes JPEG only, these samples are "
                    f"{spec.encoding}; use decode='auto' (simplejpeg for the JPEGs, Pillow "
                    "for the rest) or decode='pil'"
                )
        if (
            isinstance(transform, ImageTransform)
            and decode is None
            and spec.encoding != "raw"
        ):
            raise ValueError(
                f"{reader.root}: {transform!r} works on decoded images and these samples "
                f"are {spec.encoding} bytes; pass decode='auto'"
            )
        self.reader = reader
        self.spec = spec
        self.decode = decode
        # Only a user's own files can be CMYK/YCCK JPEGs: the check costs a header parse.
        self._may_hold_cmyk = is_imported(spec)
        self.transform = transform
        self.epoch = 0
        self._output_shape = tuple(output_shape) if output_shape is not None else None
        self._split = SplitGather(gather_threads)

    @property
    def gather_threads(self) -> int:
        """Threads one raw batch's gather is split over (``SplitGather``)."""
        return self._split.threads

    def with_gather_threads(self, threads: int) -> _MapDataset:
        """The same dataset (sharing its reader and, preloaded, its arrays) with raw batches
        gathered by ``threads`` threads at once."""
        clone = copy.copy(self)
        clone._split = SplitGather(threads)
        return clone

    def set_epoch(self, epoch: int) -> None:
        """The epoch a seeded transform (``RandomResizedCropFlip``) draws its crops for."""
        self.epoch = int(epoch)

    # -- what subclasses provide ------------------------------------------------------
    def _stored_one(self, index: int) -> tuple[np.ndarray | bytes | memoryview, int]:
        raise NotImplementedError

    def _stored_many(
        self, indices: np.ndarray, out: np.ndarray | None
    ) -> tuple[np.ndarray | list, np.ndarray]:
        raise NotImplementedError

    def _row_array(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(rows, labels) to gather raw batches from directly (``Reader.row_array``)."""
        return None

    def for_thread(self) -> _MapDataset:
        """A dataset safe to use from one more thread (readers may hold per-thread state)."""
        raise NotImplementedError

    # -- shape of what comes out ------------------------------------------------------
    @property
    def yields_arrays(self) -> bool:
        """True when samples come out as arrays (raw, decoded, or transformed)."""
        return self.spec.encoding == "raw" or self.decode is not None or self.transform is not None

    @property
    def fixed_size(self) -> bool:
        """Whether every stored image has the spec's shape (False for imported sets of
        encoded images of different sizes)."""
        return fixed_size(self.spec)

    @property
    def is_ragged(self) -> bool:
        """True when decoded samples come out with each image's own shape: a variable-size
        set decoded without a transform. Batches then hold a list of arrays."""
        return not self.fixed_size and self.decode is not None and self.transform is None

    @property
    def sample_shape(self) -> tuple[int, ...] | None:
        """Shape of every sample's image, or None when unknown in advance (encoded bytes,
        images of different sizes, or a transform that does not say: a plain callable
        without ``output_shape=``, or ``ResizeShorter`` alone on a variable-size set)."""
        if self._output_shape is not None:
            return self._output_shape
        decoded = self.spec.encoding == "raw" or self.decode is not None
        stored_shape = self.spec.image_shape if decoded and self.fixed_size else None
        if self.transform is None:
            return stored_shape
        if not decoded:
            return None
        return transform_output_shape(self.transform, stored_shape, self.spec.channels)

    @property
    def sample_dtype(self) -> np.dtype:
        return np.dtype(np.uint8)

    def probe(self) -> tuple[tuple[int, ...], np.dtype]:
        """Shape and dtype of sample 0 after decode and transform (read once to find out)."""
        image, _ = self[0]
        if not isinstance(image, np.ndarray):
            raise TypeError(
                f"{self.reader.root}: samples come out as {type(image).__name__}, not arrays; "
                "pass decode= or a transform returning arrays"
            )
        return tuple(image.shape), image.dtype

    # -- access -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> tuple[np.ndarray | bytes, int]:
        index = check_index(index, len(self), where=self.reader.root)
        stored, label = self._stored_one(index)
        return self._finish(stored, index, None), int(label)

    def get_batch(
        self, indices: Sequence[int] | np.ndarray, *, out: np.ndarray | None = None
    ) -> Batch:
        """Samples ``indices`` in that order. Indices follow the Reader's rules (integers
        only, negative ones count from the end).

        ``images`` is one (B, *sample_shape) array for fixed-size samples (raw, decoded from a
        fixed-size set, or through a transform with a fixed output), written into ``out``
        ((len(indices), *sample_shape) or larger along the first axis) when given. It is a
        list for encoded bytes, and for a variable-size set decoded without a transform
        (``is_ragged``): one (H, W, C) array per sample, each its own shape, always a list
        even when they happen to agree; ``out`` is refused there, as nothing says what
        shape to give them (pass a ``Resize``, or pad the list with ``collate_padded``).
        """
        idx = check_indices(indices, len(self), where=self.reader.root)
        if out is not None:
            out = out[: len(idx)]
            # Raw pixels are never ragged (decoding them is refused): the gather's hot path
            # skips the property chain.
            if self.spec.encoding != "raw" and self.is_ragged:
                self._refuse_out_for_ragged(out)
        if self.spec.encoding == "raw" and self.transform is None:
            source = self._row_array()
            if source is not None and (out is None or out.flags.c_contiguous):
                return self._take_rows(source, idx, out)
            if self._split.threads == 1:
                images, labels = self._stored_many(idx, out)
                return Batch(images, np.asarray(labels, dtype=np.int64), idx)
            if out is None:
                out = batch_empty((len(idx), *self.spec.image_shape))
            return Batch(out, self._split(self._stored_many, idx, out), idx)
        stored, labels = self._stored_many(idx, None)
        if self.decode == "window":
            # Each sample decoded and resized straight into its slot of the batch.
            target = out if out is not None else batch_empty((len(idx), *self.sample_shape))
            for k, data in enumerate(stored):
                self._decode_window(data, int(idx[k]), target[k])
            return Batch(target, np.asarray(labels, dtype=np.int64), idx)
        if self.is_ragged:
            images = [self._decode(data, int(idx[k]), None) for k, data in enumerate(stored)]
            return Batch(images, np.asarray(labels, dtype=np.int64), idx)
        if self.decode is not None and self.transform is None:
            target = (
                out if out is not None else batch_empty((len(idx), *self.spec.image_shape))
            )
            for k, data in enumerate(stored):
                self._decode(data, int(idx[k]), target[k])
            return Batch(target, np.asarray(labels, dtype=np.int64), idx)
        if self.decode is None and self.transform is None:
            images = [bytes(x) if not isinstance(x, bytes) else x for x in stored]
            return Batch(images, np.asarray(labels, dtype=np.int64), idx)
        finished = [self._finish(data, int(idx[k]), None) for k, data in enumerate(stored)]
        images = (
            stack_into(finished, out)
            if all(isinstance(x, np.ndarray) for x in finished)
            else finished
        )
        return Batch(images, np.asarray(labels, dtype=np.int64), idx)

    def _take_rows(self, source: tuple[np.ndarray, np.ndarray], idx: np.ndarray,
                   out: np.ndarray | None) -> Batch:
        """A raw batch gathered straight from the rows the dataset or its reader holds in
        one array (``_row_array``), split over ``gather_threads``: no reader call per batch
        or per part."""
        rows, labels = source
        shape = (len(idx), *self.spec.image_shape)
        if out is None:
            out = batch_empty(shape)
        elif out.shape != shape or out.dtype != np.uint8:
            raise ValueError(f"out must be uint8 {shape}, got {out.dtype} {out.shape}")
        try:
            self._split.take(rows, idx, out.reshape(len(idx), rows.shape[1]))
        except OSError as err:  # an I/O error on a mapped file (SIGBUS is not catchable)
            raise CorruptSampleError(self.reader._locate(int(idx[0])), int(idx[0]),
                                     str(err)) from err
        return Batch(out, labels[idx].astype(np.int64, copy=False), idx)

    def _refuse_out_for_ragged(self, out: np.ndarray) -> None:
        # Refused rather than filled when a batch's images happen to share out's shape: what
        # a batch is should not depend on which samples it drew.
        raise ValueError(
            f"{self.reader.root}: the images of this dataset differ in size, so a batch of "
            f"them cannot be written into one out array (shape {out.shape}); pass a "
            "transform with a fixed output (storebench.loaders.Resize(h, w), or "
            "Compose(ResizeShorter(s), CenterCrop(h, w))), or call get_batch without out= "
            "for a list of arrays (storebench.loaders.collate_padded pads it into one)"
        )

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        """PyTorch's batched fetch: one ``read_many`` for the whole batch. The ``Batch`` is
        a sequence of ``(image, label)`` samples, as the protocol asks."""
        return self.get_batch(indices)

    # -- decode and transform ---------------------------------------------------------
    def _finish(self, stored, index: int, out: np.ndarray | None):
        if is_seeded(self.transform):
            return self._finish_seeded(stored, index)
        if self.decode is not None:
            stored = self._decode(stored, index, out)
        elif self.spec.encoding != "raw" and not isinstance(stored, bytes):
            stored = bytes(stored)  # an arena slice or memoryview: hand out stored bytes
        if self.transform is not None:
            try:
                stored = self.transform(stored)
            except Exception as err:
                err.add_note(
                    f"while applying {self.transform!r} to sample {index} "
                    f"({self.reader._locate(index)})"
                )
                raise
        return stored

    def _finish_seeded(self, stored, index: int) -> np.ndarray:
        """Decode (fully, reduced to the crop's scale, or only the crop's window) and apply a
        seeded transform with the sample's index and this dataset's epoch."""
        if self.decode == "window":
            return self._decode_window(stored, index, None)
        if self.decode == "reduced":
            try:
                return self.transform.decode_reduced(
                    bytes(stored), index=index, epoch=self.epoch,
                    colorspace="GRAY" if self.spec.channels == 1 else "RGB")
            except ValueError as err:  # simplejpeg's errors on damaged JPEG data
                raise CorruptSampleError(self.reader._locate(index), index,
                                         f"cannot decode jpeg: {err}") from err
        image = self._decode(stored, index, None) if self.decode is not None else stored
        try:
            return self.transform(image, index=index, epoch=self.epoch)
        except Exception as err:
            err.add_note(f"while applying {self.transform!r} to sample {index} "
                         f"({self.reader._locate(index)})")
            raise

    def _decode_window(self, data, index: int, out: np.ndarray | None) -> np.ndarray:
        """Sample ``index``'s crop: a JPEG decoded only in its window (``decode_window``),
        anything else (PNG, a CMYK JPEG) decoded whole and cropped."""
        try:
            if sniff_encoding(data) == "jpeg":
                header = jpeg_header(data)
                if header[2] not in JPEG_ONLY_PILLOW:
                    return self.transform.decode_window(
                        data, index=index, epoch=self.epoch, channels=self.spec.channels,
                        out=out, header=header)
        except (ValueError, DatasetError) as err:
            raise CorruptSampleError(self.reader._locate(index), index,
                                     f"cannot decode {self.spec.encoding}: {err}") from err
        image = self._decode(data, index, None)
        return self.transform(image, index=index, epoch=self.epoch, out=out)

    def _decode(self, data, index: int, out: np.ndarray | None) -> np.ndarray:
        expected = self.spec.image_shape if self.fixed_size else None
        try:
            use_simplejpeg = self.decode == "simplejpeg" or (
                self.decode == "auto" and sniff_encoding(data) == "jpeg"
            )
            image = None
            if use_simplejpeg:
                image = self._decode_simplejpeg(data, out if expected is not None else None)
            if image is None:
                image = self._decode_pil(data)
        except (ValueError, OSError, SyntaxError, DatasetError) as err:
            raise CorruptSampleError(
                self.reader._locate(index), index, f"cannot decode {self.spec.encoding}: {err}"
            ) from err
        if expected is None:
            if image.shape[2:] != (self.spec.channels,):  # decoders convert: a bug if not
                raise CorruptSampleError(
                    self.reader._locate(index),
                    index,
                    f"decoded to {image.shape}, not (H, W, {self.spec.channels})",
                )
        elif image.shape != expected:
            raise CorruptSampleError(
                self.reader._locate(index),
                index,
                f"decoded to {image.shape}, the spec says {expected}",
            )
        if out is not None and image is not out and not np.shares_memory(image, out):
            out[...] = image
            return out
        return image

    def _decode_simplejpeg(self, data, out: np.ndarray | None) -> np.ndarray | None:
        """The decoded JPEG, or None for one that Pillow should decode (CMYK, YCCK)."""
        import simplejpeg

        if self._may_hold_cmyk or out is None:
            # simplejpeg has no pixel cap of its own: a 65,000 x 65,000 JPEG would ask for
            # 12 GB. (Into ``out`` it writes no more than ``out`` holds, or refuses.)
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
            check_pixels(height, width, "JPEG header")
            if colorspace in PIL_ONLY_JPEG_COLORSPACES and self._may_hold_cmyk:
                return None
        # Greyscale JPEGs come out as RGB too (the three channels equal) when the spec has 3.
        wanted = "GRAY" if self.spec.channels == 1 else "RGB"
        return simplejpeg.decode_jpeg(data, colorspace=wanted, buffer=out)

    def _decode_pil(self, data) -> np.ndarray:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as img:
                check_pixels(img.size[1], img.size[0], "image header")  # before decoding
                # Every mode (L, P, RGBA, CMYK, ...) converts to the spec's: alpha is dropped
                # and palettes expanded, as ImageFolder's img.convert("RGB") does.
                mode = "L" if self.spec.channels == 1 else "RGB"
                image = np.asarray(img if img.mode == mode else img.convert(mode))
        except Image.DecompressionBombError as err:  # not an OSError: caught by nothing else
            raise ValueError(str(err)) from err
        return image.reshape(*image.shape[:2], -1)

    def _close_gather(self) -> None:
        self._split.close()

    # -- state (torch's Stateful protocol) --------------------------------------------
    def state_dict(self) -> dict:
        """What a loader's state checks its dataset against: the number of samples and the
        digest of their content (the manifest's, the same whatever the format). A map-style
        dataset has no position: the sampler holds it."""
        return {"num_samples": len(self), "content_digest": str(self.reader.manifest["digest"])}

    def load_state_dict(self, state_dict: dict) -> None:
        """Refuse a state taken over other samples (ValueError naming the dataset); a state
        of the same samples in another format loads."""
        own = self.state_dict()
        differing = [k for k in own if state_dict.get(k) != own[k]]
        if differing:
            raise ValueError(
                f"{self.reader.root}: this loader state was taken over another dataset ("
                + ", ".join(f"{k} {state_dict.get(k)!r} there, {own[k]!r} here"
                            for k in differing) + ")")

    def __repr__(self) -> str:
        threads = f", gather_threads={self.gather_threads}" if self.gather_threads > 1 else ""
        return f"{type(self).__name__}({self.reader!r}, decode={self.decode!r}{threads})"


class LazyDataset(_MapDataset):
    """Reads from storage on every access: nothing is held in RAM but the reader's handles.

    Picklable (the reader re-opens its handles in each process), so it can be sent to
    process workers under fork, spawn or forkserver.
    """

    def _stored_one(self, index: int):
        return self.reader[index]

    def _stored_many(self, indices: np.ndarray, out: np.ndarray | None):
        return self.reader.read_many(indices, out=out)

    def _row_array(self) -> tuple[np.ndarray, np.ndarray] | None:
        return self.reader.row_array()

    def for_thread(self) -> LazyDataset:
        # Shared, not copied: the readers here are safe for concurrent reads (pread, a
        # transaction per LMDB call, memory maps; h5py serialises calls itself), and LMDB
        # refuses to open one environment twice in a process.
        return self

    def abandon_reads(self, threads) -> contextlib.AbstractContextManager:
        """For a loader stopping mid-pass, whose batches in hand will be dropped: while
        inside, the reads its ``threads`` asked for that have not started yet fail at once
        where the reader can drop them (an object store's queued GETs,
        ``ObjectStore.abandoning``); other threads' reads, and local readers, read on."""
        abandon = getattr(self.reader, "abandon_reads", None)
        return abandon(threads) if abandon is not None else contextlib.nullcontext()

    def close(self) -> None:
        self._close_gather()
        self.reader.close()

    def __enter__(self) -> LazyDataset:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class PreloadedDataset(_MapDataset):
    """Reads the whole dataset once into RAM, then serves it from there.

    Raw samples live in one contiguous (N, H, W, C) uint8 array; encoded samples in one
    bytes arena (uint8 array) with an int64 ``offsets`` array of N + 1 entries, sample i being
    ``arena[offsets[i]:offsets[i + 1]]`` (decoding still happens per access: that is the point
    of keeping them encoded). ``footprint_bytes`` is the RAM held.

    Before reading, the needed bytes are compared with the RAM available to this process
    (``storebench.cgroups.available_memory``: the host's, or less where its memory cgroup
    leaves less) and an ``InsufficientMemoryError`` is raised if more than
    ``max_memory_fraction`` of it would be used. Pickling copies the arrays: under
    spawn/forkserver each worker receives a copy, under fork workers share the parent's pages
    copy-on-write.
    """

    def __init__(
        self,
        reader: Reader,
        *,
        decode: str | None = None,
        transform: Callable | None = None,
        output_shape: Sequence[int] | None = None,
        progress: bool = True,
        chunk_size: int = 1024,
        max_memory_fraction: float = 0.8,
        gather_threads: int = 1,
    ) -> None:
        super().__init__(reader, decode=decode, transform=transform, output_shape=output_shape,
                         gather_threads=gather_threads)
        self.needed_bytes = self.estimate_bytes(reader)
        self._check_memory(self.needed_bytes, max_memory_fraction)
        from tqdm.auto import tqdm

        n = len(reader)
        self.labels = np.empty(n, dtype=np.int64)
        self.images: np.ndarray | None = None
        self.arena: np.ndarray | None = None
        self.offsets: np.ndarray | None = None
        bar = tqdm(
            total=n,
            desc=f"preload {reader.format}-{reader.spec.encoding}",
            unit="img",
            disable=None if progress else True,
            leave=False,
        )
        with bar:
            if reader.is_raw:
                self.images = np.empty((n, *reader.spec.image_shape), dtype=np.uint8)
                for start in range(0, n, chunk_size):
                    stop = min(start + chunk_size, n)
                    _, self.labels[start:stop] = reader.read_many(
                        np.arange(start, stop), out=self.images[start:stop]
                    )
                    bar.update(stop - start)
            else:
                self._load_encoded(reader, chunk_size, bar)
        reader.close()  # everything is in RAM now; the reader re-opens only to name files

    @staticmethod
    def estimate_bytes(reader: Reader) -> int:
        """RAM a preload of ``reader`` needs: raw pixel bytes, or (for encoded data) the
        dataset's file bytes as an upper bound of the encoded bytes, plus labels and offsets."""
        n = len(reader)
        if reader.is_raw:
            return n * reader.spec.raw_sample_bytes + 8 * n
        files = reader.manifest.get("files", {})
        encoded = sum(files.values()) if isinstance(files, dict) else 0
        encoded = encoded or int(reader.manifest.get("bytes_apparent", 0))
        return encoded + 8 * n + 8 * (n + 1)

    @staticmethod
    def _check_memory(needed: int, max_fraction: float) -> None:
        from storebench.cgroups import available_memory

        available, where = available_memory()
        if needed > max_fraction * available:
            raise InsufficientMemoryError(
                f"preloading needs {format_bytes(needed)} ({needed} bytes) but only "
                f"{format_bytes(available)} ({available} bytes) of RAM is available {where} "
                f"(limit: {max_fraction:.0%} of it); use LazyDataset, a smaller profile, "
                "or raise max_memory_fraction"
            )

    def _load_encoded(self, reader: Reader, chunk_size: int, bar) -> None:
        n = len(reader)
        capacity = max(self.needed_bytes - 16 * n, 1024)
        arena = np.empty(capacity, dtype=np.uint8)
        offsets = np.zeros(n + 1, dtype=np.int64)
        used = 0
        for start in range(0, n, chunk_size):
            stop = min(start + chunk_size, n)
            encoded, self.labels[start:stop] = reader.read_many(np.arange(start, stop))
            for k, data in enumerate(encoded):
                size = len(data)
                if used + size > len(arena):  # file bytes underestimated: grow by half
                    grown = np.empty(max(len(arena) * 3 // 2, used + size), dtype=np.uint8)
                    grown[:used] = arena[:used]
                    arena = grown
                arena[used : used + size] = np.frombuffer(data, dtype=np.uint8)
                used += size
                offsets[start + k + 1] = used
            bar.update(stop - start)
        # Slack over 10 % is worth one copy to give back; less is not.
        self.arena = arena[:used].copy() if len(arena) > 1.1 * used else arena[:used]
        self.offsets = offsets

    @property
    def footprint_bytes(self) -> int:
        """Bytes of RAM held by the preloaded arrays."""
        held = [self.labels, self.images, self.offsets]
        arena = (
            self.arena.base
            if self.arena is not None and self.arena.base is not None
            else self.arena
        )
        return int(sum(a.nbytes for a in (*held, arena) if a is not None))

    def _stored_one(self, index: int):
        if self.images is not None:
            return self.images[index], int(self.labels[index])
        return self.arena[self.offsets[index] : self.offsets[index + 1]], int(self.labels[index])

    def _stored_many(self, indices: np.ndarray, out: np.ndarray | None):
        # ``indices`` come from get_batch, which has checked them (check_indices): a second
        # min/max pass here was a few percent of a shuffled 3 MiB gather, for nothing.
        labels = self.labels[indices]
        if self.images is not None:
            if out is None:
                out = batch_empty((len(indices), *self.images.shape[1:]))
            if out.flags.c_contiguous:
                rows = self.images.reshape(len(self.images), -1)
                take_rows(rows, indices, out.reshape(len(indices), -1))
            else:
                take_rows(self.images, indices, out)
            return out, labels
        starts, stops = self.offsets[indices], self.offsets[indices + 1]
        spans = zip(starts.tolist(), stops.tolist(), strict=True)
        return [self.arena[a:b] for a, b in spans], labels

    def _row_array(self) -> tuple[np.ndarray, np.ndarray] | None:
        if self.images is None:
            return None
        return self.images.reshape(len(self.images), -1), self.labels

    def for_thread(self) -> PreloadedDataset:
        return self  # read-only numpy arrays: safe to share between threads

    def close(self) -> None:
        self._close_gather()
        self.reader.close()

    def __enter__(self) -> PreloadedDataset:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
