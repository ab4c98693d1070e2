"""Memory-mapped NumPy: ``images.npy`` (N, H, W, C) uint8 and ``labels.npy`` (N,) int64.

Readable with plain ``np.load(root / "images.npy", mmap_mode="r")``. Raw pixels only.

A memory map turns a read past the end of a file that shrank after mapping into SIGBUS, which
kills the process. The reader compares the file's size with the manifest's (one ``fstat``)
before every read and raises ``DatasetError`` instead; a file truncated in the microseconds
between that check and the copy, or while a consumer holds the zero-copy ``images`` map, can
still end the process with SIGBUS. Writing uses plain writes, never a writable map, so a full
disk during a build is an ``OSError`` rather than a SIGBUS.
"""

from __future__ import annotations

import builtins
import fnmatch
import io
import mmap
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from data_gen import DatasetSpec

from ..gather import take_rows
from . import npyfile
from .base import CorruptSampleError, DatasetError, Reader
from .manifest import fingerprint_span as default_span
from .traits import FormatTraits

NAME = "memmap"
ENCODINGS = ("raw",)
DEFAULT_KNOBS: dict = {}
OPEN_OPTIONS = ("madvise_random", "populate")
TRAITS = FormatTraits(
    out_of_core_options=(({"madvise_random": True}, "shuffle"),),
    readahead_option="madvise_random",
    remote_unsupported="a memory-mapped .npy needs a local file to map",
)
# MADV_POPULATE_READ (Linux 5.14): fill the page tables from the page cache in one call.
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
IMAGES, LABELS = "images.npy", "labels.npy"
# Stored bytes per raw byte (the .npy header is all there is besides the pixels).
SIZE_OVERHEAD = {"raw": 1.01}


def fingerprint_span(rel: str, path: Path, size: int) -> tuple[int, int]:
    """The labels file is small and read whole at open: fingerprint all of it."""
    return (size, 0) if fnmatch.fnmatch(rel, LABELS) else default_span(size)


def write(samples: Iterable, root: Path, spec: DatasetSpec) -> None:
    labels = np.empty(spec.num_samples, dtype=np.int64)
    count = 0
    with builtins.open(root / IMAGES, "wb") as f:
        npyfile.write_header(f, (spec.num_samples, *spec.image_shape), np.uint8)
        for i, (image, label) in enumerate(samples):
            if i >= spec.num_samples:
                raise DatasetError(f"{root}: got more samples than the spec's {spec.num_samples}")
            image = np.asarray(image)
            if image.shape != spec.image_shape or image.dtype != np.uint8:
                raise DatasetError(
                    f"{root}: sample {i} is {image.dtype} {image.shape}, the spec says uint8 "
                    f"{spec.image_shape}"
                )
            f.write(np.ascontiguousarray(image))
            labels[i] = label
            count += 1
    if count != spec.num_samples:
        raise DatasetError(f"{root}: got {count} samples, the spec says {spec.num_samples}")
    np.save(root / LABELS, labels)


class MemmapReader(Reader):
    """Fancy indexing into a read-only memory map.

    ``madvise_random=True`` sets MADV_RANDOM on the map: a cold random access then reads one
    page instead of the kernel's multi-megabyte read-around (right for data larger than RAM,
    wrong for sequential scans).

    ``populate=True`` fills the map's page tables at open (``populate()``): on warm data it
    removes one minor page fault per 4 KiB page from the first epoch (a 2x difference for
    shuffled 12 KiB samples); on cold data it reads the whole file first.
    """

    def __init__(
        self,
        root: Path,
        manifest: dict,
        *,
        verify: bool = True,
        madvise_random: bool = False,
        populate: bool = False,
    ) -> None:
        super().__init__(root, manifest, verify=verify)
        self.madvise_random = madvise_random
        self.populate_on_open = populate
        self._h_images = None
        self._h_labels = None
        self._h_rows = None
        self._h_stat_file: io.FileIO | None = None
        self._h_size = 0

    def _open(self) -> None:
        path = self.root / IMAGES
        images = npyfile.open_memmap(path, dtype=np.uint8, ndim=4)
        labels = npyfile.load(self.root / LABELS, dtype="<i8", ndim=1).astype(np.int64)
        expected = (len(self), *self.spec.image_shape)
        if images.shape != expected:
            raise DatasetError(f"{path}: holds {images.shape}, the manifest's spec says {expected}")
        if labels.shape != (len(self),):
            raise DatasetError(
                f"{self.root / LABELS}: {labels.shape[0]} labels, expected {len(self)}"
            )
        self._check_integrity("labels_crc32c", labels, self.root / LABELS, "labels")
        if self.madvise_random:
            images._mmap.madvise(mmap.MADV_RANDOM)
        # Our own descriptor of the mapped file: fstat on it sees a truncation in place.
        self._h_stat_file = io.FileIO(path, "r")
        self._h_size = int(self.manifest["files"][IMAGES])
        self._h_images, self._h_labels = images, labels
        # What row_array hands out, made once (it is asked for on every batch): a plain
        # ndarray view (NumPy wraps what it makes from an np.memmap subclass in Python).
        self._h_rows = np.asarray(images).reshape(len(self), -1)
        self._check_size(0)
        if self.populate_on_open:
            self._populate(images)

    def _check_size(self, index: int) -> None:
        self._check_not_shrunk(
            self._h_stat_file, self._h_size, IMAGES, index,
            "reading the mapped range would crash with SIGBUS",
        )

    def row_array(self) -> tuple[np.ndarray, np.ndarray] | None:
        if self.verify:
            return None
        self._ensure_open()
        self._check_size(0)
        return self._h_rows, self._h_labels

    def populate(self) -> None:
        """Map every page of ``images.npy`` now (reading it if it is not cached)."""
        self._ensure_open()
        self._check_size(0)
        self._populate(self._h_images)

    @staticmethod
    def _populate(images: np.ndarray) -> None:
        try:
            images._mmap.madvise(MADV_POPULATE_READ)
        except OSError:  # kernels before 5.14: touch one byte per page instead
            page = mmap.PAGESIZE
            flat = images.reshape(-1)
            int(flat[::page].sum())

    def _close(self) -> None:
        # Dropping the last reference unmaps; mmap.close() would fail while views exist.
        if self._h_stat_file is not None:
            self._h_stat_file.close()
        self._h_images = self._h_labels = self._h_rows = self._h_stat_file = None

    def _locate(self, index: int) -> Path:
        return self.root / IMAGES

    def _read_one(self, index: int) -> tuple[np.ndarray, int]:
        self._check_size(index)
        return np.array(self._h_images[index]), int(self._h_labels[index])

    def _read_many(self, indices: np.ndarray, out: np.ndarray | None):
        self._check_size(int(indices[0]))
        images = self._raw_buffer(len(indices), out)
        flat_source = self._h_rows
        try:
            take_rows(flat_source, indices, images.reshape(len(indices), -1))
        except OSError as err:  # SIGBUS is not catchable; an I/O error on the map is
            raise CorruptSampleError(self.root / IMAGES, int(indices[0]), str(err)) from err
        return images, self._h_labels[indices]

    @property
    def images(self) -> np.ndarray:
        """The (N, H, W, C) memory map itself, for zero-copy consumers (unguarded: see the
        module docstring on files that shrink under a map)."""
        self._ensure_open()
        return self._h_images


def open(root: Path, manifest: dict, **options) -> MemmapReader:  # noqa: A001 - registry verb
    return MemmapReader(root, manifest, **options)
