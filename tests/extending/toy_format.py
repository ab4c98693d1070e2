"""A format defined outside storebench, for ``tests/test_extending.py``: every raw sample in
one file, each padded to ``alignment`` bytes (its one build knob), the labels in a ``.npy``
beside it. This module and one registry line (``sitecustomize.py``) are all it takes."""

from __future__ import annotations

import builtins
import os
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from storebench.formats import npyfile
from storebench.formats.base import DatasetError, Reader
from storebench.formats.traits import FormatTraits, KnobVariant

NAME = "toy"
ENCODINGS = ("raw",)
DEFAULT_KNOBS: dict = {"alignment": 1}
OPEN_OPTIONS: tuple = ()
TRAITS = FormatTraits(
    knob_variants=(KnobVariant(NAME, "raw", (("alignment", 4096),)),),
    knob_metrics={"alignment": "sequential_cold"},
    remote_unsupported="the toy format is read from local disk only",
)
SIZE_OVERHEAD = {"raw": 1.35}
DATA, LABELS = "data.bin", "labels.npy"
# The first bytes of the data file: the (height, width, channels) it was written with.
HEADER = struct.Struct("<3I")


def stride(sample_bytes: int, alignment: int) -> int:
    return -(-sample_bytes // alignment) * alignment


def write(samples: Iterable, root: Path, spec, *, alignment: int = 1) -> None:
    if not isinstance(alignment, int) or alignment < 1:
        raise DatasetError(f"{root}: alignment must be a positive integer, got {alignment!r}")
    padding = bytes(stride(spec.raw_sample_bytes, alignment) - spec.raw_sample_bytes)
    labels: list[int] = []
    with builtins.open(root / DATA, "wb") as f:
        f.write(HEADER.pack(*spec.image_shape))
        for image, label in samples:
            pixels = np.ascontiguousarray(image, dtype=np.uint8)
            if pixels.shape != spec.image_shape or len(labels) == spec.num_samples:
                raise DatasetError(f"{root}: sample {len(labels)} does not fit the spec")
            f.write(pixels.tobytes() + padding)
            labels.append(int(label))
    if len(labels) != spec.num_samples:
        raise DatasetError(f"{root}: got {len(labels)} samples, the spec says "
                           f"{spec.num_samples}")
    np.save(root / LABELS, np.array(labels, dtype=np.int64))


class ToyReader(Reader):
    """One ``pread`` per sample from the one data file."""

    def _open(self) -> None:
        labels = npyfile.load(self.root / LABELS, dtype="<i8", ndim=1).astype(np.int64)
        if labels.shape != (len(self),):
            raise DatasetError(f"{self.root / LABELS}: {len(labels)} labels, expected "
                               f"{len(self)}")
        self._check_integrity("labels_crc32c", labels, self.root / LABELS, "labels")
        self._h_stride = stride(self.spec.raw_sample_bytes, self.manifest["knobs"]["alignment"])
        self._h_file = builtins.open(self.root / DATA, "rb")  # noqa: SIM115 - held open
        size = os.fstat(self._h_file.fileno()).st_size
        shape = HEADER.unpack(os.pread(self._h_file.fileno(), HEADER.size, 0).ljust(
            HEADER.size, b"\0"))
        if size != HEADER.size + len(self) * self._h_stride or shape != self.spec.image_shape:
            self._h_file.close()
            raise DatasetError(f"{self.root / DATA}: {size} bytes of {shape} images, the "
                               f"manifest's spec needs {self.spec.image_shape}")
        self._h_labels = labels

    def _close(self) -> None:
        self._h_file.close()

    def _locate(self, index: int) -> Path:
        return self.root / DATA

    def _read_one(self, index: int) -> tuple[np.ndarray, int]:
        data = os.pread(self._h_file.fileno(), self.spec.raw_sample_bytes,
                        HEADER.size + index * self._h_stride)
        return self._decode_raw(data, index).copy(), int(self._h_labels[index])


def open(root: Path, manifest: dict, **options) -> ToyReader:  # noqa: A001 - registry verb
    return ToyReader(root, manifest, **options)
