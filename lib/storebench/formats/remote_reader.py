"""What every reader over object storage shares: its store and the checksums read from it.

A format that reads over S3 defines ``open_remote(store, manifest, **options)``, whose reader
is its local reader with this mixin placed first: the same layout checks, CRCs, fingerprints
and per-sample checksums, with its I/O hooks pointed at ``store`` (a
``storebench.remote.s3.ObjectStore``: ``read``, ``read_many``, ``read_range``, ``open_file``...).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .manifest import CHECKSUMS_NAME, load_checksums


@dataclass(frozen=True)
class RemoteObject:
    """An object a reader holds open: its name and size (closing it is a no-op, as for
    the local readers' file handles)."""

    name: str
    size: int

    def close(self) -> None:
        pass


class RemoteReader:
    """Mixin placed before a format's local reader: ``root`` becomes the store's
    ``s3://`` path, and the manifest's checksums come from the store."""

    def __init__(self, store, manifest: dict, **options) -> None:
        super().__init__(store.root, manifest, **options)
        self.store = store

    def name_of(self, path) -> str:
        """``path`` (under ``root``) as an object name relative to the store's prefix."""
        return path.relative_to(self.root).as_posix()

    def abandon_reads(self, threads):
        """Context manager: the reads ``threads`` asked for that are not sent yet fail at
        once (``ObjectStore.abandoning``)."""
        return self.store.abandoning(thread.ident for thread in threads)

    def _load_checksums(self) -> np.ndarray:
        return load_checksums(self.root, len(self), data=self.store.read(CHECKSUMS_NAME))

    def _close(self) -> None:
        super()._close()
        self.store.close()
