"""Batches: what every loader path hands to the consumer, and how batches are assembled.

A ``Batch`` holds the images either as one (B, H, W, C) array (fixed-size samples: raw or
decoded) or as a list (encoded bytes, or samples of different sizes), plus int64 labels and
the sample indices it was read for. It is also a sequence of ``(image, label)`` samples, so
code written for per-sample datasets (and PyTorch's ``__getitems__`` contract) can use it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..buffers import batch_empty


@dataclass(frozen=True)
class Batch:
    """One batch. ``images`` may be a view into a reused buffer: see the loader's docs."""

    images: np.ndarray | list
    labels: np.ndarray
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, k: int) -> tuple[np.ndarray | bytes, int]:
        return self.images[k], int(self.labels[k])

    def __iter__(self) -> Iterator[tuple[np.ndarray | bytes, int]]:
        for k in range(len(self)):
            yield self[k]

    @property
    def is_array(self) -> bool:
        """True when ``images`` is one stacked array (fixed-size samples)."""
        return isinstance(self.images, np.ndarray)

    @property
    def nbytes(self) -> int:
        """Bytes of image payload (array bytes, or the sum of encoded lengths)."""
        if self.is_array:
            return int(self.images.nbytes)
        return int(
            sum(len(x) if isinstance(x, bytes | bytearray) else x.nbytes for x in self.images)
        )

    def copy(self) -> Batch:
        """A batch that owns its memory (safe to keep after the loader reuses its buffers)."""
        images = self.images.copy() if self.is_array else list(self.images)
        return Batch(images, self.labels.copy(), self.indices.copy())


def batch_buffer(batch_size: int, sample_shape: Sequence[int], dtype=np.uint8) -> np.ndarray:
    """A pre-faulted (batch_size, *sample_shape) buffer: first-touch page faults would
    otherwise be charged to the first batches that use it. It starts half a page past a page
    boundary (``storebench.buffers``): row copies into it stay fast whatever it is filled
    from."""
    buffer = batch_empty((batch_size, *sample_shape), dtype)
    buffer.reshape(-1).view(np.uint8)[::4096] = 0
    return buffer


def stack_into(images: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray | list:
    """Stack same-shape arrays into ``out`` (or a new array); a list of differently shaped
    arrays is returned unchanged (use ``collate_padded`` for those)."""
    if not images:
        return out[:0] if out is not None else []
    first = images[0]
    if any(img.shape != first.shape or img.dtype != first.dtype for img in images):
        return list(images)
    if out is None or out.shape[1:] != first.shape or out.dtype != first.dtype:
        out = np.empty((len(images), *first.shape), dtype=first.dtype)
    target = out[: len(images)]
    for k, img in enumerate(images):
        target[k] = img
    return target


def collate_padded(
    images: Sequence[np.ndarray], *, pad_value: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Collate variable-size (H, W, C) images into one zero-padded (B, Hmax, Wmax, C) array.

    Returns ``(padded, shapes)`` where ``shapes[k]`` is the (H, W, C) of sample k, so a model
    can mask or crop the padding.
    """
    if not images:
        raise ValueError("collate_padded needs at least one image")
    shapes = np.array([img.shape for img in images], dtype=np.int64)
    if shapes.shape[1] != 3:
        raise ValueError(
            f"collate_padded takes (H, W, C) images, got shapes like {images[0].shape}"
        )
    if len(set(shapes[:, 2].tolist())) != 1:
        raise ValueError(f"images have different channel counts: {sorted(set(shapes[:, 2]))}")
    dtype = np.result_type(*[img.dtype for img in images])
    padded = np.full((len(images), *shapes.max(axis=0)), pad_value, dtype=dtype)
    for k, img in enumerate(images):
        padded[k, : img.shape[0], : img.shape[1]] = img
    return padded, shapes
