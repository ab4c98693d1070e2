"""Per-sample image transforms that give variable-size images one shape before batching.

A dataset runs its ``transform`` on each decoded sample, in whichever thread or process
reads it (a prefetch worker, a DataLoader worker), before the batch is assembled. These
transforms are frozen dataclasses, so they pickle to spawn/forkserver workers (a lambda
does not), compare by value and print as what they do.

Each one takes an (H, W, C) uint8 array and says, through ``output_shape(input_shape,
channels)``, what shape it returns: a fixed shape (``Resize``, ``CenterCrop``) lets a dataset
know its ``sample_shape`` without reading a sample, so batches of images of mixed sizes are
stacked into one (B, H, W, C) array, and process workers can write them into shared memory.

The classic ImageNet evaluation transform, as torchvision writes it::

    Compose(ResizeShorter(256), CenterCrop(224, 224))

``ResizeShorter`` and ``CenterCrop`` round as ``torchvision.transforms`` do, and ``Resize``
is Pillow's bilinear resize (the filter torchvision applies to PIL images by default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

Shape = tuple[int, ...]


class ImageTooSmallError(ValueError):
    """A crop was asked of an image smaller than the crop."""


@runtime_checkable
class ImageTransform(Protocol):
    """What the datasets ask of a transform beyond being callable: the shape it returns for
    an input of ``input_shape`` (None when the input's shape is not known in advance), or
    None when that depends on the image."""

    def __call__(self, image: np.ndarray) -> np.ndarray: ...

    def output_shape(self, input_shape: Shape | None, channels: int) -> Shape | None: ...


def _check_image(image, owner: object) -> np.ndarray:
    if not isinstance(image, np.ndarray):
        raise TypeError(
            f"{owner!r} takes decoded (H, W, C) uint8 arrays, got {type(image).__name__}: "
            "pass decode='auto' (or 'pil' / 'simplejpeg') to the dataset"
        )
    if image.ndim != 3 or image.dtype != np.uint8:
        raise TypeError(
            f"{owner!r} takes (H, W, C) uint8 arrays, got a {image.dtype} array of shape "
            f"{image.shape}"
        )
    return image


def _positive(value: int, name: str, owner: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}")
    return int(value)


def _pil_resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Pillow's bilinear resize of an (H, W, C) uint8 array, channel count kept."""
    from PIL import Image

    if image.shape[:2] == (height, width):
        return image
    channels = image.shape[2]
    if channels in (1, 3):
        # One Pillow image of mode L or RGB, as a PIL-based pipeline would resize it.
        pil = Image.fromarray(image[:, :, 0] if channels == 1 else image)
        resized = np.asarray(pil.resize((width, height), Image.Resampling.BILINEAR))
        return resized.reshape(height, width, channels)
    # Any other count band by band: Pillow would treat a 4th channel as alpha and
    # premultiply by it, which is not what an arbitrary channel means.
    bands = [
        Image.fromarray(np.ascontiguousarray(image[:, :, c])).resize(
            (width, height), Image.Resampling.BILINEAR
        )
        for c in range(channels)
    ]
    return np.stack([np.asarray(band) for band in bands], axis=-1)


@dataclass(frozen=True)
class Resize:
    """Resize every image to ``height`` x ``width`` (Pillow bilinear), whatever its aspect
    ratio; channels are kept."""

    height: int
    width: int

    def __post_init__(self) -> None:
        _positive(self.height, "height", "Resize")
        _positive(self.width, "width", "Resize")

    def __call__(self, image: np.ndarray) -> np.ndarray:
        image = _check_image(image, self)
        return _pil_resize(image, self.height, self.width)

    def output_shape(self, input_shape: Shape | None, channels: int) -> Shape:
        return (self.height, self.width, input_shape[2] if input_shape else channels)


@dataclass(frozen=True)
class ResizeShorter:
    """Resize so that the shorter side is ``size``, keeping the aspect ratio (Pillow
    bilinear). The longer side becomes ``int(size * longer / shorter)``, truncated, as
    ``torchvision.transforms.Resize(size)`` does, so both pipelines agree on shapes."""

    size: int

    def __post_init__(self) -> None:
        _positive(self.size, "size", "ResizeShorter")

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) an image of ``height`` x ``width`` is resized to."""
        if height <= width:
            return self.size, int(self.size * width / height)
        return int(self.size * height / width), self.size

    def __call__(self, image: np.ndarray) -> np.ndarray:
        image = _check_image(image, self)
        return _pil_resize(image, *self.resized_size(*image.shape[:2]))

    def output_shape(self, input_shape: Shape | None, channels: int) -> Shape | None:
        if input_shape is None:
            return None  # depends on each image's aspect ratio
        return (*self.resized_size(*input_shape[:2]), input_shape[2])


@dataclass(frozen=True)
class CenterCrop:
    """Cut the central ``height`` x ``width`` window out of every image. The top-left corner
    is at ``round((H - height) / 2)``, ``round((W - width) / 2)``, as torchvision's
    ``CenterCrop`` places it. An image smaller than the window raises
    ``ImageTooSmallError`` (torchvision would pad it with zeros): resize first."""

    height: int
    width: int

    def __post_init__(self) -> None:
        _positive(self.height, "height", "CenterCrop")
        _positive(self.width, "width", "CenterCrop")

    def __call__(self, image: np.ndarray) -> np.ndarray:
        image = _check_image(image, self)
        rows, cols = image.shape[:2]
        if rows < self.height or cols < self.width:
            raise ImageTooSmallError(
                f"CenterCrop({self.height}, {self.width}) needs images of at least "
                f"{self.height}x{self.width} (height x width), got one of {rows}x{cols}; "
                f"resize first, e.g. Compose(ResizeShorter({max(self.height, self.width)}), "
                f"CenterCrop({self.height}, {self.width}))"
            )
        top = int(round((rows - self.height) / 2.0))
        left = int(round((cols - self.width) / 2.0))
        return image[top : top + self.height, left : left + self.width]

    def output_shape(self, input_shape: Shape | None, channels: int) -> Shape:
        return (self.height, self.width, input_shape[2] if input_shape else channels)


@dataclass(frozen=True, init=False)
class Compose:
    """Apply ``transforms`` in order. Its ``output_shape`` is known when the last
    transform's is, given what the earlier ones return; plain callables (without
    ``output_shape``) make it unknown, as a bare callable transform is."""

    transforms: tuple[Callable[[np.ndarray], np.ndarray], ...]

    def __init__(self, *transforms: Callable[[np.ndarray], np.ndarray]) -> None:
        if not transforms:
            raise ValueError("Compose needs at least one transform")
        for transform in transforms:
            if not callable(transform):
                raise TypeError(f"Compose takes callables, got {transform!r}")
        object.__setattr__(self, "transforms", tuple(transforms))

    def __call__(self, image: np.ndarray) -> np.ndarray:
        for transform in self.transforms:
            image = transform(image)
        return image

    def output_shape(self, input_shape: Shape | None, channels: int) -> Shape | None:
        shape = input_shape
        for transform in self.transforms:
            if not isinstance(transform, ImageTransform):
                return None
            shape = transform.output_shape(shape, channels)
        return shape

    def __repr__(self) -> str:
        return f"Compose({', '.join(map(repr, self.transforms))})"


def transform_output_shape(
    transform: Callable | None, input_shape: Shape | None, channels: int
) -> Shape | None:
    """The shape ``transform`` returns for inputs of ``input_shape``: None when it does not
    say (a plain callable) or when that depends on the image."""
    if isinstance(transform, ImageTransform):
        return transform.output_shape(input_shape, channels)
    return None


@dataclass(frozen=True)
class ScaledJpegDecode:
    """Decodes JPEG bytes at the smallest DCT scale (libjpeg-turbo's n/8, through simplejpeg's
    ``min_height``/``min_width``) that leaves at least ``min_height`` x ``min_width`` pixels:
    a 375x500 image read for a 224 crop decodes at 5/8, about 40% of its pixels. Give it
    as a dataset's ``transform`` with ``decode=None`` and ``output_shape=`` the scaled shape
    (``scaled_shape``)."""

    min_height: int
    min_width: int

    def __post_init__(self) -> None:
        _positive(self.min_height, "min_height", "ScaledJpegDecode")
        _positive(self.min_width, "min_width", "ScaledJpegDecode")

    def __call__(self, data: bytes) -> np.ndarray:
        import simplejpeg

        return simplejpeg.decode_jpeg(data, colorspace="RGB",
                                      min_height=self.min_height, min_width=self.min_width)

    def scaled_shape(self, data: bytes) -> Shape:
        """The (H, W, 3) this transform decodes ``data`` to."""
        return tuple(self(data).shape)
