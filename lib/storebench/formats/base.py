"""The Reader contract every format meets, and the errors it raises."""

from __future__ import annotations

import abc
import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import crc32c
import numpy as np

from data_gen import DatasetSpec


class DatasetError(Exception):
    """A dataset cannot be opened or read: missing, incomplete, or damaged."""


class ManifestError(DatasetError):
    """The manifest is missing, unreadable, or does not describe what is on disk."""


class CorruptSampleError(DatasetError):
    """One sample's stored bytes are damaged; the message names the file and the index."""

    def __init__(self, path: Path | str, index: int, reason: str) -> None:
        self.path = Path(path)
        self.index = int(index)
        self.reason = reason
        super().__init__(f"{self.path}: sample {self.index}: {reason}")


def sample_checksum(image: np.ndarray | bytes, label: int) -> int:
    """CRC32C of a sample's stored bytes followed by its label as 8 little-endian bytes."""
    data = image if isinstance(image, bytes | bytearray | memoryview) else image.tobytes()
    return crc32c.crc32c(int(label).to_bytes(8, "little", signed=True), crc32c.crc32c(data))


class Reader(abc.ABC):
    """Random and sequential access to one built dataset.

    Subclasses implement ``_open`` (create handles in the calling process), ``_close`` and
    ``_read_one``; they override ``_read_many`` where the format can batch better than a loop.
    Handles are opened lazily and re-opened after a fork, and are never pickled: a Reader
    can be sent to fork, spawn and forkserver workers.

    With ``verify=True`` (the default) every sample is checked against the manifest's
    CRC32C checksums, so a damaged byte raises ``CorruptSampleError`` instead of returning a
    silently wrong sample.
    """

    def __init__(self, root: Path, manifest: dict, *, verify: bool = True) -> None:
        self.root = Path(root)
        self.manifest = manifest
        self.spec = DatasetSpec.from_dict(manifest["spec"])
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
        index = self._check_index(index)
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
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            bad = int(idx[(idx < 0) | (idx >= len(self))][0])
            raise IndexError(f"{self.root}: sample index {bad} out of range for {len(self)}")
        if idx.size == 0:
            empty = self._raw_buffer(0, out) if self.is_raw else []
            return empty, np.empty(0, dtype=np.int64)
        self._ensure_open()
        images, labels = self._read_many(idx, out)
        if self.verify:
            for k, i in enumerate(idx):
                self._verify(int(i), images[k], int(labels[k]))
        return images, labels

    def iter_sequential(self, *, batch_size: int = 256) -> Iterator[tuple[np.ndarray | bytes, int]]:
        """Every sample in index order, read in batches of ``batch_size``."""
        for start in range(0, len(self), batch_size):
            images, labels = self.read_many(np.arange(start, min(start + batch_size, len(self))))
            for image, label in zip(images, labels):
                yield image, int(label)

    def close(self) -> None:
        if self._open_pid == os.getpid():
            self._close()
        self._open_pid = None

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

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

    def _check_index(self, index: int) -> int:
        i = int(index)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"{self.root}: sample index {index} out of range for {len(self)}")
        return i

    def _raw_buffer(self, count: int, out: np.ndarray | None) -> np.ndarray:
        shape = (count, *self.spec.image_shape)
        if out is None:
            return np.empty(shape, dtype=np.uint8)
        if out.shape != shape or out.dtype != np.uint8:
            raise ValueError(f"out must be uint8 {shape}, got {out.dtype} {out.shape}")
        return out

    def _verify(self, index: int, image: np.ndarray | bytes, label: int) -> None:
        if self._checksums is None:
            from .manifest import load_checksums

            self._checksums = load_checksums(self.root, len(self))
        if sample_checksum(image, label) != int(self._checksums[index]):
            raise CorruptSampleError(
                self._locate(index), index, "checksum mismatch: stored bytes or label damaged"
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
