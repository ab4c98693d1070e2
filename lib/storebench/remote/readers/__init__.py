"""Readers for datasets in object storage: one module per format that reads over S3, behind
the plain registry ``REMOTE_READERS``; ``LOCAL_ONLY`` says why the others refuse.

Each reader is the local format's reader with its I/O hooks pointed at an ``ObjectStore``:
the same layout checks, CRCs, fingerprints and per-sample checksums, over the network.
"""

from __future__ import annotations

from types import ModuleType

from . import hdf5, parquet, rawfiles, tfrecord

REMOTE_READERS: dict[str, ModuleType] = {
    module.NAME: module for module in (rawfiles, hdf5, tfrecord, parquet)
}

# Formats that need a local file, and what to do instead.
LOCAL_ONLY: dict[str, str] = {
    "lmdb": "LMDB maps its database file into memory (mmap), which needs a local file",
    "memmap": "a memory-mapped .npy needs a local file to map",
    **{name: (f"storebench has no S3 reader for the peer format {name!r} (the peers study "
              "reads local files); its own library may read from S3")
       for name in ("webdataset", "litdata", "mds", "lance", "zarr", "ffcv")},
}

__all__ = ["LOCAL_ONLY", "REMOTE_READERS"]
