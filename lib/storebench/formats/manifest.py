"""manifest.json and checksums.npy: what a built dataset holds and how to verify it.

Besides the spec, knobs and sizes, the manifest records what lets a reader recognise its own
files without reading them whole:

- ``fingerprints``: per data file, the CRC32C of its first ``head`` and last ``tail`` bytes
  (4 KiB each by default; the whole file for small index files, the whole footer for
  Parquet). Checked at open: a swapped, replaced or overwritten-at-the-ends file is refused.
- ``integrity``: CRC32C of every label and of every sample's stored size (int64, in index
  order), which readers that load them at open compare against.
- ``manifest_digest``: SHA-256 of the manifest's own content, so that a hand-edited manifest
  (say, ``png`` for a raw dataset) is refused instead of misdescribing the data.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path, PurePath

import crc32c
import numpy as np

from .base import DatasetError, ManifestError
from .npyfile import load as load_npy
from .npyfile import loads as loads_npy
from .specs import spec_from_dict

MANIFEST_NAME = "manifest.json"
CHECKSUMS_NAME = "checksums.npy"
# 2: fingerprints, integrity and manifest_digest; HDF5 encoded images as bytes + offsets.
MANIFEST_VERSION = 2
FINGERPRINT_BYTES = 4096
# Files beside the data that describe it; they are not counted as the format's bytes.
SOURCES_NAME = "sources.json"  # imported datasets: the source file of each sample
SIDECAR_NAMES = (MANIFEST_NAME, CHECKSUMS_NAME, SOURCES_NAME)

# Every manifest records these; a format adds its own (``FormatTraits.distributions``).
VERSIONED_PACKAGES = ("numpy", "pillow", "crc32c")


def package_versions(names=VERSIONED_PACKAGES) -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def content_digest(checksums: np.ndarray) -> str:
    """One SHA-256 over every sample's CRC32C, in index order."""
    return hashlib.sha256(np.ascontiguousarray(checksums, dtype="<u4").tobytes()).hexdigest()


def data_files(root: Path) -> list[str]:
    """Relative paths of every data file under ``root`` (sidecars excluded), sorted."""
    found = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if rel not in SIDECAR_NAMES:
                found.append(rel)
    return sorted(found)


def disk_usage(root: Path, files: list[str]) -> tuple[int, int]:
    """(apparent bytes, allocated bytes) of ``files`` under ``root``."""
    apparent = allocated = 0
    for rel in files:
        st = os.stat(root / rel)
        apparent += st.st_size
        allocated += st.st_blocks * 512
    return apparent, allocated


def fingerprint_span(size: int, head: int = FINGERPRINT_BYTES, tail: int = FINGERPRINT_BYTES):
    """``(head, tail)`` byte counts that cover a file of ``size`` bytes without overlap."""
    head = min(head, size)
    return head, min(tail, size - head)


def file_fingerprint(path: Path | str, head: int, tail: int) -> int:
    """CRC32C of the first ``head`` and the last ``tail`` bytes of ``path``.

    Read with POSIX_FADV_RANDOM, so that checking a cold file pulls in these pages only, not a
    readahead window.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        size = os.fstat(fd).st_size
        crc = crc32c.crc32c(os.pread(fd, head, 0))
        if tail:
            crc = crc32c.crc32c(os.pread(fd, tail, max(size - tail, 0)), crc)
        return crc
    finally:
        os.close(fd)


def bytes_fingerprint(data: bytes | memoryview, head: int, tail: int) -> int:
    """``file_fingerprint`` of a file whose bytes are already in memory."""
    crc = crc32c.crc32c(data[:head])
    return crc32c.crc32c(data[len(data) - tail :], crc) if tail else crc


def manifest_digest(manifest: dict) -> str:
    """SHA-256 of the manifest's canonical JSON, its own ``manifest_digest`` left out."""
    content = {k: v for k, v in manifest.items() if k != "manifest_digest"}
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_manifest(root: Path | str) -> dict:
    root = Path(root)
    if not root.exists():
        raise ManifestError(f"{root}: no such dataset directory")
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(
            f"{path}: missing; {root} is not a complete storebench dataset "
            "(an interrupted build leaves no manifest)"
        )
    try:
        text = path.read_text()
    except OSError as err:
        raise ManifestError(f"{path}: unreadable manifest: {err}") from err
    return parse_manifest(text, path)


def parse_manifest(text: str | bytes, path) -> dict:
    """A manifest's JSON ``text``, checked (version, fields, spec, its own digest); ``path``
    names it in errors."""
    try:
        manifest = json.loads(text)
    except ValueError as err:
        raise ManifestError(f"{path}: unreadable manifest: {err}") from err
    if not isinstance(manifest, dict):
        raise ManifestError(f"{path}: unreadable manifest: not a JSON object")
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        raise ManifestError(
            f"{path}: manifest version {manifest.get('manifest_version')}, "
            f"this storebench reads {MANIFEST_VERSION}: rebuild the dataset "
            "(storebench build rebuilds it in place)"
        )
    required = (
        "format", "encoding", "spec", "knobs", "num_samples", "digest", "files",
        "fingerprints", "integrity", "manifest_digest",
    )
    missing = [key for key in required if key not in manifest]
    if missing:
        raise ManifestError(f"{path}: manifest lacks {missing}")
    try:
        spec = spec_from_dict(manifest["spec"])
    except (TypeError, ValueError, AttributeError) as err:
        raise ManifestError(f"{path}: invalid spec: {err}") from err
    if manifest["num_samples"] != spec.num_samples:
        raise ManifestError(f"{path}: num_samples disagrees with the spec")
    if manifest["encoding"] != spec.encoding:
        raise ManifestError(f"{path}: encoding {manifest['encoding']!r} disagrees with the spec")
    if set(manifest["fingerprints"]) != set(manifest["files"]):
        raise ManifestError(f"{path}: fingerprints do not cover exactly the listed files")
    if manifest_digest(manifest) != manifest["manifest_digest"]:
        raise ManifestError(
            f"{path}: edited after the build (its content does not match its "
            "manifest_digest); rebuild the dataset rather than editing the manifest"
        )
    return manifest


def check_files(root: Path, manifest: dict, *, fingerprints: bool = True) -> None:
    """Every data file the manifest lists exists with the size it was written with and,
    with ``fingerprints``, the same bytes at its head and tail (for index files: the same
    bytes throughout)."""
    # Strings, not Paths, in the loop: a raw-files set lists 20,000 files, and building a
    # Path per file took half of every open's time (a Path is made only for an error).
    base = os.fspath(root)
    for rel, size in manifest["files"].items():
        try:
            actual = os.stat(os.path.join(base, rel)).st_size
        except FileNotFoundError:
            raise ManifestError(f"{root / rel}: listed in the manifest but missing") from None
        if actual != size:
            raise ManifestError(
                f"{root / rel}: {actual} bytes on disk, the manifest says {size} (truncated or "
                "replaced)"
            )
        if fingerprints:
            check_fingerprint(root / rel, manifest["fingerprints"][rel])


def check_fingerprint(path: Path, recorded: dict, data: bytes | memoryview | None = None) -> None:
    """Compare a file's head and tail with the fingerprint recorded at build time; ``data``
    is the whole file when the caller has already read it."""
    head, tail = recorded["head"], recorded["tail"]
    try:
        crc = (
            bytes_fingerprint(data, head, tail)
            if data is not None
            else file_fingerprint(path, head, tail)
        )
    except OSError as err:
        raise DatasetError(f"{path}: cannot read: {err}") from err
    if crc != recorded["crc32c"]:
        raise DatasetError(
            f"{path}: not the file this dataset was built with (fingerprint of its first "
            f"{head} and last {tail} bytes differs): swapped, replaced or damaged"
        )


def save_checksums(root: Path, checksums: np.ndarray) -> None:
    np.save(root / CHECKSUMS_NAME, np.asarray(checksums, dtype="<u4"))


def load_checksums(root: Path, num_samples: int, data: bytes | None = None) -> np.ndarray:
    """The per-sample CRC32Cs beside the data; ``data``: the file's bytes, already read
    (from object storage, say), ``root`` then only names it."""
    path = (root if isinstance(root, PurePath) else Path(root)) / CHECKSUMS_NAME
    try:
        if data is None:
            checksums = load_npy(path, dtype="<u4", ndim=1)
        else:
            checksums = loads_npy(data, path, dtype="<u4", ndim=1)
    except DatasetError as err:
        raise ManifestError(f"cannot read checksums: {err}") from err
    if checksums.shape != (num_samples,):
        raise ManifestError(f"{path}: {checksums.shape[0]} checksums for {num_samples} samples")
    return checksums
