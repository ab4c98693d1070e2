"""The measurement functions count what they deliver correctly (no timings asserted)."""

from __future__ import annotations

import numpy as np
import pytest

from storebench.loaders import Batch, PreloadedDataset
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
    assert T.dram_read_bandwidth(nbytes=1 << 20, repeats=2) > 0


def test_gather_against_copy_times_interleaved_measurements_of_the_same_bytes(memmap_raw):
    """Each round: the copies (one thread, split over k), each dataset's gathers, a bare
    take_rows and NumPy's np.take of the same batches; every measurement covers the same
    bytes, and "copy" is the faster copy."""
    from storebench.loaders import throughput

    dataset = PreloadedDataset(memmap_raw, progress=False)
    split = dataset.with_gather_threads(2)
    timed = throughput.gather_against_copy({"one": dataset, "split": split}, batch_size=32,
                                           rounds=2, rows=dataset.images, copy_threads=2)
    split.close()
    epoch = (len(dataset) // 32) * 32 * dataset.images[0].nbytes
    assert sorted(timed) == ["bare_take", "bare_take_2_threads", "copy", "copy_1_thread",
                             "copy_2_threads", "numpy_take", "one", "split"]
    assert {m.bytes for m in timed.values()} == {2 * epoch}
    assert timed["one"].batches == timed["split"].batches == timed["bare_take"].batches == (
        timed["bare_take_2_threads"].batches) == timed["numpy_take"].batches == 2 * (
        len(dataset) // 32)
    assert all(m.seconds > 0 for m in timed.values())
    assert timed["copy"].seconds == min(timed["copy_1_thread"].seconds,
                                        timed["copy_2_threads"].seconds)
    without = throughput.gather_against_copy({"gather": dataset}, batch_size=32, rounds=1)
    assert sorted(without) == ["copy", "copy_1_thread", "gather"]
    one_thread = throughput.gather_against_copy({"gather": dataset}, batch_size=32, rounds=1,
                                                rows=dataset.images)
    assert sorted(one_thread) == ["bare_take", "copy", "copy_1_thread", "gather", "numpy_take"]
    with pytest.raises(ValueError, match="not \\['bare_take', 'copy', 'copy_1_thread', "
                                         "'numpy_take'\\]"):
        throughput.gather_against_copy({"copy": dataset}, batch_size=32, rounds=1)
    with pytest.raises(ValueError, match="'bare_take_2_threads', 'copy'"):
        throughput.gather_against_copy({"bare_take_2_threads": dataset}, batch_size=32,
                                       rounds=1, copy_threads=2)


def test_an_epoch_function_is_timed_with_each_rounds_batches_in_order(memmap_raw):
    """``epochs``: each round (the warm-up too) hands its batches to the function, timed
    beside the datasets; it must be named apart from them."""
    from storebench.loaders import throughput

    dataset = PreloadedDataset(memmap_raw, progress=False)
    seen = []
    timed = throughput.gather_against_copy(
        {"one": dataset}, batch_size=32, rounds=3,
        epochs={"passes": lambda order: seen.append([idx.copy() for idx in order])})
    per_epoch = len(dataset) // 32
    assert len(seen) == 4 and all(len(order) == per_epoch for order in seen)
    assert not np.array_equal(np.concatenate(seen[0]), np.concatenate(seen[1]))  # reshuffled
    for order in seen:  # every round's batches cover distinct samples
        flat = np.concatenate(order)
        assert len(np.unique(flat)) == len(flat) == per_epoch * 32
    assert timed["passes"].batches == 3 * per_epoch
    assert timed["passes"].bytes == timed["one"].bytes
    with pytest.raises(ValueError, match="named apart"):
        throughput.gather_against_copy({"one": dataset}, batch_size=32, rounds=1,
                                       epochs={"one": lambda order: None})
    with pytest.raises(ValueError, match="named apart"):
        throughput.gather_against_copy({"one": dataset}, batch_size=32, rounds=1,
                                       epochs={"copy": lambda order: None})


def test_interleaved_passes_run_every_slice_through_every_pass_in_rotating_order():
    """A warm-up over the first batches, untimed; then equal slices, a multiple of
    ``multiple`` batches, each run by every pass, the first pass rotating; what does not fill
    a slice is left out."""
    order = [np.array([k]) for k in range(13)]
    calls = []

    def pass_named(name):
        def run(batches):
            calls.append((name, [int(b[0]) for b in batches]))
            return len(batches), 10 * len(batches)
        return run

    timed = T.interleaved_passes({"a": pass_named("a"), "b": pass_named("b"),
                                  "c": pass_named("c")}, order, rounds=3,
                                 warmup_batches=2, multiple=2)
    assert calls == [
        ("a", [0, 1]), ("b", [0, 1]), ("c", [0, 1]),  # warm-up
        ("a", [2, 3]), ("b", [2, 3]), ("c", [2, 3]),
        ("b", [4, 5]), ("c", [4, 5]), ("a", [4, 5]),
        ("c", [6, 7]), ("a", [6, 7]), ("b", [6, 7]),
    ]
    assert sorted(timed) == ["a", "b", "c"]
    assert {(m.samples, m.bytes, m.batches) for m in timed.values()} == {(6, 60, 6)}
    assert all(m.seconds > 0 for m in timed.values())
    with pytest.raises(ValueError, match="13 batches leave no slice of 4 for each of 3 rounds"):
        T.interleaved_passes({"a": pass_named("a")}, order, rounds=3, warmup_batches=2,
                             multiple=4)
    with pytest.raises(ValueError, match="no passes"):
        T.interleaved_passes({}, order, rounds=1)


def test_a_pinned_pass_decodes_into_one_buffer_on_its_core_then_lets_go(ci_data_root,
                                                                       monkeypatch):
    """The one-thread rate on each core (the thread decode target's denominator): every batch
    is decoded into the head of the same buffer, made before the clock starts (a fresh array
    per batch timed the first touch of its pages too), by the calling thread pinned to one
    core, the cores taking turns slice by slice; afterwards the thread may run on every
    usable core again."""
    import os

    from storebench.formats import open_dataset
    from storebench.loaders.batching import batch_buffer

    calls = []
    real = PreloadedDataset.get_batch

    def recorded(self, indices, *, out=None):
        calls.append((np.asarray(indices).tolist(), out, os.sched_getaffinity(0)))
        return real(self, indices, out=out)

    monkeypatch.setattr(PreloadedDataset, "get_batch", recorded)
    usable = os.sched_getaffinity(0)
    cores = sorted(usable)
    with open_dataset(ci_data_root / "lmdb-jpeg", verify=False) as reader:
        dataset = PreloadedDataset(reader, decode="simplejpeg", progress=False)
        out = batch_buffer(8, dataset.sample_shape, dataset.sample_dtype)
        batches = [np.arange(0, 8), np.arange(8, 16), np.arange(16, 20)]
        timed = T.interleaved_passes(
            {f"cpu{cpu}": T.pinned_pass(dataset, cpu, cores, out) for cpu in cores},
            batches, rounds=3)
    assert os.sched_getaffinity(0) == usable
    assert {name: (m.samples, m.batches) for name, m in timed.items()} == {
        f"cpu{cpu}": (20, 3) for cpu in cores}
    assert {m.bytes for m in timed.values()} == {20 * int(np.prod(dataset.sample_shape))}
    # Three slices of one batch each; every core decodes each slice, the first core of a
    # slice rotating.
    expected = []
    for k, batch in enumerate(batches):
        turn = cores[k % len(cores):] + cores[:k % len(cores)]
        expected += [(batch.tolist(), {cpu}) for cpu in turn]
    assert [(indices, pinned) for indices, _, pinned in calls] == expected
    buffers = [buffer for _, buffer, _ in calls]
    assert all(np.shares_memory(buffer, out) for buffer in buffers)
    assert [len(buffer) for buffer in buffers] == [len(b) for b, _ in expected]
