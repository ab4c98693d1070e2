"""Index orders for one epoch: sequential, full shuffle, block shuffle; shardable by rank.

Every sampler yields the sample indices of the current epoch (``set_epoch`` changes the
shuffle) and, when ``world_size > 1``, only this rank's share of them. The sharding rules are
``torch.utils.data.DistributedSampler``'s:

- all ranks compute the same epoch order (same ``seed`` and epoch);
- ``drop_last=False``: the order is padded by repeating its first indices until it divides
  evenly, so every rank gets ``ceil(n / world_size)`` indices (a few samples appear twice);
- ``drop_last=True``: the tail that does not divide evenly is dropped, so every rank gets
  ``n // world_size`` indices and no sample appears twice.

One difference: each rank takes a *contiguous* slice of the epoch order, not every
``world_size``-th index, so a sequential or block-shuffled order keeps its locality on every
rank (a strided split would make each rank touch every block).

Sizes, ranks, seeds and epochs must be integers (NumPy integers too); a bool, float or str is
a TypeError rather than a silent truncation. Samplers yield indices in ``0 .. n-1``, which
every Reader and dataset accepts, as they accept Python-style negative ones.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np


def _integer(value, name: str, *, minimum: int | None = None) -> int:
    """``value`` as an int: ints and NumPy integers only (a bool, float or str is a
    TypeError: ``BatchSampler(s, 2.7)`` must not quietly make batches of 2)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


class _ShardedSampler:
    """Shared sharding and epoch bookkeeping; subclasses define ``_epoch_order``."""

    def __init__(
        self, num_samples: int, *, rank: int = 0, world_size: int = 1, drop_last: bool = False
    ) -> None:
        num_samples = _integer(num_samples, "num_samples", minimum=0)
        world_size = _integer(world_size, "world_size", minimum=1)
        rank = _integer(rank, "rank")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        self.num_samples = num_samples
        self.rank = rank
        self.world_size = world_size
        self.drop_last = bool(drop_last)
        self.epoch = 0

    def _epoch_order(self) -> np.ndarray:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order ``__iter__`` and ``indices`` return."""
        self.epoch = _integer(epoch, "epoch", minimum=0)

    @property
    def per_rank(self) -> int:
        """How many indices each rank gets per epoch."""
        if self.drop_last:
            return self.num_samples // self.world_size
        return math.ceil(self.num_samples / self.world_size)

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch, as an int64 array."""
        order = self._epoch_order()
        total = self.per_rank * self.world_size
        if total > len(order):
            # Pad by repeating the order from its start, as DistributedSampler does.
            repeats = math.ceil(total / max(len(order), 1))
            order = np.tile(order, repeats)
        order = order[:total]
        start = self.rank * self.per_rank
        return order[start : start + self.per_rank]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.per_rank

    def _describe(self) -> str:
        return f"n={self.num_samples}, rank={self.rank}/{self.world_size}, epoch={self.epoch}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._describe()})"


class SequentialSampler(_ShardedSampler):
    """Indices in storage order, ``0 .. n-1`` (the same every epoch)."""

    def _epoch_order(self) -> np.ndarray:
        return np.arange(self.num_samples, dtype=np.int64)


class ShuffleSampler(_ShardedSampler):
    """A full random permutation per epoch, from ``default_rng([seed, epoch])``."""

    def __init__(
        self,
        num_samples: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
    ) -> None:
        super().__init__(num_samples, rank=rank, world_size=world_size, drop_last=drop_last)
        self.seed = _integer(seed, "seed", minimum=0)

    def _epoch_order(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.epoch])
        return rng.permutation(self.num_samples).astype(np.int64, copy=False)

    def _describe(self) -> str:
        return f"{super()._describe()}, seed={self.seed}"


class BlockShuffleSampler(_ShardedSampler):
    """Shuffle the order of blocks (chunks, row groups, shards), then samples within each.

    ``boundaries`` is ``[0, b1, ..., n]`` as returned by ``Reader.blocks()``. Consecutive
    indices then stay inside one block for a whole block, so a format that must read a whole
    block per access (a Parquet row group, an HDF5 chunk) reads each block once per epoch.
    ``shuffle_within=False`` keeps storage order inside each block.
    """

    def __init__(
        self,
        boundaries: Sequence[int] | np.ndarray,
        *,
        seed: int = 0,
        shuffle_within: bool = True,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
    ) -> None:
        bounds = np.asarray(boundaries)
        if bounds.size and bounds.dtype.kind not in "iu":
            raise TypeError(f"boundaries must be integers, got {bounds.dtype}")
        bounds = bounds.astype(np.int64).reshape(-1)
        if bounds.size < 2 or bounds[0] != 0 or np.any(np.diff(bounds) <= 0):
            raise ValueError(
                "boundaries must be strictly increasing and start at 0, like Reader.blocks(); "
                f"got {bounds[:8].tolist()}{'...' if bounds.size > 8 else ''}"
            )
        super().__init__(int(bounds[-1]), rank=rank, world_size=world_size, drop_last=drop_last)
        self.boundaries = bounds
        self.seed = _integer(seed, "seed", minimum=0)
        self.shuffle_within = bool(shuffle_within)
        # Each sample's block, worked out once, in the narrowest unsigned type that holds a
        # block number: the per-epoch stable sort on it is then numpy's radix sort, O(n).
        blocks = len(bounds) - 1
        self._key_type = np.uint8 if blocks <= 1 << 8 else (
            np.uint16 if blocks <= 1 << 16 else np.int64)
        self._block_of_sample = np.repeat(np.arange(blocks, dtype=self._key_type),
                                          np.diff(bounds))

    @classmethod
    def from_reader(cls, reader, **kwargs) -> BlockShuffleSampler:
        """A block-shuffle sampler over ``reader.blocks()``."""
        return cls(reader.blocks(), **kwargs)

    @property
    def num_blocks(self) -> int:
        return len(self.boundaries) - 1

    def _epoch_order(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.epoch])
        position_of_block = np.empty(self.num_blocks, dtype=self._key_type)
        position_of_block[rng.permutation(self.num_blocks)] = np.arange(
            self.num_blocks, dtype=self._key_type)
        # A stable sort by the position of each sample's block in the shuffled block order
        # keeps, inside each block, the order the samples came in: storage order, or a
        # uniform random permutation's, which leaves each block's samples uniformly shuffled.
        # (A lexsort on a random key per sample did the same in O(n log n), several times
        # slower: much of the time of a capped epoch read from RAM.)
        order = (rng.permutation(self.num_samples) if self.shuffle_within
                 else np.arange(self.num_samples))
        keys = position_of_block[self._block_of_sample[order]]
        return order[np.argsort(keys, kind="stable")].astype(np.int64, copy=False)

    def _describe(self) -> str:
        return f"{super()._describe()}, blocks={self.num_blocks}, seed={self.seed}"


class FirstSamples:
    """The first ``count`` indices of each epoch of ``sampler`` (all of them where it has
    fewer), in its order; ``set_epoch`` is passed on. A loader handed it gets no more work
    than will be taken: a prefetcher stopped after a few batches of a whole epoch has read
    ahead batches nobody takes, and its stop waits for those in hand."""

    def __init__(self, sampler, count: int) -> None:
        self.sampler = sampler
        self.count = _integer(count, "count", minimum=0)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def indices(self) -> np.ndarray:
        if hasattr(self.sampler, "indices"):
            return self.sampler.indices()[: self.count]
        return np.fromiter(itertools.islice(self.sampler, self.count), dtype=np.int64)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return min(self.count, len(self.sampler))

    def __repr__(self) -> str:
        return f"FirstSamples({self.sampler!r}, count={self.count})"


class BatchSampler:
    """Groups a sampler's indices into int64 arrays of ``batch_size`` (the last one shorter
    unless ``drop_last``). Re-iterable; ``set_epoch`` is passed on to the sampler, so it can
    be handed to prefetchers and to ``DataLoader(batch_sampler=...)``."""

    def __init__(self, sampler, batch_size: int, *, drop_last: bool = False) -> None:
        self.sampler = sampler
        self.batch_size = _integer(batch_size, "batch_size", minimum=1)
        self.drop_last = bool(drop_last)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def _all_indices(self) -> np.ndarray:
        if hasattr(self.sampler, "indices"):
            return self.sampler.indices()
        return np.fromiter(iter(self.sampler), dtype=np.int64)

    def __iter__(self) -> Iterator[np.ndarray]:
        order = self._all_indices()
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        for start in range(0, stop, self.batch_size):
            yield order[start : start + self.batch_size]

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __repr__(self) -> str:
        return f"BatchSampler({self.sampler!r}, batch_size={self.batch_size})"
