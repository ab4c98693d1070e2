"""The measurement functions count what they deliver correctly (no timings asserted)."""

from __future__ import annotations

import numpy as np
import pytest

from storebench.formats import open_dataset
from storebench.loaders import Batch, LazyDataset, PreloadedDataset
from storebench.loaders import throughput as T


def test_measure_counts_samples_and_bytes_after_warmup():
    batches = [
        Batch(np.zeros((n, 2, 2, 3), np.uint8), np.zeros(n, np.int64), np.arange(n))
        for n in (4, 5, 6, 7)
    ]
    m = T.measure(batches, name="x", warmup_batches=1)
    assert (m.samples, m.bytes, m.batches) == (18, 18 * 12, 3)
    assert m.seconds > 0 and m.samples_per_second > 0
    assert T.measure(batches, name="x", warmup_batches=0, max_batches=2).samples == 9
    with pytest.raises(ValueError, match="fewer batches"):
        T.measure(batches, name="x", warmup_batches=5)


def test_batch_assembly_runs_as_many_batches_as_asked(memmap_raw):
    m = T.shuffled_batch_assembly(
        PreloadedDataset(memmap_raw, progress=False), batch_size=100, num_batches=12
    )  # more than one epoch of 5 batches
    assert (m.batches, m.samples, m.bytes) == (12, 1200, 1200 * 32 * 32 * 3)
    results = T.target_batch_assembly(memmap_raw, batch_size=64, num_batches=3)
    assert sorted(results) == ["memmap", "preloaded"]
    assert all(r.samples == 192 for r in results.values())
    assert T.dram_read_bandwidth(nbytes=1 << 20, repeats=2) > 0


@pytest.mark.timeout(120)
def test_process_prefetch_target_compares_three_loaders(memmap_raw):
    results = T.target_process_prefetch(
        LazyDataset(memmap_raw), workers=2, batch_size=64, start_method="fork", max_batches=4
    )
    assert sorted(results) == ["pickled_baseline", "process_prefetcher", "torch_dataloader"]
    assert all((r.batches, r.samples) == (4, 256) for r in results.values())


def test_thread_decode_and_block_shuffle_targets(build_ci, encoded_format):
    with open_dataset(build_ci(encoded_format, "jpeg")) as reader:
        dataset = LazyDataset(reader, decode="simplejpeg")
        results = T.target_thread_decode(dataset, batch_size=32, max_batches=3)
        assert {k: r.samples for k, r in results.items()} == {"serial": 96, "thread_prefetcher": 96}
        block = T.target_block_shuffle(reader, batch_size=50, random_samples=20)
        assert block["block_shuffled_epoch"].samples == len(reader)
        assert block["random_row_access"].samples == 20
