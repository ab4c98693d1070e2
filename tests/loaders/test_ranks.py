"""Data-parallel ranks: our samplers and prefetchers under real torch.distributed (gloo), the
``run_ranks`` launcher's failure paths, and tf.data sharded by ``InputContext``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from storebench.formats import open_dataset
from storebench.loaders import (
    BatchSampler,
    BlockShuffleSampler,
    LazyDataset,
    ProcessPrefetcher,
    SequentialSampler,
    ShuffleSampler,
    ThreadPrefetcher,
)
from storebench.ranks import (
    RankDiedError,
    RankFailedError,
    RankTimeoutError,
    gather_across_ranks,
    run_ranks,
)

NUM_SAMPLES = 512  # the ci raw set: 4 TFRecord shards of 128 samples
EPOCHS = (0, 1, 2)
BATCH_SIZE = 50
# (sampler, drop_last, prefetcher): every sampler with threads, and one with processes.
CASES = [
    (sampler, drop_last, "thread")
    for sampler in ("sequential", "shuffle", "block")
    for drop_last in (False, True)
] + [("shuffle", False, "process")]
# Samples per rank and epoch, as DistributedSampler has it: ceil(n / w), or n // w.
PER_RANK = {(2, False): 256, (2, True): 256, (3, False): 171, (3, True): 170}
# Samples read twice (padding) or not at all (drop_last) per epoch, over all ranks.
TWICE = {(2, False): 0, (3, False): 1, (2, True): 0, (3, True): 0}
NEVER = {(2, False): 0, (3, False): 0, (2, True): 0, (3, True): 2}


def make_sampler(name: str, reader, **sharding):
    if name == "sequential":
        return SequentialSampler(len(reader), **sharding)
    if name == "shuffle":
        return ShuffleSampler(len(reader), seed=11, **sharding)
    return BlockShuffleSampler.from_reader(reader, seed=11, **sharding)


def read_epochs(rank: int, world_size: int, root: str, cases: list) -> dict:
    """In each rank: for every case and epoch, read this rank's share through its own
    sampler and prefetcher; beside it, the whole epoch order as every rank computed it
    (gathered with gloo) and the share torch's DistributedSampler gives this rank."""
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler

    out = {"pid": os.getpid(), "rank": dist.get_rank(), "world_size": dist.get_world_size()}
    with open_dataset(root) as reader:
        dataset = LazyDataset(reader)
        for sampler_name, drop_last, prefetcher_name in cases:
            sampler = make_sampler(
                sampler_name, reader, rank=rank, world_size=world_size, drop_last=drop_last
            )
            whole_epoch = make_sampler(sampler_name, reader)
            batches = BatchSampler(sampler, BATCH_SIZE)
            if prefetcher_name == "thread":
                prefetcher = ThreadPrefetcher(dataset, batches, workers=2)
            else:
                prefetcher = ProcessPrefetcher(dataset, batches, workers=2, start_method="fork")
            # num_replicas and rank come from the process group.
            torch_sampler = DistributedSampler(
                range(len(reader)), shuffle=False, drop_last=drop_last
            )
            epochs = []
            with prefetcher:
                for epoch in EPOCHS:
                    prefetcher.set_epoch(epoch)
                    whole_epoch.set_epoch(epoch)
                    torch_sampler.set_epoch(epoch)
                    read = [
                        (b.indices.copy(), b.labels.copy(), np.array(b.images)) for b in prefetcher
                    ]
                    epochs.append(
                        {
                            "indices": np.concatenate([r[0] for r in read]),
                            "labels": np.concatenate([r[1] for r in read]),
                            "images": np.concatenate([r[2] for r in read]),
                            "orders": gather_across_ranks(whole_epoch.indices()),
                            "torch": np.array(list(torch_sampler)),
                        }
                    )
            out[sampler_name, drop_last, prefetcher_name] = epochs
    return out


def raise_in_rank(rank: int, world_size: int, failing: int) -> None:
    """Rank ``failing`` raises; the others wait for it in a collective, which never ends."""
    import torch.distributed as dist

    if rank == failing:
        raise ValueError(f"boom in rank {rank} of {world_size}")
    dist.barrier()


def hang_in_rank(rank: int, world_size: int, pid_dir: str) -> None:
    """Rank 1 ignores SIGTERM and sleeps; rank 0 starts a child process and then waits for
    rank 1 in a collective. Both write their pids (and the child's) to ``pid_dir``."""
    import torch.distributed as dist

    pids = [os.getpid()]
    if rank == 0:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        pids.append(child.pid)
    Path(pid_dir, f"rank{rank}").write_text(" ".join(map(str, pids)))
    if rank == 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)
    dist.barrier()


def exit_in_rank(rank: int, world_size: int) -> None:
    """Rank 0 ends without a word (as a crash would); the others wait for it."""
    import torch.distributed as dist

    if rank == 0:
        os._exit(3)
    dist.barrier()


def return_rank(rank: int, world_size: int) -> int:
    return rank


def our_children() -> set[int]:
    """Live child processes, without multiprocessing's long-lived resource tracker."""
    pids = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" in " ".join(child.cmdline()) or child.status() == "zombie":
                continue
        except psutil.Error:
            continue
        pids.add(child.pid)
    return pids


def alive(pids) -> list[int]:
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture(scope="module")
def tfrecord_raw(build_ci) -> Path:
    return build_ci("tfrecord", "raw")


@pytest.fixture(scope="module")
def reference(tfrecord_raw) -> tuple[np.ndarray, np.ndarray]:
    """Every sample of the set as ``reader[i]`` returns it: (images, labels)."""
    with open_dataset(tfrecord_raw) as reader:
        assert len(reader) == NUM_SAMPLES
        assert reader.blocks().tolist() == [0, 128, 256, 384, 512]
        samples = [reader[i] for i in range(len(reader))]
    images = np.stack([image for image, _ in samples])
    assert len({image.tobytes() for image in images}) == NUM_SAMPLES  # each sample is unique
    return images, np.array([label for _, label in samples])


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def ranks_read(request, tfrecord_raw) -> dict:
    """``read_epochs`` run by 2 or 3 gloo ranks (once per world size), and the child
    processes of this one left after it."""
    world_size = request.param
    before = our_children()
    results = run_ranks(read_epochs, world_size, args=(str(tfrecord_raw), CASES), timeout_s=150)
    return {
        "world_size": world_size,
        "results": results,
        "left": our_children() - before,
    }


def epochs_of(ranks_read, case):
    """Per epoch, the ranks' reads of that epoch in rank order."""
    per_rank = [result[case] for result in ranks_read["results"]]
    return [[reads[e] for reads in per_rank] for e in range(len(EPOCHS))]


@pytest.mark.timeout(240)
def test_each_rank_runs_in_its_own_process_in_one_gloo_group(ranks_read):
    w = ranks_read["world_size"]
    results = ranks_read["results"]
    assert [r["rank"] for r in results] == list(range(w))
    assert [r["world_size"] for r in results] == [w] * w
    pids = {r["pid"] for r in results}
    assert len(pids) == w and os.getpid() not in pids
    assert ranks_read["left"] == set()  # nothing of the run is still running


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_each_rank_reads_its_contiguous_share_of_one_common_epoch_order(ranks_read, case):
    w, (_, drop_last, _) = ranks_read["world_size"], case
    per_rank = PER_RANK[w, drop_last]
    for reads in epochs_of(ranks_read, case):
        order = reads[0]["orders"][0]
        assert sorted(order.tolist()) == list(range(NUM_SAMPLES))
        for read in reads:  # every rank computed the same order, and gathered it from all
            assert len(read["orders"]) == w
            for gathered in read["orders"]:
                np.testing.assert_array_equal(gathered, order)
        assert [len(read["indices"]) for read in reads] == [per_rank] * w
        # Rank r reads positions r * per_rank ... of the order, padded by repeating its start.
        want = np.concatenate([order, order])[: per_rank * w]
        np.testing.assert_array_equal(np.concatenate([r["indices"] for r in reads]), want)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_the_ranks_cover_the_dataset_with_distributed_samplers_padding(ranks_read, case):
    w, (sampler, drop_last, _) = ranks_read["world_size"], case
    for reads in epochs_of(ranks_read, case):
        order = reads[0]["orders"][0]
        counts = np.bincount(np.concatenate([r["indices"] for r in reads]), minlength=NUM_SAMPLES)
        total = PER_RANK[w, drop_last] * w
        assert counts.sum() == total == NUM_SAMPLES + TWICE[w, drop_last] - NEVER[w, drop_last]
        assert counts.max() <= 2
        # Padding repeats the first samples of the epoch order; drop_last drops its last.
        assert np.flatnonzero(counts == 2).tolist() == sorted(order[: TWICE[w, drop_last]])
        never = order[NUM_SAMPLES - NEVER[w, drop_last] :]
        assert np.flatnonzero(counts == 0).tolist() == sorted(never)
        # torch's DistributedSampler in the same group: the same share sizes, and as many
        # samples read once, twice, never.
        torch_shares = [r["torch"] for r in reads]
        assert [len(s) for s in torch_shares] == [PER_RANK[w, drop_last]] * w
        torch_counts = np.bincount(np.concatenate(torch_shares), minlength=NUM_SAMPLES)
        assert (
            np.bincount(counts, minlength=3).tolist()
            == np.bincount(torch_counts, minlength=3).tolist()
        )
        if sampler == "sequential":  # same order as torch's unshuffled one: same samples
            np.testing.assert_array_equal(counts, torch_counts)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_every_rank_delivers_the_readers_bytes(ranks_read, reference, case):
    images, labels = reference
    for reads in epochs_of(ranks_read, case):
        for read in reads:
            assert read["images"].dtype == np.uint8
            assert read["images"].tobytes() == images[read["indices"]].tobytes()
            np.testing.assert_array_equal(read["labels"], labels[read["indices"]])


@pytest.mark.timeout(240)
def test_shuffled_orders_change_every_epoch_and_keep_blocks_together(ranks_read):
    def orders(case):
        return [reads[0]["orders"][0] for reads in epochs_of(ranks_read, case)]

    for drop_last in (False, True):
        for order in orders(("sequential", drop_last, "thread")):
            assert order.tolist() == list(range(NUM_SAMPLES))
        for sampler in ("shuffle", "block"):
            epochs = orders((sampler, drop_last, "thread"))
            assert len({e.tobytes() for e in epochs}) == len(EPOCHS)
            shares = [
                reads[0]["indices"]
                for reads in epochs_of(ranks_read, (sampler, drop_last, "thread"))
            ]
            assert len({s.tobytes() for s in shares}) == len(EPOCHS)
        for order in orders(("block", drop_last, "thread")):
            blocks = order // 128  # each 128-sample shard is read in one run
            assert np.count_nonzero(np.diff(blocks)) == 3
    # The same sampler gives the same orders whichever prefetcher reads them.
    for thread, process in zip(
        orders(("shuffle", False, "thread")), orders(("shuffle", False, "process")), strict=True
    ):
        np.testing.assert_array_equal(thread, process)


# -- run_ranks: failures, time-outs, clean-up ---------------------------------------------
@pytest.mark.timeout(120)
def test_a_rank_that_raises_stops_every_rank_and_names_itself():
    before = our_children()
    started = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 1 failed") as caught:
        run_ranks(raise_in_rank, 2, args=(1,), timeout_s=100)
    assert time.monotonic() - started < 60  # not the time-out: rank 0 was stopped
    error = caught.value
    assert error.rank == 1
    assert "ValueError: boom in rank 1 of 2" in str(error)
    assert "in raise_in_rank" in error.rank_traceback
    assert isinstance(error.__cause__, ValueError)
    assert str(error.__cause__) == "boom in rank 1 of 2"
    assert our_children() - before == set()


@pytest.mark.timeout(120)
def test_ranks_that_hang_are_killed_at_the_timeout_with_what_they_started(tmp_path):
    before = our_children()
    rendezvous_dirs = set(Path(tempfile.gettempdir()).glob("storebench-ranks-*"))
    started = time.monotonic()
    # The time-out counts the ranks' start-up (torch imported, gloo joined) before they write
    # their pids: 10 s leaves a slow machine room for it.
    with pytest.raises(RankTimeoutError,
                       match=r"rank\(s\) \[0, 1\] of 2 still running after 10 s"):
        run_ranks(hang_in_rank, 2, args=(str(tmp_path),), timeout_s=10, grace_s=1)
    assert 10 <= time.monotonic() - started < 60
    pids = [int(p) for name in ("rank0", "rank1") for p in (tmp_path / name).read_text().split()]
    assert len(pids) == 3  # two ranks and rank 0's child
    assert alive(pids) == []
    assert our_children() - before == set()
    assert set(Path(tempfile.gettempdir()).glob("storebench-ranks-*")) <= rendezvous_dirs


@pytest.mark.timeout(120)
def test_a_rank_that_dies_without_reporting_stops_every_rank():
    before = our_children()
    with pytest.raises(RankDiedError, match=r"rank 0 \(pid \d+\) exited with code 3") as caught:
        run_ranks(exit_in_rank, 2, timeout_s=100)
    assert (caught.value.rank, caught.value.exitcode) == (0, 3)
    assert our_children() - before == set()


@pytest.mark.timeout(60)
def test_run_ranks_refuses_what_spawned_ranks_could_not_load():
    with pytest.raises(TypeError, match="module-level function"):
        run_ranks(lambda rank, world_size: rank, 2)
    with pytest.raises(ValueError, match="start_method"):
        run_ranks(return_rank, 2, start_method="forkserver")
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        run_ranks(return_rank, 0)


# -- tf.data: one pipeline per InputContext -----------------------------------------------
def pipeline_share(root, world_size, pipeline, **options):
    import tensorflow as tf

    from storebench.loaders.tf_adapter import tfrecord_pipeline

    context = tf.distribute.InputContext(num_input_pipelines=world_size, input_pipeline_id=pipeline)
    dataset = tfrecord_pipeline(root, batch_size=32, input_context=context, **options)
    batches = [(images.numpy(), labels.numpy()) for images, labels in dataset]
    return np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])


def index_of(images, reference):
    """The sample index of each image, found by its bytes."""
    where = {image.tobytes(): i for i, image in enumerate(reference[0])}
    return np.array([where[image.tobytes()] for image in images])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("shard_by", ["auto", "file", "record"])
def test_tf_input_pipelines_partition_the_dataset(tfrecord_raw, reference, world_size, shard_by):
    shards = np.arange(4)  # pipeline p reads shards p, p + w, ... or records p, p + w, ...
    for pipeline in range(world_size):
        images, labels = pipeline_share(tfrecord_raw, world_size, pipeline, shard_by=shard_by)
        if shard_by == "record":
            want = np.arange(pipeline, NUM_SAMPLES, world_size)
        else:
            mine = shards[pipeline::world_size]
            want = np.concatenate([np.arange(128 * s, 128 * (s + 1)) for s in mine])
        assert images.tobytes() == reference[0][want].tobytes()
        np.testing.assert_array_equal(labels, reference[1][want])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("shard_by", ["file", "record"])
def test_shuffled_tf_input_pipelines_partition_every_epoch(tfrecord_raw, reference, shard_by):
    import tensorflow as tf

    from storebench.loaders.tf_adapter import tfrecord_pipeline

    pipelines = [
        tfrecord_pipeline(
            tfrecord_raw,
            batch_size=32,
            shuffle_buffer=64,
            seed=5,
            shard_by=shard_by,
            input_context=tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=p),
        )
        for p in range(3)
    ]
    epochs = []
    for _ in range(2):
        shares = [np.concatenate([index_of(b[0].numpy(), reference) for b in p]) for p in pipelines]
        everything = np.concatenate(shares)
        assert sorted(everything.tolist()) == list(range(NUM_SAMPLES))
        epochs.append(everything)
    assert epochs[0].tolist() != epochs[1].tolist()  # reshuffled, still a partition


@pytest.mark.timeout(120)
def test_tf_input_context_batches_per_replica_and_checks_its_options(tfrecord_raw, reference):
    import tensorflow as tf

    from storebench.loaders.tf_adapter import tfrecord_pipeline

    context = tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=2
    )
    sizes = [
        len(b[1]) for b in tfrecord_pipeline(tfrecord_raw, batch_size=64, input_context=context)
    ]
    assert sizes == [32] * 8  # 64 over 2 replicas; shards 1 and 3: 256 samples
    with pytest.raises(ValueError, match="not divisible"):
        tfrecord_pipeline(tfrecord_raw, batch_size=63, input_context=context)
    five = tf.distribute.InputContext(num_input_pipelines=5, input_pipeline_id=4)
    with pytest.raises(ValueError, match="4 files for 5 pipelines"):
        tfrecord_pipeline(tfrecord_raw, batch_size=8, input_context=five, shard_by="file")
    with pytest.raises(ValueError, match="deterministic=True"):
        tfrecord_pipeline(
            tfrecord_raw, batch_size=8, input_context=five, shuffle_buffer=8, deterministic=False
        )
    with pytest.raises(ValueError, match="shard_by must be one of"):
        tfrecord_pipeline(tfrecord_raw, batch_size=8, shard_by="rows")
    # Five pipelines over four files: "auto" cuts records, and they still partition.
    shares = [pipeline_share(tfrecord_raw, 5, p)[0] for p in range(5)]
    assert [len(s) for s in shares] == [103, 103, 102, 102, 102]
    np.testing.assert_array_equal(
        np.sort(np.concatenate([index_of(s, reference) for s in shares])), np.arange(NUM_SAMPLES)
    )
