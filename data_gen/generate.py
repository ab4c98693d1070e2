"""Deterministic, class-conditional synthetic images.

Every sample is a pure function of ``(spec, index)``: its random generator is seeded with
``(spec.seed, index)``, so the bytes do not depend on generation order or process count.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from .spec import DatasetSpec

# Eight shape kinds cycle over the classes; colours are spread over the hue circle, so that
# class identity is visible both in geometry and colour (a small CNN can learn it).
SHAPE_KINDS = ("disc", "square", "triangle", "ring", "hstripes", "vstripes", "cross", "diamond")


def _class_colour(label: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    hue = (label / num_classes + rng.uniform(-0.03, 0.03)) % 1.0
    # HSV -> RGB with full saturation and value, then a little jitter.
    k = (np.array([5.0, 3.0, 1.0]) + hue * 6.0) % 6.0
    rgb = 1.0 - np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)
    return np.clip(rgb * 220.0 + 20.0 + rng.normal(0.0, 8.0, 3), 0, 255)


def _shape_mask(kind: str, yy: np.ndarray, xx: np.ndarray, cy: float, cx: float, r: float):
    dy, dx = yy - cy, xx - cx
    if kind == "disc":
        return dy * dy + dx * dx <= r * r
    if kind == "square":
        return (np.abs(dy) <= r) & (np.abs(dx) <= r)
    if kind == "triangle":
        return (dy <= r) & (dy >= -r) & (np.abs(dx) <= (dy + r) / 2.0)
    if kind == "ring":
        d2 = dy * dy + dx * dx
        return (d2 <= r * r) & (d2 >= (0.55 * r) ** 2)
    if kind == "hstripes":
        return (np.abs(dx) <= r) & (np.abs(dy) <= r) & ((np.floor(dy / max(r / 3, 1)) % 2) == 0)
    if kind == "vstripes":
        return (np.abs(dx) <= r) & (np.abs(dy) <= r) & ((np.floor(dx / max(r / 3, 1)) % 2) == 0)
    if kind == "cross":
        w = max(r / 3.0, 1.0)
        return ((np.abs(dy) <= w) & (np.abs(dx) <= r)) | ((np.abs(dx) <= w) & (np.abs(dy) <= r))
    if kind == "diamond":
        return np.abs(dy) + np.abs(dx) <= r
    raise ValueError(f"unknown shape kind {kind!r}")


def render(spec: DatasetSpec, index: int) -> tuple[np.ndarray, int]:
    """The decoded pixels (H, W, C uint8) and label of sample ``index``."""
    if not 0 <= index < spec.num_samples:
        raise IndexError(f"sample index {index} out of range for {spec.num_samples} samples")
    rng = np.random.default_rng([spec.seed, int(index)])
    label = int(rng.integers(spec.num_classes))
    h, w = spec.height, spec.width
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)

    # Background: a smooth two-colour gradient whose angle depends on the class.
    angle = 2 * np.pi * label / spec.num_classes + rng.uniform(-0.4, 0.4)
    t = (np.cos(angle) * xx / w + np.sin(angle) * yy / h + 1.0) / 2.0
    c0 = rng.uniform(0, 110, 3)
    c1 = rng.uniform(90, 200, 3)
    img = c0[None, None, :] * (1.0 - t[..., None]) + c1[None, None, :] * t[..., None]

    # Foreground: one main class shape plus one or two distractor shapes.
    kind = SHAPE_KINDS[label % len(SHAPE_KINDS)]
    r = rng.uniform(0.18, 0.32) * min(h, w)
    cy, cx = rng.uniform(r, h - r), rng.uniform(r, w - r)
    img[_shape_mask(kind, yy, xx, cy, cx, r)] = _class_colour(label, spec.num_classes, rng)
    for _ in range(int(rng.integers(1, 3))):
        other = SHAPE_KINDS[int(rng.integers(len(SHAPE_KINDS)))]
        rr = rng.uniform(0.05, 0.12) * min(h, w)
        mask = _shape_mask(other, yy, xx, rng.uniform(0, h), rng.uniform(0, w), rr)
        img[mask] = rng.uniform(0, 255, 3)

    img += rng.normal(0.0, 4.0, img.shape[:2])[..., None]  # mild sensor noise
    img = np.clip(img, 0, 255).astype(np.uint8)
    if spec.channels == 1:
        img = img.mean(axis=2, keepdims=True).astype(np.uint8)
    return img, label


def encode(spec: DatasetSpec, pixels: np.ndarray) -> np.ndarray | bytes:
    """Pixels as stored for ``spec.encoding``: the array itself, or PNG/JPEG bytes."""
    if spec.encoding == "raw":
        return pixels
    from PIL import Image

    image = Image.fromarray(pixels[..., 0] if spec.channels == 1 else pixels)
    buffer = io.BytesIO()
    if spec.encoding == "png":
        image.save(buffer, format="PNG", compress_level=6)
    else:
        image.save(buffer, format="JPEG", quality=spec.jpeg_quality, subsampling=2)
    return buffer.getvalue()


def sample(spec: DatasetSpec, index: int) -> tuple[np.ndarray | bytes, int]:
    """Sample ``index`` as stored: (H, W, C) uint8 for raw, encoded bytes for png/jpeg.
    ``spec`` may be a ``PhotoSpec`` too (``data_gen.photo``: the ImageNet-like set)."""
    if getattr(spec, "kind", None) == "photo":
        from .photo import photo_sample  # photo imports this module

        return photo_sample(spec, index)
    pixels, label = render(spec, index)
    return encode(spec, pixels), label


class WorkersFailedToStartError(RuntimeError):
    """The generator's worker processes died (most often while starting)."""


def _broken_pool_message() -> str:
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    where = f"your main module {main}" if main else "your main program"
    return (
        "the sample generator's worker processes died. A spawned worker first re-runs "
        f"{where}: if that builds datasets at top level, without an "
        '`if __name__ == "__main__":` guard, every worker tries to start workers of its own '
        "and fails (their tracebacks are on stderr). Put the top-level code under the guard, "
        "or pass workers=1"
    )


def _sample_chunk(args: tuple[DatasetSpec, int, int]) -> list[tuple[np.ndarray | bytes, int]]:
    spec, start, stop = args
    return [sample(spec, i) for i in range(start, stop)]


def generate(
    spec: DatasetSpec,
    indices: Sequence[int] | None = None,
    *,
    workers: int | None = None,
    chunk_size: int = 64,
    progress: bool | str = False,
) -> Iterator[tuple[np.ndarray | bytes, int]]:
    """Yield samples in index order (all of them, or a contiguous range given as ``indices``).

    With ``workers > 1`` samples are made in spawned processes, in chunks, and still yielded
    in order. ``progress`` shows a tqdm bar (a string sets its description).
    """
    if indices is None:
        start, stop = 0, spec.num_samples
    else:
        start, stop = int(indices[0]), int(indices[-1]) + 1
        if list(indices) != list(range(start, stop)):
            raise ValueError("generate() takes a contiguous, increasing range of indices")
    workers = workers if workers is not None else (os.cpu_count() or 1)
    total = stop - start
    chunks = [(spec, s, min(s + chunk_size, stop)) for s in range(start, stop, chunk_size)]

    from tqdm.auto import tqdm

    desc = progress if isinstance(progress, str) else f"generate {spec.encoding}"
    with tqdm(total=total, desc=desc, unit="img", disable=not progress, leave=False) as bar:
        if workers <= 1 or total <= chunk_size:
            for chunk in chunks:
                yield from _sample_chunk(chunk)
                bar.update(chunk[2] - chunk[1])
            return
        # An executor, not a multiprocessing.Pool: a Pool replaces workers that die while
        # starting, forever, where an executor breaks and says so.
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            try:
                for (_, s, e), items in zip(chunks, pool.map(_sample_chunk, chunks)):
                    yield from items
                    bar.update(e - s)
            except BrokenProcessPool as err:
                raise WorkersFailedToStartError(_broken_pool_message()) from err
