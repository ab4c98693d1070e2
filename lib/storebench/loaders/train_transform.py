"""The standard training transform: a random resized crop to 224x224 and a random flip.

``RandomResizedCropFlip`` is torchvision's ``RandomResizedCrop(224)`` (scale 0.08-1, ratio
3/4-4/3, ten tries and then its central-crop fallback) followed by
``RandomHorizontalFlip()``, with one difference that matters for a storage benchmark: its
randomness is a pure function of ``(seed, epoch, sample index)``, not of a global generator.
So every loader path (a dataset read directly, ``ThreadPrefetcher``, ``ProcessPrefetcher``
under fork, spawn or forkserver, torch's ``DataLoader``) delivers the same pixels for the same
epoch, whichever worker reads which sample, and a resumed epoch repeats them. The crop is cut
and resized with one bilinear resize (below) on every path, so full decodes agree bit for bit.

Give it to a dataset as ``transform=`` with ``decode="window"``, ``"simplejpeg"`` (or
``"pil"``/``"auto"``);
the dataset passes each sample's index and its epoch (``dataset.set_epoch``; a prefetcher
or ``torch_dataloader`` takes the epoch from its sampler's ``set_epoch``).

**Reduced-size decode** (``decode="reduced"``): libjpeg-turbo decodes a JPEG at a scale of
n/8 through its DCT (simplejpeg's ``min_height``/``min_width``) at a fraction of the full
decode's cost. The crop's parameters come from the header's full size, the decode is the
smallest scale at which the crop still covers 224x224, and the crop box is scaled to it. The
pixels differ a little from the full decode's: ``reduced_decode_psnr`` measures by how much.

**Crop-window decode** (``decode="window"``, ``decode_window``): libjpeg-turbo decodes only
the rows and iMCU columns the crop keeps (``storebench._jpegwindow``): the rows above it are
entropy-decoded but not transformed, the rows below it not read. Its pixels are the full
decode's (a test checks them on the ImageNet-like set). ``dct_scale=True`` also decodes at
1/2, 1/4 or 1/8 scale where the crop still covers ``size`` x ``size`` there.

**Resize filters.** ``filter="antialiased"`` (the default) is a bilinear filter widened by
the downscale factor, as Pillow's, FFCV's ``INTER_AREA`` and DALI's default resize are;
``filter="plain"`` samples two pixels a direction, as ``tf.image.resize(antialias=False)``
does. Recipes are compared within one class. ``resampler="storebench"`` (the default)
resizes in C without the GIL, straight into the batch (``storebench._resize``): Pillow's
bilinear weights and rounding, its vertical pass first (Pillow picks its passes' order
itself, and where it runs them the other way its pixels differ by at most one level).
``resampler="pillow"`` resizes with Pillow, as torchvision's ``RandomResizedCrop`` does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .transforms import Shape, _check_image, _positive

CROP_TRIES = 10  # torchvision's RandomResizedCrop.get_params
FILTERS = ("antialiased", "plain")
RESAMPLERS = ("storebench", "pillow")
# The DCT scales libjpeg decodes at (1/n), largest first: ``decode_window(dct_scale=True)``.
DCT_DENOMINATORS = (8, 4, 2)
JPEG_ONLY_PILLOW = frozenset({"CMYK", "YCCK"})


def crop_box(rng: np.random.Generator, height: int, width: int, *,
             scale: tuple[float, float], ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """(top, left, height, width) of a crop of a ``height`` x ``width`` image, drawn from
    ``rng`` as torchvision's ``RandomResizedCrop.get_params`` draws it: ten tries at a random
    area share and log-uniform aspect ratio, then the centre crop at the nearest allowed
    ratio."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(CROP_TRIES):
        target_area = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return (int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)),
                    h, w)
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


@dataclass(frozen=True)
class CropParams:
    """Where one sample's crop lies in its full-size image, and whether it is flipped."""

    top: int
    left: int
    height: int
    width: int
    flipped: bool


@dataclass(frozen=True)
class RandomResizedCropFlip:
    """Random resized crop to ``size`` x ``size`` then a horizontal flip with probability
    ``flip``, seeded per ``(seed, epoch, index)`` (see the module docstring)."""

    size: int = 224
    seed: int = 0
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    flip: float = 0.5
    filter: str = "antialiased"
    resampler: str = "storebench"

    # Datasets call it with the sample's index and epoch (``_MapDataset._finish``).
    seeded = True

    def __post_init__(self) -> None:
        _positive(self.size, "size", "RandomResizedCropFlip")
        object.__setattr__(self, "scale", tuple(float(x) for x in self.scale))
        object.__setattr__(self, "ratio", tuple(float(x) for x in self.ratio))
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ValueError(f"RandomResizedCropFlip: scale must be 0 < lo <= hi <= 1, "
                             f"got {self.scale}")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"RandomResizedCropFlip: ratio must be 0 < lo <= hi, got {self.ratio}")
        if not 0 <= self.flip <= 1:
            raise ValueError(f"RandomResizedCropFlip: flip must be in 0..1, got {self.flip}")
        if self.filter not in FILTERS:
            raise ValueError(f"RandomResizedCropFlip: filter must be one of {FILTERS}, got "
                             f"{self.filter!r}")
        if self.resampler not in RESAMPLERS:
            raise ValueError(f"RandomResizedCropFlip: resampler must be one of {RESAMPLERS}, "
                             f"got {self.resampler!r}")
        if self.resampler == "pillow" and self.filter != "antialiased":
            raise ValueError("RandomResizedCropFlip: Pillow's bilinear resize is antialiased; "
                             "filter='plain' needs resampler='storebench'")

    def params(self, height: int, width: int, *, index: int, epoch: int) -> CropParams:
        """Sample ``index``'s crop in ``epoch`` of an image of ``height`` x ``width``:
        torchvision's ``RandomResizedCrop.get_params``, drawn from this sample's generator."""
        rng = np.random.default_rng([self.seed, int(epoch), int(index)])
        top, left, h, w = crop_box(rng, height, width, scale=self.scale, ratio=self.ratio)
        return CropParams(top, left, h, w, bool(rng.random() < self.flip))

    def __call__(self, image: np.ndarray, *, index: int, epoch: int = 0,
                 out: np.ndarray | None = None) -> np.ndarray:
        """Sample ``index``'s (H, W, C) uint8 image cropped, resized and maybe flipped
        (into ``out``, a (size, size, C) array, when given)."""
        image = _check_image(image, self)
        p = self.params(*image.shape[:2], index=index, epoch=epoch)
        crop = image[p.top : p.top + p.height, p.left : p.left + p.width]
        return self._finish(crop, (0.0, 0.0, float(p.width), float(p.height)), p.flipped, out)

    def decode_reduced(self, data: bytes, *, index: int, epoch: int = 0,
                       colorspace: str = "RGB") -> np.ndarray:
        """JPEG ``data`` decoded at the smallest DCT scale at which sample ``index``'s crop
        still covers ``size`` x ``size``, then cropped, resized and maybe flipped."""
        import simplejpeg

        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        p = self.params(height, width, index=index, epoch=epoch)
        decoded = simplejpeg.decode_jpeg(
            data, colorspace=colorspace,
            min_height=math.ceil(self.size * height / p.height),
            min_width=math.ceil(self.size * width / p.width))
        if decoded.ndim == 2:
            decoded = decoded[:, :, None]
        sy, sx = decoded.shape[0] / height, decoded.shape[1] / width
        if (sy, sx) == (1.0, 1.0):  # decoded at full size: exactly the full decode's crop
            crop = decoded[p.top : p.top + p.height, p.left : p.left + p.width]
            return self._finish(crop, (0.0, 0.0, float(p.width), float(p.height)), p.flipped)
        box = (p.left * sx, p.top * sy, (p.left + p.width) * sx, (p.top + p.height) * sy)
        # Resize only the whole pixels the box touches, not the whole decoded image.
        x0, y0 = int(box[0]), int(box[1])
        x1 = min(math.ceil(box[2]), decoded.shape[1])
        y1 = min(math.ceil(box[3]), decoded.shape[0])
        return self._finish(decoded[y0:y1, x0:x1],
                            (box[0] - x0, box[1] - y0, box[2] - x0, box[3] - y0), p.flipped)

    def window_scale(self, p: CropParams) -> int:
        """The largest DCT denominator (8, 4, 2, else 1) at which crop ``p`` still spans
        ``size`` pixels each way."""
        return next((d for d in DCT_DENOMINATORS
                     if p.height // d >= self.size and p.width // d >= self.size), 1)

    def window_plan(self, height: int, width: int, *, index: int, epoch: int = 0,
                    dct_scale: bool = False) -> tuple[CropParams, int, tuple[int, int, int, int],
                                                      tuple[float, float, float, float]]:
        """Sample ``index``'s crop of a ``height`` x ``width`` JPEG as ``decode_window``
        decodes it: (params, DCT denominator, window (top, left, bottom, right) in the
        scaled image's pixels, box (left, top, right, bottom) within the window)."""
        p = self.params(height, width, index=index, epoch=epoch)
        d = self.window_scale(p) if dct_scale else 1
        if d == 1:
            return (p, 1, (p.top, p.left, p.top + p.height, p.left + p.width),
                    (0.0, 0.0, float(p.width), float(p.height)))
        # libjpeg's scaled size rounds up (jdiv_round_up).
        scaled_h, scaled_w = -(-height // d), -(-width // d)
        box = (p.left / d, p.top / d, min((p.left + p.width) / d, scaled_w),
               min((p.top + p.height) / d, scaled_h))
        x0, y0 = int(box[0]), int(box[1])
        x1, y1 = min(math.ceil(box[2]), scaled_w), min(math.ceil(box[3]), scaled_h)
        return (p, d, (y0, x0, y1, x1), (box[0] - x0, box[1] - y0, box[2] - x0, box[3] - y0))

    def decode_window(self, data, *, index: int, epoch: int = 0, channels: int = 3,
                      out: np.ndarray | None = None, dct_scale: bool = False,
                      header: tuple | None = None) -> np.ndarray:
        """JPEG ``data``'s sample ``index`` decoded only where its crop lies, then resized
        and maybe flipped, into ``out`` ((size, size, channels) uint8) when given.
        ``header``: ``jpeg_header(data)`` where the caller parsed it already. Raises
        ValueError on damaged data, and for CMYK/YCCK JPEGs (decode those whole)."""
        from storebench.formats.confine import check_pixels, max_image_pixels

        jpegwindow = jpeg_window_module()
        height, width, colorspace, _ = header or jpegwindow.header(data)
        if colorspace in JPEG_ONLY_PILLOW:
            raise ValueError(f"a {colorspace} JPEG: decode it whole (Pillow)")
        check_pixels(height, width, "JPEG header")
        p, d, window, box = self.window_plan(height, width, index=index, epoch=epoch,
                                             dct_scale=dct_scale)
        if out is None:
            out = np.empty((self.size, self.size, channels), np.uint8)
        if self.resampler == "pillow":
            pixels = np.empty((window[2] - window[0], window[3] - window[1], channels),
                              np.uint8)
            jpegwindow.decode_window_into(data, window, pixels, scale_denom=d,
                                          max_pixels=max_image_pixels())
            return self._finish(pixels, box, p.flipped, out)
        jpegwindow.decode_crop_resize(data, window, box, out, flip=p.flipped,
                                      antialias=self.filter == "antialiased", scale_denom=d,
                                      max_pixels=max_image_pixels())
        return out

    def _finish(self, image: np.ndarray, box: tuple[float, float, float, float],
                flipped: bool, out: np.ndarray | None = None) -> np.ndarray:
        """``box`` (left, top, right, bottom) of ``image`` resized to size x size with the
        transform's filter, channel count kept; flipped left to right if asked; into
        ``out`` when given."""
        channels = image.shape[2]
        if out is None:
            out = np.empty((self.size, self.size, channels), np.uint8)
        if self.resampler == "storebench":
            from storebench import _resize

            if image.strides[1:] != (channels, 1):  # rows may be strided, pixels packed
                image = np.ascontiguousarray(image)
            _resize.resize_into(image, box, out, flip=flipped,
                                antialias=self.filter == "antialiased")
            return out
        from PIL import Image

        bands = [image[:, :, 0]] if channels == 1 else [image] if channels == 3 else [
            image[:, :, c] for c in range(channels)]
        resized = [np.asarray(Image.fromarray(np.ascontiguousarray(b)).resize(
            (self.size, self.size), Image.Resampling.BILINEAR, box=box)) for b in bands]
        out[...] = (resized[0].reshape(self.size, self.size, -1) if len(resized) == 1
                    else np.stack(resized, axis=-1))[:, ::-1 if flipped else 1]
        return out

    def output_shape(self, input_shape: Shape | None, channels: int) -> Shape:
        return (self.size, self.size, input_shape[2] if input_shape else channels)


def jpeg_window_module():
    """``storebench._jpegwindow``, or an ImportError that says how to build it."""
    try:
        from storebench import _jpegwindow
    except ImportError as err:
        raise ImportError(
            "decode='window' needs storebench's crop-window decoder, built against "
            "libjpeg-turbo's headers at install time, and this install has none: install "
            "them (Debian: apt-get install libjpeg62-turbo-dev) and reinstall storebench "
            "(make setup)") from err
    return _jpegwindow


def jpeg_header(data) -> tuple[int, int, str, bool]:
    """(height, width, colour space, progressive) of a JPEG's header; ValueError if damaged."""
    return jpeg_window_module().header(data)


def is_seeded(transform) -> bool:
    """Whether ``transform`` takes each sample's index and epoch (``RandomResizedCropFlip``)."""
    return getattr(transform, "seeded", False) is True


@dataclass(frozen=True)
class ReducedDecodeReport:
    """How far reduced-size decodes are from full decodes, over ``images`` samples:
    ``psnr_db`` over all their pixels (the mean squared error pooled), the worst image's,
    the share decoded below full size and the mean decoded pixels as a share of full."""

    images: int
    psnr_db: float
    worst_psnr_db: float
    reduced_share: float
    pixel_fraction: float


def _psnr(mse: float) -> float:
    return math.inf if mse == 0 else 10.0 * math.log10(255.0**2 / mse)


def reduced_decode_psnr(jpegs: Sequence[bytes], transform: RandomResizedCropFlip | None = None,
                        *, epoch: int = 0) -> ReducedDecodeReport:
    """Compare ``transform`` (default ``RandomResizedCropFlip()``) after a full simplejpeg
    decode with the same transform after a reduced-size decode (``decode_reduced``), for
    each of ``jpegs`` as sample 0, 1, ... of ``epoch``."""
    import simplejpeg

    transform = transform or RandomResizedCropFlip()
    if not jpegs:
        raise ValueError("reduced_decode_psnr needs at least one JPEG")
    errors, worst, reduced, fractions = [], math.inf, 0, []
    for index, data in enumerate(jpegs):
        full = transform(simplejpeg.decode_jpeg(data, colorspace="RGB"), index=index,
                         epoch=epoch)
        small = transform.decode_reduced(data, index=index, epoch=epoch)
        mse = float(np.mean((full.astype(np.float64) - small) ** 2))
        errors.append(mse)
        worst = min(worst, _psnr(mse))
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        p = transform.params(height, width, index=index, epoch=epoch)
        scaled = simplejpeg.decode_jpeg(
            data, colorspace="GRAY", min_height=math.ceil(transform.size * height / p.height),
            min_width=math.ceil(transform.size * width / p.width))
        fractions.append(scaled.size / (height * width))
        reduced += scaled.size < height * width
    return ReducedDecodeReport(len(jpegs), _psnr(float(np.mean(errors))), worst,
                               reduced / len(jpegs), float(np.mean(fractions)))
