"""Storage formats: one module per format behind the plain registry ``FORMATS``.

A format module has ``NAME``, ``ENCODINGS``, ``DEFAULT_KNOBS``, ``OPEN_OPTIONS``,
``write(samples, root, spec, **knobs)`` and ``open(root, manifest, **options) -> Reader``.
Adding a format is one module plus one line below; the contract tests cover it.

A peer's format (WebDataset, LitData, MDS, Lance, Zarr, FFCV) also has ``PEER = True`` and
``LIBRARIES``, the modules it imports to write and read. The peers study covers those; the
other studies cover the ``CORE_FORMATS``. Where a library is missing (the main environment
has none of the peers'), ``unavailable_reason`` says so, and building or opening the format
is a ``DatasetError`` naming the environment that has it.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from . import (
    ffcv_beton,
    hdf5,
    lance_table,
    litdata_chunks,
    lmdb,
    mds,
    memmap,
    parquet,
    rawfiles,
    tfrecord,
    webdataset_tar,
    zarr_array,
)
from .base import CorruptSampleError, DatasetError, ManifestError, Reader, sample_checksum
from .build import BuildResult, build_dataset, dataset_dirname
from .manifest import MANIFEST_NAME, check_files, read_manifest

FORMATS: dict[str, ModuleType] = {
    module.NAME: module for module in (
        rawfiles, hdf5, lmdb, memmap, tfrecord, parquet,
        # The peers' formats (PEER = True): the peers study's.
        webdataset_tar, litdata_chunks, mds, lance_table, zarr_array, ffcv_beton,
    )
}


CORE_FORMATS: tuple[str, ...] = tuple(
    name for name, module in FORMATS.items() if not getattr(module, "PEER", False))


def is_peer_format(name: str) -> bool:
    return bool(getattr(get_format(name), "PEER", False))


def unavailable_reason(name: str) -> str | None:
    """None when format ``name`` can be written and read in this interpreter, else why not."""
    from ..environments import needs_text

    return needs_text(getattr(get_format(name), "LIBRARIES", ()), what=f"format {name!r}")


def get_format(name: str) -> ModuleType:
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown format {name!r}; known formats: {sorted(FORMATS)}") from None


def open_dataset(path: Path | str, **options) -> Reader:
    """Open any built dataset from its manifest. ``options`` are the format's open options
    (``verify`` for all; e.g. ``madvise_random`` for memmap, ``readahead`` for lmdb).

    Before returning, whatever ``verify`` says: the manifest is checked (version, its own
    digest, a known format, an encoding and knobs that format has), every data file's size
    and head/tail fingerprint against it, and the reader opens once to check the layout,
    index and labels. Any mismatch is a ``DatasetError`` naming the file.

    An ``s3://bucket/prefix`` path opens a dataset uploaded there (``storebench.remote``):
    the same checks over the network; ``s3=S3Config(...)`` says where the store is (default:
    the AWS environment variables) and ``concurrency`` how many requests stay in flight.
    """
    from ..remote.s3 import is_s3_url

    if is_s3_url(path):
        from ..remote.dataset import open_remote

        return open_remote(path, **options)
    root = Path(path)
    manifest = read_manifest(root)
    module = FORMATS.get(manifest["format"])
    where = root / MANIFEST_NAME
    if module is None:
        raise ManifestError(
            f"{where}: unknown format {manifest['format']!r}; known formats: {sorted(FORMATS)}"
        )
    if manifest["encoding"] not in module.ENCODINGS:
        raise ManifestError(
            f"{where}: format {module.NAME!r} cannot hold {manifest['encoding']!r} samples"
        )
    if set(manifest["knobs"]) != set(module.DEFAULT_KNOBS):
        raise ManifestError(
            f"{where}: knobs {sorted(manifest['knobs'])} are not {module.NAME!r}'s "
            f"{sorted(module.DEFAULT_KNOBS)}"
        )
    reason = unavailable_reason(module.NAME)
    if reason:
        raise DatasetError(f"{root}: {reason}")
    unknown = set(options) - {"verify", *module.OPEN_OPTIONS}
    if unknown:
        raise TypeError(
            f"format {module.NAME!r} has no open option(s) {sorted(unknown)}; "
            f"its options are {sorted({'verify', *module.OPEN_OPTIONS})}"
        )
    check_files(root, manifest, fingerprints=getattr(module, "FINGERPRINTS_AT_OPEN", True))
    reader = module.open(root, manifest, **options)
    reader.check()
    return reader


def find_datasets(root: Path | str) -> list[Path]:
    """Every built dataset (a directory with a manifest) under ``root``, sorted."""
    root = Path(root)
    if (root / MANIFEST_NAME).is_file():
        return [root]
    return sorted(p.parent for p in root.rglob(MANIFEST_NAME) if ".tmp-" not in str(p))


__all__ = [
    "CORE_FORMATS",
    "FORMATS",
    "BuildResult",
    "CorruptSampleError",
    "DatasetError",
    "ManifestError",
    "Reader",
    "build_dataset",
    "dataset_dirname",
    "find_datasets",
    "get_format",
    "is_peer_format",
    "open_dataset",
    "read_manifest",
    "sample_checksum",
    "unavailable_reason",
]
