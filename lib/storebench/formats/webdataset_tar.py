"""WebDataset: POSIX tar shards of ``<key>.<ext>`` files, with an offset index beside them.

Layout under the dataset root, for ``samples_per_shard`` = S and N samples::

    shard-000000.tar   samples [0, S): 00000000.jpg 00000000.cls 00000001.jpg 00000001.cls ...
    shard-000001.tar   samples [S, 2S)
    ...
    index.npy          int64 (N, 4): (shard, offset of the image file's data, its size, label)

These are standard WebDataset shards: ``webdataset.WebDataset(shard_paths(root))`` reads them
as they are, grouping the files of a sample by their key, the zero-padded sample index
(``"%08d"``). Each sample is two tar members: the image, stored byte for byte (``.jpg`` /
``.png``; ``.npy`` holding the (H, W, C) uint8 array for raw pixels, which WebDataset's
default decoder loads with ``numpy.lib.format``), and its label as ASCII decimal in ``.cls``
(WebDataset's class-label convention, decoded to an int). Shard ``k`` holds the contiguous
index range ``[k * S, (k + 1) * S)``, so index order is file order and the shards are the
natural blocks; WebDataset's own pipelines split and shuffle by shard.

The shards are written by the standard library's ``tarfile`` in USTAR format: one 512-byte
header per member and no PAX extension headers (short names, integer sizes and times), which
keeps WebDataset's streaming tar parser on its fast path. ``tarfile``'s default (PAX) would
add an extra header per member for a float modification time.

Random access does not scan the tars: ``index.npy`` places every sample, and one ``pread``
fetches the span from the image's header to the end of its ``.cls`` member (a run of
adjacent samples in one read). Whatever ``verify`` says, every read checks both tar headers
(their checksum, and the name and size the index expects: a swapped or shifted member is an
error, not another sample's bytes), the zero padding between members, the ``.npy`` header
against the spec, and the ``.cls`` label against the index. At open the index is checked
whole against the manifest's fingerprint, the labels and sizes against the manifest's
CRC32Cs, and its structure: members back to back from the start of each shard, each shard
long enough to hold them. The tar format has no checksum over file data: a flipped byte
inside an image is caught by ``verify=True`` (the manifest's per-sample CRC32C) only.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from data_gen import DatasetSpec

from . import npyfile
from .base import (
    CorruptSampleError,
    DatasetError,
    ManifestError,
    Reader,
    coalesced_runs,
    sniff_encoding,
)
from .manifest import check_fingerprint
from .manifest import fingerprint_span as default_span
from .traits import FormatTraits

NAME = "webdataset"
ENCODINGS = ("raw", "png", "jpeg", "mixed")
# 500 samples per shard: the small profile's 4,000 PNG/JPEG samples make 8 shards (4 per
# worker of the study's 2), its 20,000 raw ones 40; shards of ~1-10 MB there.
DEFAULT_KNOBS: dict = {"samples_per_shard": 500}
OPEN_OPTIONS: tuple = ()
TRAITS = FormatTraits(
    remote_unsupported=("storebench has no S3 reader for this peer format (the peers study reads "
                        "local files); its own library may read from S3"),
    distributions=("webdataset",),
)
PEER = True
LIBRARIES: tuple = ()  # the standard library writes and reads these tars
# Stored bytes per sample byte: a 512-byte header and up to 511 bytes of padding per image,
# plus a 1 KiB .cls member (header and one padded block): large for the ci profile's ~2 KB
# PNGs, ~10 % for 64x64 raw and 256x256 JPEG.
SIZE_OVERHEAD = {"raw": 1.2, "png": 2.0, "jpeg": 1.3, "mixed": 1.3}

INDEX_NAME = "index.npy"
SHARD_PATTERN = "shard-{shard:06d}.tar"
KEY_PATTERN = "{index:08d}"
LABEL_EXT = "cls"
# The image member's extension, per encoding (a "mixed" set keeps each file's own).
IMAGE_EXTS = {"raw": ("npy",), "png": ("png",), "jpeg": ("jpg",), "mixed": ("jpg", "png")}
_EXT_OF_ENCODING = {"png": "png", "jpeg": "jpg"}

BLOCK = tarfile.BLOCKSIZE  # 512
# A run of adjacent samples is fetched with one pread, up to this many bytes.
_ZEROS = bytes(BLOCK)
# USTAR header fields: (offset, length).
_NAME, _SIZE, _CHKSUM = (0, 100), (124, 12), (148, 8)


def shard_name(shard: int) -> str:
    return SHARD_PATTERN.format(shard=shard)


def num_shards(num_samples: int, samples_per_shard: int) -> int:
    return -(-num_samples // samples_per_shard)


def shard_bounds(num_samples: int, samples_per_shard: int) -> np.ndarray:
    """``[0, S, 2S, ..., num_samples]``: shard ``k`` holds samples ``[b[k], b[k+1])``."""
    stops = np.arange(num_shards(num_samples, samples_per_shard) + 1, dtype=np.int64)
    return np.minimum(stops * samples_per_shard, num_samples)


def shard_paths(root: Path | str, manifest: dict) -> list[Path]:
    """Every shard of the dataset at ``root`` (as its manifest describes it), in order: the
    URLs to hand to ``webdataset.WebDataset``."""
    sps = samples_per_shard_of(manifest, Path(root))
    return [Path(root) / shard_name(k) for k in range(num_shards(manifest["num_samples"], sps))]


def samples_per_shard_of(manifest: dict, root: Path) -> int:
    value = manifest["knobs"].get("samples_per_shard")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ManifestError(f"{root}: samples_per_shard must be a positive integer, got {value!r}")
    return value


def sample_key(index: int) -> str:
    return KEY_PATTERN.format(index=index)


def fingerprint_span(rel: str, path: Path, size: int) -> tuple[int, int]:
    """The offset index is read whole at open: fingerprint all of it."""
    return (size, 0) if rel == INDEX_NAME else default_span(size)


def padded(size):
    """``size`` rounded up to whole 512-byte tar blocks (ints or arrays)."""
    return (size + BLOCK - 1) // BLOCK * BLOCK


def label_text(label: int) -> bytes:
    return str(int(label)).encode("ascii")


def label_digits(labels: np.ndarray) -> np.ndarray:
    """``len(label_text(x))`` for each of ``labels``, without a Python loop."""
    digits = np.ones(len(labels), dtype=np.int64) + (labels < 0)
    rest = np.abs(labels)
    while (rest >= 10).any():
        digits += rest >= 10
        rest = rest // 10
    return digits


def raw_npy_header(shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` header ``np.save`` writes before a C-order uint8 array of ``shape``."""
    f = io.BytesIO()
    npyfile.write_header(f, shape, np.uint8)
    return f.getvalue()


def _member(name: str, size: int) -> tarfile.TarInfo:
    """A plain, reproducible member: no owner, mode 0444, time 0 (an int: no PAX header)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o444, 0
    return info


def write(samples: Iterable, root: Path, spec: DatasetSpec, *, samples_per_shard: int) -> None:
    if isinstance(samples_per_shard, bool) or not isinstance(samples_per_shard, int) or (
        samples_per_shard < 1
    ):
        raise ValueError(f"samples_per_shard must be a positive integer, got {samples_per_shard!r}")
    n = spec.num_samples
    index = np.empty((n, 4), dtype=np.int64)
    header = raw_npy_header(spec.image_shape) if spec.encoding == "raw" else b""
    bounds = shard_bounds(n, samples_per_shard)
    samples = iter(samples)
    for shard in range(len(bounds) - 1):
        path = root / shard_name(shard)
        with (
            io.FileIO(path, "w") as raw,
            io.BufferedWriter(raw, 1 << 20) as f,
            tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar,
        ):
            for i in range(int(bounds[shard]), int(bounds[shard + 1])):
                try:
                    image, label = next(samples)
                except StopIteration:
                    raise DatasetError(
                        f"{root}: got {i} samples, the spec says {n}"
                    ) from None
                key = sample_key(i)
                if spec.encoding == "raw":
                    image = np.asarray(image)
                    if image.shape != spec.image_shape or image.dtype != np.uint8:
                        raise DatasetError(
                            f"{root}: sample {i} is {image.dtype} {image.shape}, the spec "
                            f"says uint8 {spec.image_shape}"
                        )
                    data, ext = header + np.ascontiguousarray(image).tobytes(), "npy"
                else:
                    data = bytes(image)
                    ext = _EXT_OF_ENCODING.get(
                        spec.encoding if spec.encoding != "mixed" else sniff_encoding(data)
                    )
                    if ext is None:
                        raise DatasetError(f"{root}: sample {i} is neither PNG nor JPEG")
                # One 512-byte USTAR header per member: the data follows it directly.
                index[i] = shard, tar.offset + BLOCK, len(data), label
                tar.addfile(_member(f"{key}.{ext}", len(data)), io.BytesIO(data))
                text = label_text(label)
                tar.addfile(_member(f"{key}.{LABEL_EXT}", len(text)), io.BytesIO(text))
    if next(samples, None) is not None:
        raise DatasetError(f"{root}: got more samples than the spec's {n}")
    with io.FileIO(root / INDEX_NAME, "w") as f:
        np.save(f, index, allow_pickle=False)


class WebDatasetReader(Reader):
    """Random access to WebDataset tar shards through ``index.npy``, with ``os.pread``.

    ``read_many`` sorts a batch by position and fetches each run of adjacent samples of one
    shard in one ``pread`` (a sequential batch is one read per shard); samples come back in
    the requested order. WebDataset is never imported.
    """

    def __init__(self, root: Path, manifest: dict, *, verify: bool = True) -> None:
        super().__init__(root, manifest, verify=verify)
        self.samples_per_shard = samples_per_shard_of(manifest, self.root)
        self.bounds = shard_bounds(len(self), self.samples_per_shard)
        self.shards = [self.root / shard_name(k) for k in range(len(self.bounds) - 1)]
        self.index_path = self.root / INDEX_NAME
        # Raw samples: the exact .npy header every image member starts with.
        self._npy_header = raw_npy_header(self.spec.image_shape) if self.is_raw else b""
        self._exts = IMAGE_EXTS[self.spec.encoding]
        self._h_files: list[io.FileIO] | None = None
        self._h_starts: np.ndarray | None = None  # each sample's image header offset
        self._h_ends: np.ndarray | None = None  # the end of its padded .cls member
        self._h_sizes: np.ndarray | None = None
        self._h_labels: np.ndarray | None = None

    # -- open: the index, checked whole ------------------------------------------------------
    def _open(self) -> None:
        starts, ends, sizes, labels = self._load_index()
        files = []
        try:
            for path in self.shards:
                try:
                    files.append(io.FileIO(path, "r"))
                except OSError as err:
                    raise DatasetError(f"{path}: cannot open shard: {err}") from err
            for shard, f in enumerate(files):
                last = int(self.bounds[shard + 1]) - 1
                need = int(ends[last]) + 2 * BLOCK  # the tar's two zero end blocks
                size = os.fstat(f.fileno()).st_size
                if size < need:
                    raise DatasetError(
                        f"{self.shards[shard]}: shard is cut off: it has {size} bytes, the "
                        f"index {INDEX_NAME} places the end of its last sample ({last}) and "
                        f"the tar's end blocks at byte {need}"
                    )
        except BaseException:
            for f in files:
                f.close()
            raise
        self._h_files = files
        self._h_starts, self._h_ends, self._h_sizes, self._h_labels = starts, ends, sizes, labels
        # Nothing in a shard names the dataset's encoding but the members' extensions: read
        # sample 0 now, so a manifest claiming another encoding or shape is refused at open.
        try:
            self._read_one(0)
        except BaseException:
            self._close()
            raise

    def _load_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        path = self.index_path
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise DatasetError(f"{path}: offset index missing") from None
        except OSError as err:
            raise DatasetError(f"{path}: unreadable offset index: {err}") from err
        recorded = self.manifest["fingerprints"].get(INDEX_NAME)
        if recorded is None:
            raise DatasetError(f"{path}: not listed in the manifest")
        check_fingerprint(path, recorded, data)
        try:
            index = npyfile.loads(data, path, dtype="<i8", ndim=2)
        except DatasetError as err:
            raise DatasetError(f"unreadable offset index: {err}") from err
        if index.shape != (len(self), 4):
            raise DatasetError(f"{path}: offset index is {index.shape}, expected ({len(self)}, 4)")
        index = index.astype(np.int64)
        shard, offsets, sizes, labels = (np.ascontiguousarray(index[:, k]) for k in range(4))
        self._check_integrity("labels_crc32c", labels, path, "labels")
        stored_sizes = sizes - len(self._npy_header)
        self._check_integrity("sizes_crc32c", stored_sizes, path, "sample sizes")
        expected_shard = np.arange(len(self), dtype=np.int64) // self.samples_per_shard
        starts = offsets - BLOCK
        ends = offsets + padded(sizes) + BLOCK + padded(label_digits(labels))
        # Members back to back: each shard's first sample at byte 0, each next one where
        # the previous sample's .cls padding ends.
        same_shard = np.zeros(len(self), dtype=bool)
        same_shard[1:] = expected_shard[1:] == expected_shard[:-1]
        expected_start = np.where(same_shard, np.concatenate([[0], ends[:-1]]), 0)
        bad = (shard != expected_shard) | (sizes < 0) | (starts != expected_start)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DatasetError(
                f"{path}: damaged offset index: sample {i} at (shard {int(shard[i])}, offset "
                f"{int(offsets[i])}, size {int(sizes[i])}) does not follow the previous sample "
                f"in shard {int(expected_shard[i])}"
            )
        return starts, ends, sizes, labels

    def _close(self) -> None:
        for f in self._h_files or ():
            f.close()
        self._h_files = self._h_starts = self._h_ends = self._h_sizes = self._h_labels = None

    # -- reads ------------------------------------------------------------------------------
    def _shard_of(self, index: int) -> int:
        return index // self.samples_per_shard

    def _locate(self, index: int) -> Path:
        return self.shards[self._shard_of(index)]

    def blocks(self) -> np.ndarray:
        return self.bounds.copy()

    def _read_one(self, index: int) -> tuple[np.ndarray | bytes, int]:
        start, end = int(self._h_starts[index]), int(self._h_ends[index])
        span = self._pread(self._shard_of(index), start, end - start, index)
        return self._parse(index, memoryview(span))

    def _read_many(self, indices: np.ndarray, out: np.ndarray | None):
        runs = coalesced_runs(indices, self._h_starts[indices], self._h_ends[indices],
                              indices // self.samples_per_shard)
        return self._read_runs(
            indices, out, runs,
            (self._pread(run.file, run.offset, run.length, run.first_index, allow_short=True)
             for run in runs),
            lambda run, index, end, want: self._cut_off(index, end, want),
            lambda shard, index, data: self._parse(index, data))

    # -- helpers ----------------------------------------------------------------------------
    def _pread(self, shard: int, offset: int, length: int, index: int, *,
               allow_short: bool = False) -> bytes:
        try:
            data = os.pread(self._h_files[shard].fileno(), length, offset)
        except OSError as err:
            raise CorruptSampleError(self.shards[shard], index, f"read failed: {err}") from err
        if len(data) < length and not allow_short:
            raise self._cut_off(index, offset + len(data), offset + length)
        return data

    def _cut_off(self, index: int, file_end: int, sample_end: int) -> CorruptSampleError:
        return CorruptSampleError(
            self._locate(index), index,
            f"shard is cut off: it ends at byte {file_end}, the index places this sample's "
            f"end at byte {sample_end}",
        )

    def _parse(self, index: int, span: memoryview) -> tuple[np.ndarray | bytes, int]:
        """The image and label from ``span``: the sample's image member and ``.cls`` member,
        headers and padding included, every byte but the image data checked."""
        size, label = int(self._h_sizes[index]), int(self._h_labels[index])
        key = sample_key(index)
        name = self._check_header(index, span[:BLOCK], key, size, self._exts, "image")
        image = span[BLOCK : BLOCK + size]
        label_at = BLOCK + padded(size)
        text = label_text(label)
        self._check_padding(index, span[BLOCK + size : label_at], name)
        self._check_header(index, span[label_at : label_at + BLOCK], key, len(text),
                           (LABEL_EXT,), "label")
        stored = span[label_at + BLOCK : label_at + BLOCK + len(text)]
        if stored != text:
            raise CorruptSampleError(
                self._locate(index), index,
                f"{key}.{LABEL_EXT} holds {bytes(stored)!r}, the index says label {label}",
            )
        self._check_padding(index, span[label_at + BLOCK + len(text) :], f"{key}.{LABEL_EXT}")
        if self.is_raw:
            header = self._npy_header
            if image[: len(header)] != header:
                raise CorruptSampleError(
                    self._locate(index), index,
                    f"{name}: .npy header is not that of a uint8 {self.spec.image_shape} "
                    "array, as the spec says",
                )
            return self._decode_raw(image[len(header) :], index), label
        data = bytes(image)
        if self.spec.encoding == "mixed" and _EXT_OF_ENCODING.get(sniff_encoding(data)) != (
            name.rpartition(".")[2]
        ):
            raise CorruptSampleError(
                self._locate(index), index, f"{name} does not hold what its extension says"
            )
        return data, label

    def _check_header(self, index: int, header: memoryview, key: str, size: int,
                      exts: tuple[str, ...], what: str) -> str:
        """The member's name (``key`` plus one of ``exts``), after checking the header's
        checksum and that its name and size are what the index says."""
        path = self._locate(index)
        if len(header) < BLOCK:
            raise CorruptSampleError(path, index, f"shard ends inside the {what} header")
        raw = bytes(header)
        try:
            recorded = int(raw[_CHKSUM[0] : _CHKSUM[0] + _CHKSUM[1]].rstrip(b"\0 ") or b"-1", 8)
        except ValueError:
            recorded = -1
        # The checksum: the sum of the header's bytes, its own field counted as spaces.
        actual = sum(raw) - sum(raw[_CHKSUM[0] : _CHKSUM[0] + _CHKSUM[1]]) + 8 * 0x20
        if recorded != actual:
            raise CorruptSampleError(
                path, index,
                f"damaged tar header for the {what} member (checksum {recorded}, computed "
                f"{actual})",
            )
        name = raw[: _NAME[1]].split(b"\0", 1)[0].decode("ascii", "replace")
        stem, _, ext = name.rpartition(".")
        try:
            stored_size = int(raw[_SIZE[0] : _SIZE[0] + _SIZE[1]].rstrip(b"\0 ") or b"-1", 8)
        except ValueError:
            stored_size = -1
        if stem != key or ext not in exts or stored_size != size:
            want = " or ".join(f"{key}.{e}" for e in exts)
            raise CorruptSampleError(
                path, index,
                f"tar member {name!r} of {stored_size} bytes where the index expects {want} "
                f"of {size} bytes: the shard is not the one indexed, or another dataset's",
            )
        return name

    def _check_padding(self, index: int, padding: memoryview, after: str) -> None:
        if padding != _ZEROS[: len(padding)]:
            raise CorruptSampleError(
                self._locate(index), index, f"non-zero bytes in the tar padding after {after}"
            )


def open(root: Path, manifest: dict, **options) -> WebDatasetReader:  # noqa: A001 - registry verb
    return WebDatasetReader(root, manifest, **options)
