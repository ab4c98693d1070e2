"""One confinement rule for every name that comes from data, and reads of regular files only.

A dataset, an image folder or a bucket may come from someone else, so the names its manifest,
``sources.json`` or object listing holds are data, not paths to trust (see docs/security.md):

- ``check_name``: a name is relative, non-empty, POSIX, with no ``..`` or ``.`` part, no empty
  part, no NUL and no backslash. It holds for object keys too (``s3://`` prefixes).
- ``confined_path``: the name joined to the root and resolved (symlinks followed) stays under
  the resolved root, so a symlink out of the dataset is refused as a ``../`` name would be.
- ``open_regular`` / ``read_regular``: a file is opened with ``O_NONBLOCK`` (a FIFO does not
  block the open) and ``fstat``-ed before anything is read; a FIFO, device, socket or
  directory is refused by name, and a read is bounded by a size the caller states.

Every refusal is a ``ManifestError`` (an entry of the data is wrong) or a ``DatasetError`` (a
file is not what it must be), naming the entry or file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .base import DatasetError, ManifestError

# The most pixels (height x width) an image may have, in a spec or in a file to decode:
# Pillow's own DecompressionBombError threshold (2 x Image.MAX_IMAGE_PIXELS), about 179
# million pixels (a 13,000 x 13,000 image, 0.5 GB as RGB). Override with the environment
# variable STOREBENCH_MAX_IMAGE_PIXELS (docs/security.md).
DEFAULT_MAX_IMAGE_PIXELS = 2 * 89_478_485
MAX_IMAGE_PIXELS_ENV = "STOREBENCH_MAX_IMAGE_PIXELS"
# The largest single stored sample or source image read in one piece (an index entry that
# places a bigger member, in a sparse shard, say, is refused before any read is sized).
MAX_SAMPLE_BYTES = 512 << 20

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
)


def max_image_pixels() -> int:
    """The pixel cap: ``STOREBENCH_MAX_IMAGE_PIXELS`` if set, else the default."""
    text = os.environ.get(MAX_IMAGE_PIXELS_ENV, "")
    try:
        value = int(text) if text else DEFAULT_MAX_IMAGE_PIXELS
    except ValueError:
        raise ValueError(f"{MAX_IMAGE_PIXELS_ENV}={text!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"{MAX_IMAGE_PIXELS_ENV} must be at least 1, got {value}")
    return value


def check_pixels(height: int, width: int, where: object, *, what: str = "image") -> None:
    """Refuse an image of more than ``max_image_pixels()`` pixels before anything is
    allocated for it."""
    cap = max_image_pixels()
    if height * width > cap:
        raise DatasetError(
            f"{where}: {what} of {height} x {width} pixels exceeds the cap of {cap} pixels "
            f"(a decompression bomb, or a bigger image than expected: raise "
            f"{MAX_IMAGE_PIXELS_ENV} to allow it)")


def file_kind(mode: int) -> str:
    """What a file of ``mode`` is, in words ("a FIFO", "a regular file"...)."""
    return next((words for test, words in _KINDS if test(mode)), "a regular file"
                if stat.S_ISREG(mode) else "not a regular file")


def check_name(name: object, where: object, *, what: str = "entry") -> str:
    """``name`` if it is a safe relative POSIX name, else ``ManifestError`` naming it and
    ``where`` it came from (the manifest, ``sources.json``...)."""
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{where}: {what} {name!r} is not a non-empty name")
    problem = None
    if "\0" in name:
        problem = "holds a NUL byte"
    elif "\\" in name:
        problem = "holds a backslash"
    elif name.startswith("/"):
        problem = "is an absolute path"
    elif any(part in ("", ".", "..") for part in name.split("/")):
        problem = "has a '..', '.' or empty part"
    if problem:
        raise ManifestError(
            f"{where}: {what} {name!r} {problem}: names in a dataset must stay inside it")
    return name


def check_names(names, where: object, *, what: str = "entry") -> None:
    for name in names:
        check_name(name, where, what=what)


def resolved_root(root: Path | str) -> Path:
    return Path(os.path.realpath(root))


def is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def confined_path(root: Path | str, name: str, where: object, *, what: str = "entry",
                  real_root: str | None = None) -> Path:
    """``root / name`` after ``check_name``, refused when it resolves outside the resolved
    ``root`` (a symlink out); ``real_root``: ``os.path.realpath(root)`` when already known."""
    check_name(name, where, what=what)
    real_root = real_root or os.path.realpath(root)
    real = os.path.realpath(os.path.join(root, name))
    if not is_under(real, real_root):
        raise ManifestError(
            f"{where}: {what} {name!r} resolves to {real}, outside {real_root} (a symbolic "
            "link out of the dataset)")
    return Path(root) / name


def open_regular(path: Path | str, *, follow: bool = True) -> int:
    """A read-only descriptor of ``path`` if it is a regular file, else ``DatasetError``
    saying what it is. ``O_NONBLOCK``: opening a FIFO returns at once instead of waiting for
    a writer; ``follow=False`` refuses a symbolic link as the last part."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing") from None
    except OSError as err:
        raise DatasetError(f"{path}: cannot open: {err.strerror or err}") from err
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise DatasetError(f"{path}: is {file_kind(mode)}, not a regular file: refused")
    return fd


def read_fd(fd: int, path: Path | str, *, limit: int) -> bytes:
    """The whole regular file open as ``fd``, refused if it holds more than ``limit`` bytes
    (checked before reading, and again while reading: a file that grows is cut off)."""
    size = os.fstat(fd).st_size
    if size > limit:
        raise DatasetError(f"{path}: {size} bytes, more than the {limit} allowed here")
    chunks, got = [], 0
    while True:
        # os.read allocates what it is asked for: ask for the file's size (one read for a
        # sample), never the whole limit at once.
        chunk = os.read(fd, min(limit + 1 - got, max(size + 1 - got, 1 << 16), 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
        if got > limit:
            raise DatasetError(f"{path}: more than the {limit} bytes allowed here")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_regular(path: Path | str, *, limit: int) -> bytes:
    """``path``'s bytes if it is a regular file of at most ``limit`` bytes."""
    fd = open_regular(path)
    try:
        return read_fd(fd, path, limit=limit)
    except OSError as err:
        raise DatasetError(f"{path}: cannot read: {err.strerror or err}") from err
    finally:
        os.close(fd)


def check_regular(path: Path | str, where: object, *, what: str = "entry") -> os.stat_result:
    """``stat`` of a listed file (links followed: confinement is ``confined_path``'s job):
    a regular file, else a ``ManifestError`` saying what it is."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ManifestError(f"{path}: listed in the manifest but missing") from None
    except OSError as err:  # a symlink loop (ELOOP), a name too long...
        raise ManifestError(f"{path}: cannot stat {what}: {err.strerror or err}") from err
    if not stat.S_ISREG(st.st_mode):
        raise ManifestError(f"{path}: {what} is {file_kind(st.st_mode)}, not a regular file")
    return st
