"""The correctness study's measures: pure functions over what a loader delivered, each sample
named by its own content (its label, unique per sample in the study's probe sets) and each
augmentation draw read back from its pixels (``recipes.probe.recover_box``).

- ``count_deliveries``: exactly once. Which indices were delivered twice or never, and how
  many of the extra copies are the padding a sampler adds so that every rank gets as many
  samples (counted apart: that is a documented choice, not a lost or repeated sample).
- ``shared_draws``, ``same_draws``, ``sequence_matches``, ``draw_correlation``: distinct
  randomness and determinism, from the crop boxes and flips recovered from the pixels.
- ``longest_stored_run`` and ``storage_rank_correlation``: shuffle quality, one measure for
  every recipe.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...bench.shuffle_quality import storage_rank_correlation
from ...recipes.probe import PROBE_SIDE, CropBox

# Two recovered draws are the same draw when every box edge agrees within this many source
# pixels and the flip is the same: one draw read back from two samples' JPEGs differs by a
# fraction of a pixel, two independent draws almost never come this close on all four.
DRAW_TOLERANCE_PX = 1.0
# The most the draws of two ranks may correlate (the study's definition of independent).
RANK_CORRELATION_LIMIT = 0.05

__all__ = ["DRAW_TOLERANCE_PX", "RANK_CORRELATION_LIMIT", "DeliveryCount",
           "correlated", "count_deliveries", "draw_array", "draw_correlation",
           "longest_stored_run", "pooled_correlation", "recover_boxes",
           "same_draws", "same_order", "sequence_matches", "shared_draws",
           "storage_rank_correlation"]


@dataclass(frozen=True)
class DeliveryCount:
    """One epoch's deliveries against the set: ``duplicated`` names the indices delivered
    more than once, ``missing`` those never delivered, ``unknown`` the delivered labels
    that are no sample of the set. ``duplicates`` counts the extra copies that are not
    padding; ``padding`` the extra copies a rank split adds to even out ranks."""

    expected: int
    delivered: int
    duplicated: tuple[int, ...]
    missing: tuple[int, ...]
    unknown: tuple[int, ...]
    duplicates: int
    padding: int

    @property
    def misses(self) -> int:
        return len(self.missing)

    @property
    def exact(self) -> bool:
        """Every sample once, beyond the padding that evens out ranks."""
        return not (self.duplicates or self.missing or self.unknown)


def count_deliveries(labels: Sequence[int] | np.ndarray, num_samples: int, *,
                     per_rank: Sequence[int] | None = None) -> DeliveryCount:
    """Audit one epoch's delivered ``labels`` (of every rank, concatenated) against the set
    ``0 .. num_samples - 1``. ``per_rank``: how many samples each rank delivered; where
    every rank delivered ``ceil(num_samples / ranks)``, up to that many extra copies beyond
    the set are padding (what ``DistributedSampler`` and storebench's samplers add with
    ``drop_last`` off), the rest are duplicates."""
    labels = [int(label) for label in np.asarray(labels).reshape(-1)]
    counts = Counter(labels)
    unknown = tuple(sorted(label for label in counts if not 0 <= label < num_samples))
    known = {label: n for label, n in counts.items() if 0 <= label < num_samples}
    missing = tuple(index for index in range(num_samples) if index not in known)
    duplicated = tuple(sorted(label for label, n in known.items() if n > 1))
    extra = sum(n - 1 for n in known.values())
    allowance = 0
    if per_rank is not None and len(per_rank) > 1:
        even = math.ceil(num_samples / len(per_rank))
        if all(int(n) == even for n in per_rank):
            allowance = even * len(per_rank) - num_samples
    padding = min(extra, allowance)
    return DeliveryCount(num_samples, len(labels), duplicated, missing, unknown,
                         extra - padding, padding)


def recover_boxes(images: np.ndarray, side: int = PROBE_SIDE) -> list[CropBox]:
    """``recipes.probe.recover_box`` of every image of a (B, H, W, 3) batch at once: the same
    least-squares lines through each image's column means of red and row means of green,
    in closed form."""
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[3] < 2:
        raise ValueError(f"a batch of probe crops is (B, H, W, 3), got shape {images.shape}")
    count, height, width = images.shape[:3]
    scale = (side - 1) / 255.0
    columns = images[..., 0].mean(axis=1, dtype=np.float64) * scale  # (B, W)
    rows = images[..., 1].mean(axis=2, dtype=np.float64) * scale  # (B, H)

    def line(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        positions = np.arange(values.shape[1], dtype=np.float64)
        centred = positions - positions.mean()
        slope = (values * centred).sum(axis=1) / (centred ** 2).sum()
        return slope, values.mean(axis=1) - slope * positions.mean()

    x_slope, x_first = line(columns)
    y_slope, y_first = line(rows)
    widths, heights = np.abs(x_slope) * width, np.abs(y_slope) * height
    flipped = x_slope < 0
    first = x_first + 0.5
    lefts = np.where(flipped, first - widths * (width - 0.5) / width,
                     first - 0.5 * widths / width)
    tops = y_first + 0.5 - 0.5 * heights / height
    return [CropBox(float(lefts[k]), float(tops[k]), float(widths[k]), float(heights[k]),
                    bool(flipped[k])) for k in range(count)]


def draw_array(boxes: Sequence[CropBox]) -> np.ndarray:
    """(n, 5) float64: each draw's left, top, width, height (source pixels) and flip."""
    return np.array([(b.left, b.top, b.width, b.height, float(b.flipped)) for b in boxes],
                    dtype=np.float64).reshape(-1, 5)


def _alike(a: np.ndarray, b: np.ndarray, tolerance: float) -> np.ndarray:
    """Row-wise: draw ``a[i]`` is draw ``b[i]`` (edges within ``tolerance``, same flip)."""
    return (np.abs(a[:, :4] - b[:, :4]).max(axis=1) <= tolerance) & (a[:, 4] == b[:, 4])


def shared_draws(boxes: Sequence[CropBox], *, tolerance: float = DRAW_TOLERANCE_PX) -> float:
    """The share of draws that another sample of the same list also drew: about 0 for
    independent draws, about ``1 - 1 / workers`` where workers repeat each other's random
    sequence (one seed in every worker)."""
    draws = draw_array(boxes)
    if len(draws) < 2:
        return 0.0
    shared = np.zeros(len(draws), dtype=bool)
    for start in range(0, len(draws), 256):  # blocks of rows: a few MB at a time
        block = draws[start:start + 256]
        close = (np.abs(block[:, None, :4] - draws[None, :, :4]).max(axis=2) <= tolerance) & (
            block[:, None, 4] == draws[None, :, 4])
        close[np.arange(len(block)), np.arange(start, start + len(block))] = False
        shared[start:start + len(block)] = close.any(axis=1)
    return float(shared.mean())


def same_draws(first: Mapping[int, CropBox], second: Mapping[int, CropBox], *,
               tolerance: float = DRAW_TOLERANCE_PX) -> tuple[float, int]:
    """Over the samples both hold (sample -> its draw): the share drawn alike, and how many
    were compared."""
    common = sorted(set(first) & set(second))
    if not common:
        return math.nan, 0
    alike = _alike(draw_array([first[k] for k in common]),
                   draw_array([second[k] for k in common]), tolerance)
    return float(alike.mean()), len(common)


def sequence_matches(first: Sequence[CropBox], second: Sequence[CropBox], *,
                     tolerance: float = DRAW_TOLERANCE_PX) -> float:
    """The share of positions at which two delivered sequences hold the same draw (two ranks
    or two workers seeded alike: about 1)."""
    count = min(len(first), len(second))
    if not count:
        return math.nan
    return float(_alike(draw_array(first[:count]), draw_array(second[:count]),
                        tolerance).mean())


def _features(boxes: Sequence[CropBox], side: int) -> np.ndarray:
    """Each draw as (area, log ratio, centre x, centre y, flip): what a crop decides."""
    draws = draw_array(boxes)
    area = draws[:, 2] * draws[:, 3] / (side * side)
    ratio = np.log(np.maximum(draws[:, 2], 1e-9) / np.maximum(draws[:, 3], 1e-9))
    return np.column_stack([area, ratio, draws[:, 0] + draws[:, 2] / 2,
                            draws[:, 1] + draws[:, 3] / 2, draws[:, 4]])


def draw_correlation(first: Sequence[CropBox], second: Sequence[CropBox], *,
                     side: int = PROBE_SIDE) -> float:
    """Pearson's correlation of two delivered sequences' draws, position by position, over
    every feature of a draw at once (each standardised over the two sequences): about 0
    (within ~1/sqrt(5n)) for independent streams, 1 for one stream delivered twice."""
    count = min(len(first), len(second))
    if count < 2:
        return math.nan
    a, b = _features(first[:count], side), _features(second[:count], side)
    both = np.vstack([a, b])
    spread = both.std(axis=0)
    spread[spread == 0] = 1.0
    a, b = (a - both.mean(axis=0)) / spread, (b - both.mean(axis=0)) / spread
    x, y = a.reshape(-1), b.reshape(-1)
    if x.std() == 0 or y.std() == 0:
        return 1.0 if np.array_equal(x, y) else 0.0
    return float(np.corrcoef(x, y)[0, 1])


def pooled_correlation(pairs: Sequence[tuple[Sequence[CropBox], Sequence[CropBox]]], *,
                       side: int = PROBE_SIDE) -> tuple[float, int]:
    """``draw_correlation`` over several pairs of sequences (every pair of ranks) at once:
    the mean of their standardised products, weighted by length, and how many values it
    pools. One pair of ranks seeded alike among six still shows as 1/6."""
    total, count = 0.0, 0
    for first, second in pairs:
        n = min(len(first), len(second))
        if n < 2:
            continue
        values = 5 * n
        total += draw_correlation(first, second, side=side) * values
        count += values
    return (total / count if count else math.nan), count


def correlated(correlation: float, values: int, *,
               limit: float = RANK_CORRELATION_LIMIT) -> bool:
    """Whether draws correlate: beyond ``limit`` and beyond three standard errors of a
    correlation over ``values`` independent values (a short epoch's noise alone can pass
    the limit)."""
    if not values or math.isnan(correlation):
        return False
    return abs(correlation) >= max(limit, 3 / math.sqrt(values))


def same_order(first: Sequence[int], second: Sequence[int]) -> float:
    """The share of positions (over the longer order) holding the same sample."""
    count = max(len(first), len(second))
    if not count:
        return math.nan
    shorter = min(len(first), len(second))
    equal = np.asarray(first[:shorter]) == np.asarray(second[:shorter])
    return float(equal.sum() / count)


def longest_stored_run(order: Sequence[int] | np.ndarray) -> int:
    """The most consecutive deliveries that are consecutive stored samples (``i, i + 1,
    ...``): the set's size for storage order, 1 or 2 for a full shuffle, a shard's length
    for a shuffle that reads shards whole."""
    order = np.asarray(order, dtype=np.int64).reshape(-1)
    if not order.size:
        return 0
    steps = np.flatnonzero(np.diff(order) != 1)
    bounds = np.concatenate([[-1], steps, [order.size - 1]])
    return int(np.diff(bounds).max())
