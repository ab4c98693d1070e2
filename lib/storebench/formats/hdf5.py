"""HDF5 (h5py): dataset ``images``, dataset ``labels`` (int64), the spec in root attributes.

Raw samples: ``images`` is (N, H, W, C) uint8, chunked ``chunk_samples`` samples at a time.
Encoded samples: ``images`` is one 1-D uint8 dataset holding every PNG/JPEG file back to back
(contiguous, or chunked about ``chunk_samples`` samples at a time when compressed), and
``offsets`` is int64 (N + 1,): sample ``i`` is ``images[offsets[i]:offsets[i + 1]]``.
Imported images of mixed sizes add ``shapes``, int32 (N, 3): each image's decoded
(H, W, C), read from its header at build time.
Readable with plain ``h5py.File(path)["images"][i]`` (raw) or
``f["images"][f["offsets"][i]:f["offsets"][i + 1]].tobytes()`` (encoded).

Encoded bytes are not stored as a variable-length dataset: those live in HDF5's global heap,
and a zeroed range in a heap collection sends libhdf5 into an endless loop
(``H5HG__cache_heap_deserialize``) that neither an error nor Ctrl-C ends. A plain byte array
plus offsets has no such structure, and a range read is one contiguous read. The offsets and
labels are checked against the manifest's CRC32C at open.

libhdf5 reads past the end of a file as zeros: the reader compares the file's size with the
manifest's (one ``fstat``) before every read, so that a file truncated under an open reader
is an error rather than silently zeroed samples.
"""

from __future__ import annotations

import builtins
import io
import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from data_gen import DatasetSpec

from .base import CorruptSampleError, DatasetError, ManifestError, Reader
from .remote_reader import RemoteReader
from .specs import fixed_size, stored_image_shape
from .traits import FormatTraits, KnobVariant

NAME = "hdf5"
ENCODINGS = ("raw", "png", "jpeg", "mixed")
# 64 samples of 64x64x3 make a 768 KiB chunk: large enough for sequential throughput, small
# enough that a random read does not pull in megabytes. compression: None, "gzip" or "lzf".
DEFAULT_KNOBS: dict = {"chunk_samples": 64, "compression": None}
OPEN_OPTIONS = ("chunk_cache_bytes",)
TRAITS = FormatTraits(
    # 1024 samples of 224x224x3 make a 154 MB chunk, read whole for a random sample: the
    # ImageNet-like set builds the per-sample chunk only.
    knob_variants=(KnobVariant(NAME, "raw", (("chunk_samples", 1),)),
                   KnobVariant(NAME, "raw", (("chunk_samples", 1024),),
                               families=("synthetic",))),
    knob_metrics={"chunk_samples": "random_cold"},
    variant_access="block_shuffle",
    # A disabled chunk cache re-reads a chunk for every sample of it out of core.
    out_of_core_options=(({"chunk_cache_bytes": 0}, "block_shuffle"),),
    distributions=("h5py",),
)
FILENAME = "data.h5"
# Stored bytes per sample byte, per encoding; encoded builds stage their bytes once before
# copying them into the file, so they need twice the space while writing.
SIZE_OVERHEAD = {"raw": 1.02, "png": 2.05, "jpeg": 2.05, "mixed": 2.05}
# Encoded bytes are staged here (inside the build's temporary directory) so that ``images``
# can be created at its final size, contiguous; removed before the build completes.
_STAGING = ".encoded.staging"
_COPY_BYTES = 16 << 20
# What h5py raises on a damaged file besides OSError: bad object headers surface as
# KeyError/ValueError/RuntimeError/TypeError from its low-level layer.
_H5_ERRORS = (OSError, KeyError, ValueError, RuntimeError, TypeError)


def write(
    samples: Iterable, root: Path, spec: DatasetSpec, *, chunk_samples: int, compression: str | None
) -> None:

    if chunk_samples < 1:
        raise ValueError(f"chunk_samples must be >= 1, got {chunk_samples}")
    chunk = min(chunk_samples, spec.num_samples)
    n = spec.num_samples
    labels = np.empty(n, dtype=np.int64)
    with _created(root / FILENAME) as f:
        if spec.encoding == "raw":
            count = _write_raw(f, samples, labels, spec, chunk, compression)
        else:
            count = _write_encoded(f, samples, labels, root, spec, chunk, compression)
        if count != n:
            raise DatasetError(f"{root}: got {count} samples, the spec says {n}")
        f.create_dataset("labels", data=labels, track_times=False)
        f.attrs["storebench_spec"] = json.dumps(spec.to_dict())
        for key, value in spec.to_dict().items():
            # h5py cannot store a list of str as an attribute: class names go in as JSON.
            as_json = isinstance(value, list)
            f.attrs[key] = json.dumps(value, ensure_ascii=False) if as_json else value


def _created(path: Path):
    """A new ``h5py.File`` (libver latest) whose objects, the root group included, record no
    timestamps: two builds of the same samples are then the same bytes. h5py's ``File``
    takes no creation property list, so the file is created at the low level."""
    import h5py

    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_obj_track_times(False)
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    return h5py.File(h5py.h5f.create(os.fsencode(path), h5py.h5f.ACC_TRUNC, fcpl=fcpl,
                                     fapl=fapl))


def _write_raw(f, samples, labels, spec: DatasetSpec, chunk: int, compression) -> int:
    images = f.create_dataset(
        "images",
        shape=(spec.num_samples, *spec.image_shape),
        dtype=np.uint8,
        chunks=(chunk, *spec.image_shape),
        compression=compression,
        track_times=False,
    )
    # Whole chunks at a time: one write per chunk instead of one per sample.
    pending: list = []
    start = count = 0
    for i, (image, label) in enumerate(samples):
        if i >= spec.num_samples:
            raise DatasetError(f"got more samples than the spec's {spec.num_samples}")
        labels[i] = label
        pending.append(image)
        count += 1
        if len(pending) == chunk:
            images[start : start + len(pending)] = np.stack(pending)
            start, pending = start + len(pending), []
    if pending:
        images[start : start + len(pending)] = np.stack(pending)
    return count


def _write_encoded(f, samples, labels, root: Path, spec: DatasetSpec, chunk: int, compression):
    n = spec.num_samples
    offsets = np.zeros(n + 1, dtype=np.int64)
    staging = root / _STAGING
    count = 0
    shapes = None if fixed_size(spec) else np.zeros((n, 3), dtype=np.int32)
    try:
        with builtins.open(staging, "wb") as out:
            for i, (image, label) in enumerate(samples):
                if i >= n:
                    raise DatasetError(f"{root}: got more samples than the spec's {n}")
                out.write(image)
                offsets[i + 1] = offsets[i] + len(image)
                labels[i] = label
                if shapes is not None:
                    shapes[i] = stored_image_shape(spec, image)
                count += 1
        total = int(offsets[count])
        chunks = None
        if compression is not None:  # filters need chunks: about ``chunk`` samples each
            chunks = (max(1, min(total, total * chunk // max(count, 1))),)
        images = f.create_dataset(
            "images", shape=(total,), dtype=np.uint8, chunks=chunks, compression=compression,
            track_times=False,
        )
        with builtins.open(staging, "rb") as source:
            for start in range(0, total, _COPY_BYTES):
                block = np.frombuffer(source.read(_COPY_BYTES), dtype=np.uint8)
                images[start : start + len(block)] = block
        f.create_dataset("offsets", data=offsets, track_times=False)
        if shapes is not None:
            f.create_dataset("shapes", data=shapes, track_times=False)
    finally:
        staging.unlink(missing_ok=True)
    return count


class Hdf5Reader(Reader):
    """Batched reads go chunk by chunk in sorted order, then scatter back to request order."""

    def __init__(
        self, root: Path, manifest: dict, *, verify: bool = True, chunk_cache_bytes: int = 4 << 20
    ) -> None:
        super().__init__(root, manifest, verify=verify)
        self.chunk_cache_bytes = chunk_cache_bytes
        self.chunk_samples = min(manifest["knobs"]["chunk_samples"], len(self))
        self._h_file = self._h_images = self._h_labels = self._h_offsets = None
        self._h_stat_file: io.FileIO | None = None

    def _open(self) -> None:
        import h5py

        path = self.root / FILENAME
        try:
            self._h_file = h5py.File(self._file_object(path), "r",
                                     rdcc_nbytes=self.chunk_cache_bytes)
            self._check_layout(self._h_file, path)
        except _H5_ERRORS as err:
            self._close()
            raise DatasetError(f"{path}: cannot open as a storebench HDF5 dataset: {err}") from err
        except DatasetError:
            self._close()
            raise

    def _file_object(self, path):
        """What ``h5py.File`` opens: the path (an I/O hook: ``storebench.remote`` passes a
        file object reading an S3 object). Also keeps a descriptor to notice truncation."""
        self._h_stat_file = io.FileIO(path, "r")
        return path

    def _check_size(self, index: int) -> None:
        self._check_not_shrunk(
            self._h_stat_file, self.manifest["files"][FILENAME], FILENAME, index,
            "libhdf5 would return zeros past its end",
        )

    def _check_layout(self, f, path: Path) -> None:
        try:
            stored = json.loads(f.attrs["storebench_spec"])
        except (KeyError, ValueError, TypeError):
            stored = None
        if stored != self.spec.to_dict():
            raise ManifestError(
                f"{path}: the spec in the file's attributes differs from the manifest's "
                "(or is missing or damaged)"
            )
        names = ("images", "labels") if self.is_raw else ("images", "labels", "offsets")
        for name in names:
            self._check_self_contained(f, name, path)
        images, labels = f["images"], f["labels"][:]
        n = len(self)
        if labels.shape != (n,) or labels.dtype != np.int64:
            raise DatasetError(f"{path}: labels are {labels.dtype} {labels.shape}, expected ({n},)")
        if images.dtype != np.uint8:
            raise DatasetError(f"{path}: images are {images.dtype}, expected uint8")
        self._check_integrity("labels_crc32c", labels, path, "labels")
        if self.is_raw:
            if images.shape != (n, *self.spec.image_shape):
                raise DatasetError(
                    f"{path}: images are {images.shape}, expected {(n, *self.spec.image_shape)}"
                )
        else:
            offsets = f["offsets"][:]
            if images.ndim != 1 or offsets.shape != (n + 1,) or offsets.dtype != np.int64:
                raise DatasetError(
                    f"{path}: expected 1-D images and ({n + 1},) int64 offsets, found "
                    f"{images.shape} and {offsets.dtype} {offsets.shape}"
                )
            sizes = np.diff(offsets)
            if offsets[0] != 0 or np.any(sizes < 0) or offsets[-1] != images.shape[0]:
                raise DatasetError(
                    f"{path}: offsets are not an increasing partition of the "
                    f"{images.shape[0]} image bytes"
                )
            self._check_integrity("sizes_crc32c", sizes, path, "sample offsets")
            self._h_offsets = offsets
        self._h_images, self._h_labels = images, labels

    @staticmethod
    def _check_self_contained(f, name: str, path: Path) -> None:
        """Refuse a dataset whose bytes live outside this file: an external link, external
        raw storage or a virtual dataset can name any file on disk (a hostile file's
        ``labels`` in /etc/passwd, say), which the manifest neither lists nor fingerprints.
        storebench writes none of them."""
        import h5py

        link = f.get(name, getlink=True)
        if link is None:
            raise DatasetError(f"{path}: no dataset {name!r}")
        if not isinstance(link, h5py.HardLink):
            raise DatasetError(f"{path}: {name!r} is a {type(link).__name__} (it points at "
                               "another file or object): refused")
        dataset = f[name]
        if not isinstance(dataset, h5py.Dataset):
            raise DatasetError(f"{path}: {name!r} is not a dataset")
        if dataset.external:
            files = sorted({str(entry[0]) for entry in dataset.external})
            raise DatasetError(f"{path}: {name!r} keeps its bytes in external file(s) "
                               f"{files}: refused (a dataset's bytes stay in its own file)")
        if dataset.is_virtual:
            raise DatasetError(f"{path}: {name!r} is a virtual dataset mapping other files: "
                               "refused")

    def _close(self) -> None:
        if self._h_file is not None:
            self._h_file.close()
        if self._h_stat_file is not None:
            self._h_stat_file.close()
        self._h_file = self._h_images = self._h_labels = self._h_offsets = None
        self._h_stat_file = None

    def _locate(self, index: int) -> Path:
        return self.root / FILENAME

    def _read_span(self, lo: int, hi: int):
        """Samples ``lo..hi-1``: a (hi - lo, H, W, C) array, or for encoded data the bytes
        from sample ``lo``'s start to sample ``hi - 1``'s end."""
        self._check_size(lo)
        try:
            if self.is_raw:
                return self._h_images[lo:hi]
            return self._h_images[self._h_offsets[lo] : self._h_offsets[hi]]
        except _H5_ERRORS as err:
            raise CorruptSampleError(self.root / FILENAME, lo, f"HDF5 read failed: {err}") from err

    def _read_one(self, index: int):
        span = self._read_span(index, index + 1)
        label = int(self._h_labels[index])
        return (span[0], label) if self.is_raw else (span.tobytes(), label)

    def _read_many(self, indices: np.ndarray, out: np.ndarray | None):
        order = np.argsort(indices, kind="stable")
        ordered = indices[order]
        chunk_ids = ordered // self.chunk_samples
        # Split the sorted request into runs that fall in one chunk; read each run's span once.
        cuts = np.flatnonzero(np.diff(chunk_ids)) + 1
        labels = self._h_labels[indices]
        if self.is_raw:
            images = self._raw_buffer(len(indices), out)
        else:
            images = [b""] * len(indices)
        for run_positions, run in zip(np.split(order, cuts), np.split(ordered, cuts)):
            lo, hi = int(run[0]), int(run[-1]) + 1
            span = self._read_span(lo, hi)
            if self.is_raw:
                images[run_positions] = span[run - lo]
                continue
            base = int(self._h_offsets[lo])
            starts = (self._h_offsets[run] - base).tolist()
            stops = (self._h_offsets[run + 1] - base).tolist()
            for position, a, b in zip(run_positions.tolist(), starts, stops, strict=True):
                images[position] = span[a:b].tobytes()
        return images, labels

    def blocks(self) -> np.ndarray:
        bounds = np.arange(0, len(self), self.chunk_samples, dtype=np.int64)
        return np.append(bounds, len(self))


def open(root: Path, manifest: dict, **options) -> Hdf5Reader:  # noqa: A001 - registry verb
    return Hdf5Reader(root, manifest, **options)


# -- over object storage ----------------------------------------------------------
# An HDF5 file over S3: h5py reads through a file object whose every read is a ranged GET.
# libhdf5 reads one chunk at a time, so requests are not concurrent: its row in the study says
# what that costs at a distance.
class RemoteHdf5Reader(RemoteReader, Hdf5Reader):
    def _file_object(self, path):
        return self.store.open_file(self.name_of(path))

    def _check_size(self, index: int) -> None:
        """An object cannot shrink under the reader (S3 replaces objects whole); its size
        was checked against the manifest at open."""


def open_remote(store, manifest: dict, **options) -> RemoteHdf5Reader:
    return RemoteHdf5Reader(store, manifest, **options)
