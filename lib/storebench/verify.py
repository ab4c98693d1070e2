"""Re-read every sample of a built dataset and compare it with ``data_gen.sample``, or, for
an imported dataset, with its source files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

import data_gen

from .formats import DatasetError, open_dataset, sample_checksum
from .formats.manifest import content_digest
from .formats.specs import is_imported


@dataclass(frozen=True)
class VerifyResult:
    path: Path
    ok: bool
    samples_checked: int
    message: str


def verify_dataset(
    path: Path | str, *, batch_size: int = 256, workers: int | None = None, progress: bool = False
) -> VerifyResult:
    """Compare every stored sample with a freshly generated one, and the digest with the
    manifest's. Reads without the reader's per-sample checksum check, so the comparison is
    independent of the sidecar checksums; the format's own checks (file fingerprints, index
    structure, TFRecord CRCs, Parquet page checksums) still run, and every read of a damaged
    file ends in an error within bounded time (HDF5 keeps no heap that could loop)."""
    path = Path(path)
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    untrusted = _untrusted(path)
    if untrusted:
        return verify_untrusted(path, untrusted, batch_size=batch_size, workers=workers,
                                progress=progress)
    return _verify(path, batch_size=batch_size, workers=workers, progress=progress,
                   trust=False)


def _untrusted(path: Path) -> list[str]:
    from .formats import FORMATS, read_manifest, untrusted_files

    try:
        module = FORMATS.get(read_manifest(path)["format"])
    except DatasetError:
        return []  # _verify says why it cannot open
    return untrusted_files(path, module) if module is not None else []


def verify_untrusted(path: Path, names: list[str], *, batch_size: int, workers: int | None,
                     progress: bool) -> VerifyResult:
    """Verify a dataset holding trusted-input-only files (LMDB's ``data.mdb``) that this
    user has neither built nor verified: in a separate process, so that a crafted file that
    crashes its reader (SIGBUS) fails the verify instead of ending it. When every sample
    matches, each file (unchanged meanwhile) is marked trusted for later opens."""
    import multiprocessing
    import signal

    from .formats.trust import file_identity, mark_trusted

    before = {name: file_identity(path / name) for name in names}
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_verify_child, args=(sender, str(path), batch_size,
                                                         workers, progress),
                            name="storebench-verify")
    child.start()
    sender.close()
    try:
        result = receiver.recv()
    except EOFError:
        result = None
    finally:
        child.join()
        receiver.close()
    if result is None:
        code = child.exitcode
        how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exit code {code}")
        return VerifyResult(path, False, 0, f"{path / names[0]}: reading it crashed the "
                            f"verifying process ({how}): damaged or crafted; do not open it")
    if result.ok and all(file_identity(path / n) == before[n] for n in names):
        for name in names:
            mark_trusted(path / name)
    return result


def _verify_child(sender, path: str, batch_size: int, workers: int | None,
                  progress: bool) -> None:
    try:
        sender.send(_verify(Path(path), batch_size=batch_size, workers=workers,
                            progress=progress, trust=True))
    finally:
        sender.close()


def _verify(path: Path, *, batch_size: int, workers: int | None, progress: bool,
            trust: bool) -> VerifyResult:
    try:
        reader = open_dataset(path, verify=False, trust=trust)
    except DatasetError as err:  # every damage, manifest mismatch and unknown format
        return VerifyResult(path, False, 0, f"cannot open: {err}")
    try:
        check_checksums(path, reader)
    except DatasetError as err:
        reader.close()  # every damage, manifest mismatch and unknown format
        return VerifyResult(path, False, 0, f"cannot open: {err}")
    if is_imported(reader.spec):
        with reader:
            return verify_imported(path, reader, batch_size=batch_size, progress=progress)
    with reader:
        generated = data_gen.generate(
            reader.spec, workers=workers, progress=f"verify {path.name}" if progress else False
        )
        expected = ((image, label, "data_gen") for image, label in generated)
        try:
            return compare_every_sample(path, reader, expected, batch_size=batch_size)
        finally:
            generated.close()


def check_checksums(path: Path, reader) -> None:
    """``checksums.npy`` is whole and is the one the manifest's content digest was made
    from: reads with ``verify=True`` (every default read) depend on it."""
    from .formats.manifest import load_checksums

    checksums = load_checksums(path, len(reader))
    if content_digest(checksums) != reader.manifest["digest"]:
        raise DatasetError(f"{path / 'checksums.npy'}: its digest differs from the manifest's: "
                           "damaged or replaced (every read with verify=True would fail)")


def compare_every_sample(path: Path, reader, expected, *, batch_size: int = 256,
                         image_word: str = "image bytes", note: str = "") -> VerifyResult:
    """Read every sample of ``reader`` in index order and compare it with ``expected``'s
    ``(image, label, origin)`` for that index (arrays for raw samples, bytes otherwise), then
    the content digest with the manifest's. The first difference ends it, naming the file,
    the sample and ``origin``."""
    checksums = np.zeros(len(reader), dtype=np.uint32)
    checked = 0
    try:
        for start in range(0, len(reader), batch_size):
            indices = np.arange(start, min(start + batch_size, len(reader)))
            images, labels = reader.read_many(indices)
            for k, i in enumerate(indices):
                want_image, want_label, origin = next(expected)
                image, label = images[k], int(labels[k])
                same = (np.array_equal(image, want_image) if reader.is_raw
                        else bytes(image) == want_image)
                if not same or label != want_label:
                    what = image_word if not same else f"label {label} != {want_label}"
                    return VerifyResult(
                        path, False, checked,
                        f"{reader._locate(int(i))}: sample {i}: {what} differ from {origin}",
                    )
                checksums[i] = sample_checksum(image, label)
                checked += 1
    except DatasetError as err:
        return VerifyResult(path, False, checked, str(err))
    digest = content_digest(checksums)
    if digest != reader.manifest["digest"]:
        return VerifyResult(path, False, checked, "content digest differs from the manifest")
    return VerifyResult(path, True, checked, f"digest {digest[:16]}{note}")


def verify_imported(path: Path, reader, *, batch_size: int = 256, progress: bool = False):
    """Compare every stored sample of an imported dataset with its source file (listed in
    ``sources.json``, itself checked against the manifest): the same bytes for encoded
    copies, the same resized pixels for raw ones, and the same label."""
    import hashlib
    import json

    from tqdm.auto import tqdm

    from .formats.confine import confined_path, read_regular
    from .formats.manifest import MAX_MANIFEST_BYTES, SOURCES_NAME
    from .importer import check_sources, read_source_bytes, resized_pixels

    sidecar = Path(path) / SOURCES_NAME
    try:
        raw_sidecar = read_regular(confined_path(path, SOURCES_NAME, sidecar),
                                   limit=MAX_MANIFEST_BYTES)
        sources = json.loads(raw_sidecar)
    except (DatasetError, ValueError, RecursionError) as err:
        return VerifyResult(path, False, 0, f"{sidecar}: cannot read the source list: {err}")
    recorded = reader.manifest.get("sidecars", {}).get(SOURCES_NAME)
    if hashlib.sha256(raw_sidecar).hexdigest() != recorded:
        return VerifyResult(path, False, 0, f"{sidecar}: differs from the one written at "
                                            "import (SHA-256 mismatch)")
    spec = reader.spec
    try:
        root, names, labels = check_sources(sources, len(reader), sidecar)
    except DatasetError as err:
        return VerifyResult(path, False, 0, str(err))

    def expected():
        # The names are relative with no '..' (check_sources); the root is the imported
        # folder on this machine, whose own links (a class folder on another disk) are
        # the user's. Each source is read as a bounded regular file.
        for i in tqdm(range(len(reader)), desc=f"verify {Path(path).name}", unit="img",
                      disable=None if progress else True, leave=False):
            source = root / names[i]
            data = read_source_bytes(source)
            if spec.encoding == "raw":
                data = resized_pixels(data, source, spec.height, spec.width)
            yield data, labels[i], f"the source {source}"

    samples = expected()
    try:
        return compare_every_sample(
            path, reader, samples, batch_size=batch_size,
            image_word="resized pixels" if spec.encoding == "raw" else "image bytes",
            note=f", matches {root}")
    finally:
        samples.close()  # a difference ends the comparison early: close the progress bar
