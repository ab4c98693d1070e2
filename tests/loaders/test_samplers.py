from __future__ import annotations

import itertools

import numpy as np
import pytest

from storebench.loaders import (
    BatchSampler,
    BlockShuffleSampler,
    FirstSamples,
    SequentialSampler,
    ShuffleSampler,
)

BOUNDS = np.array([0, 10, 25, 26, 40, 57], dtype=np.int64)  # uneven blocks, one of size 1


def make(kind: str, **kwargs):
    if kind == "sequential":
        return SequentialSampler(57, **kwargs)
    if kind == "shuffle":
        return ShuffleSampler(57, seed=5, **kwargs)
    return BlockShuffleSampler(BOUNDS, seed=5, **kwargs)


KINDS = ["sequential", "shuffle", "block"]


def test_sequential_is_storage_order():
    assert list(SequentialSampler(7)) == list(range(7))


@pytest.mark.parametrize("kind", KINDS)
def test_every_epoch_is_a_permutation(kind):
    sampler = make(kind)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        assert sorted(sampler) == list(range(57))


@pytest.mark.parametrize("kind", ["shuffle", "block"])
def test_shuffles_are_seeded_and_change_per_epoch(kind):
    a, b = make(kind), make(kind)
    assert list(a) == list(b)  # same seed, same epoch: same order in a fresh object
    a.set_epoch(1)
    assert list(a) != list(b)
    b.set_epoch(1)
    assert list(a) == list(b)
    assert list(a) != list(range(57))
    other_seed = (
        ShuffleSampler(57, seed=6) if kind == "shuffle" else BlockShuffleSampler(BOUNDS, seed=6)
    )
    other_seed.set_epoch(1)
    assert list(other_seed) != list(a)


def test_block_shuffle_keeps_blocks_together_and_shuffles_their_order():
    sampler = BlockShuffleSampler(BOUNDS, seed=1)
    block_of = np.searchsorted(BOUNDS, np.arange(57), side="right") - 1
    seen_orders = set()
    for epoch in range(6):
        sampler.set_epoch(epoch)
        blocks = block_of[sampler.indices()]
        runs = blocks[np.r_[True, np.diff(blocks) != 0]]
        assert sorted(runs.tolist()) == list(range(5)), "each block must be one contiguous run"
        seen_orders.add(tuple(runs.tolist()))
    assert len(seen_orders) > 1


def test_block_shuffle_shuffles_each_block_uniformly():
    # Block 0 holds 4 samples: over 2,400 epochs each of its 24 orders turns up about 100
    # times, and each sample leads the block about 600 times.
    sampler = BlockShuffleSampler([0, 4, 9], seed=3)
    orders = []
    for epoch in range(2400):
        sampler.set_epoch(epoch)
        order = sampler.indices()
        orders.append(tuple(order[order < 4].tolist()))
    counts = {o: orders.count(o) for o in set(orders)}
    assert set(counts) == set(itertools.permutations(range(4)))
    assert min(counts.values()) > 60 and max(counts.values()) < 140
    leads = np.bincount([o[0] for o in orders], minlength=4)
    assert np.all(np.abs(leads - 600) < 90)


@pytest.mark.parametrize("blocks", [300, 70_000])  # past uint8 and uint16 block numbers
def test_block_shuffle_keeps_many_blocks_together(blocks):
    bounds = np.arange(blocks + 1) * 2
    order = BlockShuffleSampler(bounds, seed=0).indices()
    assert np.array_equal(np.sort(order), np.arange(2 * blocks))
    block_of = order // 2
    assert np.all(block_of[0::2] == block_of[1::2])
    assert not np.array_equal(block_of[0::2], np.arange(blocks))


def test_block_shuffle_within_block_order_is_optional():
    sampler = BlockShuffleSampler(BOUNDS, seed=1, shuffle_within=False)
    order = sampler.indices()
    for start, stop in zip(BOUNDS[:-1], BOUNDS[1:], strict=True):
        at = int(np.flatnonzero(order == start)[0])
        assert order[at : at + stop - start].tolist() == list(range(start, stop))


@pytest.mark.parametrize("bad", [[0], [1, 5], [0, 5, 5], [0, 7, 3]])
def test_block_shuffle_refuses_bad_boundaries(bad):
    with pytest.raises(ValueError, match="boundaries"):
        BlockShuffleSampler(bad)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ranks_partition_the_epoch_without_drop_last(kind, world_size):
    shards = [make(kind, rank=r, world_size=world_size) for r in range(world_size)]
    for s in shards:
        s.set_epoch(2)
    lists = [s.indices().tolist() for s in shards]
    per_rank = -(-57 // world_size)
    assert all(len(x) == per_rank == len(s) for x, s in zip(lists, shards, strict=True))
    combined = sum(lists, [])
    assert set(combined) == set(range(57))
    # Padding repeats only as many samples as needed to even out the ranks.
    assert len(combined) - 57 == per_rank * world_size - 57


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ranks_are_disjoint_with_drop_last(kind, world_size):
    shards = [make(kind, rank=r, world_size=world_size, drop_last=True) for r in range(world_size)]
    lists = [s.indices().tolist() for s in shards]
    combined = sum(lists, [])
    assert len(combined) == len(set(combined)) == 57 // world_size * world_size
    assert all(len(x) == 57 // world_size for x in lists)


def test_rank_arguments_are_checked():
    with pytest.raises(ValueError, match="rank"):
        SequentialSampler(10, rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size"):
        SequentialSampler(10, world_size=0)


def test_batch_sampler_groups_the_order():
    sampler = ShuffleSampler(10, seed=0)
    batches = list(BatchSampler(sampler, 4))
    assert [len(b) for b in batches] == [4, 4, 2]
    assert np.concatenate(batches).tolist() == list(sampler)
    assert len(BatchSampler(sampler, 4)) == 3
    assert [len(b) for b in BatchSampler(sampler, 4, drop_last=True)] == [4, 4]
    assert len(BatchSampler(sampler, 4, drop_last=True)) == 2
    batch_sampler = BatchSampler(sampler, 4)
    batch_sampler.set_epoch(3)
    assert sampler.epoch == 3


@pytest.mark.parametrize("kind", KINDS)
def test_first_samples_is_the_head_of_each_epoch(kind):
    sampler = make(kind, rank=1, world_size=2)
    head = FirstSamples(sampler, 10)
    assert len(head) == 10 and list(head) == list(sampler)[:10]
    assert head.indices().dtype == np.int64
    head.set_epoch(3)
    assert sampler.epoch == 3 and list(head) == list(sampler)[:10]
    assert [len(b) for b in BatchSampler(head, 4)] == [4, 4, 2]
    whole = FirstSamples(sampler, 1000)
    assert len(whole) == len(sampler) and list(whole) == list(sampler)
    assert list(FirstSamples(iter_only := _IterOnly([5, 3, 9]), 2)) == [5, 3]
    assert len(FirstSamples(iter_only, 0)) == 0
    assert FirstSamples(_Endless(), 3).indices().tolist() == [0, 1, 2]  # reads no further
    with pytest.raises(ValueError, match="count must be >= 0, got -1"):
        FirstSamples(sampler, -1)
    with pytest.raises(TypeError, match="count must be an integer, got float"):
        FirstSamples(sampler, 2.0)


class _Endless:
    def __iter__(self):
        return itertools.count()


class _IterOnly:
    """A sampler with no ``indices()``: any iterable with a length."""

    def __init__(self, order):
        self.order = order

    def __iter__(self):
        return iter(self.order)

    def __len__(self):
        return len(self.order)


@pytest.mark.parametrize("bad", [2.7, 2.0, "2", True, None])
def test_batch_size_must_be_a_positive_integer(bad):
    with pytest.raises(TypeError, match=f"batch_size must be an integer, got {type(bad).__name__}"):
        BatchSampler(SequentialSampler(10), bad)
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        BatchSampler(SequentialSampler(10), 0)
    assert [len(b) for b in BatchSampler(SequentialSampler(10), np.int64(4))] == [4, 4, 2]


@pytest.mark.parametrize("kind", KINDS)
def test_sampler_arguments_must_be_integers(kind):
    with pytest.raises(TypeError, match="rank must be an integer, got float"):
        make(kind, rank=0.0, world_size=2)
    with pytest.raises(TypeError, match="world_size must be an integer, got bool"):
        make(kind, world_size=True)
    sampler = make(kind, rank=np.int64(1), world_size=np.int32(2))
    assert (sampler.rank, sampler.world_size) == (1, 2)
    with pytest.raises(TypeError, match="epoch must be an integer, got float"):
        sampler.set_epoch(1.5)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        sampler.set_epoch(-1)
    with pytest.raises(TypeError, match="num_samples must be an integer, got float"):
        SequentialSampler(57.0)
    with pytest.raises(TypeError, match="seed must be an integer, got str"):
        ShuffleSampler(57, seed="5")
    with pytest.raises(TypeError, match="boundaries must be integers, got float64"):
        BlockShuffleSampler([0.0, 10.5, 57.0])
