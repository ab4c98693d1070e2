"""Batches for the feeder tests (``tests/loaders/test_gpu.py`` and its CUDA twin): made up
ahead, and fed through reused arrays the way a prefetcher's slots hand them over."""

from __future__ import annotations

import numpy as np

from storebench.loaders import Batch


def make_batches(count: int, size: int = 8, *, last: int | None = None,
                 image_shape: tuple[int, ...] = (4, 4, 3)) -> list[Batch]:
    """``count`` batches of ``size`` random samples, then one of ``last`` (a short last
    batch) when given."""
    rng = np.random.default_rng(7)
    sizes = [size] * count + ([last] if last else [])
    return [
        Batch(
            rng.integers(0, 256, (n, *image_shape), dtype=np.uint8),
            rng.integers(0, 1000, n, dtype=np.int64),
            np.arange(n),
        )
        for n in sizes
    ]


def reusing_source(batches):
    """Every batch through the same two arrays, as a prefetcher's reused slots: a batch is
    valid only until the next one is asked for, and then it is scribbled over."""
    images = np.empty_like(batches[0].images)
    labels = np.empty_like(batches[0].labels)
    for batch in batches:
        n = len(batch)
        images[:n] = batch.images
        labels[:n] = batch.labels
        yield Batch(images[:n], labels[:n], batch.indices)
        images.fill(0)
        labels.fill(-1)
