"""Resuming an epoch mid-way: a state taken after batch b, loaded into a fresh loader (a fresh
process, another worker count, another world size), delivers exactly the rest of the epoch.
Killed epochs run in child processes (``resume_child.py``) that SIGKILL themselves at seeded
batches; ranks are real gloo ``torch.distributed`` processes."""

from __future__ import annotations

import collections
import itertools
import json
import os
import subprocess
import sys
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
from storebench.loaders.samplers import merge_rank_states
from storebench.processes import SHM_DIR, SHM_PREFIX
from storebench.ranks import gather_across_ranks, run_ranks

CHILD = Path(__file__).with_name("resume_child.py")
ROOT_DIR = Path(__file__).resolve().parents[2]
N = 512  # the ci raw set
BATCH = 24  # 22 batches, the last one of 8: a short tail is resumed too
SEED, EPOCH = 3, 2
CHECKPOINT_EVERY = 4


@pytest.fixture(scope="module")
def root(build_ci) -> Path:
    return build_ci("memmap", "raw")


def batch_bytes(batch) -> bytes:
    return batch.images.tobytes() + batch.labels.tobytes() + batch.indices.tobytes()


def uninterrupted(root: Path, sampler) -> list[bytes]:
    """The epoch's batches read one after another, without any prefetcher."""
    with open_dataset(root) as reader:
        dataset = LazyDataset(reader)
        return [batch_bytes(dataset.get_batch(i)) for i in BatchSampler(sampler, BATCH)]


def epoch_sampler(**sharding) -> ShuffleSampler:
    sampler = ShuffleSampler(N, seed=SEED, **sharding)
    sampler.set_epoch(EPOCH)
    return sampler


# -- samplers ---------------------------------------------------------------------------
def make_sampler(kind: str, **sharding):
    if kind == "sequential":
        return SequentialSampler(N, **sharding)
    if kind == "block":
        return BlockShuffleSampler(np.arange(0, N + 1, 64), seed=SEED, **sharding)
    return ShuffleSampler(N, seed=SEED, **sharding)


@pytest.mark.parametrize("kind", ["sequential", "shuffle", "block"])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("old", "new"), [(1, 1), (2, 2), (2, 3), (3, 2), (3, 1), (1, 4)])
def test_a_resumed_epoch_delivers_the_remaining_multiset_exactly_once(kind, drop_last, old, new):
    rng = np.random.default_rng([old, new, drop_last])
    ranks = [make_sampler(kind, rank=r, world_size=old, drop_last=drop_last) for r in range(old)]
    whole, before, states = [], [], []
    for sampler in ranks:
        sampler.set_epoch(EPOCH)
        whole += sampler.indices().tolist()
        taken = BatchSampler(sampler, 10)
        stop = int(rng.integers(0, len(taken) + 1))
        for indices in itertools.islice(taken, stop):  # takes exactly ``stop`` batches
            before += indices.tolist()
        states.append(taken.state_dict())
    merged = merge_rank_states(states[::-1])
    resumed = [make_sampler(kind, rank=r, world_size=new, drop_last=drop_last)
               for r in range(new)]
    after = []
    for sampler in resumed:
        sampler.load_state_dict(merged if old != new else states[sampler.rank])
        sampler.set_epoch(EPOCH)  # the state's epoch: keeps the position
        share = len(sampler)
        got = list(sampler)
        assert len(got) == share
        after += got
    # Exactly what an uninterrupted epoch at the old world size delivers, nothing twice.
    assert collections.Counter(before) + collections.Counter(after) == collections.Counter(whole)
    if old == new:  # the same ranks: each one's rest, in its order
        for sampler, state in zip(ranks, states):
            sampler.load_state_dict(state)
            done = json.loads(state["positions"])[sampler.rank]
            full = make_sampler(kind, rank=sampler.rank, world_size=old, drop_last=drop_last)
            full.set_epoch(EPOCH)
            np.testing.assert_array_equal(sampler.indices(), full.indices()[done:])
    # The next epoch is a plain one at the new world size.
    for sampler in resumed:
        sampler.set_epoch(EPOCH + 1)
        plain = make_sampler(kind, rank=sampler.rank, world_size=new, drop_last=drop_last)
        plain.set_epoch(EPOCH + 1)
        np.testing.assert_array_equal(np.fromiter(sampler, np.int64), plain.indices())


def test_elastic_shares_differ_by_at_most_one_sample():
    states = []
    for rank, stop in enumerate([3, 7]):
        sampler = epoch_sampler(rank=rank, world_size=2)
        taken = iter(BatchSampler(sampler, 10))
        for _ in range(stop):
            next(taken)
        states.append(sampler.state_dict())
    merged = merge_rank_states(states)
    sizes = []
    for rank in range(3):
        sampler = ShuffleSampler(N, rank=rank, world_size=3)
        sampler.load_state_dict(merged)
        sizes.append(len(sampler))
    assert sum(sizes) == N - 100 and max(sizes) - min(sizes) <= 1


def test_a_state_survives_a_second_resize():
    """2 ranks -> 3 -> 2: each resize is recorded, and the epoch still adds up."""
    whole, before, states = [], [], []
    for rank, stop in enumerate([40, 90]):
        sampler = epoch_sampler(rank=rank, world_size=2)
        whole += sampler.indices().tolist()
        taken = iter(sampler)
        before += [next(taken) for _ in range(stop)]
        states.append(sampler.state_dict())
    merged, states = merge_rank_states(states), []
    for rank, stop in enumerate([10, 0, 50]):
        sampler = ShuffleSampler(N, rank=rank, world_size=3)
        sampler.load_state_dict(merged)
        taken = iter(sampler)
        before += [next(taken) for _ in range(stop)]
        states.append(sampler.state_dict())
    merged, after = merge_rank_states(states), []
    assert len(json.loads(merged["resumed_from"])) == 1
    for rank in range(2):
        sampler = ShuffleSampler(N, rank=rank, world_size=2)
        sampler.load_state_dict(merged)
        after += list(sampler)
    assert collections.Counter(before) + collections.Counter(after) == collections.Counter(whole)


def test_states_that_cannot_load_say_why():
    sampler = epoch_sampler(rank=1, world_size=2)
    state = sampler.state_dict()
    with pytest.raises(ValueError, match=r"rank\(s\) \[1\] only, and this sampler is rank 0"):
        ShuffleSampler(N, rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="needs every old rank's position.*merge_rank_states"):
        ShuffleSampler(N, rank=0, world_size=3).load_state_dict(state)
    with pytest.raises(ValueError, match=r"num_samples \(state 512, sampler 500\)"):
        ShuffleSampler(500, rank=1, world_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="sampler .state 'ShuffleSampler', sampler 'Sequential"):
        SequentialSampler(N, rank=1, world_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"no state of rank\(s\) \[0\] of 2"):
        merge_rank_states([state])
    with pytest.raises(ValueError, match="not a storebench loader state"):
        sampler.load_state_dict({"epoch": 1})
    far = {**state, "positions": json.dumps([None, 10_000])}
    with pytest.raises(ValueError, match="outside its share of 256 samples"):
        sampler.load_state_dict(far)


def test_set_epoch_keeps_a_loaded_position_and_another_epoch_starts_clean():
    first = epoch_sampler()
    taken = iter(first)
    head = [next(taken) for _ in range(100)]
    state = first.state_dict()
    resumed = ShuffleSampler(N, seed=0)  # the seed comes from the state
    resumed.load_state_dict(state)
    resumed.set_epoch(EPOCH)
    assert head + list(resumed) == epoch_sampler().indices().tolist()
    assert list(resumed) == epoch_sampler().indices().tolist()  # the next pass: whole again
    resumed.load_state_dict(state)
    resumed.set_epoch(EPOCH + 1)
    nxt = epoch_sampler()
    nxt.set_epoch(EPOCH + 1)
    assert list(resumed) == nxt.indices().tolist()


# -- torch's Stateful protocol ------------------------------------------------------------
@pytest.mark.timeout(120)
def test_loaders_are_stateful_and_round_trip_through_torch_distributed_checkpoint(root, tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.stateful import Stateful

    from storebench.loaders.torch_adapter import torch_dataloader

    with open_dataset(root) as reader:
        dataset = LazyDataset(reader)
        loader = torch_dataloader(dataset, batch_size=BATCH, sampler=epoch_sampler())
        with ThreadPrefetcher(dataset, BatchSampler(epoch_sampler(), BATCH)) as prefetcher:
            for thing in (epoch_sampler(), BatchSampler(epoch_sampler(), BATCH), dataset,
                          prefetcher, loader):
                assert isinstance(thing, Stateful), thing
            taken = iter(prefetcher)
            head = [batch_bytes(next(taken)) for _ in range(5)]
            dcp.save({"loader": prefetcher}, checkpoint_id=tmp_path)
            del taken
        with ThreadPrefetcher(dataset, BatchSampler(ShuffleSampler(N), BATCH)) as fresh:
            dcp.load({"loader": fresh}, checkpoint_id=tmp_path)
            tail = [batch_bytes(b) for b in fresh]
    assert head + tail == uninterrupted(root, epoch_sampler())


def test_a_state_of_another_dataset_is_refused(root):
    with open_dataset(root) as reader:
        state = ThreadPrefetcher(LazyDataset(reader), BatchSampler(epoch_sampler(), BATCH),
                                 workers=1)
        with state:
            saved = state.state_dict()
    saved["dataset"] = {**saved["dataset"], "content_digest": "0" * 64}
    with (open_dataset(root) as reader,
          ThreadPrefetcher(LazyDataset(reader), BatchSampler(epoch_sampler(), BATCH),
                           workers=1) as other,
          pytest.raises(ValueError, match=f"{root}: this loader state was taken over "
                                          "another dataset .content_digest")):
        other.load_state_dict(saved)


def test_a_state_loads_between_passes_only(root):
    with open_dataset(root) as reader, ThreadPrefetcher(
            LazyDataset(reader), BatchSampler(epoch_sampler(), BATCH), workers=1) as prefetcher:
        state = prefetcher.state_dict()
        taken = iter(prefetcher)
        next(taken)
        with pytest.raises(RuntimeError, match="in the middle of a pass over this "
                                               "ThreadPrefetcher: finish the pass or leave it"):
            prefetcher.load_state_dict(state)
        del taken  # left: the load goes through
        prefetcher.load_state_dict(state)
        assert len(list(prefetcher)) == len(BatchSampler(epoch_sampler(), BATCH))


# -- in one process: read-ahead batches are delivered again -------------------------------
@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", ["thread", "process", "dataloader"])
def test_a_state_counts_delivered_batches_not_those_read_ahead(root, path):
    from storebench.loaders.torch_adapter import torch_dataloader

    expected = uninterrupted(root, epoch_sampler())

    def open_loader(dataset, workers):
        if path == "dataloader":
            return torch_dataloader(dataset, batch_size=BATCH, sampler=epoch_sampler(),
                                    num_workers=workers, multiprocessing_context="fork")
        batches = BatchSampler(epoch_sampler(), BATCH)
        if path == "thread":
            return ThreadPrefetcher(dataset, batches, workers=max(workers, 1))
        return ProcessPrefetcher(dataset, batches, workers=max(workers, 1), start_method="fork")

    def as_bytes(item):
        if path == "dataloader":
            images, labels = item
            return images.numpy().tobytes() + labels.numpy().tobytes()
        return batch_bytes(item)

    if path == "dataloader":  # its batches carry no indices
        expected = [b[: -8 * len(i)] for b, i in zip(expected, BatchSampler(epoch_sampler(),
                                                                              BATCH))]
    with open_dataset(root) as reader:
        dataset = LazyDataset(reader)
        first = open_loader(dataset, 2)
        head = []
        for item in first:
            head.append(as_bytes(item))
            if len(head) == 7:
                break
        state = first.state_dict()
        if hasattr(first, "close"):
            first.close()
        assert json.loads(state["positions"]) == [7 * BATCH]
        second = open_loader(dataset, 0)  # another worker count
        second.load_state_dict(state)
        tail = [as_bytes(item) for item in second]
        again = [as_bytes(item) for item in second]
        if hasattr(second, "close"):
            second.close()
    assert head + tail == expected
    assert again == expected  # the pass after a resume is a whole epoch


# -- SIGKILL at seeded batches, resumed in a fresh process -------------------------------
def run_child(config: dict, tmp: Path) -> subprocess.CompletedProcess:
    path = tmp / "config.json"
    path.write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT_DIR / "lib"), str(ROOT_DIR), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(CHILD), str(path)], capture_output=True,
                          text=True, timeout=150, env=env)


def assert_nothing_left(pids_file: Path) -> None:
    """The killed process's workers end and its shared memory is unlinked (by the resource
    tracker), within a bounded wait."""
    info = json.loads(pids_file.read_text())
    deadline = time.monotonic() + 20
    while True:
        alive = [p for p in info["workers"] if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        segments = list(SHM_DIR.glob(f"{SHM_PREFIX}{info['pid']}_*"))
        if not alive and not segments:
            return
        assert time.monotonic() < deadline, f"left behind: workers {alive}, {segments}"
        time.sleep(0.1)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.parametrize("workers", [(2, 2, 2, 2), (2, 3, 1, 2)], ids=["same", "changed"])
def test_killed_process_epoch_resumes_byte_for_byte(root, tmp_path, start_method, workers):
    total = len(BatchSampler(epoch_sampler(), BATCH))
    rng = np.random.default_rng([7, len(set(workers)), start_method == "spawn"])
    kills = sorted(rng.choice(np.arange(1, total - 1), size=len(workers) - 1, replace=False))
    config = {"root": str(root), "checkpoint": str(tmp_path / "checkpoint.pkl"),
              "out": str(tmp_path / "delivered.pkl"), "pids": str(tmp_path / "pids.json"),
              "prefetcher": "process", "start_method": start_method, "seed": SEED,
              "epoch": EPOCH, "batch_size": BATCH, "every": CHECKPOINT_EVERY}
    for attempt, count in enumerate(workers):
        kill_after = int(kills[attempt]) if attempt < len(kills) else -1
        result = run_child({**config, "workers": count, "kill_after": kill_after}, tmp_path)
        if kill_after >= 0:
            assert result.returncode == -9, result.stderr[-3000:]
            assert_nothing_left(tmp_path / "pids.json")
        else:
            assert result.returncode == 0, result.stderr[-3000:]
    import pickle

    delivered = pickle.loads((tmp_path / "delivered.pkl").read_bytes())
    assert delivered == uninterrupted(root, epoch_sampler())


# -- elastic: 2 -> 3 and 3 -> 2 gloo ranks -----------------------------------------------
def read_then_stop(rank: int, world_size: int, root: str, stops: list[int]) -> dict:
    """In each rank: deliver ``stops[rank]`` batches of the epoch, then the merged state."""
    with open_dataset(root) as reader:
        batches = BatchSampler(epoch_sampler(rank=rank, world_size=world_size), 20)
        with ProcessPrefetcher(LazyDataset(reader), batches, workers=2,
                               start_method="fork") as prefetcher:
            got = []
            for batch in prefetcher:
                got.append((batch.indices.copy(), batch.images.copy()))
                if len(got) == stops[rank]:
                    break
            state = merge_rank_states(gather_across_ranks(prefetcher.state_dict()))
    return {"indices": np.concatenate([g[0] for g in got] or [np.empty(0, np.int64)]),
            "images": [g[1] for g in got], "state": state}


def resume_rest(rank: int, world_size: int, root: str, state: dict) -> dict:
    """In each rank: the rest of the epoch from the merged state, then the next epoch."""
    with open_dataset(root) as reader:
        batches = BatchSampler(ShuffleSampler(N, rank=rank, world_size=world_size), 20)
        with ProcessPrefetcher(LazyDataset(reader), batches, workers=1 + rank % 2,
                               start_method="fork") as prefetcher:
            prefetcher.load_state_dict(state)
            prefetcher.set_epoch(EPOCH)
            rest = [(b.indices.copy(), b.images.copy()) for b in prefetcher]
            prefetcher.set_epoch(EPOCH + 1)
            following = np.concatenate([b.indices.copy() for b in prefetcher])
    return {"indices": np.concatenate([r[0] for r in rest] or [np.empty(0, np.int64)]),
            "images": [r[1] for r in rest], "next": following}


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 2)])
def test_a_resize_delivers_each_remaining_sample_once_across_gloo_ranks(root, old, new):
    stops = [int(s) for s in np.random.default_rng([old, new]).integers(1, 8, size=old)]
    first = run_ranks(read_then_stop, old, args=(str(root), stops), timeout_s=240)
    states = [r["state"] for r in first]
    assert all(s == states[0] for s in states)  # every rank holds every rank's position
    second = run_ranks(resume_rest, new, args=(str(root), states[0]), timeout_s=240)
    whole = np.concatenate([epoch_sampler(rank=r, world_size=old).indices() for r in range(old)])
    before = np.concatenate([r["indices"] for r in first])
    after = np.concatenate([r["indices"] for r in second])
    assert len(before) == 20 * sum(stops)
    assert collections.Counter(before.tolist()) + collections.Counter(after.tolist()) \
        == collections.Counter(whole.tolist())
    with open_dataset(root) as reader:
        truth = LazyDataset(reader)
        for part in (*first, *second):
            images = np.concatenate(part["images"]) if part["images"] else None
            if images is not None:
                np.testing.assert_array_equal(images, truth.get_batch(part["indices"]).images)
    plain = [ShuffleSampler(N, seed=SEED, rank=r, world_size=new) for r in range(new)]
    for sampler, part in zip(plain, second):
        sampler.set_epoch(EPOCH + 1)
        np.testing.assert_array_equal(part["next"], sampler.indices())
