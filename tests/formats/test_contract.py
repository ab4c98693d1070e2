"""The Reader contract, for every registered format and every encoding it stores.

A format added to ``FORMATS`` is covered here with no new test code.
"""

from __future__ import annotations

import multiprocessing
import pickle
import re
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
from format_cases import format_cases

import data_gen
from storebench.formats import FORMATS, open_dataset, read_manifest

CASES = [
    (name, encoding)
    for name, module in FORMATS.items()
    for encoding in data_gen.ENCODINGS
    if encoding in module.ENCODINGS
]
IDS = [f"{name}-{encoding}" for name, encoding in CASES]


def same_image(got, want) -> bool:
    if isinstance(want, bytes):
        return isinstance(got, bytes) and got == want
    return isinstance(got, np.ndarray) and got.dtype == np.uint8 and np.array_equal(got, want)


def read_in_worker(reader, indices):
    images, labels = reader.read_many(indices)
    single = [reader[int(i)] for i in indices]
    return (
        [bytes(im) if isinstance(im, bytes) else np.asarray(im) for im in images],
        list(labels),
        single,
    )


@pytest.fixture(scope="module")
def spawn_pool():
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


@pytest.mark.parametrize(("format_name", "encoding"), format_cases(CASES, IDS))
class TestReaderContract:
    def test_random_access_is_bit_identical(self, ci_dataset, ci_profile, format_name, encoding):
        spec = ci_profile.spec_for(encoding)
        with open_dataset(ci_dataset(format_name, encoding)) as reader:
            assert len(reader) == spec.num_samples
            for i in np.random.default_rng(7).choice(spec.num_samples, 25, replace=False):
                image, label = reader[int(i)]
                want_image, want_label = data_gen.sample(spec, int(i))
                assert same_image(image, want_image), f"sample {i}"
                assert label == want_label and isinstance(label, int)
            assert same_image(reader[-1][0], data_gen.sample(spec, spec.num_samples - 1)[0])

    def test_read_many_keeps_request_order(self, ci_dataset, ci_profile, format_name, encoding):
        spec = ci_profile.spec_for(encoding)
        indices = np.random.default_rng(3).permutation(spec.num_samples)[:40]
        indices = np.concatenate([indices, indices[:3], [0, spec.num_samples - 1]])
        with open_dataset(ci_dataset(format_name, encoding)) as reader:
            images, labels = reader.read_many(indices)
            assert labels.dtype == np.int64 and labels.shape == (len(indices),)
            assert len(images) == len(indices)
            for k, i in enumerate(indices):
                want_image, want_label = data_gen.sample(spec, int(i))
                assert same_image(images[k], want_image), f"position {k} (sample {i})"
                assert labels[k] == want_label
            if encoding == "raw":
                out = np.zeros((len(indices), *spec.image_shape), dtype=np.uint8)
                got, _ = reader.read_many(indices, out=out)
                assert got is out and np.array_equal(out, images)
            assert reader.read_many([])[1].shape == (0,)

    def test_sequential_iteration_covers_everything_in_order(
        self, ci_dataset, ci_profile, format_name, encoding
    ):
        spec = ci_profile.spec_for(encoding)
        with open_dataset(ci_dataset(format_name, encoding)) as reader:
            count = 0
            for i, (image, label) in enumerate(reader.iter_sequential(batch_size=100)):
                want_image, want_label = data_gen.sample(spec, i)
                assert same_image(image, want_image) and label == want_label, f"sample {i}"
                count += 1
            assert count == spec.num_samples

    def test_out_of_range_index_raises(self, ci_dataset, format_name, encoding):
        with open_dataset(ci_dataset(format_name, encoding)) as reader:
            with pytest.raises(IndexError, match="out of range"):
                reader[len(reader)]
            with pytest.raises(IndexError, match="out of range"):
                reader.read_many([0, len(reader) + 5])

    def test_blocks_partition_the_dataset(self, ci_dataset, format_name, encoding):
        with open_dataset(ci_dataset(format_name, encoding)) as reader:
            blocks = reader.blocks()
            assert blocks[0] == 0 and blocks[-1] == len(reader)
            assert np.all(np.diff(blocks) > 0)

    def test_manifest_records_build(self, ci_dataset, ci_profile, format_name, encoding):
        path = ci_dataset(format_name, encoding)
        manifest = read_manifest(path)
        assert manifest["format"] == format_name
        assert manifest["spec"] == ci_profile.spec_for(encoding).to_dict()
        assert manifest["file_count"] == len(manifest["files"]) >= 1
        assert manifest["bytes_apparent"] == sum(manifest["files"].values())
        assert manifest["bytes_allocated"] > 0 and manifest["write_seconds"] >= 0
        assert manifest["versions"]["numpy"] == np.__version__
        with open_dataset(path) as reader:
            assert all(p.is_file() for p in reader.files())
            assert {p.relative_to(path).as_posix() for p in reader.files()} == set(
                manifest["files"]
            )

    def test_pickled_reader_reads_the_same_in_a_spawned_worker(
        self, ci_dataset, ci_profile, format_name, encoding, spawn_pool
    ):
        spec = ci_profile.spec_for(encoding)
        indices = [5, 1, spec.num_samples - 1, 5]
        with open_dataset(ci_dataset(format_name, encoding)) as reader:
            reader.read_many([0])  # open handles in the parent: they must not travel
            images, labels, single = spawn_pool.submit(read_in_worker, reader, indices).result(
                timeout=120
            )
            pickle.loads(pickle.dumps(reader)).close()
        for k, i in enumerate(indices):
            want_image, want_label = data_gen.sample(spec, i)
            assert same_image(images[k], want_image) and labels[k] == want_label
            assert same_image(single[k][0], want_image) and single[k][1] == want_label


@pytest.mark.parametrize(("format_name", "encoding"), format_cases(CASES, IDS))
def test_threads_sharing_an_unopened_reader(ci_dataset, ci_profile, format_name, encoding):
    """Several threads hitting a fresh reader at once open it once and all read right."""
    import threading
    import time

    spec = ci_profile.spec_for(encoding)
    barrier = threading.Barrier(4)
    results, errors = {}, []

    def work(k: int) -> None:
        barrier.wait()
        try:
            indices = np.arange(k, spec.num_samples, 37)
            results[k] = (indices, reader.read_many(indices))
        except Exception as err:  # reported below, in the test's thread
            errors.append(err)

    with open_dataset(ci_dataset(format_name, encoding)) as reader:
        real_open = reader._open

        def slow_open():  # widen the window in which a second thread could open again
            time.sleep(0.05)
            real_open()

        reader._open = slow_open
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert not errors, errors
    for indices, (images, labels) in results.values():
        for k, i in enumerate(indices):
            want_image, want_label = data_gen.sample(spec, int(i))
            assert same_image(images[k], want_image) and labels[k] == want_label


def test_memmap_populate_maps_every_page(ci_dataset, ci_profile):
    """populate=True leaves the whole images.npy resident and mapped, and reads stay right."""
    from storebench.bench.cache import evict, resident_fraction

    path = ci_dataset("memmap", "raw")
    evict([path / "images.npy"])
    assert resident_fraction([path / "images.npy"]) < 0.05
    with open_dataset(path, populate=True) as reader:
        reader.read_many([0])
        assert resident_fraction([path / "images.npy"]) > 0.95
        spec = ci_profile.spec_for("raw")
        assert np.array_equal(reader[3][0], data_gen.sample(spec, 3)[0])


@pytest.mark.parametrize(("format_name", "encoding"), format_cases(CASES, IDS))
def test_indices_are_integers_and_negative_ones_count_from_the_end(
    ci_dataset, ci_profile, format_name, encoding
):
    spec = ci_profile.spec_for(encoding)
    n = spec.num_samples
    with open_dataset(ci_dataset(format_name, encoding), verify=False) as reader:
        last = data_gen.sample(spec, n - 1)
        for index in (-1, np.int64(-1), np.uint16(n - 1), np.int32(n - 1)):
            assert same_image(reader[index][0], last[0]) and reader[index][1] == last[1]
        images, labels = reader.read_many([-1, np.int8(0), -n])
        assert list(labels) == [last[1], data_gen.sample(spec, 0)[1], data_gen.sample(spec, 0)[1]]
        assert same_image(images[0], last[0])
        assert list(reader.read_many(np.array([n - 2, -2], dtype=np.int16))[1]) == [
            data_gen.sample(spec, n - 2)[1]
        ] * 2
        for bad in (True, np.bool_(False), 3.7, np.float64(3.0), "3", None):
            with pytest.raises(TypeError, match=re.escape(f"sample index {bad!r} is a")):
                reader[bad]
        for bad in ([True, False], [1, True], [1.0, 2.0], np.array([0.5]), ["3"],
                    np.array([True])):
            with pytest.raises(TypeError, match="integer"):
                reader.read_many(bad)
        for bad in (n, -n - 1):
            with pytest.raises(IndexError, match=f"sample index {bad} out of range for {n}"):
                reader[bad]
            with pytest.raises(IndexError, match=f"sample index {bad} out of range for {n}"):
                reader.read_many([0, bad])
            # A loader's batch (one int64 array) takes the one-reduction check first.
            with pytest.raises(IndexError, match=f"sample index {bad} out of range for {n}"):
                reader.read_many(np.array([0, bad], dtype=np.int64))
        assert list(reader.read_many(np.array([n - 1, 0, -n], dtype=np.int64))[1]) == [
            last[1], data_gen.sample(spec, 0)[1], data_gen.sample(spec, 0)[1]]
        assert reader.read_many(np.array([], dtype=np.uint8))[1].shape == (0,)


def test_a_reader_alive_at_interpreter_exit_prints_nothing(ci_dataset):
    import subprocess
    import sys

    script = (f"from storebench.formats import open_dataset\n"
              f"reader = open_dataset({str(ci_dataset('hdf5', 'raw'))!r})\n"
              "reader[0]\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_runs_by_block_puts_the_cached_block_first_then_the_batch_order():
    from storebench.formats.base import runs_by_block

    blocks = np.array([5, 5, 2, 7, 2, 1])
    as_lists = lambda runs: [run.tolist() for run in runs]  # noqa: E731
    # Block 5 is reached first, then 2, 7 and 1: not block-number order (1, 2, 5, 7).
    assert as_lists(runs_by_block(blocks, None)) == [[0, 1], [2, 4], [3], [5]]
    assert as_lists(runs_by_block(blocks, 7)) == [[3], [0, 1], [2, 4], [5]]
    assert as_lists(runs_by_block(blocks, 9)) == [[0, 1], [2, 4], [3], [5]]
    assert runs_by_block(np.array([], dtype=np.int64), None) == []
