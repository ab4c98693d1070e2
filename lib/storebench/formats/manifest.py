"""manifest.json and checksums.npy: what a built dataset holds and how to verify it."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path

import numpy as np

from .base import ManifestError

MANIFEST_NAME = "manifest.json"
CHECKSUMS_NAME = "checksums.npy"
MANIFEST_VERSION = 1
# Files beside the data that describe it; they are not counted as the format's bytes.
SIDECAR_NAMES = (MANIFEST_NAME, CHECKSUMS_NAME)

VERSIONED_PACKAGES = ("numpy", "pillow", "h5py", "lmdb", "pyarrow", "protobuf", "crc32c")


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
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ManifestError(f"{path}: unreadable manifest: {err}") from err
    required = ("manifest_version", "format", "spec", "knobs", "num_samples", "digest", "files")
    missing = [key for key in required if key not in manifest]
    if missing:
        raise ManifestError(f"{path}: manifest lacks {missing}")
    if manifest["manifest_version"] != MANIFEST_VERSION:
        raise ManifestError(
            f"{path}: manifest version {manifest['manifest_version']}, "
            f"this storebench reads {MANIFEST_VERSION}"
        )
    if manifest["num_samples"] != manifest["spec"].get("num_samples"):
        raise ManifestError(f"{path}: num_samples disagrees with the spec")
    return manifest


def check_files(root: Path, manifest: dict) -> None:
    """Every data file the manifest lists exists with the size it was written with."""
    for rel, size in manifest["files"].items():
        path = root / rel
        try:
            actual = path.stat().st_size
        except FileNotFoundError:
            raise ManifestError(f"{path}: listed in the manifest but missing") from None
        if actual != size:
            raise ManifestError(
                f"{path}: {actual} bytes on disk, the manifest says {size} (truncated or replaced)"
            )


def save_checksums(root: Path, checksums: np.ndarray) -> None:
    np.save(root / CHECKSUMS_NAME, np.asarray(checksums, dtype="<u4"))


def load_checksums(root: Path, num_samples: int) -> np.ndarray:
    path = Path(root) / CHECKSUMS_NAME
    try:
        checksums = np.load(path)
    except (OSError, ValueError) as err:
        raise ManifestError(f"{path}: cannot read checksums: {err}") from err
    if checksums.shape != (num_samples,):
        raise ManifestError(f"{path}: {checksums.shape[0]} checksums for {num_samples} samples")
    return checksums
