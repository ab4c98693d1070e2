"""LMDB: one environment directory (``data.mdb``), no pickles.

Keys: the zero-padded decimal sample index in ASCII (``b"00000042"``) -> the image bytes (raw
pixels in C order, or the PNG/JPEG file). ``b"__labels__"`` -> every label as little-endian
int64, in index order. ``b"__spec__"`` -> the DatasetSpec as JSON. Open read-only with
``lmdb.open(root, readonly=True, lock=False)``.

LMDB reads through a memory map: a read past the end of a ``data.mdb`` that shrank after
opening would be SIGBUS, which kills the process. The reader compares the file's size with
the pages the environment uses (one ``fstat``) before every read and raises ``DatasetError``
instead; a truncation in the microseconds between that check and the read can still end the
process with SIGBUS. LMDB has no checksums: with ``verify=False`` a damaged value is returned
as it is (the per-sample CRC32C of ``verify=True`` catches it).

LMDB is trusted input only (``TRUSTED_INPUT_ONLY``): it follows the page numbers and value
sizes it finds in the map, so a crafted ``data.mdb`` (a leaf node's size field raised) makes
a read touch pages past the file's end and the process dies with SIGBUS; no check outside
LMDB sees it coming. ``open_dataset`` opens a ``data.mdb`` only where this user built or
verified that very file (``storebench.formats.trust``); ``storebench verify`` reads any other
one in a separate process first.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from data_gen import DatasetSpec

from .base import CorruptSampleError, DatasetError, ManifestError, Reader
from .traits import FormatTraits

NAME = "lmdb"
ENCODINGS = ("raw", "png", "jpeg", "mixed")
DEFAULT_KNOBS: dict = {"batch_samples": 1024}
OPEN_OPTIONS = ("readahead",)
TRAITS = FormatTraits(
    out_of_core_options=(({"readahead": False}, "shuffle"),),
    readahead_option="readahead",
    remote_unsupported="LMDB maps its database file into memory (mmap), which needs a local file",
    distributions=("lmdb",),
)
# Files a crafted copy of which can crash the reading process (see the module docstring).
TRUSTED_INPUT_ONLY = ("data.mdb",)
LABELS_KEY = b"__labels__"
SPEC_KEY = b"__spec__"
DATA_FILE = "data.mdb"
# Stored bytes per sample byte: values over ~2 KiB take whole overflow pages (a 12 KiB raw
# sample takes 4), plus the B-tree.
SIZE_OVERHEAD = {"raw": 1.4, "png": 1.4, "jpeg": 1.4, "mixed": 1.4}


def key_width(num_samples: int) -> int:
    return max(8, len(str(num_samples - 1)))


def encode_key(index: int, width: int) -> bytes:
    return b"%0*d" % (width, index)


def pages_for_value(nbytes: int, page_size: int) -> int:
    """Pages one value takes: values larger than about half a page go to overflow pages."""
    if nbytes <= page_size // 2 - 64:
        return 1  # shares a leaf page; counted as one to stay on the safe side
    return math.ceil((nbytes + 16) / page_size) + 1


def write(samples: Iterable, root: Path, spec: DatasetSpec, *, batch_samples: int) -> None:
    import lmdb

    page_size = os.sysconf("SC_PAGE_SIZE")
    width = key_width(spec.num_samples)
    # The map grows by what each batch needs, computed from the values' sizes and the pages
    # already used, so the final map size follows the data rather than a guess.
    env = lmdb.open(
        str(root),
        map_size=64 * page_size,
        subdir=True,
        lock=False,
        sync=False,
        metasync=False,
        readahead=False,
        # Zeroed pages: without it a page's unused bytes are whatever memory held, and two
        # builds of the same samples differ.
        meminit=True,
    )
    labels = np.empty(spec.num_samples, dtype="<i8")
    try:
        batch: list[tuple[bytes, bytes]] = []
        count = 0
        for i, (image, label) in enumerate(samples):
            labels[i] = label
            batch.append(
                (encode_key(i, width), image if isinstance(image, bytes) else image.tobytes())
            )
            count += 1
            if len(batch) == batch_samples:
                _put_batch(env, batch, page_size)
                batch = []
        if count != spec.num_samples:
            raise DatasetError(f"{root}: got {count} samples, the spec says {spec.num_samples}")
        batch += [(LABELS_KEY, labels.tobytes()), (SPEC_KEY, json.dumps(spec.to_dict()).encode())]
        _put_batch(env, batch, page_size)
        env.sync(True)
    except lmdb.Error as err:  # a full disk surfaces as "mdb_txn_commit: Input/output error"
        raise DatasetError(f"{root / DATA_FILE}: LMDB write failed: {err}") from err
    finally:
        env.close()
    lock = root / "lock.mdb"
    if lock.exists():
        lock.unlink()


def _put_batch(env, batch: list[tuple[bytes, bytes]], page_size: int) -> None:
    info = env.info()
    used = (info["last_pgno"] + 1) * page_size
    # Values plus branch/leaf pages for the keys (doubled for copy-on-write of the tree).
    needed = sum(pages_for_value(len(v), page_size) for _, v in batch) * page_size
    needed += 2 * math.ceil(len(batch) * 64 / page_size) * page_size + 16 * page_size
    if used + needed > info["map_size"]:
        env.set_mapsize(used + needed)
    with env.begin(write=True) as txn:
        cursor = txn.cursor()
        cursor.putmulti(batch, append=True)


class LmdbReader(Reader):
    """One read transaction per batch, with values copied straight out of the map.

    ``readahead=False`` suits data far larger than RAM; on data that fits it costs 10-15x
    for cold reads (the lazy_vs_preloaded study measures both), so it is a knob and the
    default is the library's (True).
    """

    def __init__(
        self, root: Path, manifest: dict, *, verify: bool = True, readahead: bool = True
    ) -> None:
        super().__init__(root, manifest, verify=verify)
        self.readahead = readahead
        self._width = key_width(len(self))
        self._h_env = None
        self._h_labels = None
        self._h_stat_file: io.FileIO | None = None
        self._h_used = 0

    def _open(self) -> None:
        import lmdb

        path = self.root / DATA_FILE
        page_size = os.sysconf("SC_PAGE_SIZE")
        try:
            stat_file = io.FileIO(path, "r")
        except OSError as err:
            raise DatasetError(f"{path}: cannot open: {err}") from err
        try:
            self._open_env(lmdb, path, page_size, os.fstat(stat_file.fileno()).st_size)
        except BaseException:
            stat_file.close()
            raise
        self._h_stat_file = stat_file

    def _open_env(self, lmdb, path: Path, page_size: int, file_size: int) -> None:
        if file_size < 2 * page_size:
            raise DatasetError(f"{path}: {file_size} bytes, too short for an LMDB environment")
        try:
            self._h_env = lmdb.open(
                str(self.root),
                readonly=True,
                lock=False,
                subdir=True,
                readahead=self.readahead,
                max_readers=512,
            )
            # A page past a truncated end would be a SIGBUS, not an error: compare the size
            # the meta page promises with the file before any read.
            self._h_used = (self._h_env.info()["last_pgno"] + 1) * page_size
            if self._h_used > file_size:
                raise DatasetError(
                    f"{path}: truncated: {file_size} bytes on disk, the environment uses "
                    f"{self._h_used}"
                )
            with self._h_env.begin() as txn:
                raw_labels = txn.get(LABELS_KEY)
                raw_spec = txn.get(SPEC_KEY)
        except lmdb.Error as err:
            self._close()
            raise DatasetError(f"{path}: cannot open LMDB: {err}") from err
        except DatasetError:
            self._close()
            raise
        if raw_labels is None or len(raw_labels) != 8 * len(self):
            self._close()
            raise DatasetError(f"{path}: missing or short {LABELS_KEY!r} entry")
        try:
            stored_spec = json.loads(raw_spec) if raw_spec is not None else None
        except ValueError:
            stored_spec = None
        if stored_spec != self.spec.to_dict():
            self._close()
            raise ManifestError(
                f"{path}: the spec stored in {SPEC_KEY!r} differs from the manifest's "
                "(or is missing or damaged)"
            )
        labels = np.frombuffer(raw_labels, dtype="<i8").astype(np.int64)
        try:
            self._check_integrity("labels_crc32c", labels, path, f"labels in {LABELS_KEY!r}")
        except DatasetError:
            self._close()
            raise
        self._h_labels = labels

    def _close(self) -> None:
        if self._h_env is not None:
            self._h_env.close()
        if self._h_stat_file is not None:
            self._h_stat_file.close()
        self._h_env = self._h_labels = self._h_stat_file = None

    def _check_size(self, index: int) -> None:
        self._check_not_shrunk(
            self._h_stat_file, self._h_used, DATA_FILE, index,
            "reading through the map would crash with SIGBUS",
        )

    def _locate(self, index: int) -> Path:
        return self.root / DATA_FILE

    def _get(self, txn, index: int):
        import lmdb

        try:
            value = txn.get(encode_key(index, self._width))
        except lmdb.Error as err:
            raise CorruptSampleError(
                self.root / DATA_FILE, index, f"LMDB read failed: {err}"
            ) from err
        if value is None:
            raise CorruptSampleError(self.root / DATA_FILE, index, "key missing")
        return value

    def _read_one(self, index: int):
        self._check_size(index)
        with self._h_env.begin() as txn:
            value = self._get(txn, index)
        label = int(self._h_labels[index])
        if self.is_raw:
            return self._decode_raw(value, index).copy(), label
        return value, label

    def _read_many(self, indices: np.ndarray, out: np.ndarray | None):
        self._check_size(int(indices[0]))
        labels = self._h_labels[indices]
        if self.is_raw:
            images = self._raw_buffer(len(indices), out)
            with self._h_env.begin(buffers=True) as txn:
                for k, i in enumerate(indices):
                    images[k] = self._decode_raw(self._get(txn, int(i)), int(i))
            return images, labels
        with self._h_env.begin() as txn:
            return [self._get(txn, int(i)) for i in indices], labels


def open(root: Path, manifest: dict, **options) -> LmdbReader:  # noqa: A001 - registry verb
    return LmdbReader(root, manifest, **options)
