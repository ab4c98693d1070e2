"""One Parquet file, ``data.parquet``, with columns ``image`` (binary) and ``label`` (int64).

``image`` holds encoded PNG/JPEG bytes, or the raw (H, W, C) uint8 pixels as ``tobytes()``;
rows are in sample index order, ``row_group_size`` samples per row group. The dataset's spec
is also in the file's key-value metadata under ``storebench.spec`` (JSON), so
``pyarrow.parquet.read_table(root / "data.parquet")`` alone describes what it read. Pages
carry CRC checksums, and every read verifies them, whatever ``verify`` says (they cost little
next to decoding a row group; see the README's table). The manifest's fingerprint of the file
covers its first 4 KiB and its whole footer (schema, row-group offsets, the spec).

Row groups are Parquet's unit of reading: fetching one sample decodes its whole row group.
The reader keeps only the most recent row group, so sequential access costs one decode per
group while random per-sample access pays the full group each time (the pathology the study
measures); ``blocks()`` gives the row-group boundaries a block-shuffle sampler needs.
"""

from __future__ import annotations

import builtins
import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from data_gen import DatasetSpec

from ..gather import take_rows
from .base import (
    CorruptSampleError,
    DatasetError,
    ManifestError,
    Reader,
    runs_by_block,
    sample_checksum,
)
from .manifest import fingerprint_span as default_span
from .remote_reader import RemoteReader
from .traits import FormatTraits, KnobVariant

NAME = "parquet"
ENCODINGS = ("raw", "png", "jpeg", "mixed")
# 256 samples per row group: a few MB per group at the small/medium profiles' sample sizes,
# small enough that per-sample random access is not hopeless, large enough to amortise a
# group's fixed costs. No compression by default: PNG/JPEG bytes are already entropy-coded
# and the noisy raw pixels barely shrink, so a codec would add decode time for little space.
DEFAULT_KNOBS: dict = {"row_group_size": 256, "compression": "none"}
OPEN_OPTIONS: tuple = ()
TRAITS = FormatTraits(
    # On the ImageNet-like set a row group of 1024 samples is 154 MB, read whole for every
    # random sample, and zstd over JPEG bytes (entropy-coded) saves nothing: built for the
    # synthetic sets only, where they cost little.
    knob_variants=(KnobVariant(NAME, "raw", (("row_group_size", 64),)),
                   KnobVariant(NAME, "raw", (("row_group_size", 1024),),
                               families=("synthetic",)),
                   KnobVariant(NAME, "raw", (("compression", "zstd"),)),
                   KnobVariant(NAME, "jpeg", (("compression", "zstd"),),
                               families=("synthetic",))),
    knob_metrics={"row_group_size": "random_cold", "compression": "size_ratio"},
    # A random sample reads its whole row group: its shuffled order is a block shuffle.
    shuffle_unit="block",
    variant_access="block_shuffle",
    checks_content=True,  # every page carries a CRC32 that pyarrow checks
    distributions=("pyarrow",),
)
COMPRESSIONS = ("none", "snappy", "zstd", "gzip", "lz4", "brotli")

FILENAME = "data.parquet"
SPEC_METADATA_KEY = b"storebench.spec"
COLUMNS = ("image", "label")
SIZE_OVERHEAD = {"raw": 1.02, "png": 1.02, "jpeg": 1.02, "mixed": 1.02}
# A damaged footer can fail in pyarrow's reader or in decoding its key-value metadata.
_OPEN_ERRORS = (OSError, pa.ArrowException, ValueError, TypeError)


def fingerprint_span(rel: str, path: Path, size: int) -> tuple[int, int]:
    """The first 4 KiB, and the tail through the whole footer (its length is in the file's
    last 8 bytes: a little-endian uint32 and ``PAR1``)."""
    head, tail = default_span(size)
    if size >= 12:
        with builtins.open(path, "rb") as f:
            f.seek(size - 8)
            footer = int.from_bytes(f.read(4), "little")
        tail = min(max(tail, footer + 8), size - head)
    return head, tail


def schema(spec: DatasetSpec) -> pa.Schema:
    """The file's Arrow schema, with the spec in its key-value metadata."""
    return pa.schema(
        [
            pa.field("image", pa.binary(), nullable=False),
            pa.field("label", pa.int64(), nullable=False),
        ],
        metadata={SPEC_METADATA_KEY: json.dumps(spec.to_dict(), sort_keys=True).encode()},
    )


def write(
    samples: Iterable, root: Path, spec: DatasetSpec, *, row_group_size: int, compression: str
) -> None:
    if row_group_size < 1:
        raise ValueError(f"row_group_size must be positive, got {row_group_size}")
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    path = root / FILENAME
    file_schema = schema(spec)
    count = 0
    images: list[bytes] = []
    labels: list[int] = []
    # Dictionary encoding and min/max statistics are pointless for unique image blobs (and
    # statistics would copy image bytes into the footer); the labels keep both.
    with pq.ParquetWriter(
        path,
        file_schema,
        compression=compression.upper(),
        use_dictionary=["label"],
        write_statistics=["label"],
        write_page_checksum=True,
    ) as writer:

        def flush() -> None:
            table = pa.table(
                [pa.array(images, type=pa.binary()), pa.array(labels, type=pa.int64())],
                schema=file_schema,
            )
            writer.write_table(table, row_group_size=row_group_size)
            images.clear()
            labels.clear()

        for image, label in samples:
            images.append(image.tobytes() if isinstance(image, np.ndarray) else bytes(image))
            labels.append(int(label))
            count += 1
            if len(images) == row_group_size:
                flush()
        if images:
            flush()
    if count != spec.num_samples:
        raise DatasetError(f"{root}: got {count} samples, the spec says {spec.num_samples}")


class _RowGroup:
    """One decoded row group as flat NumPy views: image bytes ``data[offsets[j]:offsets[j+1]]``.

    ``damaged`` holds the sample indices known to be bad (see ``ParquetReader._salvage``) and
    ``damage`` says why.
    """

    __slots__ = ("group", "offsets", "data", "labels", "damaged", "damage", "sizes",
                 "_rows_of")

    def __init__(self, group: int, offsets: np.ndarray, data: np.ndarray, labels: np.ndarray):
        self.group, self.offsets, self.data, self.labels = group, offsets, data, labels
        self.damaged: frozenset[int] = frozenset()
        self.damage = ""
        self.sizes = np.diff(offsets)
        self._rows_of: tuple[int, np.ndarray | None] | None = None

    def rows_of(self, size: int) -> np.ndarray | None:
        """The group's data as one (rows, ``size``) array when every image has ``size``
        bytes, else ``None``; worked out once per group, not once per batch it serves."""
        if self._rows_of is None or self._rows_of[0] != size:
            uniform = bool(np.all(self.sizes == size))
            block = (self.data[self.offsets[0] : self.offsets[-1]].reshape(len(self.sizes), size)
                     if uniform else None)
            self._rows_of = (size, block)
        return self._rows_of[1]

    def image(self, j: int) -> np.ndarray:
        return self.data[self.offsets[j] : self.offsets[j + 1]]


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array: its only chunk as it is (a row group read gives one), since
    ``combine_chunks`` copies even a single chunk (3 MiB per raw row group, on every read)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _load_row_group(parquet_file: pq.ParquetFile, group: int, rows: int) -> _RowGroup:
    """Read and unpack one row group. pyarrow's errors pass through; a wrong row count or a
    null raises ``ArrowInvalid`` too."""
    table = parquet_file.read_row_group(group, columns=list(COLUMNS), use_threads=False)
    images = _one_chunk(table.column("image"))
    label_column = _one_chunk(table.column("label"))
    if (len(images) != rows or len(label_column) != rows or images.null_count
            or label_column.null_count):
        raise pa.ArrowInvalid(
            f"{len(images)} images ({images.null_count} null) and {len(label_column)} labels "
            f"({label_column.null_count} null), expected {rows}"
        )
    # From the buffer: Array.to_numpy() imports pandas, which a reader otherwise never needs.
    labels = np.frombuffer(label_column.buffers()[1], dtype=np.int64)[
        label_column.offset : label_column.offset + rows]
    _, offset_buffer, data_buffer = images.buffers()
    offsets = np.frombuffer(offset_buffer, dtype=np.int32)[images.offset : images.offset + rows + 1]
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)
        if data_buffer is not None
        else np.empty(0, dtype=np.uint8)
    )
    return _RowGroup(group, offsets, data, labels)


class ParquetReader(Reader):
    """Row-group reads through ``pyarrow.parquet.ParquetFile`` with page checksums verified.

    ``read_many`` reads each row group a batch touches once and scatters its rows into the
    requested order (into ``out`` for raw data). Reads are single-threaded: parallelism
    belongs to the loader's workers.

    A row group whose pages fail their checksums raises ``CorruptSampleError``: with
    ``verify=True`` for exactly the samples whose bytes disagree with the manifest (the rest
    of the group stays readable), with ``verify=False`` for the whole group, naming its
    first sample.

    ``loads_whole_blocks``: each row group a read touches is decoded whole.

    ``row_group_reads`` says how many row groups this process has read and how long that
    took, which is what an access pattern costs in Parquet's unit of reading.
    """

    loads_whole_blocks = True

    def __init__(self, root: Path, manifest: dict, *, verify: bool = True) -> None:
        super().__init__(root, manifest, verify=verify)
        self.path = self.root / FILENAME
        self._h_file: pq.ParquetFile | None = None
        self._h_bounds: np.ndarray | None = None
        self._h_cached: _RowGroup | None = None
        self._h_reads: list | None = None  # [row groups read, seconds], this process's

    def _parquet_file(self, *, checked: bool = True) -> pq.ParquetFile:
        """The file opened for reading, with page checksums verified when ``checked`` (an
        I/O hook: ``storebench.remote`` opens an object instead)."""
        return pq.ParquetFile(self.path, page_checksum_verification=checked)

    def _open(self) -> None:
        try:
            parquet_file = self._parquet_file()
        except FileNotFoundError:
            raise DatasetError(f"{self.path}: missing") from None
        except _OPEN_ERRORS as err:
            raise DatasetError(f"{self.path}: cannot open as Parquet: {err}") from err
        try:
            self._check_file(parquet_file)
            sizes = [
                parquet_file.metadata.row_group(g).num_rows
                for g in range(parquet_file.metadata.num_row_groups)
            ]
        except _OPEN_ERRORS as err:
            parquet_file.close()
            raise DatasetError(f"{self.path}: damaged Parquet metadata: {err}") from err
        except BaseException:
            parquet_file.close()
            raise
        self._h_bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        if self._h_bounds[-1] != len(self) or np.any(np.diff(self._h_bounds) <= 0):
            parquet_file.close()
            raise DatasetError(f"{self.path}: row groups hold {sizes} rows, expected {len(self)}")
        self._h_file = parquet_file
        self._h_cached = None
        self._h_reads = [0, 0.0]
        self._h_reads_lock = threading.Lock()
        # pyarrow's ParquetFile is not safe to read from two threads at once (two
        # ThreadPrefetcher workers reading row groups concurrently hung in read_row_group),
        # and the one-group cache is shared: row-group reads take turns.
        self._h_read_lock = threading.Lock()

    def _check_file(self, parquet_file: pq.ParquetFile) -> None:
        arrow_schema = parquet_file.schema_arrow
        for name, kind in (("image", pa.binary()), ("label", pa.int64())):
            if arrow_schema.get_field_index(name) < 0 or arrow_schema.field(name).type != kind:
                raise DatasetError(f"{self.path}: no {kind} column {name!r} in {arrow_schema}")
        rows = parquet_file.metadata.num_rows
        if rows != len(self):
            raise DatasetError(f"{self.path}: holds {rows} rows, the spec says {len(self)}")
        stored = (arrow_schema.metadata or {}).get(SPEC_METADATA_KEY)
        if stored is None or json.loads(stored) != self.spec.to_dict():
            raise ManifestError(
                f"{self.path}: the spec in the file's metadata differs from the manifest's "
                "(or is missing)"
            )

    def _close(self) -> None:
        if self._h_file is not None:
            self._h_file.close()
        self._h_file = self._h_bounds = self._h_cached = self._h_read_lock = None
        self._h_reads = self._h_reads_lock = None

    @property
    def row_group_reads(self) -> tuple[int, float]:
        """(row groups read, seconds spent reading and unpacking them) in this process since
        the reader opened; a batch served from the cached group reads none."""
        self._ensure_open()
        count, seconds = self._h_reads
        return count, seconds

    def _load(self, parquet_file: pq.ParquetFile, group: int, rows: int) -> _RowGroup:
        """``_load_row_group``, counted in ``row_group_reads`` (a failed read too)."""
        started = time.perf_counter()
        try:
            return _load_row_group(parquet_file, group, rows)
        finally:
            elapsed = time.perf_counter() - started
            with self._h_reads_lock:  # the remote reader's threads read concurrently
                self._h_reads[0] += 1
                self._h_reads[1] += elapsed

    def _locate(self, index: int) -> Path:
        return self.path

    def blocks(self) -> np.ndarray:
        self._ensure_open()
        return self._h_bounds.copy()

    def _group_of(self, indices: np.ndarray | int) -> np.ndarray | int:
        return np.searchsorted(self._h_bounds, indices, side="right") - 1

    def _row_group(self, group: int) -> _RowGroup:
        with self._h_read_lock:
            cached = self._h_cached
            if cached is not None and cached.group == group:
                return cached
            rows = self._h_cached = self._load_group(self._h_file, group)
            return rows

    def _load_group(self, file: pq.ParquetFile, group: int) -> _RowGroup:
        """Row group ``group`` read from ``file``, or what of it can be salvaged."""
        first, stop = int(self._h_bounds[group]), int(self._h_bounds[group + 1])
        try:
            return self._load(file, group, stop - first)
        except _OPEN_ERRORS as err:
            return self._salvage(group, first, stop, err)

    def _salvage(self, group: int, first: int, stop: int, err: Exception) -> _RowGroup:
        """A row group that fails its page checksums: with the manifest's per-sample checksums
        (``verify=True``) re-read it unchecked and mark exactly the samples that disagree, so
        the error names the damaged sample and its neighbours stay readable. Without them, or
        if even the unchecked read fails, the whole group is refused."""
        unreadable = CorruptSampleError(
            self.path, first, f"row group {group} (samples {first}..{stop - 1}) unreadable: {err}"
        )
        if not self.verify:
            raise unreadable from err
        unchecked = None
        try:
            unchecked = self._parquet_file(checked=False)
            rows = _load_row_group(unchecked, group, stop - first)
        except _OPEN_ERRORS:
            raise unreadable from err
        finally:
            if unchecked is not None:
                unchecked.close()
        checksums = self._manifest_checksums()
        rows.damaged = frozenset(
            i
            for i in range(first, stop)
            if sample_checksum(rows.image(i - first), int(rows.labels[i - first])) != checksums[i]
        )
        rows.damage = (
            f"row group {group} (samples {first}..{stop - 1}) fails its page checksum ({err}) "
            "and this sample disagrees with the manifest's checksum"
        )
        return rows

    def _refuse_damaged(self, rows: _RowGroup, requested) -> None:
        for index in requested:
            if index in rows.damaged:
                raise CorruptSampleError(self.path, index, rows.damage)

    def _read_one(self, index: int) -> tuple[np.ndarray | bytes, int]:
        rows = self._row_group(int(self._group_of(index)))
        self._refuse_damaged(rows, (index,))
        j = index - int(self._h_bounds[rows.group])
        image = rows.image(j)
        if self.is_raw:
            return self._decode_raw(image, index).copy(), int(rows.labels[j])
        return image.tobytes(), int(rows.labels[j])

    def _read_many(self, indices: np.ndarray, out: np.ndarray | None):
        labels = np.empty(len(indices), dtype=np.int64)
        images = self._raw_buffer(len(indices), out) if self.is_raw else [b""] * len(indices)
        groups = self._group_of(indices)
        cached = self._h_cached.group if self._h_cached is not None else None
        for positions in runs_by_block(groups, cached):
            rows = self._row_group(int(groups[positions[0]]))
            if rows.damaged:
                self._refuse_damaged(rows, indices[positions].tolist())
            local = indices[positions] - self._h_bounds[rows.group]
            labels[positions] = rows.labels[local]
            if self.is_raw:
                self._gather_raw(rows, indices, positions, local, images)
            else:
                for k, j in zip(positions.tolist(), local.tolist(), strict=True):
                    images[k] = rows.image(j).tobytes()
        return images, labels

    def _gather_raw(
        self,
        rows: _RowGroup,
        indices: np.ndarray,
        positions: np.ndarray,
        local: np.ndarray,
        images: np.ndarray,
    ) -> None:
        """Copy the group's rows ``local`` into ``images[positions]`` as (H, W, C) pixels,
        refusing wrong-sized images."""
        expected = self.spec.raw_sample_bytes
        block = rows.rows_of(expected)
        if block is None:
            wrong = np.flatnonzero(rows.sizes[local] != expected)
            if wrong.size:
                k = int(wrong[0])
                raise CorruptSampleError(
                    self.path,
                    int(indices[positions[k]]),
                    f"raw sample has {int(rows.sizes[local[k]])} bytes, expected {expected}",
                )
            for k, j in zip(positions.tolist(), local.tolist(), strict=True):
                images[k] = rows.image(j).reshape(self.spec.image_shape)
            return
        # Equal sizes: the group's data is one (rows, H*W*C) block. A block-shuffled or
        # sequential batch asks for one contiguous run of positions per group (ascending and
        # distinct, so its span says so): gather straight into the output then, without an
        # intermediate copy.
        first = int(positions[0])
        if positions[-1] - first + 1 == len(positions):
            target = images[first : first + len(positions)].reshape(len(positions), expected)
            take_rows(block, local, target)
        else:
            images[positions] = block[local].reshape(-1, *self.spec.image_shape)


def open(root: Path, manifest: dict, **options) -> ParquetReader:  # noqa: A001 - registry verb
    return ParquetReader(root, manifest, **options)


# -- over object storage ----------------------------------------------------------
# A Parquet file over S3: pyarrow reads each row group's column chunks with ranged GETs
# (``pre_buffer`` coalesces them into few large requests).
#
# Locally, row-group reads take turns on one ``ParquetFile`` (it is not safe to read from two
# threads at once). Over a network that would serialise the round trips too, so here each
# thread reads through its own ``ParquetFile`` with its own one-group cache: two prefetch
# threads keep two row groups in flight.
class RemoteParquetReader(RemoteReader, ParquetReader):
    def _parquet_file(self, *, checked: bool = True) -> pq.ParquetFile:
        return pq.ParquetFile(self.store.open_file(FILENAME),
                              page_checksum_verification=checked, pre_buffer=True)

    def _open(self) -> None:
        super()._open()
        self._h_threads = threading.local()

    def _close(self) -> None:
        self._h_threads = None
        super()._close()

    def _row_group(self, group: int) -> _RowGroup:
        mine = self._h_threads
        cached = getattr(mine, "cached", None)
        if cached is not None and cached.group == group:
            return cached
        if not hasattr(mine, "file"):
            mine.file = self._parquet_file()
        mine.cached = self._load_group(mine.file, group)
        return mine.cached


def open_remote(store, manifest: dict, **options) -> RemoteParquetReader:
    return RemoteParquetReader(store, manifest, **options)
