"""How well an epoch's order is shuffled, from the order alone: pure functions over the sample
indices a loader delivered, in delivery order.

- ``storage_rank_correlation``: Spearman's rank correlation between when a sample is delivered
  and where it is stored: 1 for storage order, -1 reversed, about 0 (within ~2/sqrt(n)) for
  any shuffle that does not follow storage order, a block shuffle's too.
- ``distinct_blocks_per_batch``: how many storage blocks (chunks, row groups, shards) each
  batch draws from, against ``expected_distinct_blocks``, a uniform permutation's mean. A
  block shuffle trades this for speed: its batches come from one or two blocks, where a
  uniform shuffle's come from nearly ``batch_size``.
- ``displacement_ratio``: the mean distance between a sample's storage position and its
  delivery position, over a uniform permutation's (n / 3): 0 for storage order, about 1 for
  a uniform shuffle or a shuffle of whole blocks, well below 1 for a shuffle buffer that only
  mixes neighbours.

``shuffle_quality`` gives all of them as one row of metrics with units. Orders may be one
rank's share or a prefix of an epoch; indices may repeat (padding).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _order(order) -> np.ndarray:
    order = np.asarray(order)
    if order.ndim != 1 or (order.size and order.dtype.kind not in "iu"):
        raise TypeError(f"an order is a 1-D array of sample indices, got {order.dtype} "
                        f"of shape {order.shape}")
    return order.astype(np.int64, copy=False)


def _boundaries(boundaries) -> np.ndarray:
    bounds = np.asarray(boundaries, dtype=np.int64).reshape(-1)
    if bounds.size < 2 or bounds[0] != 0 or np.any(np.diff(bounds) <= 0):
        raise ValueError("boundaries must be strictly increasing and start at 0, like "
                         "Reader.blocks()")
    return bounds


def storage_rank_correlation(order) -> float:
    """Spearman's rank correlation of delivery position with storage index (ties among
    repeated indices broken by delivery position). NaN for fewer than two samples."""
    order = _order(order)
    if len(order) < 2:
        return math.nan
    ranks = np.empty(len(order), dtype=np.float64)
    ranks[np.argsort(order, kind="stable")] = np.arange(len(order))
    positions = np.arange(len(order), dtype=np.float64)
    return float(np.corrcoef(positions, ranks)[0, 1])


def distinct_blocks_per_batch(order, boundaries: Sequence[int] | np.ndarray,
                              batch_size: int) -> np.ndarray:
    """For each batch of ``batch_size`` consecutive samples of ``order`` (the last one may
    be shorter), how many distinct blocks of ``boundaries`` (``[0, b1, ..., n]``) it holds."""
    order, bounds = _order(order), _boundaries(boundaries)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if order.size and (order.min() < 0 or order.max() >= bounds[-1]):
        raise ValueError(f"sample indices must be in [0, {bounds[-1]}), got "
                         f"[{order.min()}, {order.max()}]")
    blocks = np.searchsorted(bounds, order, side="right") - 1
    return np.array([len(np.unique(blocks[start:start + batch_size]))
                     for start in range(0, len(blocks), batch_size)], dtype=np.int64)


def expected_distinct_blocks(boundaries: Sequence[int] | np.ndarray, batch_size: int) -> float:
    """The mean number of distinct blocks in a batch of ``batch_size`` samples drawn from a
    uniform permutation of all ``n`` samples: sum over blocks of P(the block is hit) =
    1 - C(n - size, b) / C(n, b)."""
    bounds = _boundaries(boundaries)
    n, b = int(bounds[-1]), min(int(batch_size), int(bounds[-1]))
    hit = 0.0
    for size in np.diff(bounds).tolist():
        # A block larger than n - b is hit by every batch.
        if size <= n - b:
            hit += 1.0 - math.exp(_log_choose(n - size, b) - _log_choose(n, b))
        else:
            hit += 1.0
    return hit


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def displacement_ratio(order, num_samples: int) -> float:
    """Mean |storage index - delivery position scaled to ``num_samples``| over a uniform
    permutation's expectation, ``num_samples / 3``. NaN for an empty order."""
    order = _order(order)
    if not len(order):
        return math.nan
    scaled = np.arange(len(order)) * (num_samples / len(order))
    return float(np.mean(np.abs(order - scaled)) / (num_samples / 3))


def shuffle_quality(order, *, num_samples: int, batch_size: int,
                    boundaries: Sequence[int] | np.ndarray | None = None) -> dict:
    """Every measure above for one delivered order, as ``{metric: (value, unit)}``; the
    block measures only with ``boundaries``."""
    row = {
        "storage_rank_correlation": (storage_rank_correlation(order), "1"),
        "displacement_ratio": (displacement_ratio(order, num_samples), "1"),
    }
    if boundaries is not None:
        per_batch = distinct_blocks_per_batch(order, boundaries, batch_size)
        uniform = expected_distinct_blocks(boundaries, batch_size)
        mean = float(per_batch.mean()) if per_batch.size else math.nan
        row["distinct_blocks_per_batch"] = (mean, "blocks")
        row["uniform_distinct_blocks_per_batch"] = (uniform, "blocks")
        row["distinct_blocks_ratio"] = (mean / uniform, "1")
    return row
