"""Start-up apart from steady state: the read-ahead rule and the steady window of a loader
run, shared by the loader cases.

A loader case times two things apart (``shared_cases.loader_epoch_case``):

- **time to first batch**: a fresh loader (its workers started in the timed region) from
  before its dataset is made to the first batch handed out;
- **steady state**: the batches handed out after everything the loader could have read
  ahead while it started. The rule (``read_ahead_batches``): a loader holds at most *D*
  batches in flight or ready before the consumer lets go of its first, so batches 0 to
  *D - 1* may all have been read during start-up and come out back to back. The window
  opens when batch *D* (the (*D* + 1)-th) is handed out and counts the batches after it,
  over the time from that hand-out to the last batch's: a rate over intervals between
  hand-outs, none of which holds start-up. It closes once it holds at least
  ``SteadyMinimum.batches`` batches and ``SteadyMinimum.seconds`` seconds (the plan's
  ``steady_batches`` and ``steady_seconds``: 20 batches and 1 s by default).

*D* per path: our ``ThreadPrefetcher`` / ``ProcessPrefetcher`` and the baselines, their
window ``depth`` (2 per worker by default); torch ``DataLoader``, ``prefetch_factor`` x
``num_workers``; tf.data, its shuffle buffer in batches (``tf_data``: the buffer, at most
an epoch's samples, fills before the first batch) plus ``AUTOTUNE_READ_AHEAD_PER_CORE`` per
usable core (AUTOTUNE has no fixed depth); the one-thread path, 0 (it reads nothing ahead:
the window opens at its first batch).

An epoch of a small set may hold fewer batches than that. Where the path keeps its workers
across epochs (``persists_workers``), the next epoch runs through the same loader and the
window runs on across the boundary, the wait at the boundary included, as training sees it.
Where it cannot (a path that starts its workers per pass), each epoch is a fresh start: the
window skips *D* batches again, and its seconds and batches are the sum of the epochs'
windows. A cold lazy read stops with its first epoch: a later one would read the cache.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

# AUTOTUNE sizes tf.data's prefetch buffers as it goes; two batches per core bounds what it
# holds here, as our prefetchers' default holds two per worker.
AUTOTUNE_READ_AHEAD_PER_CORE = 2
# Paths that start their workers (threads or processes) per pass over the batches, so that
# an epoch is a fresh start: the locked-list baseline's producer thread, tf.data's
# from_generator (each iteration calls the generator anew).
PER_PASS_PATHS = ("locked_list_baseline", "tf_generator")
# Paths with no workers of their own: nothing to keep or start.
NO_WORKER_PATHS = ("none",)


@dataclass(frozen=True)
class SteadyMinimum:
    """What a steady window must hold before a run may stop: at least ``batches`` batches
    (one at the least) and ``seconds`` seconds."""

    batches: int = 1
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.batches < 0 or not self.seconds >= 0:
            raise ValueError(f"a steady minimum needs batches >= 0 and seconds >= 0, got "
                             f"{self.batches} and {self.seconds}")


def has_workers(prefetcher: str, workers: int | None) -> bool:
    """Whether loader path ``prefetcher`` with ``workers`` runs workers of its own (tf.data:
    its runtime's threads)."""
    if prefetcher in NO_WORKER_PATHS:
        return False
    return bool(workers) or prefetcher in ("tf_data", "tf_generator")


def persists_workers(prefetcher: str, workers: int | None) -> bool:
    """Whether loader path ``prefetcher`` keeps its workers across the epochs of one loader
    (False for a path with none: it has nothing to keep)."""
    if prefetcher in NO_WORKER_PATHS or prefetcher in PER_PASS_PATHS:
        return False
    return prefetcher == "tf_data" or bool(workers)


def read_ahead_batches(loader, *, prefetcher: str, batch_size: int,
                       shuffle_buffer: int = 0, shuffle: bool = True) -> int:
    """*D*: the batches ``loader`` (of path ``prefetcher``) may read before the consumer
    takes its first (see the module docstring)."""
    from storebench.loaders import read_ahead_batches as window_depth

    if prefetcher in ("tf_data", "tf_generator"):
        buffered = (math.ceil(shuffle_buffer / batch_size)
                    if prefetcher == "tf_data" and shuffle else 0)
        return buffered + AUTOTUNE_READ_AHEAD_PER_CORE * len(os.sched_getaffinity(0))
    return window_depth(loader)  # a prefetcher's depth, a DataLoader's prefetch x workers


class SteadyWindow:
    """The steady window of one loader run, fed each batch's hand-out time (``add``); a
    ``restart()`` (a path that starts afresh each epoch) skips the read-ahead again and
    begins a new segment, the gap between segments not counted."""

    def __init__(self, *, skip: int) -> None:
        self.skip = int(skip)
        self.batches = 0  # after the window opened, over all segments
        self.samples = 0
        self.nbytes = 0
        self._closed_seconds = 0.0  # of finished segments
        self._in_pass = 0  # batches since the last (re)start
        self._opened_at = math.nan
        self._last_at = math.nan

    def add(self, samples: int, nbytes: int, at: float) -> None:
        if self._in_pass == self.skip:
            self._opened_at = self._last_at = at
        elif self._in_pass > self.skip:
            self.batches += 1
            self.samples += samples
            self.nbytes += nbytes
            self._last_at = at
        self._in_pass += 1

    def restart(self) -> None:
        if math.isfinite(self._opened_at):
            self._closed_seconds += self._last_at - self._opened_at
        self._in_pass = 0
        self._opened_at = self._last_at = math.nan

    @property
    def seconds(self) -> float:
        current = self._last_at - self._opened_at if math.isfinite(self._opened_at) else 0.0
        return self._closed_seconds + current

    def met(self, minimum: SteadyMinimum) -> bool:
        return self.batches >= max(1, minimum.batches) and self.seconds >= minimum.seconds

    def rate(self) -> float:
        """Samples per second over the window (NaN where it holds no batch)."""
        seconds = self.seconds
        return self.samples / seconds if self.batches and seconds > 0 else math.nan
