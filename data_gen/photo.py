"""An ImageNet-like JPEG set: photo-sized images of many sizes, textured like photographs.

What it imitates (ImageNet-1k's training set, ILSVRC-2012):

- 1,281,167 JPEGs in about 140 GB: about 110 KB each (MLPerf Storage's ResNet-50 workload
  sizes its samples at 114.7 KB);
- images of many sizes, most with a longer side of 500 pixels (Flickr's medium size), the
  commonest 500x375 and 375x500, a median around 400-500 x 330-400 (width x height);
- a few greyscale JPEGs among the RGB ones (ImageNet also holds 22 CMYK JPEGs and one PNG
  named .JPEG, which TensorFlow's ``build_imagenet_data.py`` converts).

Each image ``index`` of a ``PhotoSpec`` is a pure function of ``(spec.seed, index)``:

- **size**: with probability ``LONG_500_FRACTION`` the longer side is 500, else it is
  log-normal (median ``LONG_SIDE_MEDIAN``, log-sd ``LONG_SIDE_SIGMA``, clipped to
  ``LONG_SIDE_RANGE``); the aspect ratio (longer / shorter) is log-normal around 4:3
  (``ASPECT_MEDIAN``, ``ASPECT_SIGMA``, clipped to ``ASPECT_RANGE``); a ``PORTRAIT_FRACTION``
  of images stand upright;
- **mode**: a ``GREYSCALE_FRACTION`` of images are stored as one-channel (greyscale) JPEGs;
  every image decodes to RGB, as ImageFolder pipelines convert them;
- **content**: colour at coarse scales and luminance detail at fine scales (1/f noise, which
  photographs' spectra follow), with the detail's strength varying over the image (sharp
  subjects on softer backgrounds), plus the class's shape as in the small synthetic sets.
  At quality 90 with 4:2:0 chroma this gives about 0.7 bytes per pixel, where photographs
  fall (flat gradients would compress far better and decode faster).

A ``raw`` PhotoSpec is the same images pre-decoded at training resolution: image ``index``
of the JPEG set with the same seed and quality, decoded, its shorter side resized to
``height`` (Pillow bilinear) and centre-cropped to ``height`` x ``width``, as
"preprocessed .npy" users and FFCV's raw mode store them.

``docs/imagenet-like.md`` holds the measured quantiles (``data_gen.describe``).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import io
import itertools
import multiprocessing
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from ._fields import VariableShapeError, spec_from_fields

PHOTO_KIND = "photo"
PHOTO_ENCODINGS = ("jpeg", "raw")

# The size distribution (see the module docstring).
LONG_500_FRACTION = 0.4
LONG_SIDE_MEDIAN = 420.0
LONG_SIDE_SIGMA = 0.35
LONG_SIDE_RANGE = (160, 1024)
ASPECT_MEDIAN = 4.0 / 3.0
ASPECT_SIGMA = 0.12
ASPECT_RANGE = (1.0, 2.4)
PORTRAIT_FRACTION = 0.22
GREYSCALE_FRACTION = 0.02
# Amplitude of the finest luminance detail: sets the bytes per pixel at quality 90.
DETAIL_AMPLITUDE = 27.0


@dataclass(frozen=True)
class PhotoSpec:
    """Everything that determines the bytes of every sample of an ImageNet-like set.

    ``encoding="jpeg"``: images of many sizes (``height`` and ``width`` are 0, and
    ``image_shape`` raises ``VariableShapeError``); ``encoding="raw"``: the same images
    decoded and resized to ``height`` x ``width`` x 3."""

    num_samples: int
    encoding: str = "jpeg"
    height: int = 0
    width: int = 0
    num_classes: int = 1000
    jpeg_quality: int = 90
    seed: int = 0
    channels: int = 3
    kind: str = PHOTO_KIND

    def __post_init__(self) -> None:
        if self.kind != PHOTO_KIND:
            raise ValueError(f"kind must be {PHOTO_KIND!r}, got {self.kind!r}")
        if self.encoding not in PHOTO_ENCODINGS:
            raise ValueError(f"encoding must be one of {PHOTO_ENCODINGS}, got {self.encoding!r}")
        if self.channels != 3:
            raise ValueError(f"photo images decode to RGB (3 channels), got {self.channels}")
        for name in ("num_samples", "num_classes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be in 1..100, got {self.jpeg_quality}")
        if self.encoding == "raw" and (self.height <= 0 or self.width <= 0):
            raise ValueError("a raw PhotoSpec needs the height and width it is resized to")
        if self.encoding == "jpeg" and (self.height or self.width):
            raise ValueError("a jpeg PhotoSpec's images differ in size: height and width are 0")

    @property
    def fixed_size(self) -> bool:
        return self.encoding == "raw"

    @property
    def image_shape(self) -> tuple[int, int, int]:
        if not self.fixed_size:
            raise VariableShapeError(
                "the images of an ImageNet-like JPEG set differ in size, so there is no one "
                "image shape: decode them with a fixed-output transform "
                "(storebench.loaders.RandomResizedCropFlip or Resize), or use the raw set"
            )
        return (self.height, self.width, self.channels)

    @property
    def raw_sample_bytes(self) -> int:
        h, w, c = self.image_shape
        return h * w * c

    @property
    def decoded_bytes(self) -> int:
        """Bytes of all images decoded to RGB at their own size (the raw set's: its size)."""
        if self.fixed_size:
            return self.num_samples * self.raw_sample_bytes
        return _decoded_bytes(self.seed, self.num_samples)

    @property
    def source(self) -> PhotoSpec:
        """The JPEG set whose images this spec holds (itself for a JPEG spec)."""
        return dataclasses.replace(self, encoding="jpeg", height=0, width=0)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PhotoSpec:
        return spec_from_fields(cls, data)


def image_size(rng: np.random.Generator) -> tuple[int, int]:
    """(height, width) of one image, drawn from the documented distribution."""
    if rng.random() < LONG_500_FRACTION:
        long_side = 500.0
    else:
        long_side = LONG_SIDE_MEDIAN * np.exp(rng.normal(0.0, LONG_SIDE_SIGMA))
    long_side = float(np.clip(long_side, *LONG_SIDE_RANGE))
    aspect = float(np.clip(ASPECT_MEDIAN * np.exp(rng.normal(0.0, ASPECT_SIGMA)), *ASPECT_RANGE))
    long_px, short_px = int(round(long_side)), max(int(round(long_side / aspect)), 64)
    portrait = rng.random() < PORTRAIT_FRACTION
    return (long_px, short_px) if portrait else (short_px, long_px)


def _draw_start(seed: int, index: int) -> tuple[np.random.Generator, int, bool, int, int]:
    """Image ``index``'s generator after its first draws: label, greyscale flag and size."""
    rng = np.random.default_rng([seed, int(index)])
    label = int(rng.integers(1000))
    grey = bool(rng.random() < GREYSCALE_FRACTION)
    return (rng, label, grey, *image_size(rng))


@functools.lru_cache(maxsize=16)
def _decoded_bytes(seed: int, num_samples: int) -> int:
    return sum(3 * h * w for _, _, _, h, w in map(lambda i: _draw_start(seed, i),
                                                   range(num_samples)))


def _noise_layer(rng: np.random.Generator, h: int, w: int, cell: int, bands: int) -> np.ndarray:
    """Noise of ``bands`` channels varying over about ``cell`` pixels, bilinearly upsampled
    from a coarse grid (Pillow's float mode), as an (h, w, bands) float32 array."""
    from PIL import Image

    gh, gw = max(h // cell, 1) + 2, max(w // cell, 1) + 2
    grid = rng.standard_normal((bands, gh, gw)).astype(np.float32)
    if cell == 1:
        return np.moveaxis(grid[:, 1 : h + 1, 1 : w + 1], 0, -1)
    box = (1.0, 1.0, gw - 1.0, gh - 1.0)  # skip the border, where bilinear flattens out
    layers = [np.asarray(Image.fromarray(g, mode="F").resize((w, h), Image.Resampling.BILINEAR,
                                                               box=box)) for g in grid]
    return np.stack(layers, axis=-1)


def render_photo(spec: PhotoSpec, index: int) -> tuple[np.ndarray, int, bool]:
    """The pixels (H, W, 3 uint8, at the image's own size), label and greyscale flag of
    image ``index`` of ``spec``'s JPEG set."""
    from .generate import SHAPE_KINDS, _class_colour, _shape_mask  # generate imports us

    if not 0 <= index < spec.num_samples:
        raise IndexError(f"sample index {index} out of range for {spec.num_samples} samples")
    rng, label, grey, h, w = _draw_start(spec.seed, index)
    label %= spec.num_classes
    # Colour at coarse scales (a palette of three colours mixed by smooth fields)...
    palette = rng.uniform(20, 235, (3, 3)).astype(np.float32)
    mix = _noise_layer(rng, h, w, 96, 2) * 0.6 + _noise_layer(rng, h, w, 24, 2) * 0.25
    weights = np.concatenate([mix, np.zeros((h, w, 1), np.float32)], axis=-1)
    weights = np.exp(weights - weights.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    img = weights @ palette
    # ...luminance detail at fine scales, 1/f-like, stronger in some regions than others.
    detail = sum(_noise_layer(rng, h, w, cell, 1)[..., 0] * amp
                 for cell, amp in ((8, 1.2), (4, 1.0), (2, 1.2), (1, 1.3)))
    strength = np.clip(1.0 + 0.8 * _noise_layer(rng, h, w, 64, 1)[..., 0], 0.15, 2.5)
    img += (DETAIL_AMPLITUDE * detail * strength)[..., None]
    # The class's shape and a distractor, textured by the same detail.
    yy, xx = np.ogrid[0:h, 0:w]
    r = rng.uniform(0.18, 0.32) * min(h, w)
    cy, cx = rng.uniform(r, h - r), rng.uniform(r, w - r)
    mask = _shape_mask(SHAPE_KINDS[label % len(SHAPE_KINDS)], yy, xx, cy, cx, r)
    colour = _class_colour(label % 10, 10, rng).astype(np.float32)
    img[mask] = 0.5 * img[mask] + 0.5 * colour
    other = SHAPE_KINDS[int(rng.integers(len(SHAPE_KINDS)))]
    rr = rng.uniform(0.05, 0.12) * min(h, w)
    img[_shape_mask(other, yy, xx, rng.uniform(0, h), rng.uniform(0, w), rr)] *= 0.6
    pixels = np.clip(img, 0, 255).astype(np.uint8)
    return pixels, label, grey


def encode_photo(spec: PhotoSpec, pixels: np.ndarray, grey: bool) -> bytes:
    """JPEG bytes at the spec's quality, 4:2:0 chroma; one channel for greyscale images."""
    from PIL import Image

    image = Image.fromarray(pixels)
    if grey:
        image = image.convert("L")
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=spec.jpeg_quality, subsampling=2)
    return buffer.getvalue()


def resize_to_training(data: bytes, height: int, width: int) -> np.ndarray:
    """JPEG ``data`` decoded to RGB (Pillow), its shorter side resized to fit ``height`` x
    ``width`` (bilinear) and centre-cropped to it, as torchvision's ``Resize(s)`` +
    ``CenterCrop`` round."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        rgb = img.convert("RGB")
    w0, h0 = rgb.size
    scale = max(height / h0, width / w0)
    new_w, new_h = max(width, int(w0 * scale)), max(height, int(h0 * scale))
    resized = rgb.resize((new_w, new_h), Image.Resampling.BILINEAR)
    top, left = int(round((new_h - height) / 2.0)), int(round((new_w - width) / 2.0))
    return np.asarray(resized.crop((left, top, left + width, top + height)))


def photo_sample(spec: PhotoSpec, index: int) -> tuple[np.ndarray | bytes, int]:
    """Sample ``index`` as stored: JPEG bytes, or the (height, width, 3) pre-decoded array."""
    source = spec.source
    pixels, label, grey = render_photo(source, index)
    data = encode_photo(source, pixels, grey)
    if spec.encoding == "jpeg":
        return data, label
    return resize_to_training(data, spec.height, spec.width), label


def _training_chunk(args: tuple[int, int, list[tuple[bytes, int]]]) -> list[tuple[np.ndarray, int]]:
    height, width, items = args
    return [(resize_to_training(data, height, width), label) for data, label in items]


def training_copies(spec: PhotoSpec, encoded: Iterable[tuple[bytes, int]], *,
                    workers: int | None = None, chunk_size: int = 64,
                    ) -> Iterator[tuple[np.ndarray, int]]:
    """The raw ``spec``'s samples, in index order, made from its source set's samples
    (``encoded``: ``(JPEG bytes, label)`` of ``spec.source``, in index order): what
    ``photo_sample`` gives for ``spec``, without drawing and encoding each image again,
    which is most of its cost. A build that has just generated the JPEG set makes its raw
    copy from it. With ``workers > 1`` the resizes run in spawned processes, a few chunks
    ahead of the consumer, so the source is read as it is used."""
    from .generate import WorkersFailedToStartError, _broken_pool_message

    if spec.encoding != "raw":
        raise ValueError(f"training copies are raw samples; the spec's encoding is "
                         f"{spec.encoding!r}")
    workers = workers if workers is not None else (os.cpu_count() or 1)
    source = iter(encoded)
    chunks = iter(lambda: list(itertools.islice(source, chunk_size)), [])
    if workers <= 1:
        for chunk in chunks:
            yield from _training_chunk((spec.height, spec.width, chunk))
        return
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending: collections.deque = collections.deque()
        try:
            for chunk in chunks:
                pending.append(pool.submit(_training_chunk, (spec.height, spec.width, chunk)))
                if len(pending) >= 2 * workers:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()
        except BrokenProcessPool as err:
            raise WorkersFailedToStartError(_broken_pool_message()) from err
        finally:
            for future in pending:
                future.cancel()
