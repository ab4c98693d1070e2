"""LitData's optimized chunk format: ``chunk-0-K.bin`` files and ``index.json``, as written
by ``litdata.streaming.writer.BinaryWriter`` (the writer ``litdata.optimize`` runs in its
workers), readable by ``litdata.StreamingDataset(input_dir=root)``.

LitData recommends ``litdata.optimize(fn, inputs, output_dir, chunk_bytes=...)``; that
switches the process to ``spawn`` and runs worker processes, so the build here calls the
same ``BinaryWriter`` in this process instead: ``add_item(i, sample)`` in index order,
``done()``, then the merge that writes ``index.json``. Each sample is the tuple
``(index, image, label)``: ``index`` and ``label`` Python ints, ``image`` the encoded
PNG/JPEG ``bytes`` exactly as given (LitData's ``bytes`` serializer stores them as they are,
nothing goes through PIL), or the raw (H, W, C) uint8 array (its ``numpy`` serializer: a
header with dtype and shape, then the pixels). A tuple, not a dict: in LitData 0.2.76 a
dict whose leaves are all ints/bytes/strings is written as an Arrow IPC table appended to
the chunk (the offset table then points nowhere), while a tuple keeps the documented
layout read below. ``chunk_bytes`` (8 MiB by default: the small profile's 4,000 JPEGs
make about eight chunks) is where the writer starts a new chunk; samples never straddle
chunks and the chunks hold consecutive index ranges in order, so they are the blocks.

Layout, all little-endian (``litdata/streaming/writer.py``, ``_create_chunk``)::

    chunk     uint32 num_items | uint32 offsets[num_items + 1] | items
    item      uint32 sizes[3] | int64 index | image leaf (sizes[1] bytes) | int64 label
    raw leaf  uint32 dtype (4: uint8) | uint32 ndim (3) | uint32 H, W, C | pixels

``offsets`` are absolute positions in the chunk file, the last one its size. ``index.json``
lists the chunks (file name, item count, byte size) and the writer's config (serializers,
compression, encryption).

Reading here parses that layout directly with ``os.pread`` (no LitData or torch import):
``StreamingDataset[i]`` also reads one item at random, but through a per-process reader
that maps whole chunks, which the Reader contract (threads sharing one reader, forked and
spawned workers) does not need. LitData keeps no checksums, so ``verify=False`` relies on
structural checks, always on: ``index.json`` whole against the manifest's fingerprint,
and its config (no compression, no encryption, this tuple's serializers); every chunk's
size against ``index.json``, its item count and offset table (first item right after the
table, non-decreasing, the last offset at the end of the file); the sample sizes the
offset tables imply against the manifest's CRC32C of the sizes; and for every item read,
its leaf sizes against its length, the index it stores against the one asked for (a
chunk swapped, replaced or shifted is caught), and for raw items the dtype and shape.
``verify=True`` adds the manifest's per-sample CRC32C of the image bytes and label.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from data_gen import DatasetSpec

from .base import (
    CorruptSampleError,
    DatasetError,
    ManifestError,
    Reader,
    coalesced_runs,
    has_encoding_magic,
)
from .manifest import check_fingerprint
from .manifest import fingerprint_span as default_span
from .traits import FormatTraits

NAME = "litdata"
ENCODINGS = ("raw", "png", "jpeg", "mixed")
PEER = True
LIBRARIES = ("litdata",)
# LitData's own default is 64 MB (sized for object storage), which would leave the small
# profile's JPEGs (~60 MB) in one chunk; 8 MiB gives several chunks at every profile.
DEFAULT_KNOBS: dict = {"chunk_bytes": 8 << 20}
OPEN_OPTIONS: tuple = ()
TRAITS = FormatTraits(
    remote_unsupported=("storebench has no S3 reader for this peer format (the peers study reads "
                        "local files); its own library may read from S3"),
    distributions=("litdata",),
)
# Per item: 12 bytes of leaf sizes, two int64 and 4 bytes of offset (+20 for a raw header).
SIZE_OVERHEAD = {"raw": 1.02, "png": 1.02, "jpeg": 1.02, "mixed": 1.02}

INDEX_NAME = "index.json"
_CHUNK_RE = re.compile(r"^chunk-\d+-\d+\.bin$")
# The serializers LitData picks for (int, bytes, int) and (int, 3-D ndarray, int).
DATA_FORMATS = {"raw": ["int", "numpy", "int"], "encoded": ["int", "bytes", "int"]}

_UINT32 = struct.Struct("<I")
_LEAF_SIZES = struct.Struct("<III")
_INT64 = struct.Struct("<q")
_RAW_HEADER = struct.Struct("<IIIII")  # dtype index, ndim, H, W, C
_UINT8_DTYPE_INDEX = 4  # litdata.constants._NUMPY_DTYPES_MAPPING[4] is uint8
_INT_BYTES = _INT64.size
_ITEM_OVERHEAD = _LEAF_SIZES.size + 2 * _INT_BYTES  # an encoded item: 28 bytes + the image
_RAW_ITEM_OVERHEAD = _ITEM_OVERHEAD + _RAW_HEADER.size  # a raw item: 48 bytes + the pixels
# A run of adjacent items is fetched with one pread, up to this many bytes.


def fingerprint_span(rel: str, path: Path, size: int) -> tuple[int, int]:
    """``index.json`` is small and read whole at open: fingerprint all of it."""
    return (size, 0) if rel == INDEX_NAME else default_span(size)


def sample_tuple(index: int, image, label: int) -> tuple:
    """The sample as handed to LitData's writer: ``(index, image, label)``."""
    return (int(index), image, int(label))


def write(samples: Iterable, root: Path, spec: DatasetSpec, *, chunk_bytes: int) -> None:
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
    from litdata.streaming.writer import BinaryWriter

    raw = spec.encoding == "raw"
    writer = BinaryWriter(str(root), chunk_bytes=chunk_bytes)
    count = 0
    with warnings.catch_warnings():
        # A sample larger than chunk_bytes gets a chunk of its own: expected with tiny knobs.
        warnings.filterwarnings("ignore", message="An item was larger than the target chunk")
        for i, (image, label) in enumerate(samples):
            if i >= spec.num_samples:
                raise DatasetError(f"{root}: got more samples than the spec's {spec.num_samples}")
            if raw:
                image = np.asarray(image)
                if image.shape != spec.image_shape or image.dtype != np.uint8:
                    raise DatasetError(
                        f"{root}: sample {i} is {image.dtype} {image.shape}, the spec says "
                        f"uint8 {spec.image_shape}"
                    )
                image = np.ascontiguousarray(image)
            else:
                image = bytes(image)  # LitData's bytes serializer takes bytes only
            writer.add_item(i, sample_tuple(i, image, label))
            count += 1
        if count != spec.num_samples:
            raise DatasetError(f"{root}: got {count} samples, the spec says {spec.num_samples}")
        writer.done()
    # merge() does the same after waiting for every rank's partial index (forever, should a
    # WORLD_SIZE variable say there are other ranks); this process is the only writer.
    writer._merge_no_wait()
    if not (root / INDEX_NAME).is_file():
        raise DatasetError(f"{root}: LitData's writer left no {INDEX_NAME}")


def read_index_json(root: Path, data: bytes) -> tuple[list[dict], dict]:
    """``(chunks, config)`` of the ``index.json`` at ``root`` (``data``: its bytes), checked
    for what this format writes: no compression or encryption, PyTreeLoader items and
    well-formed chunk entries (file name, item count, byte size), in order."""
    path = root / INDEX_NAME
    try:
        index = json.loads(data)
        chunks, config = index["chunks"], index["config"]
    except (ValueError, KeyError, TypeError) as err:
        raise DatasetError(f"{path}: unreadable LitData index: {err}") from err
    if not isinstance(chunks, list) or not chunks or not isinstance(config, dict):
        raise DatasetError(f"{path}: LitData index without chunks or config")
    for key in ("compression", "encryption"):
        if config.get(key):
            raise DatasetError(f"{path}: chunks written with {key} {config[key]!r}; this "
                               "reader reads uncompressed, unencrypted chunks only")
    if config.get("item_loader") != "PyTreeLoader":
        raise DatasetError(f"{path}: item loader {config.get('item_loader')!r}, expected "
                           "PyTreeLoader")
    for k, chunk in enumerate(chunks):
        ok = (
            isinstance(chunk, dict)
            and isinstance(chunk.get("filename"), str)
            and _CHUNK_RE.match(chunk["filename"])
            and isinstance(chunk.get("chunk_size"), int) and chunk["chunk_size"] > 0
            and isinstance(chunk.get("chunk_bytes"), int) and chunk["chunk_bytes"] > 0
        )
        if not ok:
            raise DatasetError(f"{path}: damaged entry for chunk {k}: {chunk!r}")
    return chunks, config


class LitDataReader(Reader):
    """Random access to LitData chunks through their offset tables, with ``os.pread``.

    ``read_many`` sorts a batch by position, fetches each run of adjacent items of one chunk
    in one ``pread`` and returns the samples in the requested order.
    """

    def __init__(self, root: Path, manifest: dict, *, verify: bool = True) -> None:
        super().__init__(root, manifest, verify=verify)
        self._h_files: list[io.FileIO] | None = None
        self._h_paths: list[Path] | None = None
        self._h_bounds: np.ndarray | None = None  # [0, b1, ..., n]: chunk k holds [bk, bk+1)
        self._h_starts: np.ndarray | None = None  # each item's first byte in its chunk
        self._h_ends: np.ndarray | None = None

    # -- opening ---------------------------------------------------------------------------
    def _open(self) -> None:
        chunks, config = self._load_index()
        expected = DATA_FORMATS["raw" if self.is_raw else "encoded"]
        if config.get("data_format") != expected:
            raise ManifestError(
                f"{self.root / INDEX_NAME}: items hold {config.get('data_format')} leaves, a "
                f"{self.spec.encoding} dataset of this format {expected}"
            )
        counts = np.array([chunk["chunk_size"] for chunk in chunks], dtype=np.int64)
        if int(counts.sum()) != len(self):
            raise DatasetError(
                f"{self.root / INDEX_NAME}: its chunks hold {int(counts.sum())} samples, the "
                f"manifest says {len(self)}"
            )
        paths = [self.root / chunk["filename"] for chunk in chunks]
        files = []
        try:
            for path in paths:
                try:
                    files.append(io.FileIO(path, "r"))
                except OSError as err:
                    raise DatasetError(f"{path}: cannot open chunk: {err}") from err
            starts, ends = self._load_offset_tables(files, paths, chunks)
        except BaseException:
            for f in files:
                f.close()
            raise
        self._h_files, self._h_paths = files, paths
        self._h_bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._h_starts, self._h_ends = starts, ends
        # Items do not say how images are encoded: check the first one against the spec (a
        # raw item has the wrong serializer already; a PNG item here the wrong signature).
        try:
            image, _ = self._read_one(0)
            if not self.is_raw and not has_encoding_magic(self.spec.encoding, image):
                raise ManifestError(
                    f"{paths[0]}: sample 0 is not {self.spec.encoding}, as the manifest says"
                )
        except BaseException:
            self._close()
            raise

    def _load_index(self) -> tuple[list[dict], dict]:
        path = self.root / INDEX_NAME
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise DatasetError(f"{path}: LitData index missing") from None
        except OSError as err:
            raise DatasetError(f"{path}: unreadable LitData index: {err}") from err
        recorded = self.manifest["fingerprints"].get(INDEX_NAME)
        if recorded is None:
            raise DatasetError(f"{path}: not listed in the manifest")
        check_fingerprint(path, recorded, data)
        return read_index_json(self.root, data)

    def _load_offset_tables(self, files, paths, chunks) -> tuple[np.ndarray, np.ndarray]:
        """Every item's (start, end) byte in its chunk, from the chunks' headers, checked."""
        starts, ends = [], []
        overhead = _RAW_ITEM_OVERHEAD if self.is_raw else _ITEM_OVERHEAD
        for f, path, chunk in zip(files, paths, chunks):
            count, size = chunk["chunk_size"], os.fstat(f.fileno()).st_size
            if size != chunk["chunk_bytes"]:
                raise DatasetError(
                    f"{path}: chunk has {size} bytes, {INDEX_NAME} says {chunk['chunk_bytes']} "
                    "(cut off or replaced)"
                )
            table_bytes = _UINT32.size * (count + 2)
            head = os.pread(f.fileno(), table_bytes, 0)
            if len(head) < table_bytes:
                raise DatasetError(f"{path}: chunk ends inside its offset table")
            stored_count = _UINT32.unpack_from(head)[0]
            if stored_count != count:
                raise DatasetError(
                    f"{path}: chunk header says {stored_count} items, {INDEX_NAME} {count}"
                )
            offsets = np.frombuffer(head, dtype="<u4", offset=_UINT32.size).astype(np.int64)
            lengths = np.diff(offsets)
            if offsets[0] != table_bytes or (lengths < overhead).any() or offsets[-1] != size:
                raise DatasetError(
                    f"{path}: damaged offset table: items must follow the table (byte "
                    f"{table_bytes}) back to back, each at least {overhead} bytes, up to the "
                    f"end of the chunk (byte {size})"
                )
            starts.append(offsets[:-1])
            ends.append(offsets[1:])
        starts, ends = np.concatenate(starts), np.concatenate(ends)
        # What each item's image leaf holds, from the offsets alone: compared with the sizes
        # the build recorded, a shifted offset that still looks well-formed is caught.
        self._check_integrity(
            "sizes_crc32c", ends - starts - overhead, self.root / INDEX_NAME,
            "the sample sizes implied by the chunks' offset tables",
        )
        return starts, ends

    def _close(self) -> None:
        for f in self._h_files or ():
            f.close()
        self._h_files = self._h_paths = self._h_bounds = self._h_starts = self._h_ends = None

    # -- layout ----------------------------------------------------------------------------
    def _chunk_of(self, index: int) -> int:
        return int(np.searchsorted(self._h_bounds, index, side="right")) - 1

    def _locate(self, index: int) -> Path:
        if self._h_paths is None:
            self._ensure_open()
        return self._h_paths[self._chunk_of(index)]

    def blocks(self) -> np.ndarray:
        self._ensure_open()
        return self._h_bounds.copy()

    # -- reading ---------------------------------------------------------------------------
    def _read_one(self, index: int) -> tuple[np.ndarray | bytes, int]:
        chunk = self._chunk_of(index)
        start, end = int(self._h_starts[index]), int(self._h_ends[index])
        data = self._pread(chunk, start, end - start, index)
        if len(data) < end - start:
            raise self._cut_off(chunk, index, start + len(data), end)
        return self._parse_item(chunk, index, memoryview(data))

    def _read_many(self, indices: np.ndarray, out: np.ndarray | None):
        chunks = np.searchsorted(self._h_bounds, indices, side="right") - 1
        runs = coalesced_runs(indices, self._h_starts[indices], self._h_ends[indices], chunks)
        return self._read_runs(
            indices, out, runs,
            (self._pread(run.file, run.offset, run.length, run.first_index) for run in runs),
            lambda run, index, end, want: self._cut_off(run.file, index, end, want),
            self._parse_item)

    def _pread(self, chunk: int, offset: int, length: int, index: int) -> bytes:
        try:
            return os.pread(self._h_files[chunk].fileno(), length, offset)
        except OSError as err:
            raise CorruptSampleError(self._h_paths[chunk], index, f"read failed: {err}") from err

    def _cut_off(self, chunk: int, index: int, file_end: int, item_end: int):
        return CorruptSampleError(
            self._h_paths[chunk], index,
            f"chunk is cut off: it ends at byte {file_end}, its offset table places this "
            f"item's end at byte {item_end}",
        )

    def _parse_item(self, chunk: int, index: int, item: memoryview):
        path = self._h_paths[chunk]
        first, image_size, last = _LEAF_SIZES.unpack_from(item)
        if (first, last) != (_INT_BYTES, _INT_BYTES) or (
            _LEAF_SIZES.size + first + image_size + last != len(item)
        ):
            raise CorruptSampleError(
                path, index,
                f"item header gives leaves of {first}, {image_size} and {last} bytes, the "
                f"offset table {len(item)} bytes in all: not an (index, image, label) item",
            )
        stored_index = _INT64.unpack_from(item, _LEAF_SIZES.size)[0]
        if stored_index != index:
            raise CorruptSampleError(
                path, index, f"item holds sample {stored_index}: chunk damaged or out of place"
            )
        at = _LEAF_SIZES.size + _INT_BYTES
        image = item[at : at + image_size]
        label = _INT64.unpack_from(item, at + image_size)[0]
        if not self.is_raw:
            return bytes(image), label
        header = _RAW_HEADER.unpack_from(image) if image_size >= _RAW_HEADER.size else None
        if header is None or header != (_UINT8_DTYPE_INDEX, 3, *self.spec.image_shape):
            raise CorruptSampleError(
                path, index,
                f"raw item header (dtype index, ndim, shape) {header}, expected uint8 "
                f"{self.spec.image_shape}",
            )
        return self._decode_raw(image[_RAW_HEADER.size :], index), label


def open(root: Path, manifest: dict, **options) -> LitDataReader:  # noqa: A001 - registry verb
    return LitDataReader(root, manifest, **options)
