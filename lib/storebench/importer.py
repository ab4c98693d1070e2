"""Import a user's own images: an ImageFolder tree or a CSV/Parquet listing of ``path,label``,
written in every storebench format that can hold them.

- **Encoded bytes are kept exactly**: each JPEG/PNG file's bytes are the stored sample (a
  folder of both is the ``mixed`` encoding; every file keeps its own signature). Checksums
  are of those source bytes.
- **Raw arrays** (memmap, and the raw copies in the other formats) need a fixed size:
  ``resize=(H, W)`` decodes each image to RGB and resizes it (Pillow, bilinear).
- **Class names** go into the spec (``ImportedSpec.class_names``); the rawfiles copy uses them
  as folder names. Labels are indices into the sorted class names (ImageFolder's rule).
- Every image is read and fully decoded once before anything is written, so a damaged or
  unreadable file is a ``SourceImageError`` naming it (or, with ``on_error="skip"``, left out
  and counted) and never half a dataset. Builds are atomic as for the synthetic profiles, and
  ``sources.json`` beside each copy names each sample's source file, for ``storebench verify``.
"""

from __future__ import annotations

import hashlib
import io
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .formats.base import DatasetError, ManifestError, sample_checksum, sniff_encoding
from .formats.confine import check_name, check_pixels, read_regular
from .formats.specs import ImportedSpec

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
LISTING_SUFFIXES = (".csv", ".parquet")
RESIZE_FILTER = "bilinear"
ON_ERROR = ("fail", "skip")
# The largest source image read (a 20,000 x 20,000 PNG of noise is about 1.2 GB; real photos
# are far below this): a file over it is refused unread, as a link to /dev/zero would be.
MAX_SOURCE_BYTES = 512 << 20
# The most classes an integer-labelled listing may have (ImageNet-21k has 21,841).
MAX_CLASSES = 1_000_000
SOURCES_VERSION = 1


class SourceImageError(DatasetError):
    """A source image cannot be imported: unreadable, not JPEG/PNG, or damaged."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    def __reduce__(self):
        # Rebuilt from (path, reason), not from the message: a Ray task hands it back.
        return (type(self), (str(self.path), self.reason))


@dataclass(frozen=True)
class SourceListing:
    """What to import: each image's path (relative to ``root``) and label, in import order.

    ``origin`` is the folder or listing file given by the user."""

    origin: Path
    root: Path
    paths: tuple[str, ...]
    labels: np.ndarray
    class_names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.paths)

    def subset(self, keep: np.ndarray) -> SourceListing:
        keep = np.asarray(keep, dtype=np.int64)
        return SourceListing(self.origin, self.root, tuple(self.paths[i] for i in keep),
                             self.labels[keep], self.class_names)


@dataclass(frozen=True)
class ScannedImage:
    """One source image, read and decoded once: its bytes' checksum, encoding and size."""

    encoding: str
    height: int
    width: int
    size: int
    checksum: int


@dataclass(frozen=True)
class ImportPlan:
    """The result of scanning and checking a source: the images that will be imported, the
    specs of the encoded copy and (with a resize) the raw copy, and what was skipped."""

    listing: SourceListing
    encoded_spec: ImportedSpec
    raw_spec: ImportedSpec | None
    checksums: np.ndarray
    skipped: tuple[tuple[str, str], ...]

    def sources_sidecar(self) -> dict:
        return {
            "sources_version": SOURCES_VERSION,
            "origin": str(self.listing.origin),
            "root": str(self.listing.root),
            "paths": list(self.listing.paths),
            "labels": self.listing.labels.tolist(),
            "source_checksums": self.checksums.tolist(),
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
        }


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def check_class_name(name: str, where: object) -> str:
    """``name`` if it can be a class folder's name (the rawfiles copy makes one), else a
    ``DatasetError`` naming ``where`` it came from."""
    if not name or name in (".", "..") or any(c in name for c in "/\0\n\r"):
        raise DatasetError(
            f"{where}: class name {name!r} cannot be a folder name (empty, '.', '..', or "
            "containing '/', NUL or a line break)"
        )
    return name


def _is_dir(entry: os.DirEntry) -> bool:
    """Whether ``entry`` is a folder or a link to one; a link loop is not."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def walk_images(top: Path, visited: set[tuple[int, int]]) -> list[str]:
    """The JPEG/PNG files under ``top`` (hidden names skipped), walked iteratively (a tree
    10,000 levels deep is no RecursionError). Symbolic links are followed, to folders and
    files alike (a class folder on another disk is common), but each real folder is walked
    once: ``visited`` holds the (device, inode) of every folder seen, across classes (``top``
    itself is walked whatever it holds), so a link loop ends and no image is imported twice
    through two links to one folder."""
    found: list[str] = []
    pending = [os.fspath(top)]
    while pending:
        folder = pending.pop()
        try:
            st = os.stat(folder)
            if folder != os.fspath(top) and (st.st_dev, st.st_ino) in visited:
                continue
            visited.add((st.st_dev, st.st_ino))
            with os.scandir(folder) as entries:
                entries = sorted((e for e in entries if not _is_hidden(e.name)),
                                 key=lambda e: e.name)
        except OSError as err:  # a dangling or looping link, an unreadable folder
            raise SourceImageError(folder, f"cannot list: {err.strerror or err}") from err
        subfolders = []
        for entry in entries:
            if _is_dir(entry):
                subfolders.append(entry.path)
            elif os.path.splitext(entry.name)[1].lower() in IMAGE_SUFFIXES:
                found.append(entry.path)
        pending.extend(reversed(subfolders))
    return found


def scan_folder(root: Path) -> SourceListing:
    """An ImageFolder tree: one subfolder per class (sorted by name), its JPEG/PNG files
    found recursively (``walk_images``) and sorted; other files are ignored, hidden ones
    too."""
    classes = sorted(
        entry.name for entry in os.scandir(root) if _is_dir(entry) and not _is_hidden(entry.name)
    )
    paths: list[str] = []
    labels: list[int] = []
    kept: list[str] = []
    # The root and every class folder count as seen: a link back to them from inside a
    # class (``cats/up -> ..``) would import other classes' images under this one.
    visited = {(st.st_dev, st.st_ino) for st in map(os.stat, [root, *(root / c for c in classes)])}
    for name in classes:
        found = [os.path.relpath(p, root) for p in walk_images(root / name, visited)]
        if found:
            kept.append(name)
            paths += sorted(found)
            labels += [len(kept) - 1] * len(found)
    if not paths:
        raise DatasetError(
            f"{root}: no images to import: expected one subfolder per class holding "
            f"{'/'.join(IMAGE_SUFFIXES)} files (the ImageFolder layout), or a CSV/Parquet "
            "listing of path,label"
        )
    return SourceListing(root, root, tuple(paths), np.asarray(labels, dtype=np.int64),
                         tuple(kept))


def scan_listing(listing: Path) -> SourceListing:
    """A CSV or Parquet file with columns ``path`` and ``label``; relative paths are from the
    listing's folder. String labels are class names (sorted); integer labels are kept as
    they are, with class names ``"0"``, ``"1"``, ..."""
    import pyarrow as pa

    try:
        if listing.suffix.lower() == ".csv":
            from pyarrow import csv

            table = csv.read_csv(listing, convert_options=csv.ConvertOptions(
                column_types={"path": pa.string()}))
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(listing)
    except (pa.ArrowInvalid, OSError) as err:
        raise DatasetError(f"{listing}: cannot read the listing: {err}") from err
    missing = [c for c in ("path", "label") if c not in table.column_names]
    if missing:
        raise DatasetError(
            f"{listing}: the listing needs columns 'path' and 'label'; it lacks {missing} "
            f"(it has {table.column_names})"
        )
    if table.num_rows == 0:
        raise DatasetError(f"{listing}: the listing has no rows")
    paths = table.column("path").to_pylist()
    labels = table.column("label")
    for row, (path, label) in enumerate(zip(paths, labels.to_pylist(), strict=True)):
        if not path or label is None:
            raise DatasetError(f"{listing}: row {row + 2}: empty path or label")
    if pa.types.is_integer(labels.type):
        values = np.asarray(labels.to_numpy(), dtype=np.int64)
        if values.min() < 0 or values.max() >= MAX_CLASSES:
            bad = values.min() if values.min() < 0 else values.max()
            raise DatasetError(f"{listing}: integer labels must be in [0, {MAX_CLASSES}) "
                               f"(one class name each up to the largest), found {bad}")
        class_names = tuple(str(i) for i in range(int(values.max()) + 1))
    else:
        names = [str(x) for x in labels.to_pylist()]
        class_names = tuple(sorted(set(names)))
        for name in class_names:
            check_class_name(name, listing)
        position = {name: i for i, name in enumerate(class_names)}
        values = np.asarray([position[name] for name in names], dtype=np.int64)
    root, names = common_root(listing.parent.resolve(), [str(p) for p in paths])
    return SourceListing(listing, root, names, values, class_names)


def common_root(base: Path, paths: list[str]) -> tuple[Path, tuple[str, ...]]:
    """The listing's paths (relative to ``base``, or absolute) as one root folder and names
    under it with no '..': what ``sources.json`` records, and what ``verify`` confines every
    name to."""
    full = [os.path.normpath(os.path.join(base, p)) for p in paths]
    root = os.path.commonpath([os.path.dirname(p) for p in full])
    return Path(root), tuple(os.path.relpath(p, root) for p in full)


def scan_source(source: Path | str, *, limit: int | None = None) -> SourceListing:
    """The listing of an ImageFolder tree or a CSV/Parquet file. ``limit`` keeps that many
    images spread evenly over the listing (so every class keeps its share), in order."""
    source = Path(source)
    if not source.exists():
        raise DatasetError(f"{source}: no such folder or listing file")
    if source.is_dir():
        listing = scan_folder(source.resolve())
    elif source.suffix.lower() in LISTING_SUFFIXES:
        listing = scan_listing(source.resolve())
    else:
        raise DatasetError(
            f"{source}: not a folder, and not a {' or '.join(LISTING_SUFFIXES)} listing"
        )
    if limit is not None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        if limit < len(listing):
            keep = np.unique(np.linspace(0, len(listing) - 1, limit).round().astype(np.int64))
            listing = listing.subset(keep)
    return listing


def read_source_bytes(path: Path) -> bytes:
    """A source image's bytes: a regular file (a FIFO, device or socket is refused, not
    waited on or read forever) of at most ``MAX_SOURCE_BYTES``."""
    try:
        return read_regular(path, limit=MAX_SOURCE_BYTES)
    except DatasetError as err:
        reason = str(err).removeprefix(f"{path}: ")
        raise SourceImageError(path, f"cannot read: {reason}") from err


def check_sources(sources: object, count: int, where: Path) -> tuple[Path, list[str], list[int]]:
    """``(root, paths, labels)`` of a ``sources.json``, each path a safe relative name
    (``confine.check_name``) and each label an int, ``count`` of each; else a
    ``ManifestError`` naming the entry. (Where each path resolves is checked as it is read.)"""
    if not isinstance(sources, dict):
        raise ManifestError(f"{where}: not a JSON object")
    root, paths, labels = sources.get("root"), sources.get("paths"), sources.get("labels")
    if not isinstance(root, str) or not os.path.isabs(root):
        raise ManifestError(f"{where}: 'root' {root!r} is not an absolute path")
    if not isinstance(paths, list) or not isinstance(labels, list) or not (
            len(paths) == len(labels) == count):
        raise ManifestError(f"{where}: needs {count} paths and {count} labels")
    for name in paths:
        check_name(name, where, what="source")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in labels):
        raise ManifestError(f"{where}: labels must be integers")
    return Path(root), paths, labels


def open_image(data: bytes, path: Path):
    """``data`` decoded by Pillow in full (a truncated or damaged file fails here)."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            check_pixels(image.size[1], image.size[0], path)  # before decoding anything
            image.load()
        return image
    except (OSError, SyntaxError, ValueError, DatasetError, Image.DecompressionBombWarning,
            Image.DecompressionBombError) as err:
        raise SourceImageError(path, f"cannot decode: {err}") from err


def to_rgb(image, path: Path) -> np.ndarray:
    try:
        return np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
    except (OSError, ValueError) as err:
        raise SourceImageError(path, f"cannot convert mode {image.mode} to RGB: {err}") from err


def resized_pixels(data: bytes, path: Path, height: int, width: int) -> np.ndarray:
    """The (height, width, 3) uint8 RGB pixels the raw copy stores for one source image."""
    from PIL import Image

    image = Image.fromarray(to_rgb(open_image(data, path), path))
    return np.ascontiguousarray(
        np.asarray(image.resize((width, height), Image.Resampling.BILINEAR)), dtype=np.uint8
    )


def scan_image(path: Path, label: int) -> ScannedImage:
    data = read_source_bytes(path)
    encoding = sniff_encoding(data)
    if encoding is None:
        raise SourceImageError(
            path, f"not a JPEG or PNG file (it starts with {data[:8]!r}); convert it or "
            "leave it out"
        )
    image = open_image(data, path)
    to_rgb(image, path)
    width, height = image.size
    return ScannedImage(encoding, height, width, len(data), sample_checksum(data, label))


def scan_or_fail(path: Path, label: int) -> ScannedImage | SourceImageError:
    """``scan_image``, with a bad image's error returned rather than raised: the caller
    decides, in listing order, whether it stops the import or is skipped."""
    try:
        return scan_image(path, label)
    except SourceImageError as err:
        return err


def prepared_sample(path: Path, label: int, checksum: int,
                    spec: ImportedSpec) -> np.ndarray | bytes:
    """One sample of ``spec`` from its source file: the file's bytes, or for the raw copy its
    resized pixels; checked against the checksum taken when the plan was made (a file
    changed since is an error, not a silently different dataset)."""
    data = read_source_bytes(path)
    if sample_checksum(data, label) != checksum:
        raise SourceImageError(path, "changed while it was being imported; import again")
    if spec.encoding == "raw":
        return resized_pixels(data, path, spec.height, spec.width)
    return data


class ThreadImportEngine:
    """The single-process engine: images are checked in threads of this process (Pillow
    releases the GIL while decoding) and the samples are read in order by the writer."""

    def __init__(self, *, workers: int | None = None, progress: bool = False,
                 address: str | None = None) -> None:
        if address is not None:
            raise ValueError("--address names a Ray cluster: it needs --engine ray")
        self.workers = workers
        self.progress = progress

    def __enter__(self) -> ThreadImportEngine:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def scan(self, listing: SourceListing) -> Iterator[ScannedImage | SourceImageError]:
        """Each image of ``listing`` scanned, in listing order."""
        from tqdm.auto import tqdm

        def scan(k: int) -> ScannedImage | SourceImageError:
            return scan_or_fail(listing.root / listing.paths[k], int(listing.labels[k]))

        with ThreadPoolExecutor(max_workers=self.workers or os.cpu_count() or 1) as pool, tqdm(
            total=len(listing), desc=f"check {listing.origin.name}", unit="img",
            disable=None if self.progress else True, leave=False,
        ) as bar:
            for item in pool.map(scan, range(len(listing))):
                bar.update()
                yield item

    def samples(self, plan: ImportPlan, spec: ImportedSpec) -> Callable[[], Iterator]:
        return source_samples(plan, spec)


def _ray_engine(**options):
    from .ray_import import RayImportEngine

    return RayImportEngine(**options)


# Who does the reading, decoding, checking and resizing; the format writers are the same.
IMPORT_ENGINES: dict[str, Callable] = {"process": ThreadImportEngine, "ray": _ray_engine}
DEFAULT_ENGINE = "process"


def open_engine(name: str, *, workers: int | None = None, progress: bool = False,
                address: str | None = None):
    """The import engine called ``name`` (a context manager), or a ``KeyError`` naming the
    valid ones. ``address``: a Ray cluster to connect to, for the ``ray`` engine only."""
    if name not in IMPORT_ENGINES:
        raise KeyError(f"unknown import engine {name!r}; choose one of {sorted(IMPORT_ENGINES)}")
    return IMPORT_ENGINES[name](workers=workers, progress=progress, address=address)


def plan_import(
    source: Path | str,
    *,
    resize: tuple[int, int] | None = None,
    limit: int | None = None,
    on_error: str = "fail",
    workers: int | None = None,
    progress: bool = False,
    engine=None,
) -> ImportPlan:
    """Scan ``source`` and read and decode every image once, with ``engine`` (by default the
    single-process one, in threads). ``on_error="fail"`` stops at the first bad image in
    listing order with a ``SourceImageError`` naming it; ``"skip"`` leaves bad images out
    and lists them."""
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if resize is not None and (len(resize) != 2 or min(resize) < 1):
        raise ValueError(f"resize must be (height, width), both positive, got {resize}")
    listing = scan_source(source, limit=limit)
    engine = engine or ThreadImportEngine(workers=workers, progress=progress)
    scanned: list[ScannedImage | SourceImageError] = []
    for item in engine.scan(listing):
        if isinstance(item, SourceImageError) and on_error == "fail":
            raise item
        scanned.append(item)
    return plan_from_scans(listing, scanned, resize)


def plan_from_scans(listing: SourceListing, scanned: Sequence[ScannedImage | SourceImageError],
                    resize: tuple[int, int] | None) -> ImportPlan:
    """The plan made of each image's scan (in listing order): the kept images, the specs of
    the encoded copy and (with a resize) of the raw copy, and what was skipped."""
    skipped = tuple((listing.paths[k], item.reason) for k, item in enumerate(scanned)
                    if isinstance(item, SourceImageError))
    keep = np.array([k for k, item in enumerate(scanned) if isinstance(item, ScannedImage)],
                    dtype=np.int64)
    if keep.size == 0:
        raise DatasetError(f"{listing.origin}: none of the {len(listing)} images could be "
                           f"imported; the first: {skipped[0][0]}: {skipped[0][1]}")
    images = [scanned[k] for k in keep]
    listing = listing.subset(keep)
    checksums = np.array([im.checksum for im in images], dtype=np.uint32)
    encodings = {im.encoding for im in images}
    sizes = {(im.height, im.width) for im in images}
    height, width = sizes.pop() if len(sizes) == 1 else (0, 0)  # 0: sizes differ
    common = {
        "num_samples": len(images),
        "class_names": listing.class_names,
        "source": str(listing.origin),
        "source_digest": hashlib.sha256(checksums.astype("<u4").tobytes()).hexdigest(),
    }
    encoded = ImportedSpec(
        encoding=encodings.pop() if len(encodings) == 1 else "mixed",
        stored_bytes=sum(im.size for im in images), height=height, width=width,
        decoded_bytes=sum(im.height * im.width * 3 for im in images), **common,
    )
    raw = None
    if resize is not None:
        h, w = int(resize[0]), int(resize[1])
        raw = ImportedSpec(encoding="raw", stored_bytes=len(images) * h * w * 3, height=h,
                           width=w, decoded_bytes=len(images) * h * w * 3,
                           resize_filter=RESIZE_FILTER, **common)
    return ImportPlan(listing, encoded, raw, checksums, skipped)


def source_samples(plan: ImportPlan, spec: ImportedSpec) -> Callable[[], Iterator]:
    """A factory of ``spec``'s samples from the source files, in order (``prepared_sample``)."""
    listing = plan.listing

    def samples() -> Iterator[tuple[np.ndarray | bytes, int]]:
        for k, rel in enumerate(listing.paths):
            label = int(listing.labels[k])
            yield prepared_sample(listing.root / rel, label, int(plan.checksums[k]), spec), label

    return samples


def check_out_outside_source(source: Path, out_dir: Path) -> None:
    """Refuse an output folder inside the folder being imported: the next import of the
    source would take the datasets written there for a class of images."""
    if not source.is_dir():
        return
    real_source, real_out = os.path.realpath(source), os.path.realpath(out_dir)
    if real_out == real_source or real_out.startswith(real_source.rstrip("/") + "/"):
        raise ValueError(f"--out {out_dir} is inside the source folder {source}: write the "
                         "datasets outside the images being imported")


def parse_resize(text: str | None) -> tuple[int, int] | None:
    """``"224x224"`` (or ``"224"``) -> (224, 224)."""
    if text is None:
        return None
    parts = text.lower().split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or min(values, default=0) < 1:
        raise ValueError(f"--resize takes HxW (e.g. 224x224) or one size, got {text!r}")
    return (values[0], values[-1])


def import_images(
    source: Path | str,
    out_dir: Path | str,
    *,
    formats: Sequence[str] | None = None,
    resize: tuple[int, int] | None = None,
    limit: int | None = None,
    on_error: str = "fail",
    workers: int | None = None,
    progress: bool = True,
    force: bool = False,
    log: Callable[[str], None] | None = None,
    knobs: dict[str, dict] | None = None,
    engine: str = DEFAULT_ENGINE,
    address: str | None = None,
) -> list:
    """Import ``source`` into ``out_dir/<format>-<encoding>`` for every format (or those
    named) that can hold it; returns the ``BuildResult`` of each copy. ``knobs``: a format's
    knobs by its name (its defaults otherwise). ``engine`` (``IMPORT_ENGINES``) reads,
    checks and resizes the images; every engine hands the writers the same samples in the
    same order, so the datasets are the same bytes (``storebench.ray_import``).

    Without ``resize`` the encoded formats are written and raw-only formats (memmap) are
    skipped with a log line saying why; naming a raw-only format explicitly without a resize
    is an error. With ``resize`` every format also gets a raw copy of the resized pixels.
    """
    from .formats import FORMATS, get_format

    say = log or (lambda line: None)
    check_out_outside_source(Path(source), Path(out_dir))
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    names = list(formats or FORMATS.core)
    modules = {name: get_format(name) for name in names}
    if resize is None and formats:
        raw_only = [n for n in names if set(modules[n].ENCODINGS) == {"raw"}]
        if raw_only:
            raise ValueError(
                f"{', '.join(raw_only)} store raw arrays of one size only: pass --resize HxW "
                "(resize=(H, W)) to write them"
            )
    with open_engine(engine, workers=workers, progress=progress, address=address) as runner:
        plan = plan_import(source, resize=resize, limit=limit, on_error=on_error,
                           engine=runner)
        return _write_copies(plan, runner, out_dir, names, modules, workers=workers,
                             progress=progress, force=force, say=say, knobs=knobs)


def _write_copies(plan: ImportPlan, runner, out_dir: Path | str, names: list[str],
                  modules: dict, *, workers: int | None, progress: bool, force: bool,
                  say: Callable[[str], None], knobs: dict[str, dict] | None) -> list:
    """Every chosen format's copy of the plan's encoded (and raw) samples, each format
    written by its one writer from one sample cache."""
    from .formats import build_dataset
    from .formats.build import SampleCache

    if plan.skipped:
        say(f"skipped {len(plan.skipped)} unreadable image(s), listed in sources.json; "
            f"the first: {plan.skipped[0][0]}: {plan.skipped[0][1]}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for spec in (plan.encoded_spec, plan.raw_spec):
        if spec is None:
            continue
        chosen = [n for n in names if spec.encoding in modules[n].ENCODINGS]
        for name in names:
            if name not in chosen and plan.raw_spec is None:
                say(f"skip   {name}: stores {'/'.join(modules[name].ENCODINGS)} only; "
                    "import with --resize HxW to write it")
        with SampleCache(spec, out_dir, workers=workers, progress=progress,
                         samples=runner.samples(plan, spec)) as cache:
            for name in chosen:
                result = build_dataset(spec, name, out_dir, source=cache, force=force,
                                       progress=progress, knobs=(knobs or {}).get(name),
                                       sidecars={"sources.json": plan.sources_sidecar()})
                results.append(result)
                m = result.manifest
                say(f"{'exists' if result.skipped else 'built '} {result.path}  "
                    f"{m['num_samples']} images, {spec.num_classes} classes, "
                    f"{m['bytes_apparent'] / 1e6:.1f} MB, {m['file_count']} files")
    return results
