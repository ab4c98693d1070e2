"""Shuffle-quality measures: exact values on orders whose answer is known, and our samplers'
orders where the theory says where they fall."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from storebench.bench.shuffle_quality import (
    displacement_ratio,
    distinct_blocks_per_batch,
    expected_distinct_blocks,
    shuffle_quality,
    storage_rank_correlation,
)
from storebench.loaders import BlockShuffleSampler, SequentialSampler, ShuffleSampler

N = 12_000
BOUNDS = np.arange(0, N + 1, 500)  # 24 blocks of 500
BATCH = 64


def test_storage_order_and_its_reverse():
    order = np.arange(N)
    assert storage_rank_correlation(order) == pytest.approx(1.0)
    assert storage_rank_correlation(order[::-1]) == pytest.approx(-1.0)
    assert displacement_ratio(order, N) == 0.0
    per_batch = distinct_blocks_per_batch(order, BOUNDS, 100)
    assert per_batch.tolist() == [1] * 120  # 500-sample blocks, 100-sample batches


def test_expected_distinct_blocks_matches_enumeration():
    bounds = [0, 1, 3, 6]  # blocks of 1, 2 and 3 samples
    for b in (1, 2, 3, 6):
        draws = list(itertools.combinations(range(6), b))
        blocks = np.searchsorted(bounds, np.array(draws), side="right") - 1
        mean = np.mean([len(set(row)) for row in blocks])
        assert expected_distinct_blocks(bounds, b) == pytest.approx(mean)


def test_a_uniform_shuffle_is_uncorrelated_and_spread_a_block_shuffle_is_not_mixed():
    uniform = ShuffleSampler(N, seed=1).indices()
    assert abs(storage_rank_correlation(uniform)) < 4 / math.sqrt(N)
    assert displacement_ratio(uniform, N) == pytest.approx(1.0, abs=0.05)
    expected = expected_distinct_blocks(BOUNDS, BATCH)
    assert distinct_blocks_per_batch(uniform, BOUNDS, BATCH).mean() == pytest.approx(
        expected, rel=0.03)
    blocked = BlockShuffleSampler(BOUNDS, seed=1).indices()
    assert abs(storage_rank_correlation(blocked)) < 0.5  # 24 blocks: the block order's noise
    assert distinct_blocks_per_batch(blocked, BOUNDS, BATCH).max() <= 2
    row = shuffle_quality(blocked, num_samples=N, batch_size=BATCH, boundaries=BOUNDS)
    assert row["distinct_blocks_ratio"][0] < 2 / expected
    assert row["uniform_distinct_blocks_per_batch"] == (expected, "blocks")


def test_a_rank_share_is_measured_against_its_own_length():
    share = SequentialSampler(N, rank=1, world_size=4).indices()
    assert storage_rank_correlation(share) == pytest.approx(1.0)
    assert displacement_ratio(share, N) > 0  # a quarter of the set, spread over all of it


def test_bad_input_is_refused():
    with pytest.raises(TypeError, match="1-D array of sample indices"):
        storage_rank_correlation(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match=r"must be in \[0, 12000\)"):
        distinct_blocks_per_batch([N], BOUNDS, 4)
    with pytest.raises(ValueError, match="strictly increasing and start at 0"):
        expected_distinct_blocks([1, 2], 4)
    assert math.isnan(storage_rank_correlation([3]))
