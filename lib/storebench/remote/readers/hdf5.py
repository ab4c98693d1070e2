"""An HDF5 file over S3: h5py reads through a file object whose every read is a ranged GET.
libhdf5 reads one chunk at a time, so requests are not concurrent: its row in the study says
what that costs at a distance."""

from __future__ import annotations

from ...formats import hdf5
from .base import RemoteReader

NAME = hdf5.NAME
OPEN_OPTIONS = hdf5.OPEN_OPTIONS


class RemoteHdf5Reader(RemoteReader, hdf5.Hdf5Reader):
    def _file_object(self, path):
        return self.store.open_file(self.name_of(path))

    def _check_size(self, index: int) -> None:
        """An object cannot shrink under the reader (S3 replaces objects whole); its size
        was checked against the manifest at open."""


def open(store, manifest: dict, **options) -> RemoteHdf5Reader:  # noqa: A001
    return RemoteHdf5Reader(store, manifest, **options)
