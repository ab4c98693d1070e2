"""Strict ``.npy`` reading for the small arrays beside the data (labels, offset indexes,
checksums) and the header of ``images.npy``.

``np.load`` trusts the header: a damaged one can claim a shape of terabytes (``MemoryError``),
fail inside NumPy's header tokenizer (``tokenize.TokenError``) or describe more bytes than the
file holds. Here the header is parsed, the dtype and layout compared with what the caller
expects, and the data length with the file length, before anything is allocated; every
failure is a ``DatasetError`` naming the file.
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

import numpy as np

from .base import DatasetError

# What NumPy's header parser can raise on garbage: bad literals, bad tokens, wrong types.
_HEADER_ERRORS = (ValueError, SyntaxError, TypeError, tokenize.TokenError, RecursionError)


def parse_header(f, path: Path | str) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, data offset)`` of the ``.npy`` file open as ``f`` (at its start)."""
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except _HEADER_ERRORS as err:
        raise DatasetError(f"{path}: damaged .npy header: {err}") from err
    if fortran_order or dtype.hasobject:
        raise DatasetError(f"{path}: .npy header describes a {dtype} Fortran-order array")
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise DatasetError(f"{path}: .npy header has a bad shape {shape!r}")
    return tuple(shape), dtype, f.tell()


def _check_layout(
    path: Path | str, shape: tuple, dtype: np.dtype, data_bytes: int, want_dtype, ndim: int
) -> None:
    if dtype != np.dtype(want_dtype) or len(shape) != ndim:
        raise DatasetError(
            f"{path}: holds {dtype} with {len(shape)} dimensions, expected "
            f"{np.dtype(want_dtype)} with {ndim}"
        )
    expected = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if expected != data_bytes:
        raise DatasetError(
            f"{path}: header describes {shape} ({expected} bytes), the file holds {data_bytes} "
            "bytes of data"
        )


def loads(data: bytes, path: Path | str, *, dtype, ndim: int) -> np.ndarray:
    """The array in ``data`` (a whole ``.npy`` file already read), read-only."""
    stream = io.BytesIO(data)
    shape, found, offset = parse_header(stream, path)
    _check_layout(path, shape, found, len(data) - offset, dtype, ndim)
    return np.frombuffer(data, dtype=found, offset=offset).reshape(shape)


def load(path: Path | str, *, dtype, ndim: int, limit: int = 1 << 31) -> np.ndarray:
    """Read a whole small ``.npy`` file strictly: a regular file (a FIFO or device is
    refused, not waited on) of at most ``limit`` bytes."""
    from .confine import read_regular

    return loads(read_regular(path, limit=limit), path, dtype=dtype, ndim=ndim)


def open_memmap(path: Path | str, *, dtype, ndim: int) -> np.memmap:
    """A read-only map of a ``.npy`` file's data, after checking its header and length."""
    from .confine import open_regular

    try:
        with open(open_regular(path), "rb") as f:  # a FIFO or device is refused, not read
            shape, found, offset = parse_header(f, path)
            f.seek(0, io.SEEK_END)
            size = f.tell()
    except OSError as err:
        raise DatasetError(f"{path}: cannot read: {err}") from err
    _check_layout(path, shape, found, size - offset, dtype, ndim)
    try:
        return np.memmap(path, dtype=found, mode="r", offset=offset, shape=shape)
    except (OSError, ValueError) as err:
        raise DatasetError(f"{path}: cannot map: {err}") from err


def write_header(f, shape: tuple[int, ...], dtype) -> None:
    """The header ``np.save`` writes for an array of ``shape`` and ``dtype`` (C order)."""
    np.lib.format.write_array_header_1_0(
        f,
        {
            "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
            "fortran_order": False,
            "shape": tuple(shape),
        },
    )
