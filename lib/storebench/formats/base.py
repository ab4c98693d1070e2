"""The Reader contract every format meets, and the errors it raises."""

from __future__ import annotations

import abc
import operator
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePath
from typing import NamedTuple

import crc32c
import numpy as np

from .._rows import crc32c_rows
from ..buffers import batch_empty
from .specs import Spec, spec_from_dict

# Why a sample that fails its manifest checksum is refused.
DAMAGED = "checksum mismatch: stored bytes or label damaged"
# How a stored PNG/JPEG file starts: lets a reader whose format does not record the encoding
# refuse a manifest that names the wrong one.
ENCODING_MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "jpeg": b"\xff\xd8\xff"}


def sniff_encoding(data) -> str | None:
    """"png" or "jpeg" from a stored image's first bytes, None for anything else."""
    head = bytes(data[:8])
    return next((name for name, magic in ENCODING_MAGIC.items() if head.startswith(magic)), None)


def has_encoding_magic(encoding: str, data) -> bool:
    """Whether ``data`` starts as ``encoding`` says ("mixed": PNG or JPEG)."""
    found = sniff_encoding(data)
    return found is not None and encoding in (found, "mixed")


def as_path(path) -> PurePath:
    """``path`` as a Path, leaving any PurePath as it is (an ``s3://`` path stays one)."""
    return path if isinstance(path, PurePath) else Path(path)


class DatasetError(Exception):
    """A dataset cannot be opened or read: missing, incomplete, or damaged."""


class ManifestError(DatasetError):
    """The manifest is missing, unreadable, or does not describe what is on disk."""


class CorruptSampleError(DatasetError):
    """One sample's stored bytes are damaged; the message names the file and the index."""

    def __init__(self, path: Path | str, index: int, reason: str) -> None:
        self.path = as_path(path)
        self.index = int(index)
        self.reason = reason
        super().__init__(f"{self.path}: sample {self.index}: {reason}")


def check_index(index, length: int, *, where: object) -> int:
    """``index`` as a non-negative int below ``length``.

    Python's rules: ints and NumPy integers, negative ones counting from the end
    (``-length <= index < length``). A bool, float or str is a TypeError, not a coercion:
    ``r[3.7]`` must not quietly read sample 3. ``where`` (the dataset) prefixes the messages.
    """
    if isinstance(index, bool | np.bool_):
        raise TypeError(f"{where}: sample index {index!r} is a bool, not an integer")
    try:
        i = operator.index(index)
    except TypeError:
        raise TypeError(
            f"{where}: sample index {index!r} is a {type(index).__name__}, not an integer"
        ) from None
    if not -length <= i < length:
        raise IndexError(f"{where}: sample index {index} out of range for {length}")
    return i + length if i < 0 else i


def check_indices(indices, length: int, *, where: object) -> np.ndarray:
    """A batch of indices as a flat int64 array, by ``check_index``'s rules for each.

    Integer arrays (any width, signed or not) pass without a per-element Python loop; an
    array of bools, floats or strings is a TypeError naming its first element, as is a list
    holding a bool (NumPy would silently turn ``[True, 1]`` into ``[1, 1]``).
    """
    if (type(indices) is np.ndarray and indices.dtype == np.int64 and indices.ndim == 1
            and indices.size and indices.view(np.uint64).max() < length):
        # Every index in [0, length): what a loader's batches are, one reduction on the hot
        # path (negative ones wrap past ``length`` here and take the full check below).
        return indices
    if not isinstance(indices, np.ndarray) and any(
        isinstance(x, bool | np.bool_) for x in indices
    ):
        first = next(x for x in indices if isinstance(x, bool | np.bool_))
        raise TypeError(f"{where}: sample index {first!r} is a bool, not an integer")
    array = np.asarray(indices)
    if array.size == 0:  # np.asarray([]) is float64: an empty request is still valid
        return np.empty(0, dtype=np.int64)
    if array.dtype.kind not in "iu":
        first = array.reshape(-1)[0]
        raise TypeError(
            f"{where}: sample indices must be integers, got {array.dtype} "
            f"(first: {first!r})"
        )
    array = array.reshape(-1)
    low, high = array.min(), array.max()
    if low < -length or high >= length:
        bad = low if low < -length else high
        raise IndexError(f"{where}: sample index {int(bad)} out of range for {length}")
    idx = array.astype(np.int64, copy=False)
    if low < 0:
        idx = np.where(idx < 0, idx + length, idx)
    return idx


def crc32c_of_ints(values: np.ndarray) -> int:
    """CRC32C of integers as little-endian int64: how the manifest fingerprints labels and
    sample sizes."""
    return crc32c.crc32c(np.ascontiguousarray(values, dtype="<i8").tobytes())


def _stored_bytes(image: np.ndarray | bytes) -> np.ndarray | bytes:
    """The sample's bytes as a buffer ``crc32c`` reads in place: an array's ``tobytes()``
    would copy every sample once more on each verified read."""
    if isinstance(image, bytes | bytearray | memoryview):
        return image
    return np.ascontiguousarray(image)


def sample_checksum(image: np.ndarray | bytes, label: int) -> int:
    """CRC32C of a sample's stored bytes followed by its label as 8 little-endian bytes."""
    return crc32c.crc32c(int(label).to_bytes(8, "little", signed=True),
                         crc32c.crc32c(_stored_bytes(image)))


def sample_checksums(images: np.ndarray | Sequence[bytes], labels: np.ndarray) -> np.ndarray:
    """``sample_checksum`` of each sample of a batch, as uint32: one pass with no
    per-sample conversions (a verified raw epoch spent as long in them as in the CRCs). A
    raw batch (one array, a sample per row) is checksummed in C, four rows' CRCs
    interleaved, with the GIL released (``storebench._rows.crc32c_rows``)."""
    if isinstance(images, np.ndarray):  # a raw batch: each row is one sample's bytes
        checksums = np.empty(len(images), np.uint32)
        crc32c_rows(np.ascontiguousarray(images), np.ascontiguousarray(labels, np.int64),
                    checksums)
        return checksums
    label_bytes = np.ascontiguousarray(labels, dtype="<i8").tobytes()
    stored = [_stored_bytes(image) for image in images]
    return np.fromiter(
        (crc32c.crc32c(label_bytes[8 * k : 8 * k + 8], crc32c.crc32c(data))
         for k, data in enumerate(stored)),
        dtype=np.uint32, count=len(labels))


# The most bytes one coalesced read fetches: it bounds a run's buffer whatever the batch.
MAX_RUN_BYTES = 16 << 20


class ByteRun(NamedTuple):
    """One read that fetches adjacent samples: ``length`` bytes at ``offset`` of file number
    ``file``, the first being sample ``first_index``; ``samples`` holds (index, position in
    the batch, start, end) of each, start and end counted from ``offset``."""

    file: int
    offset: int
    length: int
    first_index: int
    samples: tuple[tuple[int, int, int, int], ...]


def coalesced_runs(indices: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   files: np.ndarray | None = None, *, order: np.ndarray | None = None,
                   max_bytes: int = MAX_RUN_BYTES) -> list[ByteRun]:
    """The reads that fetch a batch: ``indices`` in batch order with each one's bytes
    ``[starts, ends)`` in file ``files`` (one file where None), visited in ``order`` (default:
    index order, which is file-then-offset order where samples are stored in index order).
    Samples that follow each other directly in one file share a read of at most
    ``max_bytes``; a file change, a gap or a repeated index starts a new one."""
    order = np.argsort(indices, kind="stable") if order is None else order
    files = np.zeros(len(indices), np.int64) if files is None else files[order]
    starts, ends = starts[order], ends[order]
    follows = np.zeros(len(order), dtype=bool)
    follows[1:] = (files[1:] == files[:-1]) & (starts[1:] == ends[:-1])
    # Python lists: the loop below touches them per sample, where NumPy scalars are slow.
    sorted_idx, positions = indices[order].tolist(), order.tolist()
    files, starts, ends, follows = files.tolist(), starts.tolist(), ends.tolist(), follows.tolist()
    runs, a = [], 0
    while a < len(sorted_idx):
        stop, base = a + 1, starts[a]
        while stop < len(sorted_idx) and follows[stop] and ends[stop] - base <= max_bytes:
            stop += 1
        runs.append(ByteRun(files[a], base, ends[stop - 1] - base, sorted_idx[a], tuple(
            (sorted_idx[j], positions[j], starts[j] - base, ends[j] - base)
            for j in range(a, stop))))
        a = stop
    return runs


def run_samples(runs: Sequence[ByteRun], fetched, cut_off) -> Iterator[tuple]:
    """(run, index, position in the batch, bytes) of every sample of ``runs``, whose bytes
    ``fetched`` yields run by run (possibly short where a file ends: then ``cut_off(run,
    index, file_end, sample_end)`` is the error raised for the first sample it cuts)."""
    for run, data in zip(runs, fetched):
        buffer = memoryview(data)
        for index, position, lo, hi in run.samples:
            if hi > len(buffer):
                raise cut_off(run, index, run.offset + len(buffer), run.offset + hi)
            yield run, index, position, buffer[lo:hi]


def runs_by_block(blocks: np.ndarray, cached: int | None) -> list[np.ndarray]:
    """A batch's positions grouped by the block (row group, chunk) each sample is in,
    ``blocks[k]`` being position k's, positions ascending within a run: the ``cached``
    block's run first (it costs no read, and reading another would evict it), then the
    others in the order the batch reaches them, so that the block read last, which a
    one-block cache keeps, is the one a block-shuffled order goes on in. (In block-number
    order, a batch that ends in a lower-numbered block than it began in left the other one
    cached, and the next batch read its block again: 128 chunk reads for 79 chunks in one
    block-shuffled epoch of the small Zarr set.)"""
    if not len(blocks):
        return []
    order = np.argsort(blocks, kind="stable")
    runs = np.split(order, np.flatnonzero(np.diff(blocks[order])) + 1)
    runs.sort(key=lambda run: (blocks[run[0]] != cached, run[0]))
    return runs


class Reader(abc.ABC):
    """Random and sequential access to one built dataset.

    Subclasses implement ``_open`` (create handles in the calling process), ``_close`` and
    ``_read_one``; they override ``_read_many`` where the format can batch better than a loop.
    Handles are opened lazily and re-opened after a fork, and are never pickled: a Reader
    can be sent to fork, spawn and forkserver workers.

    With ``verify=True`` (the default) every sample is checked against the manifest's
    CRC32C checksums, so a damaged byte raises ``CorruptSampleError`` instead of returning a
    silently wrong sample. ``verify=False`` skips only that per-sample check: the format's own
    checks (TFRecord CRCs, Parquet page checksums, index and label fingerprints, file sizes
    under mapped readers) stay on in both modes.

    Indices follow Python's rules (``-len <= i < len``, NumPy integers accepted, bool, float
    and str refused) in ``r[i]`` and ``read_many`` alike.
    """

    # Whether a read loads each block (``blocks()``) it touches whole into memory (a
    # Parquet row group): the reader's working memory then grows with the block size.
    loads_whole_blocks: bool = False

    def __init__(self, root: Path, manifest: dict, *, verify: bool = True) -> None:
        self.root = as_path(root)
        self.manifest = manifest
        self.spec: Spec = spec_from_dict(manifest["spec"])
        self.verify = verify
        self._checksums: np.ndarray | None = None
        self._open_pid: int | None = None
        self._open_lock = threading.Lock()
        self._lock_pid = os.getpid()

    # -- subclass hooks -------------------------------------------------------------------
    @abc.abstractmethod
    def _open(self) -> None: ...

    @abc.abstractmethod
    def _close(self) -> None: ...

    @abc.abstractmethod
    def _read_one(self, index: int) -> tuple[np.ndarray | bytes, int]: ...

    @abc.abstractmethod
    def _locate(self, index: int) -> Path:
        """The file that holds sample ``index`` (for error messages and cache studies)."""

    def _read_many(
        self, indices: np.ndarray, out: np.ndarray | None
    ) -> tuple[np.ndarray | list[bytes], np.ndarray]:
        labels = np.empty(len(indices), dtype=np.int64)
        if self.is_raw:
            images = self._raw_buffer(len(indices), out)
            for k, i in enumerate(indices):
                images[k], labels[k] = self._read_one(int(i))
            return images, labels
        encoded = []
        for k, i in enumerate(indices):
            image, labels[k] = self._read_one(int(i))
            encoded.append(image)
        return encoded, labels

    def _read_runs(self, indices: np.ndarray, out: np.ndarray | None,
                   runs: Sequence[ByteRun], fetched, cut_off, parse):
        """A batch read as ``coalesced_runs``: ``fetched`` yields each run's bytes,
        ``parse(file, index, data) -> (image, label)`` makes each sample of them, and
        ``cut_off(run, index, file_end, sample_end)`` is the error for a sample a short read
        leaves out."""
        labels = np.empty(len(indices), dtype=np.int64)
        images = self._raw_buffer(len(indices), out) if self.is_raw else [b""] * len(indices)
        for run, index, k, data in run_samples(runs, fetched, cut_off):
            images[k], labels[k] = parse(run.file, index, data)
        return images, labels

    def blocks(self) -> np.ndarray:
        """Boundaries of the format's natural blocks (chunks, row groups, shards) as
        ``[0, b1, ..., len]``; a block-shuffle sampler keeps each block's samples together."""
        return np.array([0, len(self)], dtype=np.int64)

    # -- public API -----------------------------------------------------------------------
    @property
    def is_raw(self) -> bool:
        return self.spec.encoding == "raw"

    @property
    def format(self) -> str:
        return self.manifest["format"]

    def files(self) -> list[Path]:
        """Every data file of the dataset (what cache control evicts and measures)."""
        return [self.root / name for name in self.manifest["files"]]

    def __len__(self) -> int:
        return self.spec.num_samples

    def __getitem__(self, index: int) -> tuple[np.ndarray | bytes, int]:
        index = check_index(index, len(self), where=self.root)
        self._ensure_open()
        image, label = self._read_one(index)
        if self.verify:
            self._verify(index, image, label)
        return image, label

    def read_many(
        self, indices: Sequence[int] | np.ndarray, *, out: np.ndarray | None = None
    ) -> tuple[np.ndarray | list[bytes], np.ndarray]:
        """Read a batch in the given order.

        Returns ``(images, labels)``: images as one (B, H, W, C) uint8 array for raw data
        (written into ``out`` when given), or a list of encoded ``bytes``; labels as int64.
        """
        idx = check_indices(indices, len(self), where=self.root)
        if idx.size == 0:
            empty = self._raw_buffer(0, out) if self.is_raw else []
            return empty, np.empty(0, dtype=np.int64)
        self._ensure_open()
        images, labels = self._read_many(idx, out)
        if self.verify:
            self.check_batch(idx, images, labels)
        return images, labels

    def row_array(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(rows, labels)``: every raw sample as one row of an (N, sample bytes) uint8
        array that a batch can be gathered from directly (``np.take``), checked as a read
        would check it, and the labels; ``None`` where the format keeps no such array, or
        where ``verify=True`` asks for per-sample checksums. Ask again for each batch: the
        check (a file shrunk under a map, say) is per call."""
        return None

    def iter_sequential(self, *, batch_size: int = 256) -> Iterator[tuple[np.ndarray | bytes, int]]:
        """Every sample in index order, read in batches of ``batch_size``."""
        for start in range(0, len(self), batch_size):
            images, labels = self.read_many(np.arange(start, min(start + batch_size, len(self))))
            for image, label in zip(images, labels):
                yield image, int(label)

    def check(self) -> None:
        """Open the dataset in this process, run the format's structural checks (layout,
        index, labels, the spec stored in the data), and close it again, so that a damaged
        or mismatched dataset is refused before any worker starts."""
        self._ensure_open()
        self.close()

    def close(self) -> None:
        if self._open_pid == os.getpid():
            self._close()
        self._open_pid = None

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        # No module globals here (contextlib, os): at interpreter exit they may already be
        # None, and a finaliser must print nothing.
        try:  # noqa: SIM105 - contextlib may be gone at interpreter exit
            self.close()
        except Exception:
            pass

    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_h_")}
        state["_open_pid"] = None
        del state["_open_lock"]
        state["_checksums"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._open_lock = threading.Lock()
        self._lock_pid = os.getpid()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r}, n={len(self)}, {self.spec.encoding})"

    # -- helpers --------------------------------------------------------------------------
    def _ensure_open(self) -> None:
        # Handles live in attributes named _h_*; a forked child re-opens its own. Threads
        # sharing a reader open it once (LMDB refuses a second open in one process).
        pid = os.getpid()
        if self._open_pid == pid:
            return
        if self._lock_pid != pid:  # a forked child: the parent's lock may be held
            self._open_lock = threading.Lock()
            self._lock_pid = pid
        with self._open_lock:
            if self._open_pid == pid:
                return
            for name in [k for k in self.__dict__ if k.startswith("_h_")]:
                setattr(self, name, None)
            self._open()
            self._open_pid = pid

    def _raw_buffer(self, count: int, out: np.ndarray | None) -> np.ndarray:
        shape = (count, *self.spec.image_shape)
        if out is None:
            return batch_empty(shape)
        if out.shape != shape or out.dtype != np.uint8:
            raise ValueError(f"out must be uint8 {shape}, got {out.dtype} {out.shape}")
        return out

    def _manifest_checksums(self) -> np.ndarray:
        """The manifest's per-sample checksums, loaded on first use."""
        if self._checksums is None:
            self._checksums = self._load_checksums()
        return self._checksums

    def _verify(self, index: int, image: np.ndarray | bytes, label: int) -> None:
        if sample_checksum(image, label) != int(self._manifest_checksums()[index]):
            raise CorruptSampleError(self._locate(index), index, DAMAGED)

    def check_batch(self, indices: Sequence[int] | np.ndarray, images, labels: np.ndarray, *,
                    problem: str = DAMAGED) -> None:
        """Compare a batch as read (``images`` and ``labels`` in ``indices`` order) with the
        manifest's per-sample checksums, whatever ``verify`` says: the first sample that
        disagrees raises ``CorruptSampleError`` naming it, with ``problem`` as the reason.
        ``read_many`` runs it on every batch where ``verify=True``; a benchmark that reads
        unverified checks a batch with it outside its timed region."""
        indices = np.asarray(indices)
        wrong = np.flatnonzero(
            sample_checksums(images, labels) != self._manifest_checksums()[indices])
        if wrong.size:
            index = int(indices[wrong[0]])
            raise CorruptSampleError(self._locate(index), index, problem)

    def _load_checksums(self) -> np.ndarray:
        from .manifest import load_checksums

        return load_checksums(self.root, len(self))

    def _check_not_shrunk(
        self, handle, expected: int, name: str, index: int, consequence: str
    ) -> None:
        """Refuse to read when the file ``name`` (under the root), open as ``handle``, is now
        shorter than ``expected`` bytes (truncated under the open reader): one ``fstat``. Its
        path is built only for the error: this runs before every read of a mapped file."""
        size = os.fstat(handle.fileno()).st_size
        if size < expected:
            raise CorruptSampleError(
                self.root / name,
                index,
                f"file shrank to {size} bytes under the open reader (expected {expected}); "
                f"{consequence}",
            )

    def _check_integrity(self, key: str, values: np.ndarray, path: Path, what: str) -> None:
        """Compare an index array read at open (labels, sample sizes) with the CRC32C the
        build recorded in the manifest: a damaged or swapped index is refused even with
        ``verify=False``."""
        expected = self.manifest["integrity"][key]
        if crc32c_of_ints(values) != expected:
            raise DatasetError(
                f"{path}: {what} differ from the ones written at build time "
                "(CRC32C mismatch): the file is damaged or not this dataset's"
            )

    def _decode_raw(self, buffer, index: int) -> np.ndarray:
        """Raw pixel bytes -> (H, W, C) array, refusing a wrong length."""
        expected = self.spec.raw_sample_bytes
        if len(buffer) != expected:
            raise CorruptSampleError(
                self._locate(index),
                index,
                f"raw sample has {len(buffer)} bytes, expected {expected}",
            )
        return np.frombuffer(buffer, dtype=np.uint8).reshape(self.spec.image_shape)
