"""Raw files in the ImageFolder layout: ``root/<class>/<index>.<ext>``.

``.npy`` (one (H, W, C) uint8 array per file) for raw samples, ``.png`` / ``.jpg`` for encoded
ones (each file by its own signature in a mixed set); ``<index>`` is zero-padded so that a
directory listing sorts in index order. ``<class>`` is the label number for synthetic sets
and the class name for imported ones. The layout is what ``torchvision.datasets.ImageFolder``
reads.

Every file is read whole, so its fingerprint (the CRC32C of its first and last 4 KiB, the
whole file for files up to 8 KiB) is checked on each read rather than at open, where it would
cost one more open per sample: a swapped or replaced file is refused with ``verify=False``
too. A changed byte in the middle of a file larger than 8 KiB is caught by ``verify=True``
only.
"""

from __future__ import annotations

import builtins
import io
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from data_gen import DatasetSpec

from .base import CorruptSampleError, DatasetError, Reader, sniff_encoding
from .manifest import bytes_fingerprint
from .remote_reader import RemoteReader
from .specs import Spec, is_imported
from .traits import FormatTraits

NAME = "rawfiles"
ENCODINGS = ("raw", "png", "jpeg", "mixed")
DEFAULT_KNOBS: dict = {}
OPEN_OPTIONS: tuple = ()
TRAITS = FormatTraits()
EXTENSIONS = {"raw": ".npy", "png": ".png", "jpeg": ".jpg"}
# One file per sample, each rounded up to whole filesystem blocks (4 KiB).
SIZE_OVERHEAD = {"raw": 1.35, "png": 1.35, "jpeg": 1.35, "mixed": 1.35}
# Fingerprints are checked as each file is read (see the module docstring).
FINGERPRINTS_AT_OPEN = False


def index_width(num_samples: int) -> int:
    return max(6, len(str(num_samples - 1)))


def npy_header(spec: DatasetSpec) -> bytes:
    """The exact .npy header np.save writes for one sample of ``spec``."""
    buffer = io.BytesIO()
    np.save(buffer, np.zeros(spec.image_shape, dtype=np.uint8))
    return buffer.getvalue()[: -spec.raw_sample_bytes]


def class_dirs(spec: Spec) -> list[str]:
    """The directory name of each label: its class name for imported sets."""
    if is_imported(spec):
        return list(spec.class_names)
    return [str(label) for label in range(spec.num_classes)]


def extensions_for(encoding: str) -> tuple[str, ...]:
    return (EXTENSIONS["jpeg"], EXTENSIONS["png"]) if encoding == "mixed" else (
        EXTENSIONS[encoding],)


def sample_path(root: Path, spec: Spec, index: int, label: int, ext: str | None = None) -> Path:
    ext = ext or EXTENSIONS[spec.encoding]
    return root / class_dirs(spec)[label] / f"{index:0{index_width(spec.num_samples)}d}{ext}"


def write(samples: Iterable, root: Path, spec: Spec) -> None:
    for name in class_dirs(spec):
        (root / name).mkdir()
    header = npy_header(spec) if spec.encoding == "raw" else b""
    count = 0
    for i, (image, label) in enumerate(samples):
        payload = header + image.tobytes() if spec.encoding == "raw" else image
        ext = None
        if spec.encoding == "mixed":
            found = sniff_encoding(payload)
            if found is None:
                raise DatasetError(f"{root}: sample {i} is neither PNG nor JPEG")
            ext = EXTENSIONS[found]
        with builtins.open(sample_path(root, spec, i, label, ext), "wb") as f:
            f.write(payload)
        count += 1
    if count != spec.num_samples:
        raise DatasetError(f"{root}: got {count} samples, the spec says {spec.num_samples}")


class RawFilesReader(Reader):
    """One file read per sample. Labels come from the directory names, found at open time."""

    def __init__(self, root: Path, manifest: dict, *, verify: bool = True) -> None:
        super().__init__(root, manifest, verify=verify)
        self._h_labels: np.ndarray | None = None
        self._h_exts: np.ndarray | None = None
        # A sample's file name is built from these as a string: pathlib's joins cost as
        # much as a warm read of a 12 KiB file.
        self._dirs = class_dirs(self.spec)
        self._width = index_width(self.spec.num_samples)
        self._allowed = extensions_for(self.spec.encoding)
        self._root_text = str(self.root)

    def _list_class_dir(self, name: str) -> list[str]:
        """The file names in one class directory (none if it does not exist)."""
        folder = self.root / name
        return [entry.name for entry in os.scandir(folder)] if folder.is_dir() else []

    def _fetch(self, name: str, index: int) -> bytes:
        """The bytes of sample ``index``'s file ``name`` (relative to the root, POSIX); an
        I/O hook: ``storebench.remote`` reads an object."""
        try:
            with builtins.open(f"{self._root_text}/{name}", "rb", buffering=0) as f:
                return f.read()
        except OSError as err:
            raise CorruptSampleError(self.root / name, index, f"cannot read: {err}") from err

    def _open(self) -> None:
        labels = np.full(len(self), -1, dtype=np.int64)
        allowed = extensions_for(self.spec.encoding)
        exts = np.zeros(len(self), dtype=np.uint8)  # index into ``allowed``
        for label, name in enumerate(class_dirs(self.spec)):
            for entry in self._list_class_dir(name):
                stem, dot, suffix = entry.partition(".")
                if "." + suffix not in allowed or not stem.isdigit() or int(stem) >= len(self):
                    raise DatasetError(
                        f"{self.root / name / entry}: unexpected file in the ImageFolder layout"
                    )
                labels[int(stem)] = label
                exts[int(stem)] = allowed.index("." + suffix)
        missing = np.flatnonzero(labels < 0)
        if missing.size:
            raise CorruptSampleError(
                self.root, int(missing[0]), f"no file for this sample ({missing.size} missing)"
            )
        self._check_integrity("labels_crc32c", labels, self.root, "labels (class directories)")
        self._h_labels = labels
        self._h_exts = exts
        self._npy_header = npy_header(self.spec) if self.is_raw else b""

    def _close(self) -> None:
        self._h_labels = None
        self._h_exts = None

    def _locate(self, index: int) -> Path:
        if self._h_labels is None:
            return sample_path(self.root, self.spec, index, 0)
        return self.root / self._name_of(index)

    def _name_of(self, index: int) -> str:
        """Sample ``index``'s file, relative to the root (as the manifest lists it)."""
        ext = self._allowed[self._h_exts[index]]
        return f"{self._dirs[self._h_labels[index]]}/{index:0{self._width}d}{ext}"

    def _read_bytes(self, index: int) -> bytes:
        name = self._name_of(index)
        return self._check_bytes(name, index, self._fetch(name, index))

    def _check_bytes(self, name: str, index: int, data: bytes) -> bytes:
        """``data`` if it is the file ``name`` the manifest lists for sample ``index`` (its
        size and fingerprint), else ``CorruptSampleError``."""
        recorded = self.manifest["fingerprints"].get(name)
        if recorded is None:
            raise CorruptSampleError(self.root / name, index, "file not listed in the manifest")
        if len(data) != self.manifest["files"][name]:
            raise CorruptSampleError(
                self.root / name, index,
                f"{len(data)} bytes, the manifest says {self.manifest['files'][name]}"
            )
        if bytes_fingerprint(data, recorded["head"], recorded["tail"]) != recorded["crc32c"]:
            raise CorruptSampleError(
                self.root / name, index,
                "not the file this dataset was built with (fingerprint differs)"
            )
        return data

    def _read_one(self, index: int) -> tuple[np.ndarray | bytes, int]:
        return self._sample(index, self._read_bytes(index))

    def _sample(self, index: int, data: bytes) -> tuple[np.ndarray | bytes, int]:
        """Sample ``index`` from its file's checked bytes."""
        label = int(self._h_labels[index])
        if not self.is_raw:
            return data, label
        header = self._npy_header
        if not data.startswith(header):
            raise CorruptSampleError(self._locate(index), index, "not the expected .npy header")
        return self._decode_raw(memoryview(data)[len(header) :], index).copy(), label


def open(root: Path, manifest: dict, **options) -> RawFilesReader:  # noqa: A001 - registry verb
    return RawFilesReader(root, manifest, **options)


# -- over object storage ----------------------------------------------------------
# One object per sample over S3: a batch is one GET per sample, all in flight at once; the
# labels come from the class prefixes in one listing.
class RemoteRawFilesReader(RemoteReader, RawFilesReader):
    def _open(self) -> None:
        self._h_listing: dict[str, list[str]] = {}
        for name in self.store.sizes():
            folder, _, file_name = name.rpartition("/")
            if folder:
                self._h_listing.setdefault(folder, []).append(file_name)
        super()._open()

    def _list_class_dir(self, name: str) -> list[str]:
        return self._h_listing.get(name, [])

    def _fetch(self, name: str, index: int) -> bytes:
        return self.store.read(name)

    def _read_many(self, indices: np.ndarray, out: np.ndarray | None):
        labels = np.empty(len(indices), dtype=np.int64)
        images = self._raw_buffer(len(indices), out) if self.is_raw else [b""] * len(indices)
        names = [self._name_of(i) for i in indices.tolist()]
        fetched = self.store.read_many(names)
        for k, (index, name, data) in enumerate(zip(indices.tolist(), names, fetched)):
            images[k], labels[k] = self._sample(index, self._check_bytes(name, index, data))
        return images, labels


def open_remote(store, manifest: dict, **options) -> RemoteRawFilesReader:
    return RemoteRawFilesReader(store, manifest, **options)
