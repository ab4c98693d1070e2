"""MosaicML Streaming's MDS format: ``shard.NNNNN.mds`` files and ``index.json``, written by
streaming's own ``MDSWriter``.

Layout under the dataset root (what ``MDSWriter(out=root, columns=..., compression=None,
hashes=["xxh64"], size_limit=...)`` writes)::

    index.json        {"version": 2, "shards": [one entry per shard: its sample count, file
                      name, size and xxh64, and the writer's config (columns, size_limit)]}
    shard.00000.mds   samples [0, c0), in index order
    shard.00001.mds   samples [c0, c0 + c1) ...

A new shard starts when the next sample would take the current one past ``size_limit`` bytes,
so shards hold whole samples and are the natural blocks. Each sample has three columns (MDS
stores them in name order): ``image`` (``bytes``: the encoded PNG/JPEG file byte for byte; or
``ndarray:uint8:H,W,C``: the raw pixels, fixed size), ``index`` (``int``: the sample's index,
the key a peer loader yields) and ``label`` (``int``). ``streaming.StreamingDataset(local=root)``
and ``streaming.base.format.reader_from_json`` read the directory as it is.

MDS shard layout (``streaming.base.format.mds.writer.MDSWriter.encode_joint_shard``), all
little-endian: ``uint32 num_samples``, ``uint32 offsets[num_samples + 1]`` (byte offset of
each sample from the start of the file, the last one the file's end), the writer's config as
JSON, then the samples back to back. A sample is a ``uint32`` size for each variable-size
column (here ``image`` when encoded), then the columns' bytes (``int`` is 8 bytes).

Reading does not import streaming: ``MDSReader`` parses ``index.json`` and every shard's
header at open and reads a sample with one ``os.pread`` (a run of adjacent samples in one
shard with one, in ``read_many``). Checks, whatever ``verify`` says:

- at open, ``index.json`` against the manifest's fingerprint of the whole file; every shard
  entry's columns, encodings and file name against what this spec is written with; each
  shard's size against ``index.json``; its header (sample count, config) against its entry;
  offsets increasing from the end of the header to the end of the file; every sample's
  image size (from the offsets) against the manifest's ``sizes_crc32c``;
- at every read: the sample's ``image`` size field against its offsets, and the stored
  ``index`` against the index asked for (a swapped shard or a shifted offset cannot return
  another sample's bytes), and a short read (a shard cut under the open reader).

MDS has no per-sample checksum: with ``verify=False`` a changed byte inside an image or a
label goes unseen. ``verify=True`` (the default) adds the per-sample CRC32C. streaming's
own integrity check is the per-shard hash in ``index.json`` (xxh64 here, the cheapest it
offers), which ``StreamingDataset(validate_hash="xxh64")`` checks only when it downloads a
shard from a remote; ``check_shard_hashes(root)`` checks them here, reading every byte.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from data_gen import DatasetSpec

from .base import (
    CorruptSampleError,
    DatasetError,
    ManifestError,
    Reader,
    check_index,
    coalesced_runs,
    has_encoding_magic,
)
from .manifest import FINGERPRINT_BYTES, check_fingerprint
from .manifest import fingerprint_span as default_span
from .traits import FormatTraits

NAME = "mds"
ENCODINGS = ("raw", "png", "jpeg", "mixed")
PEER = True
LIBRARIES = ("streaming",)
# 8 MiB shards: the small profile's 4,000 PNG / JPEG samples make 4 / 8 shards, its 20,000
# raw ones 30; streaming's default (64 MiB) would leave them in one or two. size_limit is
# MDSWriter's own knob: a shard closes before the sample that would take it past the limit.
DEFAULT_KNOBS: dict = {"size_limit": 1 << 23}
OPEN_OPTIONS: tuple = ()
TRAITS = FormatTraits(
    remote_unsupported=("storebench has no S3 reader for this peer format (the peers study reads "
                        "local files); its own library may read from S3"),
    distributions=("mosaicml-streaming",),
)
# Stored bytes per sample byte: 24 bytes per sample (offset, size field, index, label).
SIZE_OVERHEAD = {"raw": 1.05, "png": 1.05, "jpeg": 1.05, "mixed": 1.05}

INDEX_NAME = "index.json"
SHARD_PATTERN = "shard.{shard:05d}.mds"
HASH = "xxh64"
COLUMNS = ("image", "index", "label")  # MDS keeps columns sorted by name
_U32 = struct.Struct("<I")
_INDEX_LABEL = struct.Struct("<qq")  # the "index" and "label" columns (MDS "int": int64)
_SIZE_FIELD = _U32.size  # the encoded image's size, before its bytes
# A run of adjacent samples is fetched with one pread, up to this many bytes.
# The writer config keys every shard header repeats (MDSWriter.get_config).
_CONFIG_KEYS = ("column_encodings", "column_names", "column_sizes", "compression", "format",
                "hashes", "size_limit", "version")


def shard_name(shard: int) -> str:
    return SHARD_PATTERN.format(shard=shard)


def image_encoding(spec: DatasetSpec) -> str:
    """The MDS column encoding of ``image``: fixed-size uint8 pixels for raw, else bytes."""
    if spec.encoding == "raw":
        return "ndarray:uint8:" + ",".join(str(d) for d in spec.image_shape)
    return "bytes"


def column_encodings(spec: DatasetSpec) -> dict[str, str]:
    return {"image": image_encoding(spec), "index": "int", "label": "int"}


def _sample_overhead(raw: bool) -> int:
    """Stored bytes of a sample besides its image: index and label, plus the size field."""
    return _INDEX_LABEL.size + (0 if raw else _SIZE_FIELD)


def fingerprint_span(rel: str, path: Path, size: int) -> tuple[int, int]:
    """``index.json`` whole (it is small and read whole at open); a shard's whole header (its
    offset table and config, at least the first 4 KiB) and its last 4 KiB."""
    if rel == INDEX_NAME:
        return size, 0
    head, tail = default_span(size)
    with builtins.open(path, "rb") as f:
        data = f.read(8)  # the sample count, then the first sample's offset: the header's end
    if len(data) == 8:
        head = min(size, max(head, _U32.unpack_from(data, 4)[0]))
    return head, min(FINGERPRINT_BYTES, size - head)


def write(samples: Iterable, root: Path, spec: DatasetSpec, *, size_limit: int) -> None:
    from ..streaming_import import import_streaming

    if not isinstance(size_limit, int) or not 0 < size_limit < 2**32:
        raise ValueError(f"size_limit must be an int in 1..2**32-1 bytes (MDS offsets are "
                         f"uint32), got {size_limit!r}")
    streaming = import_streaming()
    raw = spec.encoding == "raw"
    writer = streaming.MDSWriter(out=str(root), columns=column_encodings(spec),
                                 compression=None, hashes=[HASH], size_limit=size_limit)
    count = 0
    try:
        for image, label in samples:
            if count >= spec.num_samples:
                raise DatasetError(f"{root}: got more samples than the spec's {spec.num_samples}")
            if raw:
                image = np.asarray(image)
                if image.shape != spec.image_shape or image.dtype != np.uint8:
                    raise DatasetError(f"{root}: sample {count} is {image.dtype} {image.shape}, "
                                       f"the spec says uint8 {spec.image_shape}")
                image = np.ascontiguousarray(image)
            else:
                image = bytes(image)
            writer.write({"image": image, "index": count, "label": int(label)})
            count += 1
        if count != spec.num_samples:
            raise DatasetError(f"{root}: got {count} samples, the spec says {spec.num_samples}")
    except BaseException:
        # MDSWriter's __exit__ would write what it holds and an index: drop it instead, and
        # end its upload thread pool.
        writer.cancel_future_jobs()
        writer.executor.shutdown(wait=True)
        raise
    writer.finish()  # the last shard, index.json, and the thread pool shut down


def check_shard_hashes(root: Path | str) -> None:
    """Hash every shard whole with streaming's own hash functions and compare with the hashes
    ``index.json`` records (what ``StreamingDataset(validate_hash=...)`` does to a download);
    a mismatch is a ``DatasetError`` naming the shard. Reads every byte of the dataset."""
    from ..streaming_import import import_streaming

    import_streaming()
    from streaming.base.hashing import get_hash

    root = Path(root)
    for entry in _parse_index(root / INDEX_NAME, (root / INDEX_NAME).read_bytes()):
        info = entry["raw_data"]
        path = root / info["basename"]
        for algo, digest in info["hashes"].items():
            if get_hash(algo, path.read_bytes()) != digest:
                raise DatasetError(f"{path}: its {algo} differs from the one index.json records "
                                   "(the shard is damaged or not this dataset's)")


def _parse_index(path: Path, data: bytes) -> list[dict]:
    """``index.json``'s shard entries, checked for shape (version 2, a list of objects)."""
    try:
        obj = json.loads(data)
    except ValueError as err:
        raise DatasetError(f"{path}: unreadable MDS index: {err}") from err
    if not isinstance(obj, dict) or obj.get("version") != 2 or not isinstance(
        obj.get("shards"), list
    ) or not all(isinstance(entry, dict) for entry in obj["shards"]):
        raise DatasetError(f"{path}: not an MDS index (version 2 with a list of shards)")
    return obj["shards"]


class MDSReader(Reader):
    """Random access to MDS shards by their offset tables, with ``os.pread``; streaming is
    not imported. ``read_many`` sorts a batch by position, reads each run of adjacent
    samples of one shard with one ``pread`` and returns the samples in the asked order."""

    def __init__(self, root: Path, manifest: dict, *, verify: bool = True) -> None:
        super().__init__(root, manifest, verify=verify)
        self.index_path = self.root / INDEX_NAME
        self._h_shards: list[Path] | None = None
        self._h_files: list[io.FileIO] | None = None
        self._h_bounds: np.ndarray | None = None  # [0, c0, c0 + c1, ..., n], per shard
        self._h_begins: np.ndarray | None = None  # per sample: offset in its shard
        self._h_ends: np.ndarray | None = None

    # -- opening: index.json, then every shard's header -------------------------------------
    def _open(self) -> None:
        data = self._read_index()
        recorded = self.manifest["fingerprints"].get(INDEX_NAME)
        if recorded is None:
            raise DatasetError(f"{self.index_path}: not listed in the manifest")
        check_fingerprint(self.index_path, recorded, data)
        entries = _parse_index(self.index_path, data)
        files: list[io.FileIO] = []
        try:
            shards, counts, begins, ends = [], [], [], []
            for k, entry in enumerate(entries):
                path = self._check_entry(k, entry)
                try:
                    files.append(io.FileIO(path, "r"))
                except OSError as err:
                    raise DatasetError(f"{path}: cannot open shard: {err}") from err
                offsets = self._read_header(path, files[-1], entry)
                shards.append(path)
                counts.append(len(offsets) - 1)
                begins.append(offsets[:-1])
                ends.append(offsets[1:])
            bounds = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
            if int(bounds[-1]) != len(self):
                raise DatasetError(f"{self.index_path}: its shards hold {int(bounds[-1])} "
                                   f"samples, the manifest says {len(self)}")
            begins = np.concatenate(begins) if begins else np.empty(0, np.int64)
            ends = np.concatenate(ends) if ends else np.empty(0, np.int64)
            sizes = ends - begins - _sample_overhead(self.is_raw)
            self._check_integrity("sizes_crc32c", sizes, self.root,
                                  "image sizes in the shards' offset tables")
        except BaseException:
            for f in files:
                f.close()
            raise
        self._h_shards, self._h_files, self._h_bounds = shards, files, bounds
        self._h_begins, self._h_ends = begins, ends
        # The columns do not say how images are encoded: check the first one against the spec.
        if not self.is_raw:
            try:
                image, _ = self._read_one(0)
                if not has_encoding_magic(self.spec.encoding, image):
                    raise ManifestError(f"{self._locate(0)}: sample 0 is not "
                                        f"{self.spec.encoding}, as the manifest says")
            except BaseException:
                self._close()
                raise

    def _read_index(self) -> bytes:
        try:
            return self.index_path.read_bytes()
        except FileNotFoundError:
            raise DatasetError(f"{self.index_path}: MDS index missing") from None
        except OSError as err:
            raise DatasetError(f"{self.index_path}: unreadable MDS index: {err}") from err

    def _check_entry(self, k: int, entry: dict) -> Path:
        """Shard ``k``'s entry in index.json describes a shard of this spec's columns."""
        want = column_encodings(self.spec)
        expected = {
            "format": "mds", "compression": None, "column_names": list(COLUMNS),
            "column_encodings": [want[name] for name in COLUMNS],
        }
        for key, value in expected.items():
            if entry.get(key) != value:
                raise DatasetError(
                    f"{self.index_path}: shard {k} has {key} {entry.get(key)!r}, a {NAME} "
                    f"dataset of {self.spec.encoding} {self._shape_text()} samples has {value!r}"
                )
        info = entry.get("raw_data")
        name = shard_name(k)
        if not isinstance(info, dict) or info.get("basename") != name:
            raise DatasetError(f"{self.index_path}: shard {k} is not {name}")
        if not isinstance(entry.get("samples"), int) or entry["samples"] < 0:
            raise DatasetError(f"{self.index_path}: shard {k} has no valid sample count")
        return self.root / name

    def _shape_text(self) -> str:
        return "x".join(map(str, self.spec.image_shape)) if self.is_raw else "encoded"

    def _read_header(self, path: Path, f: io.FileIO, entry: dict) -> np.ndarray:
        """The shard's ``num_samples + 1`` offsets, after checking its size, header and
        offsets against its ``index.json`` entry."""
        size = os.fstat(f.fileno()).st_size
        if size != entry["raw_data"].get("bytes"):
            raise DatasetError(f"{path}: {size} bytes, index.json says "
                               f"{entry['raw_data'].get('bytes')} (cut off or replaced)")
        count = entry["samples"]
        table = 4 + 4 * (count + 1)
        head = os.pread(f.fileno(), table, 0)
        if len(head) < table or _U32.unpack_from(head)[0] != count:
            found = _U32.unpack_from(head)[0] if len(head) >= 4 else None
            raise DatasetError(f"{path}: damaged shard header: {found} samples, index.json "
                               f"says {count}")
        offsets = np.frombuffer(head, dtype="<u4", offset=4).astype(np.int64)
        config_end = int(offsets[0])
        if not table <= config_end <= size:
            raise DatasetError(f"{path}: damaged shard header: samples start at byte "
                               f"{config_end}, the offset table ends at {table}")
        config = os.pread(f.fileno(), config_end - table, table)
        try:
            stored = json.loads(config)
        except ValueError:
            stored = None
        if stored != {key: entry.get(key) for key in _CONFIG_KEYS}:
            raise DatasetError(f"{path}: damaged shard header: its config differs from its "
                               "index.json entry")
        lengths = np.diff(offsets)
        smallest = _sample_overhead(self.is_raw) + (self.spec.raw_sample_bytes
                                                    if self.is_raw else 0)
        bad = lengths < smallest
        if self.is_raw:
            bad |= lengths != smallest
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DatasetError(f"{path}: damaged offset table: sample {row} of the shard spans "
                               f"{int(lengths[row])} bytes, a sample takes "
                               f"{'exactly' if self.is_raw else 'at least'} {smallest}")
        if int(offsets[-1]) != size:
            raise DatasetError(f"{path}: damaged offset table: samples end at byte "
                               f"{int(offsets[-1])}, the shard has {size} bytes")
        return offsets

    def _close(self) -> None:
        for f in self._h_files or ():
            f.close()
        self._h_files = self._h_shards = self._h_bounds = None
        self._h_begins = self._h_ends = None

    # -- where samples are --------------------------------------------------------------------
    def _shard_of(self, index: int) -> int:
        # side="right": an empty shard shares its start with the next one, which holds it.
        return int(np.searchsorted(self._h_bounds, index, side="right")) - 1

    def _locate(self, index: int) -> Path:
        if self._h_shards is None:
            return self.index_path
        return self._h_shards[self._shard_of(index)]

    def blocks(self) -> np.ndarray:
        self._ensure_open()
        return np.unique(self._h_bounds)  # one block per non-empty shard

    def shard_paths(self) -> list[Path]:
        self._ensure_open()
        return list(self._h_shards)

    def record_span(self, index: int) -> tuple[Path, int, int]:
        """(shard, first byte, end byte) of sample ``index``'s record."""
        index = check_index(index, len(self), where=self.root)
        self._ensure_open()
        return (self._h_shards[self._shard_of(index)], int(self._h_begins[index]),
                int(self._h_ends[index]))

    # -- reading --------------------------------------------------------------------------
    def _read_one(self, index: int) -> tuple[np.ndarray | bytes, int]:
        shard = self._shard_of(index)
        begin, end = int(self._h_begins[index]), int(self._h_ends[index])
        data = self._pread(shard, begin, end - begin, index)
        if len(data) < end - begin:
            raise self._cut_off(shard, index, begin + len(data), end)
        return self._decode(shard, index, memoryview(data))

    def _read_many(self, indices: np.ndarray, out: np.ndarray | None):
        shards = np.searchsorted(self._h_bounds, indices, side="right") - 1
        runs = coalesced_runs(indices, self._h_begins[indices], self._h_ends[indices], shards)
        return self._read_runs(
            indices, out, runs,
            (self._pread(run.file, run.offset, run.length, run.first_index) for run in runs),
            lambda run, index, end, want: self._cut_off(run.file, index, end, want),
            self._decode)

    def _pread(self, shard: int, offset: int, length: int, index: int) -> bytes:
        try:
            return os.pread(self._h_files[shard].fileno(), length, offset)
        except OSError as err:
            raise CorruptSampleError(self._h_shards[shard], index, f"read failed: {err}") from err

    def _cut_off(self, shard: int, index: int, file_end: int, sample_end: int):
        return CorruptSampleError(
            self._h_shards[shard], index,
            f"shard is cut off: it ends at byte {file_end}, its offset table places this "
            f"sample's end at byte {sample_end}",
        )

    def _decode(self, shard: int, index: int, data: memoryview):
        path = self._h_shards[shard]
        if self.is_raw:
            size = self.spec.raw_sample_bytes
            start = 0
        else:
            size = _U32.unpack_from(data)[0]
            start = _SIZE_FIELD
            if start + size + _INDEX_LABEL.size != len(data):
                raise CorruptSampleError(
                    path, index, f"the sample's image size field says {size} bytes, its "
                    f"offsets leave {len(data) - start - _INDEX_LABEL.size}")
        stored_index, label = _INDEX_LABEL.unpack_from(data, start + size)
        if stored_index != index:
            raise CorruptSampleError(
                path, index, f"holds the record of sample {stored_index}: the shard is "
                "swapped, replaced or its offset table damaged")
        image = data[start:start + size]
        if self.is_raw:
            return self._decode_raw(image, index), int(label)
        return bytes(image), int(label)


def open(root: Path, manifest: dict, **options) -> MDSReader:  # noqa: A001 - registry verb
    return MDSReader(root, manifest, **options)
