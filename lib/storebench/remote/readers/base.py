"""What every remote reader shares: its ``ObjectStore`` and the checksums read from it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...formats.manifest import CHECKSUMS_NAME, load_checksums
from ..s3 import ObjectStore


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

    def __init__(self, store: ObjectStore, manifest: dict, **options) -> None:
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
