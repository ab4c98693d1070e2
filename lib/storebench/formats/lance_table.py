"""A Lance dataset (``pylance``): the directory ``data.lance`` with columns ``index``,
``label`` (int64) and ``image``.

``image`` holds the encoded PNG/JPEG bytes as given (``binary``), or the raw (H, W, C) uint8
pixels as one ``fixed_size_binary[H*W*C]`` value per sample; ``index`` is the sample's index,
the key a peer loader yields. Rows are in index order, at most ``max_rows_per_file`` per
fragment (one ``.lance`` data file each): the fragments are the natural blocks. The dataset's
spec is in the schema's metadata under ``storebench.spec`` (JSON). ``lance.dataset(root /
"data.lance")`` reads it as it is: ``ds.take(indices, columns=["image", "label"])`` is Lance's
random access, the read path the reader uses.

Layout (a standard Lance dataset, one version)::

    data.lance/data/00000.lance ...     fragment k's data file (samples in index order)
    data.lance/_versions/*.manifest     Lance's manifest of version 1, and its version hint
    data.lance/_transactions/*.txn      the transaction that wrote version 1

Lance's ``write_dataset`` names data files with random ids; the writer streams the samples
through ``lance.fragment.write_fragments`` (Lance's API for writing fragments and committing
them later, bounded memory: batches of ``BATCH_ROWS`` from a ``RecordBatchReader``), renames
each fragment's file to ``NNNNN.lance`` and commits them with ``LanceOperation.Overwrite``,
so that a file's name says which fragment it is and equal builds have equal file names.
Lance's ``max_rows_per_group`` only shapes the legacy (0.1) file format and is not a knob here.

What Lance itself checks when reading: each data file's footer (magic ``LANC``, format
version), its column and page metadata (protobuf), and that pages lie inside the file; it
keeps no checksum of the values, so a changed byte inside an image is read back as it is.
``verify=True`` catches that with the manifest's per-sample CRC32C. Checks that stay on with
``verify=False``: every file's size against the manifest at open, the ``index`` column equal
to ``0..n-1`` and the labels' CRC32C at open, and on every read the ``index`` column of the
rows Lance returns equal to the indices asked for (a row from the wrong place is refused).

Lance is not fork-safe: its Rust (tokio) threads do not survive ``fork()``, and a forked child
of a process that used Lance hangs in its reads more often than not (17 of 30 tries here,
pylance 14, two children each, whatever the child opened afresh). Lance warns about it on
every fork. The reader therefore refuses, with a ``DatasetError``, to run in a forked child
of a process where this module used Lance (``FORK_SAFE = False``): use spawn or forkserver
workers, whose interpreters start clean.
"""

from __future__ import annotations

import builtins
import json
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from .base import CorruptSampleError, DatasetError, ManifestError, Reader
from .manifest import check_files
from .manifest import fingerprint_span as default_span
from .specs import Spec
from .traits import FormatTraits

NAME = "lance"
ENCODINGS = ("raw", "png", "jpeg", "mixed")
PEER = True
LIBRARIES = ("lance", "pyarrow")
# Lance's own default (about a million rows per file) would leave every profile's set in one
# fragment; 4,096 rows make files of tens of MB at the small and medium profiles (e.g. 48 MiB
# of 64x64 raw pixels) and keep several blocks for a block-shuffle sampler.
DEFAULT_KNOBS: dict = {"max_rows_per_file": 4096}
OPEN_OPTIONS: tuple = ()
TRAITS = FormatTraits(
    remote_unsupported=("storebench has no S3 reader for this peer format (the peers study reads "
                        "local files); its own library may read from S3"),
    distributions=("pylance",),
)
# Forked workers of a process that used Lance hang (see the module docstring).
FORK_SAFE = False
# Stored bytes per sample byte: the index and label columns, page and file metadata.
SIZE_OVERHEAD = {"raw": 1.02, "png": 1.02, "jpeg": 1.02, "mixed": 1.02}

DATASET_DIR = "data.lance"
DATA_DIR = "data"
FILE_PATTERN = "{fragment:05d}.lance"
SPEC_METADATA_KEY = b"storebench.spec"
# The one version the writer commits; the reader opens exactly it.
VERSION = 1
COLUMNS = ("index", "label", "image")
# Rows per RecordBatch handed to Lance while writing: bounds the writer's memory.
BATCH_ROWS = 256
# A Lance v2 data file ends with a 40-byte footer: column metadata start, column metadata
# offsets start, global buffer offsets start (u64), global buffer and column counts (u32),
# major and minor version (u16), magic.
_FOOTER = struct.Struct("<QQQIIHH4s")
_MAGIC = b"LANC"

# The pid of the process in which this module first used Lance (started its runtime
# threads). Module state on purpose: it mirrors Lance's own process-wide runtime, which a
# fork copies without its threads.
_lance_started_in: int | None = None


def _lance():
    """The ``lance`` module, refusing a forked child of a process that already used it."""
    global _lance_started_in
    pid = os.getpid()
    if _lance_started_in is not None and _lance_started_in != pid:
        raise DatasetError(
            f"Lance is not fork-safe: it was used in process {_lance_started_in} and this "
            f"process ({pid}) is a fork of it, where Lance's reads hang; read Lance datasets "
            "from spawn or forkserver workers (start_method='spawn' or 'forkserver')"
        )
    import lance

    _lance_started_in = pid
    return lance


def _is_lance_error(err: BaseException) -> bool:
    """Whether ``err`` is how Lance or Arrow reports a damaged or unreadable dataset: their
    exceptions, or a Rust panic (pyo3's ``PanicException`` derives from BaseException)."""
    import pyarrow as pa

    return isinstance(err, OSError | ValueError | RuntimeError | IndexError | pa.ArrowException
                      ) or type(err).__name__ == "PanicException"


def fragment_name(fragment: int) -> str:
    return FILE_PATTERN.format(fragment=fragment)


def fingerprint_span(rel: str, path: Path, size: int) -> tuple[int, int]:
    """For a data file: the first 4 KiB and the tail from the start of its metadata (global
    buffers, column metadata, offset tables and footer) to its end; other files as usual."""
    head, tail = default_span(size)
    if not rel.endswith(".lance") or size < _FOOTER.size:
        return head, tail
    with builtins.open(path, "rb") as f:
        f.seek(size - _FOOTER.size)
        column_meta, _, buffer_table, buffers, _, _, _, magic = _FOOTER.unpack(f.read(_FOOTER.size))
        if magic != _MAGIC:
            return head, tail
        start = column_meta
        f.seek(buffer_table)
        table = f.read(16 * buffers)
        for k in range(len(table) // 16):
            start = min(start, struct.unpack_from("<Q", table, 16 * k)[0])
    return head, min(max(tail, size - start), size - head)


def schema(spec: Spec):
    """The Arrow schema of the dataset, with the spec in its metadata."""
    import pyarrow as pa

    image = pa.binary(spec.raw_sample_bytes) if spec.encoding == "raw" else pa.binary()
    return pa.schema(
        [
            pa.field("index", pa.int64(), nullable=False),
            pa.field("label", pa.int64(), nullable=False),
            pa.field("image", image, nullable=False),
        ],
        metadata={SPEC_METADATA_KEY: json.dumps(spec.to_dict(), sort_keys=True).encode()},
    )


def _batches(samples: Iterable, file_schema, spec: Spec, counter: list[int]) -> Iterator:
    """``samples`` as RecordBatches of up to ``BATCH_ROWS`` rows; ``counter[0]`` counts them."""
    import pyarrow as pa

    image_type = file_schema.field("image").type
    images: list[bytes] = []
    labels: list[int] = []

    def batch():
        first = counter[0] - len(images)
        return pa.record_batch(
            [
                pa.array(np.arange(first, counter[0], dtype=np.int64)),
                pa.array(labels, type=pa.int64()),
                pa.array(images, type=image_type),
            ],
            schema=file_schema,
        )

    for image, label in samples:
        if counter[0] == spec.num_samples:
            raise DatasetError(f"more samples than the spec's {spec.num_samples}")
        images.append(image.tobytes() if isinstance(image, np.ndarray) else bytes(image))
        labels.append(int(label))
        counter[0] += 1
        if len(images) == BATCH_ROWS:
            yield batch()
            images.clear()
            labels.clear()
    if images:
        yield batch()


def write(samples: Iterable, root: Path, spec: Spec, *, max_rows_per_file: int) -> None:
    if max_rows_per_file < 1:
        raise ValueError(f"max_rows_per_file must be positive, got {max_rows_per_file}")
    import pyarrow as pa

    lance = _lance()
    from lance.fragment import DataFile, write_fragments

    uri = root / DATASET_DIR
    file_schema = schema(spec)
    counter = [0]
    reader = pa.RecordBatchReader.from_batches(
        file_schema, _batches(samples, file_schema, spec, counter)
    )
    fragments = write_fragments(
        reader, str(uri), file_schema, mode="create", max_rows_per_file=max_rows_per_file
    )
    if counter[0] != spec.num_samples:
        raise DatasetError(f"{root}: got {counter[0]} samples, the spec says {spec.num_samples}")
    # Fragments come back in the order of their rows; name each file after its fragment.
    for k, fragment in enumerate(fragments):
        (data_file,) = fragment.files
        name = fragment_name(k)
        os.rename(uri / DATA_DIR / data_file.path, uri / DATA_DIR / name)
        fragment.files = [
            DataFile(name, data_file.fields, data_file.column_indices,
                     data_file.file_major_version, data_file.file_minor_version,
                     data_file.file_size_bytes)
        ]
        fragment.id = k
    lance.LanceDataset.commit(str(uri), lance.LanceOperation.Overwrite(file_schema, fragments))


class LanceReader(Reader):
    """Rows by ``LanceDataset.take`` (request order, duplicates allowed), one call per batch.

    A batch whose ``take`` fails is read again one sample at a time, so that the error names
    the sample and the fragment file that cannot be read (and, with ``verify=True``, its
    readable neighbours are still returned when asked for alone).
    """

    def __init__(self, root: Path, manifest: dict, *, verify: bool = True) -> None:
        super().__init__(root, manifest, verify=verify)
        self.uri = self.root / DATASET_DIR
        self._h_dataset = None
        self._h_bounds: np.ndarray | None = None
        self._h_paths: list[Path] | None = None

    # -- open -----------------------------------------------------------------------------
    def _open(self) -> None:
        # Every listed file at its built size (open_dataset checked the fingerprints).
        check_files(self.root, self.manifest, fingerprints=False)
        lance = _lance()
        try:
            dataset = lance.dataset(str(self.uri), version=VERSION)
            fragments = sorted(dataset.get_fragments(), key=lambda f: f.fragment_id)
            metadata = [f.metadata for f in fragments]
            arrow_schema = dataset.schema
        except BaseException as err:
            if not _is_lance_error(err):
                raise
            raise DatasetError(f"{self.uri}: cannot open as a Lance dataset: {err}") from err
        self._check_schema(arrow_schema)
        rows, paths = [], []
        for meta in metadata:
            if len(meta.files) != 1 or meta.deletion_file is not None:
                raise DatasetError(
                    f"{self.uri}: fragment {meta.id} has {len(meta.files)} data files and "
                    f"deletion file {meta.deletion_file}; this dataset was written with one "
                    "file per fragment and no deletions"
                )
            rows.append(meta.physical_rows)
            paths.append(self.uri / DATA_DIR / meta.files[0].path)
        bounds = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        if bounds[-1] != len(self) or np.any(np.diff(bounds) <= 0):
            raise DatasetError(
                f"{self.uri}: fragments hold {rows} rows, the spec says {len(self)} samples"
            )
        self._h_dataset, self._h_bounds, self._h_paths = dataset, bounds, paths
        self._check_index_and_labels()

    def _check_schema(self, arrow_schema) -> None:
        for field in schema(self.spec):
            index = arrow_schema.get_field_index(field.name)
            if index < 0 or arrow_schema.field(field.name).type != field.type:
                raise DatasetError(
                    f"{self.uri}: no {field.type} column {field.name!r} (what a "
                    f"{self.spec.encoding} dataset of this spec has) in {arrow_schema}"
                )
        stored = (arrow_schema.metadata or {}).get(SPEC_METADATA_KEY)
        if stored is None or json.loads(stored) != self.spec.to_dict():
            raise ManifestError(
                f"{self.uri}: the spec in the dataset's schema metadata differs from the "
                "manifest's (or is missing)"
            )

    def _check_index_and_labels(self) -> None:
        """The ``index`` column is 0..n-1 in row order, and the labels are the ones the
        build wrote (CRC32C in the manifest), fragment by fragment so errors name the file."""
        labels = []
        for k, path in enumerate(self._h_paths):
            first, stop = int(self._h_bounds[k]), int(self._h_bounds[k + 1])
            try:
                table = self._h_dataset.take(np.arange(first, stop), columns=["index", "label"])
                index = table.column("index").to_numpy()
                labels.append(table.column("label").to_numpy())
            except BaseException as err:
                if not _is_lance_error(err):
                    raise
                raise DatasetError(f"{path}: cannot read the index and label columns: {err}"
                                   ) from err
            if not np.array_equal(index, np.arange(first, stop)):
                raise DatasetError(
                    f"{path}: its index column is not {first}..{stop - 1} (fragment {k}): the "
                    "file is damaged or not this dataset's"
                )
        self._check_integrity("labels_crc32c", np.concatenate(labels), self.uri, "labels")

    def _close(self) -> None:
        # LanceDataset has no close(): dropping it releases its files.
        self._h_dataset = self._h_bounds = self._h_paths = None

    # -- reads ----------------------------------------------------------------------------
    def _fragment_of(self, indices):
        return np.searchsorted(self._h_bounds, indices, side="right") - 1

    def _locate(self, index: int) -> Path:
        self._ensure_open()
        return self._h_paths[int(self._fragment_of(index))]

    def blocks(self) -> np.ndarray:
        self._ensure_open()
        return self._h_bounds.copy()

    def _take(self, indices: np.ndarray):
        """``(index, label, image)`` columns of ``indices`` as Arrow arrays."""
        table = self._h_dataset.take(indices, columns=list(COLUMNS))
        if table.num_rows != len(indices):
            raise ValueError(f"take returned {table.num_rows} rows for {len(indices)} indices")
        return tuple(table.column(name).combine_chunks() for name in COLUMNS)

    def _take_checked(self, indices: np.ndarray):
        """``_take``, with a failure pinned to the first sample that cannot be read alone,
        and the returned rows' index column compared with ``indices``."""
        try:
            columns = self._take(indices)
        except BaseException as err:
            if not _is_lance_error(err):
                raise
            self._raise_unreadable(indices, err)
        got = columns[0].to_numpy()
        wrong = np.flatnonzero(got != indices)
        if wrong.size:
            i = int(indices[wrong[0]])
            raise CorruptSampleError(
                self._locate(i), i,
                f"Lance returned the row of sample {int(got[wrong[0]])}: the index column or "
                "the fragment's file is damaged or not this dataset's",
            )
        return columns

    def _raise_unreadable(self, indices: np.ndarray, err: BaseException):
        for i in indices.tolist() if len(indices) > 1 else ():
            try:
                self._take(np.array([i]))
            except BaseException as single:
                if not _is_lance_error(single):
                    raise
                raise CorruptSampleError(self._locate(i), i, f"Lance cannot read it: {single}"
                                         ) from single
        i = int(indices[0])
        raise CorruptSampleError(self._locate(i), i, f"Lance cannot read it: {err}") from err

    def _read_one(self, index: int) -> tuple[np.ndarray | bytes, int]:
        images, labels = self._read_many(np.array([index], dtype=np.int64), None)
        return images[0], int(labels[0])

    def _read_many(self, indices: np.ndarray, out: np.ndarray | None):
        _, labels, images = self._take_checked(indices)
        labels = labels.to_numpy().astype(np.int64, copy=False)
        if not self.is_raw:
            return images.to_pylist(), labels
        width = self.spec.raw_sample_bytes
        if images.type.byte_width != width:  # the schema was checked at open
            raise CorruptSampleError(self._locate(int(indices[0])), int(indices[0]),
                                     f"raw sample has {images.type.byte_width} bytes, "
                                     f"expected {width}")
        data = np.frombuffer(images.buffers()[1], dtype=np.uint8)
        start = images.offset * width
        block = data[start : start + len(indices) * width].reshape(
            len(indices), *self.spec.image_shape
        )
        result = self._raw_buffer(len(indices), out)
        result[...] = block
        return result, labels


def open(root: Path, manifest: dict, **options) -> LanceReader:  # noqa: A001 - registry verb
    return LanceReader(root, manifest, **options)

