"""A raw batch gathered by several threads at once (``gather_threads``): the same bytes in the
same order as one thread, every error raised after every part has finished, and no thread
left behind."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import shutil
import threading
import time

import numpy as np
import pytest

import data_gen
from storebench.formats import CorruptSampleError, open_dataset
from storebench.loaders import LazyDataset, PreloadedDataset, split_gather
from storebench.loaders.split_gather import (
    MIN_BYTES_PER_THREAD,
    SplitGather,
    _balanced_share,
)

RAW_FORMATS = ("memmap", "rawfiles", "hdf5", "lmdb", "parquet")


def gather_threads_alive() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("storebench-gather")]


def shuffled(n: int, count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(n)[:count]


@pytest.mark.parametrize("format_name", RAW_FORMATS)
@pytest.mark.parametrize("threads", [2, 3])
def test_split_batch_has_the_bytes_and_order_of_one_thread(build_ci, format_name, threads):
    with open_dataset(build_ci(format_name, "raw")) as reader:
        one = LazyDataset(reader)
        split = one.with_gather_threads(threads)
        idx = shuffled(len(reader), 256)
        # 256 x 3 KiB: big enough to split at all.
        assert split._split.parts(256, 256 * reader.spec.raw_sample_bytes) == threads
        want = one.get_batch(idx)
        got = split.get_batch(idx)
        out = np.zeros((300, *reader.spec.image_shape), np.uint8)
        into = split.get_batch(idx, out=out)
        split.close()
    assert np.array_equal(got.images, want.images) and got.images.dtype == np.uint8
    assert np.array_equal(got.labels, want.labels) and got.labels.dtype == np.int64
    assert np.array_equal(got.indices, idx)
    assert np.shares_memory(into.images, out) and np.array_equal(out[:256], want.images)
    assert not out[256:].any()  # nothing written past the batch
    for k in (0, 128, 255):  # against the generator itself, not only against one thread
        image, label = data_gen.sample(reader.spec, int(idx[k]))
        assert np.array_equal(got.images[k], image) and got.labels[k] == label
    assert gather_threads_alive() == []


def test_preloaded_split_shares_the_arrays_and_matches(memmap_raw):
    one = PreloadedDataset(memmap_raw, progress=False)
    split = one.with_gather_threads(2)
    assert split.images is one.images and split.gather_threads == 2 and one.gather_threads == 1
    idx = shuffled(len(one), 512, seed=3)
    want = one.get_batch(idx)
    got = split.get_batch(idx)
    assert np.array_equal(got.images, want.images) and np.array_equal(got.labels, want.labels)
    assert "gather_threads=2" in repr(split) and "gather_threads" not in repr(one)
    split.close()
    assert gather_threads_alive() == []


def test_small_batches_are_not_split():
    split = SplitGather(4)
    assert split.parts(256, MIN_BYTES_PER_THREAD - 1) == 1
    assert split.parts(256, 2 * MIN_BYTES_PER_THREAD) == 2
    assert split.parts(3, 100 * MIN_BYTES_PER_THREAD) == 3
    assert split.parts(256, 100 * MIN_BYTES_PER_THREAD) == 4
    calls = []
    out = np.zeros((8, 4), np.uint8)
    labels = split(lambda idx, part: calls.append(len(idx)) or (part, idx * 10),
                   np.arange(8), out)
    assert calls == [8] and labels.tolist() == [0, 10, 20, 30, 40, 50, 60, 70]
    assert gather_threads_alive() == []  # one part: no pool started


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_thread_counts_are_refused(memmap_raw, bad):
    with pytest.raises(ValueError, match=f"gather_threads must be a positive int, got {bad!r}"):
        LazyDataset(memmap_raw, gather_threads=bad)


def test_a_failing_part_raises_after_every_part_has_finished():
    """The first failing part in batch order is raised, and only once the other parts are
    done: nothing writes into the caller's buffer after it has the error."""
    split = SplitGather(3)
    finished = []
    release = threading.Event()

    def gather(idx, part):
        if idx[0] == 0:
            release.wait(5)  # the first part (this thread) outlasts the others' failure
            finished.append("first")
            part[:] = 1
            return part, idx
        if idx[0] >= 2 * len(idx):
            finished.append("third")
            release.set()
            raise CorruptSampleError("x.bin", int(idx[0]), "third part damaged")
        finished.append("second")
        raise CorruptSampleError("x.bin", int(idx[0]), "second part damaged")

    out = np.zeros((3 * MIN_BYTES_PER_THREAD // 4, 4), np.uint8)
    with pytest.raises(CorruptSampleError, match="second part damaged"):
        split(gather, np.arange(len(out)), out)
    assert sorted(finished) == ["first", "second", "third"]
    assert out[: len(out) // 3].all()  # the first part completed before the error came
    split.close()
    assert gather_threads_alive() == []


def test_damaged_sample_in_a_later_part_is_named(build_ci, tmp_path):
    root = tmp_path / "raw"
    shutil.copytree(build_ci("rawfiles", "raw"), root)
    with open_dataset(root) as reader:
        victim = len(reader) - 1
        reader[0]  # opened: the file of a sample is named by the reader's own index
        path = reader._locate(victim)
        path.write_bytes(path.read_bytes()[:-1] + bytes([path.read_bytes()[-1] ^ 0x5A]))
        split = LazyDataset(reader, gather_threads=2)
        idx = np.concatenate([np.arange(255), [victim]])  # the last part holds it
        with pytest.raises(CorruptSampleError, match=f"sample {victim}") as err:
            split.get_batch(idx)
        assert err.value.path == path
        split.close()


def _child_batch(dataset, idx, queue) -> None:
    batch = dataset.get_batch(idx)
    queue.put((batch.images.tobytes(), batch.labels.tolist(), len(gather_threads_alive())))
    dataset.close()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_split_gather_works_in_a_child_of_every_start_method(build_ci, method):
    """The pool is per process: a forked child starts its own (the parent's has no threads
    there), a spawned one gets the dataset pickled without one."""
    with open_dataset(build_ci("memmap", "raw")) as reader:
        dataset = LazyDataset(reader, gather_threads=2)
        idx = shuffled(len(reader), 256, seed=1)
        want = LazyDataset(reader).get_batch(idx)
        dataset.get_batch(idx)  # the parent's pool is running when the child starts
        assert gather_threads_alive() != []
        copied = pickle.loads(pickle.dumps(dataset))._split
        assert copied._pool is None and copied._helpers is None
        context = multiprocessing.get_context(method)
        queue = context.Queue()
        child = context.Process(target=_child_batch, args=(dataset, idx, queue))
        child.start()
        images, labels, pool_threads = queue.get(timeout=60)
        child.join(30)
        dataset.close()
    assert child.exitcode == 0
    assert images == want.images.tobytes() and labels == want.labels.tolist()
    assert pool_threads == 1  # the child's own pool: one thread beside its main thread
    assert gather_threads_alive() == []


@pytest.mark.parametrize("threads", [1, 2])
def test_direct_row_gathers_refuse_a_wrong_out_and_respect_verify(build_ci, threads):
    """Memmap and preloaded batches are gathered straight from their arrays; a wrong ``out``
    is still refused with the reader's message, and ``verify=True`` still checks every
    sample (it goes through read_many)."""
    root = build_ci("memmap", "raw")
    with open_dataset(root, verify=False) as reader:
        assert reader.row_array()[0].shape == (len(reader), reader.spec.raw_sample_bytes)
        for dataset in (LazyDataset(reader, gather_threads=threads),
                        PreloadedDataset(reader, progress=False, gather_threads=threads)):
            wrong = np.zeros((4, 32, 32, 4), np.uint8)
            with pytest.raises(ValueError, match=r"out must be uint8 \(4, 32, 32, 3\), got "
                                                 r"uint8 \(4, 32, 32, 4\)"):
                dataset.get_batch([0, 1, 2, 3], out=wrong)
            with pytest.raises(ValueError, match="out must be uint8"):
                dataset.get_batch([0, 1], out=np.zeros((2, 32, 32, 3), np.float32))
            dataset.close()
    with open_dataset(root, verify=True) as reader:
        assert reader.row_array() is None
        victim = 5
        reader._ensure_open()
        checksums = reader._load_checksums().copy()
        checksums[victim] ^= 1  # the manifest disagrees with sample 5: verify must see it
        reader._checksums = checksums
        with pytest.raises(CorruptSampleError, match=f"sample {victim}"):
            LazyDataset(reader, gather_threads=threads).get_batch([4, victim, 6])


@pytest.mark.parametrize("threads", [1, 2])
def test_memmap_shrunk_under_a_direct_gather_is_an_error_not_sigbus(build_ci, tmp_path,
                                                                    threads):
    root = tmp_path / "memmap-raw"
    shutil.copytree(build_ci("memmap", "raw"), root)
    with open_dataset(root, verify=False) as reader:
        dataset = LazyDataset(reader, gather_threads=threads)
        dataset.get_batch([0, 1])
        images = root / "images.npy"
        os.truncate(images, images.stat().st_size // 3)
        with pytest.raises(CorruptSampleError, match="file shrank") as err:
            dataset.get_batch(np.arange(len(reader) - 300, len(reader)))
        assert err.value.path == images
        dataset.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_an_empty_batch_is_an_empty_array(memmap_raw, threads):
    for dataset in (LazyDataset(memmap_raw, gather_threads=threads),
                    PreloadedDataset(memmap_raw, progress=False, gather_threads=threads)):
        batch = dataset.get_batch([])
        assert batch.images.shape == (0, 32, 32, 3) and batch.images.dtype == np.uint8
        assert batch.labels.shape == (0,) and batch.labels.dtype == np.int64
        dataset.close()


def _rows(count: int = 2000, row_bytes: int = 4096) -> np.ndarray:
    return np.random.default_rng(5).integers(0, 256, (count, row_bytes), dtype=np.uint8)


def test_the_callers_share_balances_a_helper_that_starts_late():
    # 256 rows; the caller's 128 took 1 s. A helper done at the same time needs no change;
    # one done 0.25 s later (it woke late) wants the caller to take more; one done earlier,
    # less. With three parts the latency is shared out over both helpers' rows.
    assert _balanced_share(2, 256, 128, 1.0, 1.0) == pytest.approx(0.5)
    assert _balanced_share(2, 256, 128, 1.0, 1.25) == pytest.approx(0.5625)
    assert _balanced_share(2, 256, 128, 1.0, 0.75) == pytest.approx(0.4375)
    assert _balanced_share(3, 300, 100, 1.0, 1.3) == pytest.approx(0.4)


@pytest.mark.parametrize("share", [0.1, 0.37, 0.5, 0.9])
@pytest.mark.parametrize("threads", [2, 3])
def test_uneven_parts_give_the_bytes_and_order_of_one_thread(share, threads):
    rows = _rows()
    split = SplitGather(threads)
    idx = shuffled(len(rows), 256, seed=2)
    want = np.take(rows, idx, axis=0)
    assert split.parts(len(idx), want.nbytes) == threads
    for _ in range(3):
        split._take_helpers().share[threads] = share
        out = np.zeros((257, rows.shape[1]), np.uint8)
        split.take(rows, idx, out[:256])
        assert np.array_equal(out[:256], want) and not out[256].any()
        assert 0.1 <= split._helpers.share[threads] <= 0.9
    split.close()
    assert gather_threads_alive() == []


def test_threads_sharing_one_split_gather_each_get_their_own_batch():
    """While one caller holds the helpers, another gathers alone: every batch is exact."""
    rows = _rows()
    split = SplitGather(2)
    failures = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        out = np.empty((256, rows.shape[1]), np.uint8)
        for _ in range(40):
            idx = rng.permutation(len(rows))[:256]
            split.take(rows, idx, out)
            if not np.array_equal(out, rows[idx]):
                failures.append(seed)

    workers = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    split.close()
    assert failures == []
    assert gather_threads_alive() == []


def test_a_failing_helper_part_is_raised_after_the_callers_part(monkeypatch):
    rows = _rows()
    idx = shuffled(len(rows), 256, seed=4)
    split = SplitGather(2)
    finished = []
    real_take = split_gather.take_rows

    def take(source, indices, out):
        if threading.current_thread().name.startswith("storebench-gather"):
            finished.append("helper")
            raise MemoryError("helper part failed")
        time.sleep(0.05)  # the caller's part outlasts the helper's failure
        real_take(source, indices, out)
        finished.append("caller")

    monkeypatch.setattr(split_gather, "take_rows", take)
    out = np.zeros((256, rows.shape[1]), np.uint8)
    with pytest.raises(MemoryError, match="helper part failed"):
        split.take(rows, idx, out)
    assert sorted(finished) == ["caller", "helper"]
    monkeypatch.undo()
    split.take(rows, idx, out)  # the helpers are still there, and right
    assert np.array_equal(out, rows[idx])
    split.close()
    assert gather_threads_alive() == []


def test_a_split_gather_dropped_without_close_lets_its_helpers_end():
    import gc

    rows = _rows()
    split = SplitGather(2)
    out = np.empty((256, rows.shape[1]), np.uint8)
    split.take(rows, shuffled(len(rows), 256), out)
    assert gather_threads_alive() == ["storebench-gather-0"]
    del split
    gc.collect()
    deadline = time.monotonic() + 5
    while gather_threads_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gather_threads_alive() == []
