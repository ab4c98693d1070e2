"""TFRecord shards of ``tf.train.Example`` records, with an offset index beside each shard.

Layout under the dataset root, for ``num_shards`` = S::

    data-00000-of-0000S.tfrecord   records of samples [0, n/S), in index order
    data-00000-of-0000S.index      .npy int64 (records, 2): (offset, framed length) per record
    data-00000-of-0000S.idx        the same pairs as text, "offset size" per line: DALI's index
    ...

Shard ``k`` holds the contiguous index range ``[k * n // S, (k + 1) * n // S)``, so index order
is file order and the shards are the natural blocks. Each record is a serialized
``tf.train.Example`` with features ``image`` (bytes: encoded PNG/JPEG, or the raw (H, W, C)
uint8 pixels as ``tobytes()``), ``label``, ``height``, ``width`` and ``channels`` (int64);
``tf_feature_spec()`` is the matching description for ``tf.io.parse_single_example``, and
``tf.data.TFRecordDataset(shard_paths(root))`` reads the shards as they are.

Framing follows TensorFlow's TFRecord format: ``uint64 length``, ``uint32 masked CRC32C of
length``, ``data[length]``, ``uint32 masked CRC32C of data``, all little-endian. The index
stores, per record, the offset of its length field and the length of the whole frame
(``16 + len(data)``), the same (offset, size) pair as DALI's ``tfrecord2idx``: it gives random
access with one ``pread`` per record and no TensorFlow import. Every read checks both CRCs,
whatever ``verify`` says. At open every index is checked whole against the manifest's
fingerprint and for structure: records back to back from offset 0, each at least a frame
header long, the last ending where the shard ends.

The ``.idx`` file beside each shard is the index DALI's ``fn.readers.tfrecord`` needs
(``index_path``), in the text format its ``tfrecord2idx`` script writes, written from the same
offsets at build time so that DALI reads the dataset as built. It is part of the dataset (in
the manifest, fingerprinted whole); our reader does not read it.
"""

from __future__ import annotations

import io
import os
import re
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import crc32c
import numpy as np
from google.protobuf.message import DecodeError

from data_gen import DatasetSpec

from . import example_proto, npyfile
from .base import (
    ByteRun,
    CorruptSampleError,
    DatasetError,
    ManifestError,
    Reader,
    coalesced_runs,
    has_encoding_magic,
)
from .confine import MAX_SAMPLE_BYTES
from .manifest import check_fingerprint
from .manifest import fingerprint_span as default_span
from .remote_reader import RemoteObject, RemoteReader
from .specs import fixed_size, stored_image_shape
from .traits import FormatTraits, KnobVariant

NAME = "tfrecord"
ENCODINGS = ("raw", "png", "jpeg", "mixed")
# Four shards keep ci-sized data in several blocks and give the small/medium profiles shards of
# tens to hundreds of MB, the range TensorFlow's input-pipeline guide recommends.
DEFAULT_KNOBS: dict = {"num_shards": 4}
OPEN_OPTIONS: tuple = ()
TRAITS = FormatTraits(
    # On the ImageNet-like set 16 shards are ~110 MB each, the size TensorFlow's guide
    # recommends; one 1.8 GB shard answers nothing the default's four do not.
    knob_variants=(KnobVariant(NAME, "raw", (("num_shards", 1),), families=("synthetic",)),
                   KnobVariant(NAME, "raw", (("num_shards", 16),))),
    knob_metrics={"num_shards": "sequential_cold"},
    variant_access="block_shuffle",
    checks_content=True,  # every record carries the CRC32C of its bytes
    distributions=("protobuf",),
)
# 2: DALI's text index (.idx) beside each shard; builds of layout 1 are rebuilt.
LAYOUT = 2
# Stored bytes per sample byte: 16 bytes of framing and ~30 of Example per record.
SIZE_OVERHEAD = {"raw": 1.05, "png": 1.05, "jpeg": 1.05, "mixed": 1.05}

SHARD_PATTERN = "data-{shard:05d}-of-{count:05d}.tfrecord"
INDEX_SUFFIX = ".index"
DALI_INDEX_SUFFIX = ".idx"
_SHARD_RE = re.compile(r"^data-(\d{5})-of-(\d{5})\.tfrecord$")

HEADER = struct.Struct("<QI")  # length, masked CRC32C of the 8 length bytes
FOOTER = struct.Struct("<I")  # masked CRC32C of the data
FRAME_OVERHEAD = HEADER.size + FOOTER.size
_LENGTH = struct.Struct("<Q")
_MASK_DELTA = 0xA282EAD8
# A run of adjacent records is fetched with one pread, up to this many bytes.


def masked_crc32c(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC32C: rotate right by 15 bits, add a constant (mod 2**32)."""
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One TFRecord frame around ``data``."""
    length = _LENGTH.pack(len(data))
    return b"".join(
        (length, FOOTER.pack(masked_crc32c(length)), data, FOOTER.pack(masked_crc32c(data)))
    )


def shard_name(shard: int, num_shards: int) -> str:
    return SHARD_PATTERN.format(shard=shard, count=num_shards)


def index_path(shard_path: Path | str) -> Path:
    """The offset index beside a shard: ``data-00000-of-00004.index`` for ``...tfrecord``."""
    shard_path = Path(shard_path)
    return shard_path.with_suffix(INDEX_SUFFIX)


def dali_index_path(shard_path: Path | str) -> Path:
    """DALI's text index beside a shard: ``data-00000-of-00004.idx`` for ``...tfrecord``."""
    return Path(shard_path).with_suffix(DALI_INDEX_SUFFIX)


def dali_index_text(index: np.ndarray) -> str:
    """A shard's (offset, framed length) index as DALI's ``tfrecord2idx`` writes it: one
    ``"offset size"`` line per record."""
    return "".join(f"{offset} {size}\n" for offset, size in index.tolist())


def shard_paths(root: Path | str) -> list[Path]:
    """Every shard of the dataset at ``root``, in shard (and so sample index) order."""
    root = Path(root)
    shards = sorted(p for p in root.iterdir() if _SHARD_RE.match(p.name))
    if not shards:
        raise DatasetError(f"{root}: no TFRecord shards (data-NNNNN-of-NNNNN.tfrecord)")
    counts = {int(_SHARD_RE.match(p.name).group(2)) for p in shards}
    if len(counts) != 1 or len(shards) != counts.pop():
        names = [p.name for p in shards]
        raise DatasetError(f"{root}: shards {names} do not form one complete set")
    return shards


def shard_bounds(num_samples: int, num_shards: int) -> np.ndarray:
    """``[0, b1, ..., num_samples]``: shard ``k`` holds samples ``[bounds[k], bounds[k+1])``."""
    return np.arange(num_shards + 1, dtype=np.int64) * num_samples // num_shards


def fingerprint_span(rel: str, path: Path, size: int) -> tuple[int, int]:
    """Offset indexes (ours and DALI's) are small: fingerprint all of them."""
    return (size, 0) if rel.endswith((INDEX_SUFFIX, DALI_INDEX_SUFFIX)) else default_span(size)


def read_index_bytes(path: Path) -> bytes:
    """A shard's offset index file, whole; a missing or unreadable one is a DatasetError."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{path}: offset index missing") from None
    except OSError as err:
        raise DatasetError(f"{path}: unreadable offset index: {err}") from err


def read_index(path: Path | str, *, data: bytes | None = None) -> np.ndarray:
    """One shard's (offset, framed length) int64 array, checked for shape and dtype.
    ``data`` is the file's content when the caller has read it already."""
    path = Path(path)
    if data is None:
        data = read_index_bytes(path)
    try:
        index = npyfile.loads(data, path, dtype="<i8", ndim=2)
    except DatasetError as err:
        raise DatasetError(f"unreadable offset index: {err}") from err
    if index.shape[1] != 2:
        raise DatasetError(f"{path}: offset index is {index.shape}, expected (n, 2)")
    return index.astype(np.int64)


def check_index(
    path: Path, index: np.ndarray, shard: Path, shard_size: int, first_sample: int
) -> None:
    """The index at ``path`` describes records back to back from offset 0, each at least a
    frame header long, the last ending at the end of ``shard`` (``shard_size`` bytes);
    ``first_sample`` is the shard's first sample, for messages."""
    if len(index) == 0:
        raise DatasetError(f"{path}: empty offset index")
    offsets, lengths = index[:, 0], index[:, 1]
    ends = offsets + lengths
    bad = ((lengths < FRAME_OVERHEAD) | (lengths > MAX_SAMPLE_BYTES)
           | (offsets != np.concatenate([[0], ends[:-1]])))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DatasetError(
            f"{path}: damaged offset index: record {row} (sample {first_sample + row}) at "
            f"({int(offsets[row])}, {int(lengths[row])}) does not follow the previous record"
        )
    if int(ends[-1]) > shard_size:
        raise DatasetError(
            f"{shard}: shard is cut off: it has {shard_size} bytes, its offset index "
            f"{path.name} places the end of its last record at byte {int(ends[-1])}"
        )
    if int(ends[-1]) < shard_size:
        raise DatasetError(
            f"{path}: damaged offset index: records end at byte {int(ends[-1])}, the "
            f"shard {shard.name} has {shard_size} bytes"
        )


def scan_records(path: Path | str) -> Iterator[tuple[int, bytes]]:
    """(offset, data) of every record in a TFRecord file, checking framing and both CRCs.

    Works on any TFRecord file (uncompressed), so it can index shards written elsewhere.
    """
    path = Path(path)
    with io.FileIO(path, "r") as raw, io.BufferedReader(raw, 1 << 20) as f:
        offset = record = 0
        while True:
            header = f.read(HEADER.size)
            if not header:
                return
            data = _unframe(path, record, header, f)
            yield offset, data
            offset += FRAME_OVERHEAD + len(data)
            record += 1


def _unframe(path: Path, record: int, header: bytes, f) -> bytes:
    if len(header) < HEADER.size:
        raise DatasetError(f"{path}: record {record}: file ends inside the record header")
    length, length_crc = HEADER.unpack(header)
    if masked_crc32c(header[:8]) != length_crc:
        raise DatasetError(f"{path}: record {record}: length CRC mismatch")
    body = f.read(length + FOOTER.size)
    if len(body) < length + FOOTER.size:
        raise DatasetError(f"{path}: record {record}: file ends inside the record (cut off)")
    data = body[:length]
    if masked_crc32c(data) != FOOTER.unpack_from(body, length)[0]:
        raise DatasetError(f"{path}: record {record}: data CRC mismatch")
    return data


def build_index(path: Path | str) -> np.ndarray:
    """Scan a shard and return its (offset, framed length) index."""
    rows = [(offset, FRAME_OVERHEAD + len(data)) for offset, data in scan_records(path)]
    return np.array(rows, dtype=np.int64).reshape(-1, 2)


def tf_feature_spec() -> dict:
    """The feature description for ``tf.io.parse_single_example`` (imports TensorFlow)."""
    import tensorflow as tf

    return {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "height": tf.io.FixedLenFeature([], tf.int64),
        "width": tf.io.FixedLenFeature([], tf.int64),
        "channels": tf.io.FixedLenFeature([], tf.int64),
    }


def write(samples: Iterable, root: Path, spec: DatasetSpec, *, num_shards: int) -> None:
    if not 1 <= num_shards <= spec.num_samples:
        raise ValueError(f"num_shards must be in 1..{spec.num_samples}, got {num_shards}")
    bounds = shard_bounds(spec.num_samples, num_shards)
    samples = iter(samples)
    for shard in range(num_shards):
        path = root / shard_name(shard, num_shards)
        count = int(bounds[shard + 1] - bounds[shard])
        index = np.empty((count, 2), dtype=np.int64)
        offset = 0
        with io.FileIO(path, "w") as raw, io.BufferedWriter(raw, 1 << 20) as f:
            for row in range(count):
                try:
                    image, label = next(samples)
                except StopIteration:
                    raise DatasetError(
                        f"{root}: got {bounds[shard] + row} samples, the spec says "
                        f"{spec.num_samples}"
                    ) from None
                data = image.tobytes() if isinstance(image, np.ndarray) else bytes(image)
                height, width, channels = stored_image_shape(spec, data)
                frame = frame_record(example_proto.make_example(
                    {"image": data},
                    {"label": label, "height": height, "width": width, "channels": channels},
                ))
                f.write(frame)
                index[row] = offset, len(frame)
                offset += len(frame)
        with io.FileIO(index_path(path), "w") as f:
            np.save(f, index, allow_pickle=False)
        dali_index_path(path).write_text(dali_index_text(index), encoding="ascii")
    if next(samples, None) is not None:
        raise DatasetError(f"{root}: got more samples than the spec's {spec.num_samples}")


class TFRecordReader(Reader):
    """Random access to TFRecord shards through the offset index, with ``os.pread``.

    ``read_many`` sorts a batch by position, fetches each run of adjacent records in one
    ``pread`` (a sequential batch is one read per shard), checks every frame's CRCs and
    returns the samples in the requested order. TensorFlow is never imported.
    """

    def __init__(self, root: Path, manifest: dict, *, verify: bool = True) -> None:
        super().__init__(root, manifest, verify=verify)
        self.num_shards = int(manifest["knobs"]["num_shards"])
        self.shards = [self.root / shard_name(k, self.num_shards) for k in range(self.num_shards)]
        self.bounds = shard_bounds(len(self), self.num_shards)
        self._h_files: list[io.FileIO] | None = None
        self._h_offsets: np.ndarray | None = None
        self._h_lengths: np.ndarray | None = None

    def _open(self) -> None:
        files = self._open_shards()
        try:
            offsets, lengths = self._load_indexes(files)
        except BaseException:
            for f in files:
                f.close()
            raise
        self._h_files, self._h_offsets, self._h_lengths = files, offsets, lengths
        # Records do not say how images are encoded: check the first one against the spec
        # (a raw record has the wrong length, a PNG record the wrong signature).
        try:
            image, _ = self._read_one(0)
            if not self.is_raw and not has_encoding_magic(self.spec.encoding, image):
                raise ManifestError(
                    f"{self.shards[0]}: sample 0 is not {self.spec.encoding}, as the manifest "
                    "says"
                )
        except BaseException:
            self._close()
            raise

    # -- I/O hooks: local files here, objects in ``storebench.remote`` ----------------------
    def _open_shards(self) -> list:
        files = []
        try:
            for path in self.shards:
                files.append(io.FileIO(path, "r"))
        except OSError as err:
            for f in files:
                f.close()
            raise DatasetError(f"{path}: cannot open shard: {err}") from err
        return files

    def _shard_size(self, files: list, shard: int) -> int:
        return os.fstat(files[shard].fileno()).st_size

    def _read_index_files(self, paths: list[Path]) -> list[bytes]:
        return [read_index_bytes(path) for path in paths]

    def _read_at(self, shard: int, offset: int, length: int) -> bytes:
        return os.pread(self._h_files[shard].fileno(), length, offset)

    def _fetch_runs(self, runs: list[ByteRun]) -> list[bytes]:
        """The bytes of each run, in order, each possibly short where the shard ends (the
        caller names the record cut off)."""
        return [self._pread(run.file, run.offset, run.length, run.first_index,
                            allow_short=True) for run in runs]

    def _load_indexes(self, files: list) -> tuple[np.ndarray, np.ndarray]:
        offsets = np.empty(len(self), dtype=np.int64)
        lengths = np.empty(len(self), dtype=np.int64)
        index_paths = [index_path(path) for path in self.shards]
        # parsed and fingerprinted from one read
        for shard, (path, ipath, data) in enumerate(
            zip(self.shards, index_paths, self._read_index_files(index_paths))
        ):
            index = read_index(ipath, data=data)
            start, stop = int(self.bounds[shard]), int(self.bounds[shard + 1])
            if len(index) != stop - start:
                raise DatasetError(
                    f"{ipath}: indexes {len(index)} records, shard {path.name} "
                    f"should hold samples {start}..{stop - 1} ({stop - start} records)"
                )
            check_index(ipath, index, path, self._shard_size(files, shard), start)
            recorded = self.manifest["fingerprints"].get(ipath.name)
            if recorded is None:
                raise DatasetError(f"{ipath}: not listed in the manifest")
            check_fingerprint(ipath, recorded, data)
            offsets[start:stop], lengths[start:stop] = index[:, 0], index[:, 1]
        return offsets, lengths

    def _close(self) -> None:
        for f in self._h_files or ():
            f.close()
        self._h_files = self._h_offsets = self._h_lengths = None

    def _shard_of(self, index: int) -> int:
        return int(np.searchsorted(self.bounds, index, side="right")) - 1

    def _locate(self, index: int) -> Path:
        return self.shards[self._shard_of(index)]

    def blocks(self) -> np.ndarray:
        return self.bounds.copy()

    def _read_one(self, index: int) -> tuple[np.ndarray | bytes, int]:
        shard = self._shard_of(index)
        offset, length = int(self._h_offsets[index]), int(self._h_lengths[index])
        frame = self._pread(shard, offset, length, index)
        return self._decode(shard, index, memoryview(frame))

    def _read_many(self, indices: np.ndarray, out: np.ndarray | None):
        offsets = self._h_offsets[indices]
        shards = np.searchsorted(self.bounds, indices, side="right") - 1
        runs = coalesced_runs(indices, offsets, offsets + self._h_lengths[indices], shards)
        return self._read_runs(
            indices, out, runs, self._fetch_runs(runs),
            lambda run, index, end, want: self._cut_off(run.file, index, end, want),
            self._decode)

    # -- helpers --------------------------------------------------------------------------
    def _pread(self, shard: int, offset: int, length: int, index: int, *,
               allow_short: bool = False) -> bytes:
        """``length`` bytes at ``offset``; fewer only with ``allow_short`` (the caller then
        finds which record the end of the file cuts)."""
        try:
            data = self._read_at(shard, offset, length)
        except OSError as err:
            raise CorruptSampleError(self.shards[shard], index, f"read failed: {err}") from err
        if len(data) < length and not allow_short:
            raise self._cut_off(shard, index, offset + len(data), offset + length)
        return data

    def _cut_off(self, shard: int, index: int, file_end: int, record_end: int):
        return CorruptSampleError(
            self.shards[shard], index,
            f"shard is cut off: it ends at byte {file_end}, the offset index places this "
            f"record's end at byte {record_end}",
        )

    def _decode(self, shard: int, index: int, frame: memoryview) -> tuple[np.ndarray | bytes, int]:
        path = self.shards[shard]
        if len(frame) < FRAME_OVERHEAD:
            raise CorruptSampleError(path, index, f"{len(frame)}-byte record, shorter than a frame")
        length, length_crc = HEADER.unpack_from(frame)
        if masked_crc32c(frame[:8]) != length_crc:
            raise CorruptSampleError(path, index, "TFRecord length CRC mismatch")
        if length + FRAME_OVERHEAD != len(frame):
            raise CorruptSampleError(
                path, index,
                f"record header says {length} bytes of data, the offset index "
                f"{len(frame) - FRAME_OVERHEAD}",
            )
        data = frame[HEADER.size : HEADER.size + length]
        if masked_crc32c(data) != FOOTER.unpack_from(frame, HEADER.size + length)[0]:
            raise CorruptSampleError(path, index, "TFRecord data CRC mismatch")
        try:
            feature = example_proto.parse_example(data).features.feature
            image = feature["image"].bytes_list.value[0]
            label = feature["label"].int64_list.value[0]
            shape = tuple(feature[name].int64_list.value[0]
                          for name in ("height", "width", "channels"))
        except (DecodeError, IndexError) as err:
            raise CorruptSampleError(
                path, index, f"not a tf.train.Example with image/label/height/width/channels: "
                f"{err or type(err).__name__}"
            ) from err
        if fixed_size(self.spec) and shape != self.spec.image_shape:
            raise CorruptSampleError(
                path, index, f"record shape {shape}, the spec says {self.spec.image_shape}"
            )
        if self.is_raw:
            return self._decode_raw(image, index), int(label)
        return image, int(label)


def open(root: Path, manifest: dict, **options) -> TFRecordReader:  # noqa: A001 - registry verb
    return TFRecordReader(root, manifest, **options)


# -- over object storage ----------------------------------------------------------
# TFRecord shards over S3: the offset index turns every batch into ranged GETs, runs of
# adjacent records coalesced into one request (a block-shuffled batch is one or two), all of a
# batch's requests in flight at once.
class RemoteTFRecordReader(RemoteReader, TFRecordReader):
    def _open_shards(self) -> list[RemoteObject]:
        names = [path.name for path in self.shards]
        return [RemoteObject(name, size)
                for name, size in zip(names, self.store.sizes_of(names))]

    def _shard_size(self, files: list[RemoteObject], shard: int) -> int:
        return files[shard].size

    def _read_index_files(self, paths) -> list[bytes]:
        return self.store.read_many([path.name for path in paths])

    def _read_at(self, shard: int, offset: int, length: int) -> bytes:
        return self.store.read_range(self.shards[shard].name, offset, length)

    def _fetch_runs(self, runs) -> list[bytes]:
        return self.store.read_ranges(
            [(self.shards[run.file].name, run.offset, run.length) for run in runs]
        )


def open_remote(store, manifest: dict, **options) -> RemoteTFRecordReader:
    return RemoteTFRecordReader(store, manifest, **options)
