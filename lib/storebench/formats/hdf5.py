"""HDF5 (h5py): dataset ``images`` and dataset ``labels`` (int64), the spec in root attributes.

Raw samples: ``images`` is (N, H, W, C) uint8, chunked ``chunk_samples`` samples at a time.
Encoded samples: ``images`` is a 1-D variable-length uint8 dataset (``h5py.vlen_dtype``), one
element of PNG/JPEG bytes per sample. Readable with plain ``h5py.File(path)["images"][i]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from data_gen import DatasetSpec

from .base import CorruptSampleError, DatasetError, Reader

NAME = "hdf5"
ENCODINGS = ("raw", "png", "jpeg")
# 64 samples of 64x64x3 make a 768 KiB chunk: large enough for sequential throughput, small
# enough that a random read does not pull in megabytes. compression: None, "gzip" or "lzf".
DEFAULT_KNOBS: dict = {"chunk_samples": 64, "compression": None}
OPEN_OPTIONS = ("chunk_cache_bytes",)
FILENAME = "data.h5"


def write(
    samples: Iterable, root: Path, spec: DatasetSpec, *, chunk_samples: int, compression: str | None
) -> None:
    import h5py

    if chunk_samples < 1:
        raise ValueError(f"chunk_samples must be >= 1, got {chunk_samples}")
    chunk = min(chunk_samples, spec.num_samples)
    n = spec.num_samples
    labels = np.empty(n, dtype=np.int64)
    with h5py.File(root / FILENAME, "w", libver="latest") as f:
        if spec.encoding == "raw":
            images = f.create_dataset(
                "images",
                shape=(n, *spec.image_shape),
                dtype=np.uint8,
                chunks=(chunk, *spec.image_shape),
                compression=compression,
            )
        else:
            images = f.create_dataset(
                "images",
                shape=(n,),
                dtype=h5py.vlen_dtype(np.uint8),
                chunks=(chunk,),
                compression=compression,
            )
        # Whole chunks at a time: one write per chunk instead of one per sample.
        pending: list = []
        start = count = 0
        for i, (image, label) in enumerate(samples):
            labels[i] = label
            pending.append(image if spec.encoding == "raw" else np.frombuffer(image, np.uint8))
            count += 1
            if len(pending) == chunk:
                _flush(images, start, pending, spec)
                start, pending = start + len(pending), []
        if pending:
            _flush(images, start, pending, spec)
        if count != n:
            raise DatasetError(f"{root}: got {count} samples, the spec says {n}")
        f.create_dataset("labels", data=labels)
        f.attrs["storebench_spec"] = json.dumps(spec.to_dict())
        for key, value in spec.to_dict().items():
            f.attrs[key] = value


def _flush(images, start: int, pending: list, spec: DatasetSpec) -> None:
    if spec.encoding == "raw":
        images[start : start + len(pending)] = np.stack(pending)
    else:
        column = np.empty(len(pending), dtype=object)
        column[:] = pending
        images[start : start + len(pending)] = column


class Hdf5Reader(Reader):
    """Batched reads go chunk by chunk in sorted order, then scatter back to request order."""

    def __init__(
        self, root: Path, manifest: dict, *, verify: bool = True, chunk_cache_bytes: int = 4 << 20
    ) -> None:
        super().__init__(root, manifest, verify=verify)
        self.chunk_cache_bytes = chunk_cache_bytes
        self.chunk_samples = min(manifest["knobs"]["chunk_samples"], len(self))
        self._h_file = self._h_images = self._h_labels = None

    def _open(self) -> None:
        import h5py

        path = self.root / FILENAME
        try:
            self._h_file = h5py.File(path, "r", rdcc_nbytes=self.chunk_cache_bytes)
            self._h_images = self._h_file["images"]
            self._h_labels = self._h_file["labels"][:]
        except (OSError, KeyError) as err:
            self._h_file = None
            raise DatasetError(f"{path}: cannot open as a storebench HDF5 dataset: {err}") from err
        if self._h_images.shape[0] != len(self) or self._h_labels.shape != (len(self),):
            raise DatasetError(
                f"{path}: holds {self._h_images.shape[0]} samples, expected {len(self)}"
            )

    def _close(self) -> None:
        if self._h_file is not None:
            self._h_file.close()
        self._h_file = self._h_images = self._h_labels = None

    def _locate(self, index: int) -> Path:
        return self.root / FILENAME

    def _read_slice(self, lo: int, hi: int):
        try:
            return self._h_images[lo:hi]
        except OSError as err:
            raise CorruptSampleError(self.root / FILENAME, lo, f"HDF5 read failed: {err}") from err

    def _read_one(self, index: int):
        data = self._read_slice(index, index + 1)[0]
        label = int(self._h_labels[index])
        return (data, label) if self.is_raw else (data.tobytes(), label)

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
            span = self._read_slice(lo, hi)
            if self.is_raw:
                images[run_positions] = span[run - lo]
            else:
                for position, i in zip(run_positions, run):
                    images[position] = span[i - lo].tobytes()
        return images, labels

    def blocks(self) -> np.ndarray:
        bounds = np.arange(0, len(self), self.chunk_samples, dtype=np.int64)
        return np.append(bounds, len(self))


def open(root: Path, manifest: dict, **options) -> Hdf5Reader:  # noqa: A001 - registry verb
    return Hdf5Reader(root, manifest, **options)
