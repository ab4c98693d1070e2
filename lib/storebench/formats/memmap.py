"""Memory-mapped NumPy: ``images.npy`` (N, H, W, C) uint8 and ``labels.npy`` (N,) int64.

Readable with plain ``np.load(root / "images.npy", mmap_mode="r")``. Raw pixels only.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from data_gen import DatasetSpec

from .base import CorruptSampleError, DatasetError, Reader

NAME = "memmap"
ENCODINGS = ("raw",)
DEFAULT_KNOBS: dict = {}
OPEN_OPTIONS = ("madvise_random", "populate")
# MADV_POPULATE_READ (Linux 5.14): fill the page tables from the page cache in one call.
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
IMAGES, LABELS = "images.npy", "labels.npy"


def write(samples: Iterable, root: Path, spec: DatasetSpec) -> None:
    images = np.lib.format.open_memmap(
        root / IMAGES, mode="w+", dtype=np.uint8, shape=(spec.num_samples, *spec.image_shape)
    )
    labels = np.empty(spec.num_samples, dtype=np.int64)
    count = 0
    for i, (image, label) in enumerate(samples):
        images[i] = image
        labels[i] = label
        count += 1
    if count != spec.num_samples:
        raise DatasetError(f"{root}: got {count} samples, the spec says {spec.num_samples}")
    images.flush()
    del images
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

    def _open(self) -> None:
        path = self.root / IMAGES
        try:
            images = np.load(path, mmap_mode="r")
            labels = np.load(self.root / LABELS)
        except (OSError, ValueError) as err:
            raise DatasetError(f"{path}: cannot map: {err}") from err
        expected = (len(self), *self.spec.image_shape)
        if images.shape != expected or images.dtype != np.uint8:
            raise DatasetError(f"{path}: holds {images.dtype} {images.shape}, expected {expected}")
        if labels.shape != (len(self),):
            raise DatasetError(
                f"{self.root / LABELS}: {labels.shape[0]} labels, expected {len(self)}"
            )
        if self.madvise_random:
            images._mmap.madvise(mmap.MADV_RANDOM)
        self._h_images, self._h_labels = images, labels
        if self.populate_on_open:
            self._populate(images)

    def populate(self) -> None:
        """Map every page of ``images.npy`` now (reading it if it is not cached)."""
        self._ensure_open()
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
        self._h_images = self._h_labels = None

    def _locate(self, index: int) -> Path:
        return self.root / IMAGES

    def _read_one(self, index: int) -> tuple[np.ndarray, int]:
        return np.array(self._h_images[index]), int(self._h_labels[index])

    def _read_many(self, indices: np.ndarray, out: np.ndarray | None):
        images = self._raw_buffer(len(indices), out)
        flat_source = self._h_images.reshape(len(self), -1)
        try:
            # Row gather on a 2-D view with mode="clip" (bounds were checked by read_many)
            # skips numpy's per-element bounds checks: about 1.7x faster than plain take.
            np.take(flat_source, indices, axis=0, out=images.reshape(len(indices), -1), mode="clip")
        except OSError as err:  # SIGBUS is not catchable; an I/O error on the map is
            raise CorruptSampleError(self.root / IMAGES, int(indices[0]), str(err)) from err
        return images, self._h_labels[indices]

    @property
    def images(self) -> np.ndarray:
        """The (N, H, W, C) memory map itself, for zero-copy consumers."""
        self._ensure_open()
        return self._h_images


def open(root: Path, manifest: dict, **options) -> MemmapReader:  # noqa: A001 - registry verb
    return MemmapReader(root, manifest, **options)
