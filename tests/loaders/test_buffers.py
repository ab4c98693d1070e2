"""Batch buffers start half a page past a page boundary (``storebench.buffers``), wherever
storebench allocates one: a destination 1 to 31 bytes past its source modulo 4 KiB makes row
copies several times slower."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from storebench.buffers import BATCH_BUFFER_OFFSET, PAGE, batch_empty
from storebench.formats import open_dataset
from storebench.loaders import LazyDataset, PreloadedDataset
from storebench.loaders.batching import batch_buffer


@pytest.mark.parametrize(("shape", "dtype"), [((256, 64, 64, 3), np.uint8), (7, np.float32),
                                              ((3, 5), np.int64), ((0, 4), np.uint8)])
def test_batch_empty_starts_half_a_page_past_a_boundary(shape, dtype):
    array = batch_empty(shape, dtype)
    assert array.shape == ((shape,) if isinstance(shape, int) else shape)
    assert array.dtype == dtype and array.flags.c_contiguous and array.flags.writeable
    if array.size:
        assert array.ctypes.data % PAGE == BATCH_BUFFER_OFFSET == 2048
        array[...] = 7
        copy = pickle.loads(pickle.dumps(array))
        assert np.array_equal(copy, array) and copy.dtype == dtype


def test_buffers_storebench_allocates_are_offset(build_ci):
    assert batch_buffer(8, (32, 32, 3)).ctypes.data % PAGE == BATCH_BUFFER_OFFSET
    for name in ("memmap", "parquet", "rawfiles"):
        with open_dataset(build_ci(name, "raw")) as reader:
            images, _ = reader.read_many(np.arange(10))
            assert images.ctypes.data % PAGE == BATCH_BUFFER_OFFSET, name
            batch = LazyDataset(reader, gather_threads=2).get_batch(np.arange(300))
            assert batch.images.ctypes.data % PAGE == BATCH_BUFFER_OFFSET, name
            preloaded = PreloadedDataset(reader, progress=False)
            assert preloaded.get_batch([3, 1]).images.ctypes.data % PAGE == BATCH_BUFFER_OFFSET


def test_a_lockable_batch_buffer_has_a_mapping_of_its_own_half_a_page_in():
    """Page-locking registers whole pages: the buffer's mapping holds nothing else, starts
    on a page, and the buffer starts half a page into it like every other batch buffer."""
    from storebench.loaders.pinning import lockable_batch_buffer, mapping_of

    buffer = lockable_batch_buffer(5, (7, 9, 3))
    start, length = mapping_of(buffer)
    assert buffer.shape == (5, 7, 9, 3) and buffer.dtype == np.uint8
    assert buffer.flags.c_contiguous and buffer.flags.writeable
    assert start % PAGE == 0 and buffer.ctypes.data - start == BATCH_BUFFER_OFFSET
    assert start + length >= buffer.ctypes.data + buffer.nbytes
    assert mapping_of(buffer[2:]) == (start, length)  # a batch's slice finds it too
    with pytest.raises(ValueError, match="does not lie in a mapping of its own"):
        mapping_of(np.zeros(4))
