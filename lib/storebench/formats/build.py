"""Atomic dataset builds: write into a temporary directory, rename into place when complete.

A build first compares the free space of the target's filesystem with an estimate of what it
will write and refuses clearly when it cannot fit. A write that still fails for lack of space
or an I/O error ends in a ``DatasetError`` naming the dataset, with the partial ``.tmp-*``
directory removed, never a half-written dataset or a crash.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

import data_gen
from data_gen import DatasetSpec

from ..processes import pid_alive
from .base import DatasetError, ManifestError, crc32c_of_ints, sample_checksum
from .manifest import (
    CHECKSUMS_NAME,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    SIDECAR_NAMES,
    VERSIONED_PACKAGES,
    content_digest,
    data_files,
    disk_usage,
    file_fingerprint,
    fingerprint_span,
    manifest_digest,
    package_versions,
    read_manifest,
    save_checksums,
    write_json_atomic,
)
from .npyfile import write_header
from .specs import Spec, fixed_size, is_imported
from .trust import mark_trusted

TMP_PREFIX = ".tmp-"
# Write failures that mean "the disk cannot take this build", not a bug: reported as a
# DatasetError naming the dataset, after the partial directory is removed.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG})
# Encoded samples whose sizes are averaged to estimate a build's size.
SIZE_PROBE_SAMPLES = 4


def stored_bytes(spec: Spec) -> int:
    """About how many bytes ``spec``'s samples take as stored: exact for raw and imported
    sets; for synthetic PNG/JPEG the mean size of a few samples spread over the dataset,
    with 10 % headroom."""
    if is_imported(spec):
        return spec.stored_bytes
    if not fixed_size(spec):  # an ImageNet-like JPEG set: images of many sizes
        return int(spec.num_samples * 1.1 * _mean_probe_bytes(spec))
    return int(spec.num_samples * spec.raw_sample_bytes * stored_fraction(spec))


def _mean_probe_bytes(spec: Spec) -> float:
    probes = np.linspace(0, spec.num_samples - 1, min(SIZE_PROBE_SAMPLES, spec.num_samples))
    return float(np.mean([len(data_gen.sample(spec, int(i))[0]) for i in probes]))


def stored_fraction(spec: DatasetSpec) -> float:
    """Stored bytes per raw pixel byte of a synthetic spec (see ``stored_bytes``)."""
    if spec.encoding == "raw":
        return 1.0
    return 1.1 * _mean_probe_bytes(spec) / spec.raw_sample_bytes


def estimate_bytes(spec: Spec, module=None) -> int:
    """About how many bytes a build of ``spec`` needs while writing: the stored sample bytes
    times the format's ``SIZE_OVERHEAD[encoding]`` (1 for the sample cache, which stores them
    plainly)."""
    overhead = module.SIZE_OVERHEAD[spec.encoding] if module is not None else 1.0
    return int(stored_bytes(spec) * overhead)


def check_free_space(directory: Path, needed: int, what: str) -> None:
    """Refuse a write of about ``needed`` bytes into ``directory`` that cannot fit."""
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise DatasetError(
            f"{directory}: {what} needs about {needed / 2**20:.1f} MiB, only "
            f"{free / 2**20:.1f} MiB is free there; free some space or build elsewhere"
        )


def is_disk_error(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in DISK_ERRNOS


class SampleCache:
    """A spec's samples generated once into a scratch directory, then replayed for every
    format built from them (generation costs far more than writing, e.g. 256x256 JPEG).

    ``samples`` makes them (a callable returning an iterator of ``(image, label)`` in index
    order); by default ``data_gen.generate`` for a synthetic spec. Raw samples go to one
    ``.npy`` memmap; encoded ones to one bytes file with offsets. Use as a context manager:
    the scratch files are removed on exit.
    """

    def __init__(
        self,
        spec: Spec,
        scratch_dir: Path | str,
        *,
        workers: int | None = None,
        progress: bool = False,
        samples: Callable[[], Iterable] | None = None,
    ) -> None:
        if samples is None and is_imported(spec):
            raise ValueError("an imported spec's samples come from its source: pass samples=")
        self.spec = spec
        self._make_samples = samples
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
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            check_free_space(self.dir, estimate_bytes(self.spec), "the sample cache")
            self._write()
        except OSError as err:
            if not is_disk_error(err):
                raise
            self.close()
            raise DatasetError(f"{self.dir}: writing the sample cache failed: {err}") from err

    def _write(self) -> None:
        spec = self.spec
        labels = np.empty(spec.num_samples, dtype=np.int64)
        samples = self._make_samples() if self._make_samples is not None else data_gen.generate(
            spec,
            workers=self.workers,
            progress=f"generate {spec.encoding}" if self.progress else False,
        )
        started = time.perf_counter()
        if spec.encoding == "raw":
            # Plain writes, not a writable memory map: a full disk is then an OSError, where
            # a store into a map of a sparse file would be a SIGBUS.
            with open(self.dir / "images.npy", "wb") as f:
                write_header(f, (spec.num_samples, *spec.image_shape), np.uint8)
                for i, (image, label) in enumerate(samples):
                    f.write(np.ascontiguousarray(image, dtype=np.uint8))
                    labels[i] = label
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


def check_encoding(module, spec: Spec) -> None:
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
        self.labels = np.zeros(len(checksums), dtype=np.int64)
        self.sizes = np.zeros(len(checksums), dtype=np.int64)
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
        self.labels[self._count] = label
        self.sizes[self._count] = image.nbytes if isinstance(image, np.ndarray) else len(image)
        self._count += 1
        return image, label


def matching_manifest(path: Path, spec: Spec, format_name: str, knobs: dict) -> dict | None:
    """The existing manifest at ``path`` if it describes exactly this build, else None: the
    same format, spec and knobs, written by the format's current layout (``LAYOUT``: a
    format that starts writing another file, such as TFRecord's DALI index, raises it, so
    older builds are rebuilt rather than found lacking)."""
    from . import get_format

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
        and manifest.get("layout", 1) == getattr(get_format(format_name), "LAYOUT", 1)
    )
    return manifest if same else None


# What a build, a replaced build and the sample cache name their scratch directories:
# ``.tmp-<what>-<pid>-<8 hex digits>``. Nothing else under --out is ever swept.
STALE_BUILD_NAME = re.compile(r"\.tmp-.+-([0-9]{1,7})-[0-9a-f]{8}")


def remove_stale_builds(out_dir: Path) -> None:
    """Delete temporary directories left by interrupted builds (their owner is gone): only
    names of the form builds make (a user's ``.tmp-notes`` stays), only real directories (a
    symbolic link is neither followed nor removed)."""
    if not out_dir.is_dir():
        return
    with os.scandir(out_dir) as entries:
        for entry in entries:
            match = STALE_BUILD_NAME.fullmatch(entry.name)
            if match is None or not entry.is_dir(follow_symlinks=False):
                continue
            if pid_alive(int(match.group(1))):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)


def build_dataset(
    spec: Spec,
    format_name: str,
    out_dir: Path | str,
    *,
    knobs: dict | None = None,
    workers: int | None = None,
    progress: bool = False,
    force: bool = False,
    name: str | None = None,
    source: SampleCache | None = None,
    sidecars: dict[str, dict] | None = None,
) -> BuildResult:
    """Write ``spec``'s samples as ``format_name`` under ``out_dir/<format>-<encoding>``.

    Skipped when a manifest with the same spec, format and knobs is already there (unless
    ``force``). ``source`` replays samples generated once for several builds (an imported
    spec needs one). ``sidecars`` are JSON files written beside the data (their SHA-256 in
    the manifest), as ``sources.json`` for imports. A killed build leaves only a ``.tmp-*``
    directory, never a directory with a manifest.
    """
    from . import get_format, unavailable_reason

    module = get_format(format_name)
    check_encoding(module, spec)
    knobs = resolve_knobs(module, knobs)
    out_dir = Path(out_dir)
    target = out_dir / (name or dataset_dirname(format_name, spec.encoding))
    reason = unavailable_reason(format_name)
    if reason:
        raise DatasetError(f"{target}: cannot build: {reason}")
    if not force:
        existing = matching_manifest(target, spec, format_name, knobs)
        if existing is not None:
            return BuildResult(target, existing, skipped=True)

    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_builds(out_dir)
    check_free_space(out_dir, estimate_bytes(spec, module), target.name)
    tmp = out_dir / f"{TMP_PREFIX}{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        manifest = _write_into(
            tmp, module, spec, format_name, knobs, workers, progress, source, sidecars or {}
        )
        if target.exists():
            old = out_dir / f"{TMP_PREFIX}old-{target.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(target, old)
            os.rename(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, target)
        for trusted in getattr(module, "TRUSTED_INPUT_ONLY", ()):
            mark_trusted(target / trusted)  # this user's own build: opens without a verify
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        # Spawned workers that re-ran an unguarded main script started builds of their own
        # and may have been killed mid-way: their directories go too, once they are gone.
        remove_stale_builds(out_dir)
        if is_disk_error(err) or isinstance(err, DatasetError):
            raise DatasetError(
                f"{target}: build failed, the partial {tmp.name} was removed: {err}"
            ) from err
        raise
    return BuildResult(target, manifest, skipped=False)


def _write_into(
    tmp: Path,
    module,
    spec: Spec,
    format_name: str,
    knobs: dict,
    workers: int | None,
    progress: bool,
    source: SampleCache | None,
    sidecars: dict[str, dict],
) -> dict:
    """Write the format's files, checksums and manifest into ``tmp``; return the manifest."""
    checksums = np.zeros(spec.num_samples, dtype=np.uint32)
    if source is not None and source.spec != spec:
        raise ValueError("the sample cache holds another spec than the one being built")
    if source is None and is_imported(spec):
        raise ValueError("an imported spec is built from its source: pass source=")
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
    sidecar_digests = {}
    for sidecar, content in sidecars.items():
        if sidecar not in SIDECAR_NAMES or sidecar in (MANIFEST_NAME, CHECKSUMS_NAME):
            raise ValueError(f"unknown sidecar {sidecar!r}")
        write_json_atomic(tmp / sidecar, content)
        sidecar_digests[sidecar] = hashlib.sha256((tmp / sidecar).read_bytes()).hexdigest()
    files = data_files(tmp)
    apparent, allocated = disk_usage(tmp, files)
    save_checksums(tmp, checksums)
    span_of = getattr(module, "fingerprint_span", None)
    fingerprints = {}
    for rel in files:
        size = os.stat(tmp / rel).st_size
        head, tail = span_of(rel, tmp / rel, size) if span_of else fingerprint_span(size)
        fingerprints[rel] = {
            "head": head, "tail": tail, "crc32c": file_fingerprint(tmp / rel, head, tail)
        }
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "format": format_name,
        "encoding": spec.encoding,
        "spec": spec.to_dict(),
        "knobs": knobs,
        "layout": getattr(module, "LAYOUT", 1),
        "num_samples": spec.num_samples,
        "digest": content_digest(checksums),
        "files": {rel: os.stat(tmp / rel).st_size for rel in files},
        "fingerprints": fingerprints,
        "integrity": {
            "labels_crc32c": crc32c_of_ints(stream.labels),
            "sizes_crc32c": crc32c_of_ints(stream.sizes),
        },
        "file_count": len(files),
        "bytes_apparent": apparent,
        "bytes_allocated": allocated,
        "raw_bytes": spec.num_samples * spec.raw_sample_bytes if fixed_size(spec)
        else spec.decoded_bytes,  # imported, and ImageNet-like JPEG sets: both know it
        "sidecars": sidecar_digests,
        "write_seconds": write_seconds,
        "generate_seconds": stream.source_seconds,
        "versions": package_versions((*VERSIONED_PACKAGES, *module.TRAITS.distributions)),
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    manifest["manifest_digest"] = manifest_digest(manifest)
    write_json_atomic(tmp / MANIFEST_NAME, manifest)
    return manifest
