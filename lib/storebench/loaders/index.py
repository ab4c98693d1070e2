"""An index of a training set's size over a small built set: what start-up and worker memory
cost when the index, not the images, is large.

ImageNet-1k's train split is 1,281,167 entries. Two ways to hold them:

- ``ArrayIndex`` (how storebench holds an index): paths as one uint8 array of their bytes
  plus an array of where each starts, labels and offsets as arrays, each of the smallest
  integer type that holds it. A few buffers: pickled as a few blobs, and reading an entry
  writes nothing to them.
- ``ListIndex`` (what torchvision's ``ImageFolder`` holds: ``samples: list[tuple[str,
  int]]``, here beside ``offsets: list[int]``): 1.28M tuples, 1.28M strings and their ints,
  each a Python object with a reference count that every read increments, so a forked
  worker reading them writes to (and so copies) the pages that hold them.

Entry ``i`` points at sample ``i % n`` of the built set (its ``offset``), with that sample's
label, and a path in ImageNet's shape (``train/n<class>/n<class>_<i>.JPEG``).
``IndexedDataset`` serves batches through the index: each sample's entry is looked up
(path, label, offset), its offset read from the set, and its label checked against the set's.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np

from .batching import Batch
from .datasets import LazyDataset

INDEX_KINDS = ("arrays", "lists")


def set_labels(spec) -> np.ndarray:
    """The label of every sample of a synthetic set (``data_gen``'s rule), without
    rendering it."""
    return np.array([int(np.random.default_rng([spec.seed, i]).integers(spec.num_classes))
                     for i in range(spec.num_samples)], dtype=np.int64)


def entry_path(label: int, i: int) -> str:
    return f"train/n{label:08d}/n{label:08d}_{i}.JPEG"


class ArrayIndex:
    """Paths, labels and offsets as NumPy arrays (see the module doc)."""

    kind = "arrays"

    def __init__(self, set_labels_: np.ndarray, size: int) -> None:
        n = len(set_labels_)
        self.offsets = np.arange(size, dtype=np.int64) % n
        # Each array in the smallest type that holds its values, as a columnar index would.
        self.labels = set_labels_[self.offsets].astype(
            np.min_scalar_type(int(set_labels_.max(initial=0))))
        encoded = [entry_path(int(label), i).encode()
                   for i, label in enumerate(self.labels.tolist())]
        ends = np.cumsum([len(p) for p in encoded], dtype=np.int64)
        self.path_starts = np.zeros(size + 1, dtype=np.min_scalar_type(
            int(ends[-1]) if size else 0))
        self.path_starts[1:] = ends
        self.path_bytes = np.frombuffer(b"".join(encoded), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.offsets)

    def lookup(self, indices: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
        starts, ends = self.path_starts[indices], self.path_starts[indices + 1]
        paths = [self.path_bytes[s:e].tobytes().decode()
                 for s, e in zip(starts.tolist(), ends.tolist())]
        return paths, self.labels[indices].astype(np.int64), self.offsets[indices]


class ListIndex:
    """``samples: list[tuple[str, int]]`` and ``offsets: list[int]`` (see the module doc)."""

    kind = "lists"

    def __init__(self, set_labels_: np.ndarray, size: int) -> None:
        n = len(set_labels_)
        labels = set_labels_.tolist()
        self.samples = [(entry_path(labels[i % n], i), labels[i % n]) for i in range(size)]
        self.offsets = [i % n for i in range(size)]

    def __len__(self) -> int:
        return len(self.samples)

    def lookup(self, indices: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
        paths, labels, offsets = [], [], []
        for i in indices.tolist():
            path, label = self.samples[i]
            paths.append(path)
            labels.append(label)
            offsets.append(self.offsets[i])
        return paths, np.array(labels, dtype=np.int64), np.array(offsets, dtype=np.int64)


def make_index(kind: str, set_labels_: np.ndarray, size: int):
    if kind == "arrays":
        return ArrayIndex(set_labels_, size)
    if kind == "lists":
        return ListIndex(set_labels_, size)
    raise ValueError(f"index kind must be one of {INDEX_KINDS}, got {kind!r}")


class StartStamps:
    """Where each worker (process and thread) notes when it began its first batch: one file
    per worker in ``directory`` holding ``time.monotonic()`` (system-wide on Linux, so
    comparable across processes)."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = str(directory)

    def note(self) -> None:
        name = f"{os.getpid()}-{threading.get_ident()}"
        try:
            fd = os.open(os.path.join(self.directory, name),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            f.write(repr(time.monotonic()))

    def read(self) -> dict[str, float]:
        out = {}
        for name in os.listdir(self.directory):
            text = Path(self.directory, name).read_text()
            if text:
                out[name] = float(text)
        return out


class IndexedDataset(LazyDataset):
    """Batches of ``index`` entries (see the module doc): the set's samples at the entries'
    offsets, labelled from the index. ``stamps``: where workers note their first batch."""

    def __init__(self, reader, index, *, stamps: StartStamps | None = None) -> None:
        super().__init__(reader)
        self.index = index
        self.stamps = stamps
        self._noted: set[tuple[int, int]] = set()

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        batch = self.get_batch(np.array([i], dtype=np.int64))
        return batch.images[0], int(batch.labels[0])

    def get_batch(self, indices, *, out: np.ndarray | None = None) -> Batch:
        from ..formats import DatasetError

        key = (os.getpid(), threading.get_ident())
        if self.stamps is not None and key not in self._noted:
            self._noted.add(key)
            self.stamps.note()
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self.index)):
            raise IndexError(f"index entries {idx.min()}..{idx.max()} out of range for "
                             f"{len(self.index)} entries")
        paths, labels, offsets = self.index.lookup(idx)
        batch = super().get_batch(offsets, out=out)
        wrong = np.flatnonzero(batch.labels != labels)
        if wrong.size:
            k = int(wrong[0])
            raise DatasetError(f"{self.reader.root}: index entry {int(idx[k])} ({paths[k]}) "
                               f"says label {int(labels[k])}, sample {int(offsets[k])} holds "
                               f"{int(batch.labels[k])}")
        return Batch(batch.images, labels, idx)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_noted"] = set()
        return state
