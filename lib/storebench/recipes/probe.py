"""Probe images that say where they were cropped: the check that a recipe's training
transform is the one every recipe declares (``base.TRANSFORM``).

A probe's red channel is its column and its green channel its row, scaled to 0-255
(``probe_pixels``), so that any crop resized to 224 x 224, by any filter, and flipped or not,
still carries a linear ramp across each axis. ``recover_box`` fits those ramps to find the
crop box in the source image and whether it was flipped; ``check_draws`` holds many recovered
boxes to the definition: a random resized crop of scale 0.08-1 and ratio 3/4-4/3, then a
horizontal flip with probability one half.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The probe's side: with 256 columns, one grey level is one column, so the ramps resolve a
# box to about a pixel.
PROBE_SIDE = 256
PROBE_QUALITY = 95
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
# How far a recovered box may stray from the definition's bounds: JPEG's rounding and the
# resize's edge pixels blur a ramp by a pixel or two at each end.
AREA_SLACK = 0.03
RATIO_SLACK = 0.06


def probe_pixels(side: int = PROBE_SIDE) -> np.ndarray:
    """A (side, side, 3) uint8 probe: red = column, green = row, blue = 128."""
    ramp = np.round(np.arange(side) * 255.0 / (side - 1)).astype(np.uint8)
    pixels = np.empty((side, side, 3), np.uint8)
    pixels[..., 0] = ramp[None, :]
    pixels[..., 1] = ramp[:, None]
    pixels[..., 2] = 128
    return pixels


def write_probe_folder(root: Path | str, count: int, *, side: int = PROBE_SIDE) -> Path:
    """An ImageFolder of ``count`` probe JPEGs (one class) under ``root``, for
    ``storebench import``: every image is the same probe, so a sample's crop is read from
    its pixels alone."""
    from PIL import Image

    folder = Path(root) / "probe"
    folder.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(probe_pixels(side))
    for index in range(count):
        image.save(folder / f"{index:05d}.jpg", quality=PROBE_QUALITY)
    return Path(root)


@dataclass(frozen=True)
class CropBox:
    """Where a delivered image was cut from its probe: left, top, width, height in source
    pixels, and whether it was flipped."""

    left: float
    top: float
    width: float
    height: float
    flipped: bool

    def area(self, side: int = PROBE_SIDE) -> float:
        """The box's share of the probe's area."""
        return self.width * self.height / (side * side)

    @property
    def ratio(self) -> float:
        return self.width / self.height


def _ramp(values: np.ndarray) -> tuple[float, float]:
    """(slope, value at the first pixel's centre) of a least-squares line through
    ``values``, one per output pixel."""
    positions = np.arange(values.size, dtype=np.float64)
    slope, intercept = np.polyfit(positions, values.astype(np.float64), 1)
    return float(slope), float(intercept)


def recover_box(image: np.ndarray, side: int = PROBE_SIDE) -> CropBox:
    """The crop box a (H, W, 3) image delivered from a probe was cut from: a line fitted to
    the red channel's column means gives the box's columns (its sign, the flip), one fitted
    to the green channel's row means its rows. Output pixel ``j`` of ``n`` samples source
    column ``left + (j + 0.5) * width / n``."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] < 2:
        raise ValueError(f"a probe crop is (H, W, 3), got shape {image.shape}")
    scale = (side - 1) / 255.0
    columns = image[..., 0].mean(axis=0) * scale
    rows = image[..., 1].mean(axis=1) * scale
    x_slope, x_first = _ramp(columns)
    y_slope, y_first = _ramp(rows)
    width = abs(x_slope) * image.shape[1]
    height = abs(y_slope) * image.shape[0]
    flipped = x_slope < 0
    # The centre of the first output column samples left + 0.5 * width / n (flipped: the
    # box's right edge minus that); pixel centres sit at integer columns, edges at +-0.5.
    first = x_first + 0.5
    left = (first - width * (image.shape[1] - 0.5) / image.shape[1] if flipped
            else first - 0.5 * width / image.shape[1])
    top = y_first + 0.5 - 0.5 * height / image.shape[0]
    return CropBox(left, top, width, height, flipped)


def check_draws(boxes: Sequence[CropBox], side: int = PROBE_SIDE) -> list[str]:
    """What in ``boxes`` (many draws of one recipe) breaks the definition: a box outside
    the probe, an area or a ratio outside its range (beyond the slack), flips far from one
    half, or areas that do not spread over the range. Empty when all hold."""
    problems = []
    if not boxes:
        return ["no crop was delivered"]
    for number, box in enumerate(boxes):
        where = f"draw {number} ({box.width:.0f}x{box.height:.0f} at {box.left:.0f},"\
                f"{box.top:.0f})"
        if box.left < -2 or box.top < -2 or box.left + box.width > side + 2 \
                or box.top + box.height > side + 2:
            problems.append(f"{where}: outside the {side}x{side} image")
        if not SCALE[0] - AREA_SLACK <= box.area(side) <= SCALE[1] + AREA_SLACK:
            problems.append(f"{where}: area {box.area(side):.3f} outside {SCALE}")
        if not RATIO[0] - RATIO_SLACK <= box.ratio <= RATIO[1] + RATIO_SLACK:
            problems.append(f"{where}: ratio {box.ratio:.3f} outside 3/4-4/3")
    flips = sum(box.flipped for box in boxes) / len(boxes)
    # Three standard deviations of a fair coin's share over these draws.
    spread = 3 * math.sqrt(0.25 / len(boxes))
    if abs(flips - 0.5) > spread:
        problems.append(f"{flips:.0%} of {len(boxes)} draws flipped: not a fair coin "
                        f"(0.5 +- {spread:.2f})")
    areas = sorted(box.area(side) for box in boxes)
    if len(boxes) >= 32 and (areas[0] > 0.3 or areas[-1] < 0.6):
        problems.append(f"areas span only {areas[0]:.2f}-{areas[-1]:.2f}: a scale drawn "
                        f"from {SCALE} spreads wider")
    return problems
