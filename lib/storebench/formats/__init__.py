"""Storage formats: one module per format behind the registry ``FORMATS`` (name -> module,
each imported on first use).

A format module has ``NAME``, ``ENCODINGS``, ``DEFAULT_KNOBS``, ``OPEN_OPTIONS``,
``TRAITS`` (a ``FormatTraits``: the knob variants its studies sweep, its shuffle unit,
whether its reads check content, its remote reader or why it has none, its distributions),
``write(samples, root, spec, **knobs)``, ``open(root, manifest, **options) -> Reader`` and,
where it reads over object storage, ``open_remote(store, manifest, **options) -> Reader``.
Adding a format is one module plus one line below; the contract tests, the studies and the
fuzzer then cover it.

A peer's format (WebDataset, LitData, MDS, Lance, Zarr, FFCV) is listed among the peers'
modules, and its module also has ``PEER = True`` and
``LIBRARIES``, the modules it imports to write and read. The peers study covers those; the
other studies cover the ``FORMATS.core``. Where a library is missing (the main environment
has none of the peers'), ``unavailable_reason`` says so, and building or opening the format
is a ``DatasetError`` naming the environment that has it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType

from ..registry import LazyRegistry
from .base import (
    CorruptSampleError,
    DatasetError,
    ManifestError,
    Reader,
    sample_checksum,
    sample_checksums,
)
from .build import BuildResult, build_dataset, dataset_dirname
from .manifest import MANIFEST_NAME, check_checksums_file, check_files, read_manifest
from .traits import FormatTraits, KnobVariant

# Format name -> its module in this package. The core formats are the studies'; the peers'
# (PEER = True) are the peers study's.
CORE_FORMAT_MODULES = {
    "rawfiles": "rawfiles", "hdf5": "hdf5", "lmdb": "lmdb", "memmap": "memmap",
    "tfrecord": "tfrecord", "parquet": "parquet",
}
PEER_FORMAT_MODULES = {
    "webdataset": "webdataset_tar", "litdata": "litdata_chunks", "mds": "mds",
    "lance": "lance_table", "zarr": "zarr_array", "ffcv": "ffcv_beton",
}


class FormatRegistry(LazyRegistry):
    """Format name -> format module, each imported on first use: a case process that reads
    one format pays for its library alone (pyarrow, protobuf, h5py... cost a fresh
    interpreter tens of milliseconds each). Listing the names imports nothing.

    ``core`` and ``peers`` map names to modules of this package; ``core`` names the formats
    every study covers, in order."""

    kind = "format"

    def __init__(self, core: Mapping[str, str], peers: Mapping[str, str]) -> None:
        super().__init__({name: f"{__name__}.{module}"
                          for name, module in {**core, **peers}.items()})
        self._core = list(core)

    @property
    def core(self) -> tuple[str, ...]:
        """The formats the studies other than peers cover, in the registry's order."""
        return tuple(self._core)

    def register(self, name: str, module: str, *, peer: bool = False) -> None:
        """Add format ``name``, defined by the importable ``module`` (a format of your own,
        or one in a plugin): it then builds, opens and is studied like the others."""
        super().register(name, module)
        if not peer:
            self._core.append(name)


FORMATS = FormatRegistry(CORE_FORMAT_MODULES, PEER_FORMAT_MODULES)
OBJECT_STORE_SCHEME = "s3://"


def is_peer_format(name: str) -> bool:
    get_format(name)
    return name not in FORMATS.core


def unavailable_reason(name: str) -> str | None:
    """None when format ``name`` can be written and read in this interpreter, else why not."""
    from ..environments import needs_text

    return needs_text(getattr(get_format(name), "LIBRARIES", ()), what=f"format {name!r}")


def traits(name: str) -> FormatTraits:
    """What format ``name`` declares about itself (its module's ``TRAITS``)."""
    return get_format(name).TRAITS


def knob_variants(formats: Iterable[str] | None = None, *,
                  family: str | None = None) -> tuple[KnobVariant, ...]:
    """The build variants the studies sweep, of ``formats`` (default: every format), in the
    registry's order; with ``family``, those built for that dataset family only."""
    return tuple(variant for name in (FORMATS if formats is None else formats)
                 for variant in traits(name).knob_variants
                 if family is None or family in variant.families)


def get_format(name: str) -> ModuleType:
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown format {name!r}; known formats: {sorted(FORMATS)}") from None


def checked_format(manifest: Mapping, where: object, options: Mapping) -> ModuleType:
    """The format module that opens ``manifest``, once what the manifest and the open
    ``options`` ask has been checked against it: a known format, an encoding and knobs that
    format has, and options it takes. ``where`` names the manifest in errors. Opening a
    dataset on disk and in object storage share this check."""
    module = FORMATS.get(manifest["format"])
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
    unknown = set(options) - {"verify", *module.OPEN_OPTIONS}
    if unknown:
        raise TypeError(
            f"format {module.NAME!r} has no open option(s) {sorted(unknown)}; "
            f"its options are {sorted({'verify', *module.OPEN_OPTIONS})}"
        )
    return module


def remote_formats() -> tuple[str, ...]:
    """The formats with a reader over object storage (``open_remote``)."""
    return tuple(name for name in FORMATS if not traits(name).remote_unsupported)


def open_dataset(path: Path | str, **options) -> Reader:
    """Open a built dataset on disk from its manifest. ``options`` are the format's open
    options (``verify`` for all; e.g. ``madvise_random`` for memmap, ``readahead`` for lmdb).

    Before returning, whatever ``verify`` says: the manifest is checked (version, its own
    digest, a known format, an encoding and knobs that format has), every data file's size
    and head/tail fingerprint against it, and the reader opens once to check the layout,
    index and labels. Any mismatch is a ``DatasetError`` naming the file.

    ``trust=True`` opens a trusted-input-only format's files (LMDB's ``data.mdb``) that this
    user has neither built nor verified here; by default they are refused
    (``storebench.formats.trust``, docs/security.md).

    ``storebench.open_dataset`` opens an ``s3://bucket/prefix`` too.
    """
    if str(path).startswith(OBJECT_STORE_SCHEME):
        raise DatasetError(f"{path}: storebench.formats.open_dataset opens datasets on disk; "
                           "open one in object storage with storebench.open_dataset")
    root = Path(path)
    trust = options.pop("trust", False)
    manifest = read_manifest(root)
    module = checked_format(manifest, root / MANIFEST_NAME, options)
    reason = unavailable_reason(module.NAME)
    if reason:
        raise DatasetError(f"{root}: {reason}")
    check_files(root, manifest, fingerprints=getattr(module, "FINGERPRINTS_AT_OPEN", True))
    # Before the reader sizes anything from num_samples: a real file's size bounds it.
    check_checksums_file(root, manifest["num_samples"])
    if not trust:
        check_trusted(root, module)
    reader = module.open(root, manifest, **options)
    reader.check()
    return reader


def untrusted_files(root: Path, module) -> list[str]:
    """The format's trusted-input-only files (``TRUSTED_INPUT_ONLY``, LMDB's ``data.mdb``)
    under ``root`` that this user has neither built nor verified as they are now."""
    from .trust import is_trusted

    return [name for name in getattr(module, "TRUSTED_INPUT_ONLY", ())
            if not is_trusted(root / name)]


def check_trusted(root: Path, module) -> None:
    untrusted = untrusted_files(root, module)
    if untrusted:
        raise DatasetError(
            f"{root / untrusted[0]}: not built or verified by you here (or changed since): "
            f"{module.NAME} is trusted input only, as a crafted file can crash the reading "
            f"process with SIGBUS. Run `storebench verify {root}` (it reads the file in a "
            "separate process and trusts it if every sample matches), or open it with "
            "trust=True if you know where it came from"
        )


def find_datasets(root: Path | str) -> list[Path]:
    """Every built dataset (a directory with a manifest) under ``root``, sorted.

    The walk is iterative (a folder 10,000 levels deep is no RecursionError), follows no
    symbolic link, stays on ``root``'s filesystem (no other mount is walked) and skips
    ``.tmp-*`` build directories. ``root`` itself may not be ``/``."""
    root = Path(root)
    if os.path.realpath(root) == "/":
        raise ValueError(f"{root}: is the filesystem root; name a dataset directory or a "
                         "directory of datasets")
    if (root / MANIFEST_NAME).is_file():
        return [root]
    device = os.stat(root).st_dev
    found, pending = [], [os.fspath(root)]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                folders = [e for e in entries if e.is_dir(follow_symlinks=False)
                           and ".tmp-" not in e.name]
        except OSError:  # unreadable, or gone: not a dataset we can use
            continue
        for entry in folders:
            if entry.stat(follow_symlinks=False).st_dev != device:
                continue
            if os.path.isfile(os.path.join(entry.path, MANIFEST_NAME)):
                found.append(Path(entry.path))
            else:
                pending.append(entry.path)
    return sorted(found)


__all__ = [
    "FORMATS",
    "BuildResult",
    "CorruptSampleError",
    "DatasetError",
    "FormatTraits",
    "KnobVariant",
    "ManifestError",
    "Reader",
    "build_dataset",
    "checked_format",
    "dataset_dirname",
    "find_datasets",
    "get_format",
    "is_peer_format",
    "knob_variants",
    "open_dataset",
    "read_manifest",
    "remote_formats",
    "sample_checksum",
    "sample_checksums",
    "traits",
    "unavailable_reason",
]
