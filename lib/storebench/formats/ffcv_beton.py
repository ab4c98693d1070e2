"""FFCV's ``.beton`` file (FFCV 1.0.2, file format version 2): ``data.beton``.

One standard FFCV dataset file with three fields, in this order: ``image``, ``label``
(``IntField``) and ``index`` (``IntField``, the sample's dataset index, its key).
``ffcv.loader.Loader(root / "data.beton", ...)`` reads it as it is; the ``ffcv`` loader path
(``storebench.loaders.peers.ffcv_loader``) does. How ``image`` is stored, per encoding:

- ``raw``: ``RGBImageField(write_mode="raw")``: FFCV's own encoder stores the (H, W, 3) uint8
  pixels as they are (mode ``raw``); ``SimpleRGBImageDecoder`` copies them out.
- ``jpeg``: an ``RGBImageField`` record in mode ``jpg`` holding **the original JPEG bytes**.
  FFCV's ``RGBImageField.encode`` takes pixels and re-encodes them with OpenCV at quality 90,
  which would store other bytes than the dataset's. The field's encode is replaced, on the
  one instance the writer uses, by one that writes the same metadata (mode ``jpg``, height,
  width, data pointer) around the given bytes; the field's type in the file stays
  ``RGBImageField`` (type id 2), so any FFCV reader, and ``SimpleRGBImageDecoder``'s
  libjpeg-turbo decode, handle it as a JPEG FFCV wrote itself.
- ``png`` and ``mixed``: ``BytesField``, the bytes verbatim. FFCV stores them and reads them
  back (``BytesDecoder``), but has no PNG decoder: the FFCV loader path refuses these.

``raw`` and ``jpeg`` need 3-channel images (``RGBImageField`` is RGB only).

The file is written in this process, in index order: ``DatasetWriter`` writes the header,
field descriptors, metadata table and allocation table, and FFCV's own per-sample routine
(``ffcv.writer.handle_sample`` with its ``MemoryAllocator``) fills the pages, exactly as one
of its worker processes would, but on the incoming stream of samples, without starting a
process (``DatasetWriter`` alone forks ``num_workers`` of them). Only the metadata buffer is a
``multiprocessing.shared_memory`` block, closed and unlinked when the write ends (its first
use starts Python's resource-tracker helper process, as every shared-memory user here does).

Layout (all little-endian): a 24-byte header (version, num_fields, page_size, num_samples,
alloc_table_ptr), 3 field descriptors of 1,041 bytes, the metadata table (one 32-byte record
per sample), zero padding to the first page boundary, then pages of ``page_size`` bytes
(a sample's data never crosses a page), and at ``alloc_table_ptr`` the allocation table, one
(sample_id, ptr, size) uint64 triple per sample. Written in order, each page holds a run of
consecutive samples: the pages are the natural blocks.

The reader here parses the file with NumPy (copies of FFCV's on-disk dtypes; the tests
compare them with ``ffcv.types``), so opening it does not import FFCV (4-5 s: it imports
torch, numba and OpenCV). At open it checks the header against the spec, the field types
against the encoding, the index field (0..n-1), the labels' and sizes' CRC32C against the
manifest, and every allocation (inside the data region, within one page, matching its
metadata pointer). FFCV stores no checksum of its own: a damaged sample byte is caught only by
``verify=True`` (the manifest's per-sample CRC32C). The manifest's fingerprint covers the
header, descriptors and metadata table whole and the allocation table whole.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from data_gen import DatasetSpec

from .base import (
    CorruptSampleError,
    DatasetError,
    Reader,
    coalesced_runs,
    has_encoding_magic,
)
from .manifest import fingerprint_span as default_span
from .specs import fixed_size, stored_image_shape
from .traits import FormatTraits

NAME = "ffcv"
ENCODINGS = ("raw", "png", "jpeg", "mixed")
PEER = True
LIBRARIES = ("ffcv",)
# FFCV's DatasetWriter default (4 x its 2 MiB minimum): pages are FFCV's unit of allocation
# and, with QUASI_RANDOM order or the process cache, of reading.
DEFAULT_KNOBS: dict = {"page_size": 8 << 20}
OPEN_OPTIONS: tuple = ()
TRAITS = FormatTraits(
    remote_unsupported=("storebench has no S3 reader for this peer format (the peers study reads "
                        "local files); its own library may read from S3"),
    distributions=("ffcv",),
)
# Stored bytes per sample byte; the last page and the padding before the first add up to two
# pages besides (not counted here: they matter for tiny datasets only).
SIZE_OVERHEAD = {"raw": 1.05, "png": 1.05, "jpeg": 1.05, "mixed": 1.05}

FILENAME = "data.beton"
FIELD_NAMES = ("image", "label", "index")
# FFCV's on-disk types (ffcv/types.py, ffcv/fields/*.py), copied so that reading needs no FFCV.
FILE_VERSION = 2
HEADER_TYPE = np.dtype([
    ("version", "<u2"), ("num_fields", "<u2"), ("page_size", "<u4"),
    ("num_samples", "<u8"), ("alloc_table_ptr", "<u8"),
], align=True)
FIELD_DESC_TYPE = np.dtype([
    ("type_id", "<u1"), ("name", ("<u1", 16)), ("arguments", ("<u1", (1024,))),
], align=True)
ALLOC_TABLE_TYPE = np.dtype([("sample_id", "<u8"), ("ptr", "<u8"), ("size", "<u8")])
TYPE_IDS = {"IntField": 1, "RGBImageField": 2, "BytesField": 3}
RGB_IMAGE_METADATA = np.dtype([
    ("mode", "u1"), ("width", "<u2"), ("height", "<u2"), ("data_ptr", "<u8"),
])
BYTES_METADATA = np.dtype([("ptr", "<u8"), ("size", "<u8")])
MODE_JPG, MODE_RAW = 0, 1  # RGBImageField's IMAGE_MODES
MIN_PAGE_SIZE, MAX_PAGE_SIZE = 1 << 21, 1 << 32
# A run of adjacent samples is fetched with one pread, up to this many bytes.


def image_field_type(encoding: str) -> str:
    """The FFCV field class that holds ``encoding``'s images."""
    return "RGBImageField" if encoding in ("raw", "jpeg") else "BytesField"


def metadata_type(encoding: str) -> np.dtype:
    """One sample's metadata record, as FFCV's ``get_metadata_type`` builds it."""
    image = RGB_IMAGE_METADATA if image_field_type(encoding) == "RGBImageField" else BYTES_METADATA
    return np.dtype([("", image), ("", "<i8"), ("", "<i8")], align=True)


def data_region_start(num_samples: int, page_size: int, encoding: str) -> int:
    """Where the first page starts: after header, descriptors and metadata, page-aligned."""
    end = metadata_end(num_samples, encoding)
    return -(-end // page_size) * page_size


def metadata_end(num_samples: int, encoding: str) -> int:
    return (HEADER_TYPE.itemsize + len(FIELD_NAMES) * FIELD_DESC_TYPE.itemsize
            + num_samples * metadata_type(encoding).itemsize)


def fingerprint_span(rel: str, path: Path, size: int) -> tuple[int, int]:
    """Header, field descriptors and metadata table (labels, indices, pointers) whole, and the
    allocation table whole: the file's index, read at open anyway."""
    head, tail = default_span(size)
    with builtins.open(path, "rb") as f:
        header = np.frombuffer(f.read(HEADER_TYPE.itemsize), dtype=HEADER_TYPE)[0]
    meta = HEADER_TYPE.itemsize + int(header["num_fields"]) * FIELD_DESC_TYPE.itemsize
    meta += int(header["num_samples"]) * metadata_type_of_file(path).itemsize
    head = min(max(head, meta), size)
    tail = min(max(tail, size - int(header["alloc_table_ptr"])), size - head)
    return head, tail


def metadata_type_of_file(path: Path) -> np.dtype:
    """The metadata record of a file this module wrote (build time: the file is trusted)."""
    with builtins.open(path, "rb") as f:
        f.seek(HEADER_TYPE.itemsize)
        first = np.frombuffer(f.read(FIELD_DESC_TYPE.itemsize), dtype=FIELD_DESC_TYPE)[0]
    rgb = int(first["type_id"]) == TYPE_IDS["RGBImageField"]
    return metadata_type("raw" if rgb else "png")


# -- writing --------------------------------------------------------------------------------
def _verbatim_jpeg_field(spec):
    """An ``RGBImageField`` whose encode stores the given JPEG bytes as they are (mode
    ``jpg``) where FFCV's would re-encode pixels; its type in the file is unchanged."""
    from ffcv.fields import RGBImageField

    field = RGBImageField(write_mode="jpg")

    def encode(destination, data: bytes, malloc) -> None:
        height, width, _ = stored_image_shape(spec, data)
        destination["mode"] = MODE_JPG
        destination["height"], destination["width"] = height, width
        destination["data_ptr"], storage = malloc(len(data))
        storage[:] = np.frombuffer(data, dtype=np.uint8)

    field.encode = encode
    return field


def _fields(spec) -> dict:
    from ffcv.fields import BytesField, IntField, RGBImageField

    if spec.encoding == "raw":
        image = RGBImageField(write_mode="raw")
    elif spec.encoding == "jpeg":
        image = _verbatim_jpeg_field(spec)
    else:
        image = BytesField()
    return {"image": image, "label": IntField(), "index": IntField()}


def write(samples: Iterable, root: Path, spec: DatasetSpec, *, page_size: int) -> None:
    from ffcv.memory_allocator import MemoryAllocator
    from ffcv.writer import DatasetWriter, handle_sample

    if image_field_type(spec.encoding) == "RGBImageField" and spec.channels != 3:
        raise ValueError(
            f"FFCV's RGBImageField holds RGB images: {spec.encoding} samples need 3 channels, "
            f"the spec has {spec.channels}")
    if not (page_size & (page_size - 1) == 0 and MIN_PAGE_SIZE <= page_size < MAX_PAGE_SIZE):
        raise ValueError(f"page_size must be a power of 2 in [2 MiB, 4 GiB), got {page_size}")
    path = root / FILENAME
    fields = _fields(spec)
    writer = DatasetWriter(str(path), fields, page_size=page_size, num_workers=1)
    writer.num_samples = spec.num_samples
    writer.prepare()  # header and field descriptors; the metadata buffer (shared memory)
    metadata = np.frombuffer(writer.metadata_sm.buf, dtype=writer.metadata_type)
    try:
        allocator = MemoryAllocator(writer.fname, writer.data_region_start, writer.page_size)
        with allocator:  # flushes the last page on exit
            count = 0
            for image, label in samples:
                if count >= spec.num_samples:
                    raise DatasetError(
                        f"{root}: got more samples than the spec's {spec.num_samples}")
                if spec.encoding == "raw":
                    value = np.ascontiguousarray(image)
                    if value.shape != spec.image_shape or value.dtype != np.uint8:
                        raise DatasetError(
                            f"{root}: sample {count} is {value.dtype} {value.shape}, the spec "
                            f"says uint8 {spec.image_shape}")
                elif spec.encoding == "jpeg":
                    value = bytes(image)
                else:
                    value = np.frombuffer(bytes(image), dtype=np.uint8)
                size = value.nbytes if isinstance(value, np.ndarray) else len(value)
                if size > page_size:
                    raise DatasetError(
                        f"{root}: sample {count} has {size} bytes, more than an FFCV page "
                        f"({page_size}): raise the page_size knob")
                handle_sample((value, int(label), count), count, metadata.dtype.names,
                              metadata, allocator, fields)
                count += 1
        if count != spec.num_samples:
            raise DatasetError(f"{root}: got {count} samples, the spec says {spec.num_samples}")
        writer.finalize(allocator.allocations)  # metadata table, allocation table, header
    finally:
        del metadata  # a view of the shared buffer would keep it from closing
        # Views held by an exception in flight keep the buffer open: freed with it.
        with contextlib.suppress(BufferError):
            writer.metadata_sm.close()
        writer.metadata_sm.unlink()


# -- reading --------------------------------------------------------------------------------
class FFCVReader(Reader):
    """Random access to a ``.beton`` through its metadata and allocation tables, with
    ``os.pread``; ``read_many`` fetches each run of adjacent samples with one read."""

    def __init__(self, root: Path, manifest: dict, *, verify: bool = True) -> None:
        super().__init__(root, manifest, verify=verify)
        self.path = self.root / FILENAME
        self._h_file: io.FileIO | None = None
        self._h_ptrs: np.ndarray | None = None
        self._h_sizes: np.ndarray | None = None
        self._h_labels: np.ndarray | None = None
        self._h_pages: np.ndarray | None = None

    def _open(self) -> None:
        try:
            self._h_file = io.FileIO(self.path, "r")
        except OSError as err:
            raise DatasetError(f"{self.path}: cannot open: {err}") from err
        try:
            self._load_tables()
            if not self.is_raw:  # the field type cannot tell png from mixed, or jpeg data
                image, _ = self._read_one(0)
                if not has_encoding_magic(self.spec.encoding, image):
                    raise DatasetError(
                        f"{self.path}: sample 0 is not {self.spec.encoding}, as the manifest "
                        "says")
        except BaseException:
            self._close()
            raise

    def _read_at(self, offset: int, length: int) -> bytes:
        return os.pread(self._h_file.fileno(), length, offset)

    def _table(self, offset: int, dtype: np.dtype, count: int, what: str) -> np.ndarray:
        length = dtype.itemsize * count
        data = self._read_at(offset, length)
        if len(data) != length:
            raise DatasetError(
                f"{self.path}: file ends inside the {what} (cut off): {len(data)} of {length} "
                f"bytes at offset {offset}")
        return np.frombuffer(data, dtype=dtype)

    def _load_tables(self) -> None:
        path, n, encoding = self.path, len(self), self.spec.encoding
        size = os.fstat(self._h_file.fileno()).st_size
        header = self._table(0, HEADER_TYPE, 1, "header")[0]
        if int(header["version"]) != FILE_VERSION:
            raise DatasetError(
                f"{path}: not an FFCV version-{FILE_VERSION} .beton (version field "
                f"{int(header['version'])})")
        if int(header["num_fields"]) != len(FIELD_NAMES) or int(header["num_samples"]) != n:
            raise DatasetError(
                f"{path}: header says {int(header['num_fields'])} fields and "
                f"{int(header['num_samples'])} samples, expected {len(FIELD_NAMES)} and {n}")
        page_size, alloc_ptr = int(header["page_size"]), int(header["alloc_table_ptr"])
        if page_size & (page_size - 1) or not MIN_PAGE_SIZE <= page_size < MAX_PAGE_SIZE:
            raise DatasetError(f"{path}: damaged header: page size {page_size}")
        descriptors = self._table(HEADER_TYPE.itemsize, FIELD_DESC_TYPE, len(FIELD_NAMES),
                                  "field descriptors")
        names = tuple(d["name"].tobytes().split(b"\0")[0].decode("ascii", "replace")
                      for d in descriptors)
        types = tuple(int(d["type_id"]) for d in descriptors)
        want_types = (TYPE_IDS[image_field_type(encoding)], TYPE_IDS["IntField"],
                      TYPE_IDS["IntField"])
        if names != FIELD_NAMES or types != want_types:
            raise DatasetError(
                f"{path}: fields {names} of FFCV types {types}, a {encoding} dataset has "
                f"{FIELD_NAMES} of types {want_types}")
        meta = self._table(HEADER_TYPE.itemsize + descriptors.nbytes, metadata_type(encoding),
                           n, "metadata table")
        data_start = data_region_start(n, page_size, encoding)
        if not data_start <= alloc_ptr <= size:
            raise DatasetError(
                f"{path}: file is cut off or damaged: the allocation table should start at "
                f"byte {alloc_ptr}, the file has {size} bytes (data from byte {data_start})")
        if size - alloc_ptr != n * ALLOC_TABLE_TYPE.itemsize:
            raise DatasetError(
                f"{path}: the allocation table holds {(size - alloc_ptr)} bytes, "
                f"{n} samples need {n * ALLOC_TABLE_TYPE.itemsize}")
        allocs = self._table(alloc_ptr, ALLOC_TABLE_TYPE, n, "allocation table")

        image_meta, labels, keys = meta["f0"], meta["f1"].astype(np.int64), meta["f2"]
        if not np.array_equal(keys, np.arange(n)):
            raise DatasetError(f"{path}: the index field is not 0..{n - 1} in order")
        self._check_integrity("labels_crc32c", labels, path, "labels")
        sample_ids = allocs["sample_id"]
        if not np.array_equal(np.sort(sample_ids), np.arange(n, dtype=np.uint64)):
            raise DatasetError(f"{path}: the allocation table does not hold one entry per sample")
        by_sample = allocs[np.argsort(sample_ids, kind="stable")]
        ptrs = by_sample["ptr"].astype(np.int64)
        sizes = by_sample["size"].astype(np.int64)
        self._check_images(image_meta, ptrs, sizes, encoding)
        self._check_integrity("sizes_crc32c", sizes, path, "sample sizes")
        ends = ptrs + sizes
        pages = (ptrs - data_start) // page_size
        bad = (ptrs < data_start) | (ends > alloc_ptr) | (sizes < 1) | (
            (ends - 1 - data_start) // page_size != pages)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DatasetError(
                f"{path}: sample {i}'s allocation ({int(ptrs[i])}, {int(sizes[i])} bytes) lies "
                f"outside the data pages [{data_start}, {alloc_ptr}) or across a page boundary")
        self._h_ptrs, self._h_sizes, self._h_labels, self._h_pages = ptrs, sizes, labels, pages

    def _check_images(self, image_meta, ptrs, sizes, encoding: str) -> None:
        path = self.path
        if image_field_type(encoding) == "BytesField":
            if not (np.array_equal(image_meta["ptr"].astype(np.int64), ptrs)
                    and np.array_equal(image_meta["size"].astype(np.int64), sizes)):
                raise DatasetError(f"{path}: metadata and allocation table disagree")
            return
        mode = MODE_RAW if encoding == "raw" else MODE_JPG
        if not np.all(image_meta["mode"] == mode):
            i = int(np.flatnonzero(image_meta["mode"] != mode)[0])
            raise DatasetError(
                f"{path}: sample {i} is stored in RGBImageField mode {int(image_meta['mode'][i])}"
                f", a {encoding} dataset has mode {mode} ({'raw' if mode else 'jpg'})")
        if not np.array_equal(image_meta["data_ptr"].astype(np.int64), ptrs):
            raise DatasetError(f"{path}: metadata and allocation table disagree")
        if fixed_size(self.spec):
            h, w, _ = self.spec.image_shape
            wrong = (image_meta["height"] != h) | (image_meta["width"] != w)
            if encoding == "raw":
                wrong |= sizes != self.spec.raw_sample_bytes
            if wrong.any():
                i = int(np.flatnonzero(wrong)[0])
                raise DatasetError(
                    f"{path}: sample {i} is {int(image_meta['height'][i])}x"
                    f"{int(image_meta['width'][i])} ({int(sizes[i])} bytes), the spec says "
                    f"{h}x{w}")

    def _close(self) -> None:
        if self._h_file is not None:
            self._h_file.close()
        self._h_file = self._h_ptrs = self._h_sizes = self._h_labels = self._h_pages = None

    def _locate(self, index: int) -> Path:
        return self.path

    def blocks(self) -> np.ndarray:
        """Where the FFCV page changes, in index order (pages hold runs of samples)."""
        self._ensure_open()
        changes = np.flatnonzero(np.diff(self._h_pages)) + 1
        return np.concatenate([[0], changes, [len(self)]]).astype(np.int64)

    def _sample(self, index: int, data) -> np.ndarray | bytes:
        if self.is_raw:
            return self._decode_raw(data, index)
        return bytes(data)

    def _read_one(self, index: int) -> tuple[np.ndarray | bytes, int]:
        ptr, size = int(self._h_ptrs[index]), int(self._h_sizes[index])
        data = self._pread(ptr, size, index)
        if len(data) < size:
            raise self._cut_off(index, ptr + len(data), ptr + size)
        return self._sample(index, data), int(self._h_labels[index])

    def _read_many(self, indices: np.ndarray, out: np.ndarray | None):
        starts = self._h_ptrs[indices]
        runs = coalesced_runs(indices, starts, starts + self._h_sizes[indices],
                              order=np.argsort(starts, kind="stable"))
        return self._read_runs(
            indices, out, runs,
            (self._pread(run.offset, run.length, run.first_index) for run in runs),
            lambda run, index, end, want: self._cut_off(index, end, want),
            lambda _, index, data: (self._sample(index, data), self._h_labels[index]))

    def _pread(self, offset: int, length: int, index: int) -> bytes:
        try:
            return self._read_at(offset, length)
        except OSError as err:
            raise CorruptSampleError(self.path, index, f"read failed: {err}") from err

    def _cut_off(self, index: int, file_end: int, sample_end: int) -> CorruptSampleError:
        return CorruptSampleError(
            self.path, index,
            f"file is cut off: it ends at byte {file_end}, the allocation table places this "
            f"sample's end at byte {sample_end}")


def open(root: Path, manifest: dict, **options) -> FFCVReader:  # noqa: A001 - registry verb
    return FFCVReader(root, manifest, **options)
