"""storebench._rows: the interleaved row gather every raw batch goes through
(``storebench.gather.take_rows``), and a raw batch's checksums (``sample_checksums``)."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from storebench._rows import crc32c_rows, crc32c_rows_portable
from storebench._rows import take_rows as c_take_rows
from storebench.formats import sample_checksums
from storebench.gather import take_rows


def _rows(count: int, shape: tuple[int, ...], dtype=np.uint8, seed: int = 0) -> np.ndarray:
    data = np.random.default_rng(seed).integers(0, 255, (count, *shape), dtype=np.uint8)
    return data.astype(dtype)


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 17, 255, 256])
@pytest.mark.parametrize("width", [1, 63, 64, 65, 200, 12_288])
def test_every_group_and_tail_is_the_rows_asked_for(count, width):
    # Groups of eight rows in 64-byte turns, then the rows and bytes left over: every split.
    rows = _rows(300, (width,), seed=width)
    indices = np.random.default_rng(count).integers(0, len(rows), count)
    out = np.full((count, width), 7, np.uint8)
    assert take_rows(rows, indices, out) is out
    assert out.tobytes() == rows[indices].tobytes()


def test_image_rows_of_any_dtype_keep_their_bytes_and_order():
    rows = _rows(50, (4, 5, 3), dtype=np.float32)
    indices = np.array([49, 0, 0, 17, 3, 48, 2, 1, 30], dtype=np.int64)
    out = np.empty((len(indices), 4, 5, 3), np.float32)
    take_rows(rows, indices, out)
    assert out.tobytes() == b"".join(rows[k].tobytes() for k in indices)


def test_reads_a_read_only_file_map(tmp_path):
    rows = _rows(40, (96,))
    path = tmp_path / "rows.bin"
    path.write_bytes(rows.tobytes())
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        mapped_rows = np.frombuffer(mapped, np.uint8).reshape(40, 96)
        assert not mapped_rows.flags.writeable
        out = np.empty((3, 96), np.uint8)
        take_rows(mapped_rows, np.array([39, 5, 20]), out)
        del mapped_rows
    assert out.tobytes() == rows[[39, 5, 20]].tobytes()


@pytest.mark.parametrize(("bad", "position"), [(40, 2), (-1, 1), (2**40, 0)])
def test_an_index_out_of_range_is_refused_before_any_byte_is_written(bad, position):
    rows = _rows(40, (16,))
    indices = np.array([3, 4, 5], dtype=np.int64)
    indices[position] = bad
    out = np.full((3, 16), 9, np.uint8)
    with pytest.raises(IndexError, match=rf"row index {bad} \(position {position}\) out of "
                                         r"range for 40 rows"):
        take_rows(rows, indices, out)
    assert (out == 9).all()


def test_indices_of_another_integer_type_are_taken_as_int64():
    rows = _rows(20, (8,))
    out = np.empty((3, 8), np.uint8)
    take_rows(rows, np.array([19, 0, 7], dtype=np.int32), out)
    assert out.tobytes() == rows[[19, 0, 7]].tobytes()
    take_rows(rows, [1, 2, 3], out)
    assert out.tobytes() == rows[[1, 2, 3]].tobytes()


def test_mismatched_buffers_are_refused_with_what_is_wrong():
    rows = _rows(20, (8,))
    with pytest.raises(TypeError, match="rows are uint8 and out is float32"):
        take_rows(rows, np.arange(2), np.empty((2, 8), np.float32))
    with pytest.raises(ValueError, match=r"out has shape \(3, 8\), 2 rows asked"):
        take_rows(rows, np.arange(2), np.empty((3, 8), np.uint8))
    with pytest.raises(ValueError, match="out holds 18 bytes, 2 rows of 8 bytes need 16"):
        take_rows(rows, np.arange(2), np.empty((2, 9), np.uint8))
    with pytest.raises(ValueError, match="out overlaps rows"):
        take_rows(rows, np.arange(2), rows[10:12])
    read_only = np.empty((2, 8), np.uint8)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        take_rows(rows, np.arange(2), read_only)
    with pytest.raises(TypeError, match="1-D int64"):
        c_take_rows(rows, np.arange(4).reshape(2, 2), np.empty((2, 8), np.uint8))
    with pytest.raises(TypeError, match="format 'i'"):
        c_take_rows(rows, np.arange(2, dtype=np.int32), np.empty((2, 8), np.uint8))
    with pytest.raises(IndexError, match="out of range for 0 rows"):
        take_rows(rows[:0], np.array([0]), np.empty((1, 8), np.uint8))


def test_strided_rows_or_out_take_numpy_with_the_same_result_and_checks():
    rows = _rows(30, (12,))
    indices = np.array([29, 1, 1, 14])
    strided_out = np.zeros((4, 24), np.uint8)[:, ::2]
    take_rows(rows, indices, strided_out)
    assert strided_out.tobytes() == rows[indices].tobytes()
    strided_rows = rows[:, ::3]
    out = np.empty((4, 4), np.uint8)
    take_rows(strided_rows, indices, out)
    assert out.tobytes() == strided_rows[indices].tobytes()
    with pytest.raises(IndexError, match="row index -2 out of range for 30 rows"):
        take_rows(strided_rows, np.array([0, -2]), out[:2])


@pytest.mark.parametrize("width", [0, 1, 7, 8, 9, 63, 12_288])
@pytest.mark.parametrize("count", [0, 1, 3, 4, 5, 9])
def test_batch_checksums_are_the_per_sample_crc32c_of_bytes_then_label(width, count):
    # Four rows' CRCs interleaved, then the rows left over; the table-driven path too.
    import crc32c

    rows = _rows(count, (width,), seed=width + count)
    labels = np.random.default_rng(count).integers(-3, 1 << 40, count)
    expected = [crc32c.crc32c(int(label).to_bytes(8, "little", signed=True),
                              crc32c.crc32c(row.tobytes())) for row, label in zip(rows, labels)]
    assert sample_checksums(rows, labels).tolist() == expected
    portable = np.empty(count, np.uint32)
    crc32c_rows_portable(rows, labels, portable)
    assert portable.tolist() == expected


def test_batch_checksums_refuse_mismatched_labels_and_out():
    rows = _rows(4, (16,))
    with pytest.raises(ValueError, match="labels must be a 1-D int64 array of 4 values"):
        crc32c_rows(rows, np.arange(3), np.empty(4, np.uint32))
    with pytest.raises(ValueError, match="out must be a 1-D uint32 array of 4 values"):
        crc32c_rows(rows, np.arange(4), np.empty(4, np.uint64))


def test_rows_that_fault_in_from_the_device_are_copied_one_after_the_other(tmp_path):
    # Eight rows faulting at once put eight read-around windows in flight; under a memory
    # limit that evicted pages before their rows were copied. A cold map is read row by row.
    import os

    rows = _rows(2000, (12_288,))
    path = tmp_path / "rows.bin"
    with open(path, "wb") as file:
        file.write(rows.tobytes())
        file.flush()
        os.fsync(file.fileno())
    indices = np.random.default_rng(5).permutation(2000)[:256]
    out = np.empty((256, 12_288), np.uint8)
    with open(path, "rb") as file:
        os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        with mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ) as mapped:
            mapped.madvise(mmap.MADV_RANDOM)  # one page per fault: every row faults
            cold = np.frombuffer(mapped, np.uint8).reshape(2000, 12_288)
            assert c_take_rows(cold, indices, out) is True
            assert out.tobytes() == rows[indices].tobytes()
            assert c_take_rows(cold, indices, out) is False  # now in memory: interleaved
            assert out.tobytes() == rows[indices].tobytes()
            del cold
