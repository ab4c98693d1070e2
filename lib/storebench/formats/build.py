"""Atomic dataset builds: write into a temporary directory, rename into place when complete."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

import data_gen
from data_gen import DatasetSpec

from .base import ManifestError, sample_checksum
from .manifest import (
    MANIFEST_NAME,
    MANIFEST_VERSION,
    content_digest,
    data_files,
    disk_usage,
    package_versions,
    read_manifest,
    save_checksums,
    write_json_atomic,
)

TMP_PREFIX = ".tmp-"


class SampleCache:
    """A spec's samples generated once into a scratch directory, then replayed for every
    format built from them (generation costs far more than writing, e.g. 256x256 JPEG).

    Raw samples go to one ``.npy`` memmap; encoded ones to one bytes file with offsets.
    Use as a context manager: the scratch files are removed on exit.
    """

    def __init__(
        self,
        spec: DatasetSpec,
        scratch_dir: Path | str,
        *,
        workers: int | None = None,
        progress: bool = False,
    ) -> None:
        self.spec = spec
        self.dir = Path(scratch_dir) / f"{TMP_PREFIX}samples-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.workers = workers
        self.progress = progress
        self._labels: np.ndarray | None = None
        self._images: np.ndarray | None = None
        self._offsets: np.ndarray | None = None
        self.generate_seconds = 0.0

    def __enter__(self) -> SampleCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._images = self._offsets = self._labels = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def _fill(self) -> None:
        spec = self.spec
        self.dir.mkdir(parents=True, exist_ok=True)
        labels = np.empty(spec.num_samples, dtype=np.int64)
        samples = data_gen.generate(
            spec,
            workers=self.workers,
            progress=f"generate {spec.encoding}" if self.progress else False,
        )
        started = time.perf_counter()
        if spec.encoding == "raw":
            images = np.lib.format.open_memmap(
                self.dir / "images.npy",
                mode="w+",
                dtype=np.uint8,
                shape=(spec.num_samples, *spec.image_shape),
            )
            for i, (image, label) in enumerate(samples):
                images[i], labels[i] = image, label
            images.flush()
            self._images = np.load(self.dir / "images.npy", mmap_mode="r")
        else:
            offsets = np.zeros(spec.num_samples + 1, dtype=np.int64)
            with open(self.dir / "encoded.bin", "wb") as f:
                for i, (image, label) in enumerate(samples):
                    f.write(image)
                    offsets[i + 1] = offsets[i] + len(image)
                    labels[i] = label
            self._offsets = offsets
            self._images = (
                np.memmap(self.dir / "encoded.bin", dtype=np.uint8, mode="r")
                if offsets[-1]
                else np.empty(0, dtype=np.uint8)
            )
        # Clean pages: the builds' os.sync() then flushes their own files, not this cache.
        for path in self.dir.iterdir():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        self.generate_seconds = time.perf_counter() - started
        self._labels = labels

    def __iter__(self) -> Iterator[tuple[np.ndarray | bytes, int]]:
        if self._labels is None:
            self._fill()
        images, labels, offsets = self._images, self._labels, self._offsets
        for i in range(self.spec.num_samples):
            if offsets is None:
                yield images[i], int(labels[i])
            else:
                yield images[offsets[i] : offsets[i + 1]].tobytes(), int(labels[i])


@dataclass(frozen=True)
class BuildResult:
    path: Path
    manifest: dict
    skipped: bool


def dataset_dirname(format_name: str, encoding: str) -> str:
    return f"{format_name}-{encoding}"


def resolve_knobs(module, knobs: dict | None) -> dict:
    knobs = dict(knobs or {})
    unknown = set(knobs) - set(module.DEFAULT_KNOBS)
    if unknown:
        raise TypeError(
            f"format {module.NAME!r} has no knob(s) {sorted(unknown)}; "
            f"its knobs are {sorted(module.DEFAULT_KNOBS)}"
        )
    return {**module.DEFAULT_KNOBS, **knobs}


def check_encoding(module, spec: DatasetSpec) -> None:
    if spec.encoding not in module.ENCODINGS:
        raise ValueError(
            f"format {module.NAME!r} stores {'/'.join(module.ENCODINGS)} only and cannot hold "
            f"{spec.encoding!r} samples"
        )


class _ChecksummedSamples:
    """Passes samples through, recording each one's checksum and the time spent making them
    (so that the manifest's write time is the format's, not the generator's)."""

    def __init__(self, samples: Iterable, checksums: np.ndarray) -> None:
        self._samples = iter(samples)
        self._checksums = checksums
        self._count = 0
        self.source_seconds = 0.0

    def __iter__(self) -> Iterator[tuple[np.ndarray | bytes, int]]:
        return self

    def __next__(self) -> tuple[np.ndarray | bytes, int]:
        started = time.perf_counter()
        try:
            image, label = next(self._samples)
        finally:
            self.source_seconds += time.perf_counter() - started
        self._checksums[self._count] = sample_checksum(image, label)
        self._count += 1
        return image, label


def matching_manifest(path: Path, spec: DatasetSpec, format_name: str, knobs: dict) -> dict | None:
    """The existing manifest at ``path`` if it describes exactly this build, else None."""
    if not (path / MANIFEST_NAME).is_file():
        return None
    try:
        manifest = read_manifest(path)
    except ManifestError:
        return None
    same = (
        manifest["format"] == format_name
        and manifest["spec"] == spec.to_dict()
        and manifest["knobs"] == knobs
    )
    return manifest if same else None


def remove_stale_builds(out_dir: Path) -> None:
    """Delete temporary directories left by interrupted builds (their owner is gone)."""
    if not out_dir.is_dir():
        return
    for entry in out_dir.iterdir():
        if entry.name.startswith(TMP_PREFIX) and entry.is_dir():
            pid = entry.name.split("-")[-2] if entry.name.count("-") >= 3 else ""
            if pid.isdigit() and _pid_alive(int(pid)):
                continue
            shutil.rmtree(entry, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def build_dataset(
    spec: DatasetSpec,
    format_name: str,
    out_dir: Path | str,
    *,
    knobs: dict | None = None,
    workers: int | None = None,
    progress: bool = False,
    force: bool = False,
    name: str | None = None,
    source: SampleCache | None = None,
) -> BuildResult:
    """Write ``spec``'s samples as ``format_name`` under ``out_dir/<format>-<encoding>``.

    Skipped when a manifest with the same spec, format and knobs is already there (unless
    ``force``). ``source`` replays samples generated once for several builds. A killed
    build leaves only a ``.tmp-*`` directory, never a directory with a manifest.
    """
    from . import get_format

    module = get_format(format_name)
    check_encoding(module, spec)
    knobs = resolve_knobs(module, knobs)
    out_dir = Path(out_dir)
    target = out_dir / (name or dataset_dirname(format_name, spec.encoding))
    if not force:
        existing = matching_manifest(target, spec, format_name, knobs)
        if existing is not None:
            return BuildResult(target, existing, skipped=True)

    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_builds(out_dir)
    tmp = out_dir / f"{TMP_PREFIX}{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        checksums = np.zeros(spec.num_samples, dtype=np.uint32)
        if source is not None and source.spec != spec:
            raise ValueError("the sample cache holds another spec than the one being built")
        samples = (
            source
            if source is not None
            else data_gen.generate(
                spec,
                workers=workers,
                progress=f"{format_name}-{spec.encoding}" if progress else False,
            )
        )
        stream = _ChecksummedSamples(samples, checksums)
        started = time.perf_counter()
        module.write(stream, tmp, spec, **knobs)
        os.sync()  # clean pages: posix_fadvise(DONTNEED) can then evict them for cold reads
        write_seconds = time.perf_counter() - started - stream.source_seconds
        files = data_files(tmp)
        apparent, allocated = disk_usage(tmp, files)
        save_checksums(tmp, checksums)
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "format": format_name,
            "encoding": spec.encoding,
            "spec": spec.to_dict(),
            "knobs": knobs,
            "num_samples": spec.num_samples,
            "digest": content_digest(checksums),
            "files": {rel: os.stat(tmp / rel).st_size for rel in files},
            "file_count": len(files),
            "bytes_apparent": apparent,
            "bytes_allocated": allocated,
            "raw_bytes": spec.num_samples * spec.raw_sample_bytes,
            "write_seconds": write_seconds,
            "generate_seconds": stream.source_seconds,
            "versions": package_versions(),
            "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        write_json_atomic(tmp / MANIFEST_NAME, manifest)
        if target.exists():
            old = out_dir / f"{TMP_PREFIX}old-{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(target, old)
            os.rename(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return BuildResult(target, manifest, skipped=False)
