"""Built datasets in object storage: ``upload_dataset``, ``open_remote`` and
``download_dataset`` (stage a copy on local disk, for the formats that need one).

An uploaded dataset is the local directory's files as objects under ``s3://bucket/prefix``:
data files, ``checksums.npy``, sidecars and ``manifest.json``, the manifest written last, so
an interrupted upload leaves a prefix that does not open. Opening reads the manifest, checks
every listed object's size from one listing and its head/tail fingerprint with ranged GETs
(as ``open_dataset`` does on disk), then opens the format's remote reader, which checks the
layout and, with ``verify``, every sample's checksum.
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from ..formats.base import DatasetError, ManifestError, Reader
from ..formats.manifest import (
    CHECKSUMS_NAME,
    MANIFEST_NAME,
    SIDECAR_NAMES,
    bytes_fingerprint,
    parse_manifest,
    read_manifest,
)
from .s3 import ObjectStore, ObjectStoreError, S3Config, S3Path

UPLOAD_THREADS = 8


@dataclass(frozen=True)
class Transfer:
    """What an upload or download moved."""

    source: str
    target: str
    files: int
    bytes: int
    seconds: float


def _store(url, s3: S3Config | None, concurrency: int | None = None) -> ObjectStore:
    config = s3 if s3 is not None else S3Config.from_env()
    if concurrency is not None:
        config = replace(config, concurrency=concurrency)
    return ObjectStore(url if isinstance(url, S3Path) else S3Path.parse(str(url)), config)


def read_remote_manifest(store: ObjectStore) -> dict:
    where = store.path(MANIFEST_NAME)
    try:
        text = store.read(MANIFEST_NAME)
    except ObjectStoreError as err:
        raise ManifestError(
            f"{where}: missing or unreadable ({err}); {store.root} is not an uploaded "
            "storebench dataset (storebench upload DIR URL writes one; an interrupted upload "
            "leaves no manifest)"
        ) from err
    return parse_manifest(text, where)


def check_remote_files(store: ObjectStore, manifest: dict, *, fingerprints: bool = True) -> None:
    """Every listed object exists with the size it was built with and, with
    ``fingerprints``, the same first and last bytes."""
    sizes = store.sizes()
    for rel, size in manifest["files"].items():
        actual = sizes.get(rel)
        if actual is None:
            raise ManifestError(f"{store.path(rel)}: listed in the manifest but missing")
        if actual != size:
            raise ManifestError(f"{store.path(rel)}: {actual} bytes in the bucket, the manifest "
                                f"says {size} (truncated or replaced)")
    if not fingerprints:
        return
    requests, spans = [], []
    for rel, recorded in manifest["fingerprints"].items():
        head, tail = recorded["head"], recorded["tail"]
        requests.append((rel, 0, head))
        if tail:
            requests.append((rel, manifest["files"][rel] - tail, tail))
        spans.append((rel, recorded, bool(tail)))
    data = iter(store.read_ranges(requests))
    for rel, recorded, has_tail in spans:
        both = next(data) + (next(data) if has_tail else b"")
        if bytes_fingerprint(both, recorded["head"], recorded["tail"]) != recorded["crc32c"]:
            raise DatasetError(
                f"{store.path(rel)}: not the file this dataset was built with (fingerprint of "
                f"its first {recorded['head']} and last {recorded['tail']} bytes differs): "
                "swapped, replaced or damaged"
            )


def open_remote(url, *, s3: S3Config | None = None, concurrency: int | None = None,
                **options) -> Reader:
    """Open the dataset uploaded at ``url`` (``s3://bucket/prefix``); ``s3`` says where the
    store is (default: the AWS environment variables), ``concurrency`` how many requests a
    reader keeps in flight; ``options`` are the format's open options (``verify``...).
    A format whose module has no ``open_remote`` is refused with how to stage it."""
    from ..formats import checked_format

    store = _store(url, s3, concurrency)
    manifest = read_remote_manifest(store)
    module = checked_format(manifest, store.path(MANIFEST_NAME), options)
    reason = module.TRAITS.remote_unsupported
    if reason:
        raise DatasetError(
            f"{store.root}: no remote reader for {module.NAME}: stage it with `storebench "
            f"download {store.root} DIR`, then open DIR ({reason})"
        )
    check_remote_files(store, manifest,
                       fingerprints=getattr(module, "FINGERPRINTS_AT_OPEN", True))
    reader = module.open_remote(store, manifest, **options)
    reader.check()
    return reader


def _sidecars(root: Path) -> list[str]:
    return [name for name in SIDECAR_NAMES
            if name != MANIFEST_NAME and (root / name).is_file()]


def upload_dataset(local_dir: Path | str, url, *, s3: S3Config | None = None,
                   progress: bool = False) -> Transfer:
    """Copy the built dataset at ``local_dir`` to ``url``, manifest last. An earlier upload
    at the same prefix loses its manifest first, so no mix of two uploads looks valid."""
    from tqdm.auto import tqdm

    root = Path(local_dir)
    manifest = read_manifest(root)
    store = _store(url, s3)
    store.ensure_bucket()
    store.delete([MANIFEST_NAME])
    names = [*manifest["files"], *_sidecars(root)]
    started = time.perf_counter()
    total = sum((root / name).stat().st_size for name in names)
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"upload {root.name}",
              disable=not progress) as bar, ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        def send(name: str) -> int:
            written = store.upload(root / name, name)
            bar.update(written)
            return written

        moved = sum(pool.map(send, names))
    check_remote_files(store, manifest, fingerprints=False)
    moved += store.upload(root / MANIFEST_NAME, MANIFEST_NAME)
    return Transfer(str(root), str(store.root), len(names) + 1, moved,
                    time.perf_counter() - started)


def download_dataset(url, local_dir: Path | str, *, s3: S3Config | None = None,
                     progress: bool = False) -> Transfer:
    """Stage the dataset at ``url`` in ``local_dir`` (which must not exist): written beside
    it under a temporary name, checked by ``open_dataset``, then renamed into place."""
    from tqdm.auto import tqdm

    from ..formats import open_dataset

    target = Path(local_dir)
    if target.exists():
        raise FileExistsError(f"{target}: exists; download into a new directory")
    store = _store(url, s3)
    manifest = read_remote_manifest(store)
    check_remote_files(store, manifest, fingerprints=False)
    names = [*manifest["files"], CHECKSUMS_NAME,
             *[n for n in SIDECAR_NAMES if n in manifest.get("sidecars", {})]]
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    started = time.perf_counter()
    try:
        for name in {str(Path(n).parent) for n in names}:
            (tmp / name).mkdir(parents=True, exist_ok=True)
        with tqdm(total=len(names), unit="file", desc=f"download {target.name}",
                  disable=not progress) as bar:
            moved = 0
            for start in range(0, len(names), 256):
                batch = names[start:start + 256]
                for name, data in zip(batch, store.read_many(batch)):
                    (tmp / name).write_bytes(data)
                    moved += len(data)
                bar.update(len(batch))
        manifest_bytes = store.read(MANIFEST_NAME)
        (tmp / MANIFEST_NAME).write_bytes(manifest_bytes)
        open_dataset(tmp).close()
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Transfer(str(store.root), str(target), len(names) + 1,
                    moved + len(manifest_bytes), time.perf_counter() - started)
