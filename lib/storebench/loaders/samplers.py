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

**Resuming an epoch** (``state_dict`` / ``load_state_dict``, torch's ``Stateful`` protocol).
An epoch's order is a pure function of (seed, epoch, rank, world size), so a state is a few
numbers: the seed, the epoch and each rank's position in its share (samples taken), never a
buffer. ``load_state_dict`` makes the *next pass* deliver the rest of that epoch; the pass
after it (and ``set_epoch`` to another epoch) starts clean. ``set_epoch`` to the epoch the
state holds keeps the position, so the usual ``sampler.set_epoch(epoch)`` at the top of a
training loop's epoch does not undo a resume.

- **Same world size**: the rest of this rank's share, in the same order: the batches an
  uninterrupted epoch would have delivered, bit for bit.
- **Another world size** (elastic): the states of *every* old rank, merged with
  ``merge_rank_states`` (in ranks: ``merge_rank_states(gather_across_ranks(state))``), say
  which entries of the epoch are left: each old rank's unread tail, concatenated in rank
  order. That remaining multiset is split into contiguous shares, one per new rank, whose
  sizes differ by at most one (``np.array_split``), so every remaining entry is delivered
  exactly once across the new ranks and the epoch as a whole delivers what an uninterrupted
  one at the old world size would (its padding repeats included, its ``drop_last`` tail left
  out). The new ranks may then run a batch more or less than each other in that epoch: a
  loop with a collective per batch needs ``torch.distributed.algorithms.Join`` or a check.
  The next epoch is a plain one at the new world size.

A sampler that is iterated counts what it yields, so a loader that reads ahead (a
prefetcher, a DataLoader's workers) takes its state from itself, not from the sampler: it
counts the samples it has *delivered*, and batches read ahead but not delivered when the state
was taken are delivered again after a resume. Variable-length parts of the state (the
positions, earlier resumes) are JSON strings, so that a state's keys are the same at every
position and world size, as ``torch.distributed.checkpoint``'s in-place load requires.
"""

from __future__ import annotations

import itertools
import json
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


STATE_FORMAT = "storebench.loader-state/1"


def merge_rank_states(states: Sequence[dict]) -> dict:
    """One state holding every rank's position, from the states of all ranks of one epoch
    (each rank's ``state_dict()``, in any order; in ranks, ``gather_across_ranks`` collects
    them). Any world size can resume from it. Raises ValueError when the states are of
    different samplers or epochs, or a rank is missing or given twice."""
    states = list(states)
    if not states:
        raise ValueError("merge_rank_states needs the state of every rank, got none")
    first = states[0]
    _check_format(first)
    world_size = first["world_size"]
    merged: list[int | None] = [None] * world_size
    for state in states:
        _check_format(state)
        differing = sorted(k for k in set(first) | set(state)
                           if k != "positions" and first.get(k) != state.get(k))
        if differing:
            raise ValueError(
                "merge_rank_states: the states differ in "
                + ", ".join(f"{k} ({first.get(k)!r} vs {state.get(k)!r})" for k in differing)
                + ": they are not the ranks of one epoch")
        for rank, position in enumerate(json.loads(state["positions"])):
            if position is None:
                continue
            if merged[rank] is not None and merged[rank] != position:
                raise ValueError(f"merge_rank_states: rank {rank} is given twice, at "
                                 f"positions {merged[rank]} and {position}")
            merged[rank] = position
    missing = [rank for rank, position in enumerate(merged) if position is None]
    if missing:
        raise ValueError(f"merge_rank_states: no state of rank(s) {missing} of "
                         f"{world_size}; every rank's state is needed")
    return {**first, "positions": json.dumps(merged)}


def _check_format(state) -> None:
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"not a storebench loader state (format {found!r}, expected "
                         f"{STATE_FORMAT!r})")


class _ShardedSampler:
    """Shared sharding, epoch and resume bookkeeping; subclasses define ``_epoch_order``."""

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
        self._restart()

    def _restart(self) -> None:
        # Earlier world sizes of this epoch, oldest first: (world_size, every rank's position).
        self._resumed_from: tuple[tuple[int, tuple[int, ...]], ...] = ()
        self._position = 0  # samples of this rank's share taken in this epoch
        self._pending = False  # the next pass resumes at _position rather than starting clean
        self.passes = 0  # passes begun, so that a loader can tell a new pass from the last

    def _epoch_order(self) -> np.ndarray:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order ``__iter__`` and ``indices`` return. Another epoch
        than the current one starts clean; the current one keeps a loaded position."""
        epoch = _integer(epoch, "epoch", minimum=0)
        if epoch != self.epoch:
            passes = self.passes
            self._restart()
            self.passes = passes
        self.epoch = epoch

    @property
    def per_rank(self) -> int:
        """How many indices each rank gets per epoch."""
        return self._per_rank(self.world_size)

    def _per_rank(self, world_size: int) -> int:
        if self.drop_last:
            return self.num_samples // world_size
        return math.ceil(self.num_samples / world_size)

    def _share(self, order: np.ndarray, resumed_from, rank: int, world_size: int) -> np.ndarray:
        """Rank ``rank``'s share of the epoch ``order`` at ``world_size``, after the earlier
        world sizes ``resumed_from`` (see the module docstring)."""
        if resumed_from:
            *earlier, (old_world, positions) = resumed_from
            left = [self._share(order, earlier, old, old_world)[position:]
                    for old, position in enumerate(positions)]
            return np.array_split(np.concatenate(left), world_size)[rank]
        per_rank = self._per_rank(world_size)
        total = per_rank * world_size
        if total > len(order):
            # Pad by repeating the order from its start, as DistributedSampler does.
            repeats = math.ceil(total / max(len(order), 1))
            order = np.tile(order, repeats)
        order = order[:total]
        start = rank * per_rank
        return order[start : start + per_rank]

    def indices(self) -> np.ndarray:
        """This rank's indices for the next pass, as an int64 array: the whole share of the
        current epoch, or after ``load_state_dict`` the part of it still to deliver."""
        if not self._pending:
            return self._share(self._epoch_order(), (), self.rank, self.world_size)
        share = self._share(self._epoch_order(), self._resumed_from, self.rank, self.world_size)
        return share[self._position:]

    def begin_pass(self) -> np.ndarray:
        """Start a pass: its indices (``indices()``), with the position counting from where
        it begins. For loaders that drive the sampler; ``advance`` counts what they take."""
        order = self.indices()
        if not self._pending:
            self._resumed_from, self._position = (), 0
        self._pending = False
        self.passes += 1
        return order

    def advance(self, count: int) -> None:
        """Count ``count`` more samples of the current pass as taken."""
        self._position += count

    def __iter__(self) -> Iterator[int]:
        for index in self.begin_pass().tolist():
            self._position += 1
            yield index

    def __len__(self) -> int:
        return len(self.indices()) if self._pending else self.per_rank

    # -- state (torch's Stateful protocol) --------------------------------------------------
    def _identity(self) -> dict:
        """What a state must agree on to be loaded here (the seed and epoch it sets)."""
        return {"sampler": type(self).__name__, "num_samples": self.num_samples,
                "drop_last": self.drop_last}

    def position(self) -> int:
        """Samples of this rank's share of the epoch taken so far (its current layout's)."""
        return self._position

    def state_at(self, position: int) -> dict:
        """The state of this sampler had ``position`` samples of the current pass's share
        been delivered: what a loader that reads ahead reports (see the module docstring)."""
        positions: list[int | None] = [None] * self.world_size
        positions[self.rank] = int(position)
        return {
            "format": STATE_FORMAT, **self._identity(), "epoch": self.epoch,
            "seed": getattr(self, "seed", 0), "world_size": self.world_size,
            "positions": json.dumps(positions),
            "resumed_from": json.dumps([[w, list(p)] for w, p in self._resumed_from]),
        }

    def state_dict(self) -> dict:
        """The epoch, the seed and this rank's position: the samples this sampler has
        yielded in the current epoch."""
        return self.state_at(self._position)

    def load_state_dict(self, state_dict: dict) -> None:
        """Make the next pass deliver the rest of the state's epoch (see the module
        docstring); takes its seed and epoch. A state of another world size must hold every
        rank's position (``merge_rank_states``). Raises ValueError for a state of another
        sampler or dataset size, or without the position this rank needs."""
        _check_format(state_dict)
        differing = {k: (state_dict.get(k), v) for k, v in self._identity().items()
                     if state_dict.get(k) != v}
        if differing:
            raise ValueError(
                f"cannot load this state into {self!r}: it differs in "
                + ", ".join(f"{k} (state {a!r}, sampler {b!r})" for k, (a, b) in differing.items()))
        positions = json.loads(state_dict["positions"])
        resumed_from = tuple((int(w), tuple(p)) for w, p in json.loads(state_dict["resumed_from"]))
        old_world = _integer(state_dict["world_size"], "world_size", minimum=1)
        if len(positions) != old_world:
            raise ValueError(f"a state of world size {old_world} holds {len(positions)} positions")
        known = [rank for rank, p in enumerate(positions) if p is not None]
        if old_world == self.world_size:
            if positions[self.rank] is None:
                raise ValueError(
                    f"this state holds the position of rank(s) {known} only, and this sampler "
                    f"is rank {self.rank}: load each rank's own state, or one merged with "
                    "merge_rank_states")
            position = positions[self.rank]
        else:
            if len(known) != old_world:
                raise ValueError(
                    f"resuming at world size {self.world_size} from a state taken at world "
                    f"size {old_world} needs every old rank's position, and this state holds "
                    f"rank(s) {known} only: merge them with merge_rank_states("
                    "gather_across_ranks(state)) before saving")
            resumed_from = (*resumed_from, (old_world, tuple(positions)))
            position = 0
        if hasattr(self, "seed"):
            self.seed = _integer(state_dict["seed"], "seed", minimum=0)
        self.epoch = _integer(state_dict["epoch"], "epoch", minimum=0)
        self._check_positions(resumed_from, position)
        self._resumed_from, self._position, self._pending = resumed_from, position, True

    def _check_positions(self, resumed_from, position: int) -> None:
        order = self._epoch_order()
        levels = list(resumed_from)
        for depth in range(len(levels) + 1):
            if depth < len(levels):
                world, positions = levels[depth]
                checks = list(enumerate(positions))
            else:
                world, checks = self.world_size, [(self.rank, position)]
            for rank, at in checks:
                size = len(self._share(order, levels[:depth], rank, world))
                if not (isinstance(at, int) and 0 <= at <= size):
                    raise ValueError(
                        f"this state's position {at!r} of rank {rank} (world size {world}) "
                        f"is outside its share of {size} samples: not a state of this epoch")

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

    def _identity(self) -> dict:
        return {**super()._identity(), "num_blocks": self.num_blocks,
                "shuffle_within": self.shuffle_within}

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
    be handed to prefetchers and to ``DataLoader(batch_sampler=...)``.

    Over a storebench sampler it is resumable: ``state_dict`` / ``load_state_dict`` are the
    sampler's, its position counting the samples of the batches yielded. The batch size is
    not part of the state: resumed with the same one, the rest of the epoch comes in the same
    batches; a state taken mid-batch (a cut-short pass) resumes at that sample. With
    ``drop_last``, a resume at another world size drops each new rank's incomplete last
    batch of its share of the remaining samples, as an epoch drops each rank's."""

    def __init__(self, sampler, batch_size: int, *, drop_last: bool = False) -> None:
        self.sampler = sampler
        self.batch_size = _integer(batch_size, "batch_size", minimum=1)
        self.drop_last = bool(drop_last)
        self.pass_start = 0  # the sampler's position where the current pass began

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    @property
    def resumable(self) -> bool:
        return hasattr(self.sampler, "begin_pass")

    @property
    def passes(self) -> int:
        return getattr(self.sampler, "passes", 0)

    def _all_indices(self) -> np.ndarray:
        if self.resumable:
            order = self.sampler.begin_pass()
            self.pass_start = self.sampler.position()
            return order
        if hasattr(self.sampler, "indices"):
            return self.sampler.indices()
        return np.fromiter(iter(self.sampler), dtype=np.int64)

    def __iter__(self) -> Iterator[np.ndarray]:
        order = self._all_indices()
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        counts = self.resumable
        for start in range(0, stop, self.batch_size):
            batch = order[start : start + self.batch_size]
            if counts:
                self.sampler.advance(len(batch))
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _sampler_state(self, method: str):
        if not self.resumable:
            raise TypeError(f"{self!r} cannot be resumed: its sampler {self.sampler!r} is not "
                            "a storebench sampler with a state")
        return getattr(self.sampler, method)

    def state_at(self, position: int) -> dict:
        """The state had ``position`` samples of the current pass's share been delivered."""
        return self._sampler_state("state_at")(position)

    def state_dict(self) -> dict:
        return self._sampler_state("state_dict")()

    def load_state_dict(self, state_dict: dict) -> None:
        self._sampler_state("load_state_dict")(state_dict)

    def __repr__(self) -> str:
        return f"BatchSampler({self.sampler!r}, batch_size={self.batch_size})"
