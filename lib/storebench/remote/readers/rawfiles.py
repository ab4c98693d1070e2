"""One object per sample over S3: a batch is one GET per sample, all in flight at once; the
labels come from the class prefixes in one listing."""

from __future__ import annotations

import numpy as np

from ...formats import rawfiles
from .base import RemoteReader

NAME = rawfiles.NAME
OPEN_OPTIONS = rawfiles.OPEN_OPTIONS


class RemoteRawFilesReader(RemoteReader, rawfiles.RawFilesReader):
    def _open(self) -> None:
        self._h_listing: dict[str, list[str]] = {}
        for name in self.store.sizes():
            folder, _, file_name = name.rpartition("/")
            if folder:
                self._h_listing.setdefault(folder, []).append(file_name)
        super()._open()

    def _list_class_dir(self, name: str) -> list[str]:
        return self._h_listing.get(name, [])

    def _fetch(self, name: str, index: int) -> bytes:
        return self.store.read(name)

    def _read_many(self, indices: np.ndarray, out: np.ndarray | None):
        labels = np.empty(len(indices), dtype=np.int64)
        images = self._raw_buffer(len(indices), out) if self.is_raw else [b""] * len(indices)
        names = [self._name_of(i) for i in indices.tolist()]
        fetched = self.store.read_many(names)
        for k, (index, name, data) in enumerate(zip(indices.tolist(), names, fetched)):
            images[k], labels[k] = self._sample(index, self._check_bytes(name, index, data))
        return images, labels


def open(store, manifest: dict, **options) -> RemoteRawFilesReader:  # noqa: A001
    return RemoteRawFilesReader(store, manifest, **options)
